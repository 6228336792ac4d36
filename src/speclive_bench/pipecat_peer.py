"""Pipecat 1.14 as the peer voice pipeline of the turn-taking benchmark (``speclive bench turns``).

The benchmark plays the same spoken user turns into speclive and into Pipecat and compares the
time from the true end of the user's speech to the first answer audio. This module is the
product side of the Pipecat half; the pipeline itself is ``benchmarks/pipecat_peer/runner.py``,
a script that runs inside a separate venv (Pipecat's pins are not speclive's):

- ``ensure_pipecat_env`` creates ``<speclive home>/peers/pipecat-1.14`` on demand
  (``python -m venv`` + ``pip install pipecat-ai[silero,whisper,openai,piper]==1.14.0``) and
  returns its interpreter;
- ``run_pipecat`` starts llama-cpp-python's OpenAI server (this venv's ``llama_cpp.server``) on
  a free 127.0.0.1 port over the same GGUF speclive chats with, writes the job file (the
  Whisper CTranslate2 folder and the Piper voice speclive uses, the system prompt), runs the
  runner with the venv's interpreter and returns its per-turn records; the server is stopped
  in a ``finally``.

Per-turn record (all times in seconds on the turn WAV's clock, 0 = its first sample fed)::

    {"conversation", "id", "duration_s", "speech_end_s", "transcripts": [[t, text], ...],
     "answers": [text, ...], "bot_audio": [[start, end], ...], "user_stopped": [t, ...],
     "vad_stopped": [t, ...], "first_audio_t": t or None, "timed_out": bool,
     "latency_s": first_audio_t - speech_end_s or None}

(``speech_end_s``: the turn's own, else its WAV's duration.)

Only the standard library and speclive are imported here; Pipecat is never imported into
speclive's environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from speclive.errors import ConfigError, EngineUnavailableError
from speclive.models.install import speclive_home
from speclive.models.resolve import resolve
from speclive_bench.launch import free_port

PIPECAT_VERSION = "1.14.0"
#: the extras of the pipecat-ai 1.14.0 wheel (its METADATA ``Provides-Extra``) the runner needs:
#: ``silero`` (VAD; its ONNX ships in the wheel, no extra requirement), ``whisper``
#: (faster-whisper), ``openai`` (OpenAILLMService), ``piper`` (piper-tts). Smart Turn v3 runs on
#: onnxruntime and numpy, core requirements; the wheel has no ``local-smart-turn-v3`` extra and
#: its ``local-smart-turn`` extra (torch, transformers, coremltools) is for v2 and CoreML only.
PIPECAT_EXTRAS: tuple[str, ...] = ("silero", "whisper", "openai", "piper")
#: the distributions whose versions go into the result header
PEER_DISTS: tuple[str, ...] = (
    "pipecat-ai",
    "faster-whisper",
    "ctranslate2",
    "piper-tts",
    "onnxruntime",
    "openai",
)
#: the models speclive's live pipeline uses by default (``speclive.live.build.LiveModelsConfig``)
DEFAULT_LLM = "qwen2.5-coder-0.5b-instruct"
DEFAULT_ASR = "whisper-base"
DEFAULT_VOICE = "piper-joe-medium"
SAMPLE_RATE = 16000
_MARKER = ".speclive-installed"

Log = Callable[[str], None]


# ------------------------------------------------------------------------------------ venv


def pipecat_requirement() -> str:
    """The pip requirement of the peer venv: ``pipecat-ai[extras]==1.14.0``."""
    return f"pipecat-ai[{','.join(PIPECAT_EXTRAS)}]=={PIPECAT_VERSION}"


def pipecat_venv_dir() -> Path:
    """Where the peer venv lives: ``<speclive home>/peers/pipecat-<major.minor>``."""
    major_minor = ".".join(PIPECAT_VERSION.split(".")[:2])
    return speclive_home() / "peers" / f"pipecat-{major_minor}"


def venv_python(venv: Path) -> Path:
    """The interpreter of a venv."""
    return venv / "bin" / "python"


def runner_script() -> Path:
    """``benchmarks/pipecat_peer/runner.py`` of this checkout (the benchmark runs from one)."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "pipecat_peer" / "runner.py"
    if not script.is_file():
        raise EngineUnavailableError(
            f"no Pipecat runner at {script}: the turn benchmark runs from a speclive checkout"
        )
    return script


def ensure_pipecat_env(log: Log = print) -> Path:
    """Create and fill the Pipecat venv if it is missing or incomplete; return its python.

    The venv counts as complete once a marker naming the requirement was written after a
    successful ``pip install``, so an interrupted install is redone on the next call.
    """
    venv = pipecat_venv_dir()
    py = venv_python(venv)
    marker = venv / _MARKER
    req = pipecat_requirement()
    if py.is_file() and marker.is_file() and marker.read_text().strip() == req:
        return py
    if not py.is_file():
        log(f"pipecat peer: creating the venv {venv}")
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    log(f"pipecat peer: pip install {req} (a few minutes the first time)")
    subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q", req], check=True)
    marker.write_text(req + "\n")
    return py


def peer_versions(python: Path) -> dict[str, str | None]:
    """Versions of the peer's distributions (in its venv) and of llama-cpp-python (here)."""
    code = (
        "import json, sys\nfrom importlib import metadata\nout = {}\n"
        "for d in sys.argv[1:]:\n"
        "    try:\n        out[d] = metadata.version(d)\n"
        "    except metadata.PackageNotFoundError:\n        out[d] = None\n"
        "print(json.dumps(out))"
    )
    res = subprocess.run([str(python), "-c", code, *PEER_DISTS], capture_output=True, text=True, check=True)
    versions: dict[str, str | None] = json.loads(res.stdout)
    versions["llama-cpp-python"] = _local_version("llama_cpp_python")
    return versions


def _local_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# ------------------------------------------------------------------------------------ models


def model_files(
    llm: str = DEFAULT_LLM, asr: str = DEFAULT_ASR, voice: str = DEFAULT_VOICE
) -> dict[str, Path]:
    """The local files of the models speclive uses: the GGUF, the Whisper CT2 folder, the voice."""

    llm_ref = resolve(llm)
    if llm_ref.gguf is None:
        raise ConfigError(f"{llm!r} is not a GGUF model: llama-cpp-python's server needs one")
    asr_ref = resolve(asr)
    if asr_ref.path is None or not (asr_ref.path / "model.bin").is_file():
        raise ConfigError(f"{asr!r} is not a local CTranslate2 Whisper folder")
    onnx = Path(voice).expanduser()
    if onnx.suffix != ".onnx":
        voice_ref = resolve(voice)
        found = sorted(voice_ref.path.glob("*.onnx")) if voice_ref.path else []
        if len(found) != 1:
            raise ConfigError(f"no single Piper .onnx voice in {voice_ref.path}")
        onnx = found[0]
    if not onnx.is_file() or not onnx.with_name(onnx.name + ".json").is_file():
        raise ConfigError(f"Piper voice {onnx} or its .onnx.json is missing")
    return {"gguf": llm_ref.gguf, "whisper_dir": asr_ref.path, "piper_voice": onnx}


# ------------------------------------------------------------------------------------ job


def wav_duration(path: str | Path) -> float:
    """Duration in seconds of a 16 kHz mono 16-bit WAV (anything else: ConfigError)."""
    with wave.open(str(path), "rb") as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (SAMPLE_RATE, 1, 2):
            raise ConfigError(
                f"{path}: need 16 kHz mono int16, got {w.getframerate()} Hz, "
                f"{w.getnchannels()} channel(s), {8 * w.getsampwidth()}-bit"
            )
        return w.getnframes() / SAMPLE_RATE


def build_job(
    conversations: Sequence[Mapping[str, Any]],
    *,
    llm_base_url: str,
    llm_model: str,
    whisper_dir: str | Path,
    piper_voice: str | Path,
    system_prompt: str,
    max_tokens: int,
    answer_timeout_s: float = 60.0,
) -> dict[str, Any]:
    """The runner's job file: conversations with absolute WAV paths and durations, and settings.

    A conversation is ``{"id", "turns": [{"id", "wav", "duration_s" (optional),
    "speech_end_s" (optional: the true end of speech on the WAV's clock)}]}``; a turn may also
    be a bare WAV path (its id is then the file stem). Ids must be unique.
    """
    if not conversations:
        raise ConfigError("no conversations to run")
    if max_tokens < 1:
        raise ConfigError(f"max_tokens must be at least 1, got {max_tokens}")
    convs: list[dict[str, Any]] = []
    conv_ids: set[str] = set()
    for ci, conv in enumerate(conversations):
        cid = str(conv.get("id", f"c{ci}"))
        if cid in conv_ids:
            raise ConfigError(f"duplicate conversation id {cid!r}")
        conv_ids.add(cid)
        turns: list[dict[str, Any]] = []
        turn_ids: set[str] = set()
        for ti, turn in enumerate(conv.get("turns") or ()):
            if isinstance(turn, (str, Path)):
                turn = {"id": Path(turn).stem, "wav": turn}
            wav = Path(turn["wav"]).expanduser().resolve()
            if not wav.is_file():
                raise ConfigError(f"no such WAV: {wav}")
            tid = str(turn.get("id", f"t{ti}"))
            if tid in turn_ids:
                raise ConfigError(f"duplicate turn id {tid!r} in conversation {cid!r}")
            turn_ids.add(tid)
            dur = turn.get("duration_s")
            rec = {
                "id": tid,
                "wav": str(wav),
                "duration_s": float(dur) if dur is not None else wav_duration(wav),
            }
            if turn.get("speech_end_s") is not None:
                rec["speech_end_s"] = float(turn["speech_end_s"])
            turns.append(rec)
        if not turns:
            raise ConfigError(f"conversation {cid!r} has no turns")
        convs.append({"id": cid, "turns": turns})
    return {
        "conversations": convs,
        "llm_base_url": llm_base_url,
        "llm_model": llm_model,
        "whisper_dir": str(whisper_dir),
        "piper_voice": str(piper_voice),
        "system_prompt": system_prompt,
        "max_tokens": int(max_tokens),
        "answer_timeout_s": float(answer_timeout_s),
    }


def _times(values: Any) -> list[float]:
    return [round(float(v), 4) for v in values or ()]


def parse_results(data: Mapping[str, Any], job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The runner's output as per-turn records in job order, checked against the job.

    Adds ``conversation``, ``duration_s`` and ``speech_end_s`` (the turn's, else its
    duration) from the job and ``latency_s``, the time from the end of speech to the first
    bot audio (None when the bot did not answer; negative when it spoke first).
    A turn the runner did not report (it failed) raises ConfigError.
    """
    by_key: dict[tuple[str, str], Mapping[str, Any]] = {}
    for conv in data.get("conversations") or ():
        for rec in conv.get("turns") or ():
            by_key[(str(conv.get("id")), str(rec.get("id")))] = rec
    out: list[dict[str, Any]] = []
    for conv in job["conversations"]:
        for turn in conv["turns"]:
            rec = by_key.get((conv["id"], turn["id"]))
            if rec is None:
                raise ConfigError(f"the Pipecat runner reported no turn {conv['id']}/{turn['id']}")
            first = rec.get("first_audio_t")
            first = None if first is None else round(float(first), 4)
            speech_end = float(turn.get("speech_end_s", turn["duration_s"]))
            out.append(
                {
                    "conversation": conv["id"],
                    "id": turn["id"],
                    "duration_s": turn["duration_s"],
                    "speech_end_s": speech_end,
                    "transcripts": [[round(float(t), 4), str(x)] for t, x in rec.get("transcripts") or ()],
                    "answers": [str(a) for a in rec.get("answers") or ()],
                    "bot_audio": [
                        [round(float(a), 4), round(float(b), 4)] for a, b in rec.get("bot_audio") or ()
                    ],
                    "user_stopped": _times(rec.get("user_stopped")),
                    "vad_stopped": _times(rec.get("vad_stopped")),
                    "first_audio_t": first,
                    "latency_s": None if first is None else round(first - speech_end, 4),
                    "timed_out": bool(rec.get("timed_out", False)),
                }
            )
    return out


# ------------------------------------------------------------------------------------ server


def llama_server_command(gguf: Path, port: int, threads: int = 2, n_ctx: int = 4096) -> list[str]:
    """llama-cpp-python's OpenAI-compatible server over ``gguf`` on 127.0.0.1:``port``."""
    return [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(threads),
    ]


def peer_env(threads: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the peer's processes: ``base`` (default: this one's) plus defaults.

    CTranslate2 (faster-whisper) runs 4 OpenMP threads unless told, and OpenMP threads spin
    while they wait: on a small shared machine both make a transcription several times slower.
    Unless the caller set them, ``OMP_NUM_THREADS`` is the LLM server's thread count and
    ``OMP_WAIT_POLICY`` is ``PASSIVE`` (what speclive's tests set for the same reason).
    """
    env = dict(os.environ if base is None else base)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


class LlamaServer:
    """One ``python -m llama_cpp.server`` process on 127.0.0.1 (a context manager)."""

    def __init__(self, gguf: Path, port: int | None = None, threads: int = 2, log_file: Path | None = None):
        self.gguf = Path(gguf)
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.threads = threads
        self.cmd = llama_server_command(self.gguf, self.port, threads=threads)
        self.log_file = log_file
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the server and wait until ``/v1/models`` answers."""
        out = open(self.log_file, "wb") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=peer_env(self.threads),
            )
        finally:
            if self.log_file:
                out.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineUnavailableError(
                    f"llama_cpp.server exited with {self.proc.returncode}"
                    + (f"; see {self.log_file}" if self.log_file else "")
                )
            try:
                with urllib.request.urlopen(self.base_url + "/models", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        self.stop()
        raise EngineUnavailableError(f"llama_cpp.server not ready after {timeout_s:.0f} s")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------------------ run


def run_pipecat(
    conversations: Sequence[Mapping[str, Any]],
    system_prompt: str,
    max_tokens: int = 128,
    log: Log = print,
    *,
    llm: str = DEFAULT_LLM,
    asr: str = DEFAULT_ASR,
    voice: str = DEFAULT_VOICE,
    threads: int = 2,
    answer_timeout_s: float = 60.0,
    timeout_s: float | None = None,
    info: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run every conversation through Pipecat in real time and return the per-turn records.

    ``conversations``: ``[{"id", "turns": [{"id", "wav", "duration_s"}]}]`` (16 kHz mono
    int16 WAVs). Each conversation runs in a fresh pipeline, its turns one after the other in
    the same context. ``info``, when given, receives the peer's versions and settings for the
    result header. ``timeout_s`` bounds the whole runner (default: the audio, plus
    ``answer_timeout_s`` a turn, plus 5 minutes of start-up).
    """
    python = ensure_pipecat_env(log)
    script = runner_script()
    files = model_files(llm, asr, voice)
    with tempfile.TemporaryDirectory(prefix="speclive-pipecat-") as tmp:
        tmpdir = Path(tmp)
        server = LlamaServer(files["gguf"], threads=threads, log_file=tmpdir / "llama-server.log")
        job = build_job(
            conversations,
            llm_base_url=server.base_url,
            llm_model=files["gguf"].stem,
            whisper_dir=files["whisper_dir"],
            piper_voice=files["piper_voice"],
            system_prompt=system_prompt,
            max_tokens=max_tokens,
            answer_timeout_s=answer_timeout_s,
        )
        job_path, out_path = tmpdir / "job.json", tmpdir / "out.json"
        job_path.write_text(json.dumps(job, indent=1))
        if timeout_s is None:
            turns = [t for c in job["conversations"] for t in c["turns"]]
            timeout_s = 300.0 + sum(t["duration_s"] + answer_timeout_s for t in turns)
        if info is not None:
            env = peer_env(threads)
            info.update(
                {
                    "versions": peer_versions(python),
                    "llm_server": f"llama_cpp.server n_ctx=4096 n_threads={threads}",
                    "models": {k: str(v) for k, v in files.items()},
                    "env": {k: env[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")},
                }
            )
        log(f"pipecat peer: llama_cpp.server on {server.base_url} ({files['gguf'].name})")
        try:
            server.start()
            env = dict(peer_env(threads), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
            cmd = [str(python), str(script), str(job_path), str(out_path)]
            rc = _run_logged(cmd, env, timeout_s, log)
            if rc != 0 or not out_path.is_file():
                tail = _tail(tmpdir / "llama-server.log")
                raise EngineUnavailableError(
                    f"the Pipecat runner failed (exit {rc})"
                    + (f"; llama server log:\n{tail}" if tail else "")
                )
            data = json.loads(out_path.read_text())
        finally:
            server.stop()
        if info is not None:
            info["runner"] = {k: v for k, v in data.items() if k != "conversations"}
        return parse_results(data, job)


def _run_logged(cmd: list[str], env: Mapping[str, str], timeout_s: float, log: Log) -> int:
    """Run ``cmd``, passing each output line to ``log``; killed after ``timeout_s`` or when
    interrupted. Its exit status."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(env))
    watchdog = threading.Timer(timeout_s, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log(line.rstrip("\n"))
        return proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def remove_pipecat_env() -> None:
    """Delete the peer venv (the next ``ensure_pipecat_env`` recreates it)."""
    shutil.rmtree(pipecat_venv_dir(), ignore_errors=True)
