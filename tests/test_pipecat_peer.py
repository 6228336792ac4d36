"""The Pipecat peer of the turn benchmark without Pipecat: job files, the runner's timeline
logic (turn clocks, answers, bot-audio spans, end of an answer) and result parsing.

``benchmarks/pipecat_peer/runner.py`` imports Pipecat only inside its functions, so its pure
part is loaded here from the file. Real Pipecat runs are benchmarks.
"""

from __future__ import annotations

import importlib.util
import sys
import wave
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from speclive.errors import ConfigError
from speclive_bench import pipecat_peer

RUNNER = Path(__file__).resolve().parents[1] / "benchmarks" / "pipecat_peer" / "runner.py"


def _load_runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pipecat_peer_runner", RUNNER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved  # the script drops its own folder from sys.path
    return module


runner = _load_runner()


def _wav(path: Path, seconds: float, rate: int = 16000, channels: int = 1) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(int(seconds * rate) * 2 * channels))
    return path


# ------------------------------------------------------------------------------------ runner


def test_runner_imports_without_pipecat() -> None:
    assert "pipecat" not in sys.modules
    assert runner.CHUNK_BYTES == 640  # 20 ms of 16 kHz int16


def test_split_chunks_pads_the_last_chunk() -> None:
    pcm = bytes(range(10)) * 70  # 700 bytes: one full chunk and 60 bytes
    chunks = runner.split_chunks(pcm)
    assert [len(c) for c in chunks] == [640, 640]
    assert chunks[0] == pcm[:640]
    assert chunks[1][:60] == pcm[640:] and chunks[1][60:] == bytes(580)
    assert runner.split_chunks(b"") == []


def test_read_pcm_checks_the_format(tmp_path: Path) -> None:
    good = _wav(tmp_path / "a.wav", 0.5)
    assert len(runner.read_pcm(good)) == 16000
    with pytest.raises(ValueError):
        runner.read_pcm(_wav(tmp_path / "b.wav", 0.5, rate=22050))
    with pytest.raises(ValueError):
        runner.read_pcm(_wav(tmp_path / "c.wav", 0.5, channels=2))


def test_merge_spans_joins_touching_chunks_only() -> None:
    spans = [(1.04, 1.08), (1.0, 1.04), (1.08, 1.12), (1.5, 1.54)]
    assert runner.merge_spans(spans) == [[1.0, 1.12], [1.5, 1.54]]
    assert runner.merge_spans([]) == []


def test_llm_responses_groups_text_between_start_and_end() -> None:
    tl = runner.Timeline()
    tl.add("llm_start", 1.0)
    tl.add("llm_text", 1.1, "Paris")
    tl.add("llm_text", 1.2, " is it.")
    tl.add("llm_end", 1.3)
    tl.add("audio", 1.4, 1.44)
    tl.add("llm_start", 5.0)
    tl.add("llm_end", 5.1)  # an empty response is still one
    tl.add("llm_text", 6.0, "stray")  # text without a start opens a response
    assert runner.llm_responses(tl.events) == [(1.0, "Paris is it."), (5.0, ""), (6.0, "stray")]


def _two_turn_timeline() -> tuple[list[tuple[str, float]], Any]:
    # turn a starts at monotonic 100.0, turn b at 110.0
    tl = runner.Timeline()
    tl.add("audio", 99.0, 99.04)  # before any turn: dropped
    tl.add("vad_stopped", 102.3)
    tl.add("transcript", 102.9, " What is the capital of France? ")
    tl.add("user_stopped", 103.0)
    tl.add("llm_start", 103.1)
    tl.add("llm_text", 103.2, "Paris.")
    tl.add("llm_end", 103.3)
    for k in range(5):  # 200 ms of contiguous bot audio
        tl.add("audio", 103.5 + 0.04 * k, 103.54 + 0.04 * k)
    tl.add("audio", 104.0, 104.04)
    tl.add("vad_stopped", 112.0)
    tl.add("transcript", 112.5, "And Germany?")
    tl.add("user_stopped", 112.6)
    tl.add("llm_start", 112.7)  # the answer starts in turn b...
    tl.add("llm_text", 112.8, "Berlin.")
    tl.add("llm_end", 112.9)
    tl.add("audio", 113.0, 113.04)
    return [("a", 100.0), ("b", 110.0)], tl


def test_turn_records_put_events_on_each_turns_clock() -> None:
    turns, tl = _two_turn_timeline()
    a, b = runner.turn_records(turns, tl, timed_out=[False, True])
    assert a["id"] == "a" and b["id"] == "b"
    assert a["transcripts"] == [[2.9, "What is the capital of France?"]]
    assert a["vad_stopped"] == [2.3] and a["user_stopped"] == [3.0]
    assert a["answers"] == ["Paris."]
    assert a["bot_audio"] == [[3.5, 3.7], [4.0, 4.04]]
    assert a["first_audio_t"] == 3.5 and a["timed_out"] is False
    assert b["transcripts"] == [[2.5, "And Germany?"]]
    assert b["answers"] == ["Berlin."] and b["user_stopped"] == [2.6]
    assert b["bot_audio"] == [[3.0, 3.04]] and b["first_audio_t"] == 3.0
    assert b["timed_out"] is True


def test_turn_records_without_an_answer() -> None:
    tl = runner.Timeline()
    tl.add("vad_stopped", 1.5)
    (rec,) = runner.turn_records([("only", 1.0)], tl)
    assert rec["first_audio_t"] is None and rec["answers"] == [] and rec["bot_audio"] == []
    assert rec["timed_out"] is False


def test_an_answer_is_over_once_llm_ended_and_the_bot_is_quiet() -> None:
    tl = runner.Timeline()
    assert not tl.answered(since=0.0, now=50.0)  # nothing yet
    tl.add("llm_start", 3.0)
    tl.add("audio", 3.5, 3.54)
    assert not tl.answered(since=0.0, now=10.0)  # the LLM is still running
    tl.add("llm_end", 4.0)
    tl.add("audio", 4.2, 6.0)  # plays until 6.0
    assert not tl.answered(since=0.0, now=6.5)  # silent for 0.5 s only
    assert tl.answered(since=0.0, now=7.0)
    assert not tl.answered(since=8.0, now=20.0)  # a later turn has had no answer
    tl.add("llm_start", 9.0)
    tl.add("llm_end", 9.5)
    assert not tl.answered(since=8.0, now=20.0)  # ... and no audio: not over
    tl.add("audio", 9.6, 10.0)
    assert tl.answered(since=8.0, now=11.0)


# ------------------------------------------------------------------------------------ product side


def test_requirement_and_venv_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLIVE_HOME", str(tmp_path))
    assert pipecat_peer.pipecat_requirement() == ("pipecat-ai[silero,whisper,openai,piper]==1.14.0")
    assert pipecat_peer.pipecat_venv_dir() == tmp_path / "peers" / "pipecat-1.14"
    assert pipecat_peer.runner_script() == RUNNER


def test_ensure_env_reuses_a_complete_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLIVE_HOME", str(tmp_path))
    venv = pipecat_peer.pipecat_venv_dir()
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / ".speclive-installed").write_text(pipecat_peer.pipecat_requirement() + "\n")

    def no_subprocess(*a: Any, **k: Any) -> None:
        raise AssertionError("a complete venv is not reinstalled")

    monkeypatch.setattr(pipecat_peer.subprocess, "run", no_subprocess)
    assert pipecat_peer.ensure_pipecat_env(log=lambda m: None) == venv / "bin" / "python"


def test_ensure_env_installs_when_the_marker_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECLIVE_HOME", str(tmp_path))
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], check: bool) -> None:
        calls.append(cmd)
        if "venv" in cmd:
            py = Path(cmd[-1]) / "bin" / "python"
            py.parent.mkdir(parents=True)
            py.write_text("")

    monkeypatch.setattr(pipecat_peer.subprocess, "run", fake_run)
    py = pipecat_peer.ensure_pipecat_env(log=lambda m: None)
    assert calls[0][1:3] == ["-m", "venv"]
    assert calls[1][0] == str(py) and calls[1][-1] == pipecat_peer.pipecat_requirement()
    marker = py.parent.parent / ".speclive-installed"
    assert marker.read_text().strip() == pipecat_peer.pipecat_requirement()


def test_llama_server_command_and_env() -> None:
    cmd = pipecat_peer.llama_server_command(Path("m/q.gguf"), 8123, threads=2)
    assert cmd[1:3] == ["-m", "llama_cpp.server"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert flags == {
        "--model": "m/q.gguf",
        "--host": "127.0.0.1",
        "--port": "8123",
        "--n_ctx": "4096",
        "--n_threads": "2",
    }
    env = pipecat_peer.peer_env(2, base={"LANG": "C"})
    assert env == {"LANG": "C", "OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}
    kept = pipecat_peer.peer_env(2, base={"OMP_NUM_THREADS": "8"})
    assert kept["OMP_NUM_THREADS"] == "8"


def _job(tmp_path: Path) -> dict[str, Any]:
    w1 = _wav(tmp_path / "q1.wav", 1.5)
    w2 = _wav(tmp_path / "q2.wav", 2.0)
    return pipecat_peer.build_job(
        [
            {
                "id": "c1",
                "turns": [
                    {"id": "t1", "wav": str(w1), "speech_end_s": 1.1},
                    {"id": "t2", "wav": w2, "duration_s": 2.0},
                ],
            },
            {"id": "c2", "turns": [w1]},
        ],
        llm_base_url="http://127.0.0.1:9/v1",
        llm_model="qwen",
        whisper_dir=tmp_path,
        piper_voice=tmp_path / "v.onnx",
        system_prompt="Be brief.",
        max_tokens=64,
    )


def test_build_job(tmp_path: Path) -> None:
    job = _job(tmp_path)
    c1, c2 = job["conversations"]
    assert c1["turns"][0] == {
        "id": "t1",
        "wav": str((tmp_path / "q1.wav").resolve()),
        "duration_s": 1.5,
        "speech_end_s": 1.1,
    }
    assert c1["turns"][1]["duration_s"] == 2.0 and "speech_end_s" not in c1["turns"][1]
    assert c2["turns"] == [{"id": "q1", "wav": str((tmp_path / "q1.wav").resolve()), "duration_s": 1.5}]
    assert job["system_prompt"] == "Be brief." and job["max_tokens"] == 64
    assert job["whisper_dir"] == str(tmp_path) and job["piper_voice"].endswith("v.onnx")
    assert job["answer_timeout_s"] == 60.0


@pytest.mark.parametrize(
    "convs, why",
    [
        ([], "no conversations"),
        ([{"id": "c", "turns": []}], "no turns"),
        ([{"id": "c", "turns": ["{w}", "{w}"]}], "duplicate turn"),
        ([{"id": "c", "turns": ["{w}"]}, {"id": "c", "turns": ["{w}"]}], "duplicate conversation"),
        ([{"id": "c", "turns": ["{missing}"]}], "no such WAV"),
        ([{"id": "c", "turns": ["{loud}"]}], "16 kHz mono"),
    ],
)
def test_build_job_rejects(tmp_path: Path, convs: list[dict[str, Any]], why: str) -> None:
    paths = {
        "w": str(_wav(tmp_path / "w.wav", 0.2)),
        "missing": str(tmp_path / "nope.wav"),
        "loud": str(_wav(tmp_path / "l.wav", 0.2, rate=44100)),
    }
    convs = [{**c, "turns": [t.format(**paths) for t in c["turns"]]} for c in convs]
    with pytest.raises(ConfigError, match=why):
        pipecat_peer.build_job(
            convs,
            llm_base_url="u",
            llm_model="m",
            whisper_dir="w",
            piper_voice="v",
            system_prompt="s",
            max_tokens=8,
        )


def test_parse_results_adds_latency_from_the_end_of_speech(tmp_path: Path) -> None:
    job = _job(tmp_path)
    out = {
        "conversations": [
            {"id": "c2", "turns": [{"id": "q1", "first_audio_t": None, "timed_out": True}]},
            {
                "id": "c1",
                "turns": [
                    {
                        "id": "t2",
                        "transcripts": [[2.41234567, "And?"]],
                        "answers": ["Berlin."],
                        "bot_audio": [[2.9, 3.5]],
                        "user_stopped": [2.6],
                        "vad_stopped": [2.3],
                        "first_audio_t": 2.9,
                    },
                    {"id": "t1", "first_audio_t": 1.8, "bot_audio": [[1.8, 2.2]]},
                ],
            },
        ],
        "settings": {},
    }
    recs = pipecat_peer.parse_results(out, job)
    assert [(r["conversation"], r["id"]) for r in recs] == [("c1", "t1"), ("c1", "t2"), ("c2", "q1")]
    t1, t2, q1 = recs
    assert t1["speech_end_s"] == 1.1 and t1["latency_s"] == pytest.approx(0.7)
    assert t1["transcripts"] == [] and t1["answers"] == [] and t1["timed_out"] is False
    assert t2["speech_end_s"] == 2.0 and t2["latency_s"] == pytest.approx(0.9)
    assert t2["transcripts"] == [[2.4123, "And?"]] and t2["answers"] == ["Berlin."]
    assert t2["user_stopped"] == [2.6] and t2["vad_stopped"] == [2.3]
    assert q1["first_audio_t"] is None and q1["latency_s"] is None and q1["timed_out"] is True


def test_parse_results_rejects_a_missing_turn(tmp_path: Path) -> None:
    job = _job(tmp_path)
    with pytest.raises(ConfigError, match="no turn c1/t1"):
        pipecat_peer.parse_results({"conversations": []}, job)


_FAKE_RUNNER = """
import json, sys
job = json.load(open(sys.argv[1]))
print("fake runner:", job["llm_model"], job["system_prompt"])
convs = [
    {"id": c["id"], "turns": [{"id": t["id"], "first_audio_t": t["duration_s"] + 0.5,
                               "bot_audio": [[t["duration_s"] + 0.5, t["duration_s"] + 1.0]]}
                              for t in c["turns"]]}
    for c in job["conversations"]
]
json.dump({"conversations": convs, "settings": {"fake": True}}, open(sys.argv[2], "w"))
"""


def test_run_pipecat_drives_server_and_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "runner.py"
    script.write_text(_FAKE_RUNNER)
    events: list[str] = []
    monkeypatch.setattr(pipecat_peer, "ensure_pipecat_env", lambda log: Path(sys.executable))
    monkeypatch.setattr(pipecat_peer, "runner_script", lambda: script)
    monkeypatch.setattr(
        pipecat_peer,
        "model_files",
        lambda *a: {"gguf": tmp_path / "q.gguf", "whisper_dir": tmp_path, "piper_voice": tmp_path / "v.onnx"},
    )
    monkeypatch.setattr(pipecat_peer.LlamaServer, "start", lambda self: events.append("start"))
    monkeypatch.setattr(pipecat_peer.LlamaServer, "stop", lambda self: events.append("stop"))
    wav = _wav(tmp_path / "q.wav", 1.0)
    lines: list[str] = []
    info: dict[str, Any] = {}
    recs = pipecat_peer.run_pipecat(
        [{"id": "c", "turns": [{"id": "t", "wav": wav, "speech_end_s": 0.8}]}],
        "Be brief.",
        max_tokens=16,
        log=lines.append,
        info=info,
    )
    assert events == ["start", "stop"]
    assert "fake runner: q Be brief." in lines
    (rec,) = recs
    assert rec["first_audio_t"] == 1.5 and rec["latency_s"] == pytest.approx(0.7)
    assert info["runner"] == {"settings": {"fake": True}}
    assert set(info["versions"]) >= {"pipecat-ai", "faster-whisper", "llama-cpp-python"}
    assert info["env"]["OMP_WAIT_POLICY"]


def test_run_pipecat_stops_the_server_when_the_runner_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "runner.py"
    script.write_text("import sys; print('boom'); sys.exit(3)")
    events: list[str] = []
    monkeypatch.setattr(pipecat_peer, "ensure_pipecat_env", lambda log: Path(sys.executable))
    monkeypatch.setattr(pipecat_peer, "runner_script", lambda: script)
    monkeypatch.setattr(
        pipecat_peer,
        "model_files",
        lambda *a: {"gguf": tmp_path / "q.gguf", "whisper_dir": tmp_path, "piper_voice": tmp_path / "v.onnx"},
    )
    monkeypatch.setattr(pipecat_peer.LlamaServer, "start", lambda self: events.append("start"))
    monkeypatch.setattr(pipecat_peer.LlamaServer, "stop", lambda self: events.append("stop"))
    with pytest.raises(pipecat_peer.EngineUnavailableError, match="exit 3"):
        pipecat_peer.run_pipecat(
            [{"id": "c", "turns": [_wav(tmp_path / "q.wav", 0.2)]}], "s", log=lambda m: None
        )
    assert events == ["start", "stop"]
