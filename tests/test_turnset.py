"""The end-of-turn turn set (``speclive_bench.turnset``), built with fake voices: a tone as long
as the text, padded with silence the assembly must trim; the ground truth is checked against
where the written audio is loud and quiet."""

from __future__ import annotations

import json
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from speclive_bench import turnset as ts

FAKE_SR = 22_050
PAD_S = 0.1


def tone_voice(freq: float, calls: list[tuple[str, float]] | None = None) -> ts.Synth:
    """A fake voice: ``PAD_S`` of silence, a tone of 0.04 s per character at rate 1, silence."""

    def synth(text: str, rate: float) -> tuple[np.ndarray, int]:
        if calls is not None:
            calls.append((text, rate))
        n = int(0.04 * len(text) / rate * FAKE_SR)
        t = np.arange(n) / FAKE_SR
        pad = np.zeros(int(PAD_S * FAKE_SR), np.float32)
        return np.concatenate([pad, 0.3 * np.sin(2 * np.pi * freq * t), pad]).astype(np.float32), FAKE_SR

    return synth


def fake_voices(calls: list[tuple[str, float]] | None = None) -> dict[str, ts.Synth]:
    return {name: tone_voice(f, calls) for name, f in zip(ts.VOICES, (220.0, 330.0, 440.0), strict=True)}


def read(path: str | Path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16_000, 1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0


def frame_rms(audio: np.ndarray, frame: int = 160) -> np.ndarray:
    k = len(audio) // frame
    return np.sqrt(np.mean(audio[: k * frame].reshape(k, frame) ** 2, axis=1))


def quiet_runs(audio: np.ndarray, a: float, b: float, floor: float = 1e-3) -> list[tuple[float, float]]:
    """Runs of 10 ms frames under ``floor`` RMS within ``[a, b]`` s, as (start, end) seconds."""
    env = frame_rms(audio)
    lo, hi = round(a * 100), round(b * 100)
    out, start = [], None
    for i in range(lo, hi + 1):
        q = i < hi and env[i] < floor
        if q and start is None:
            start = i
        elif not q and start is not None:
            out.append((start / 100, i / 100))
            start = None
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("turnset")
    return root, ts.build_turnset(root, log=lambda _m: None, voices=fake_voices(), progress=False)


def all_turns(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for c in manifest["conversations"] for t in c["turns"]]


def test_ground_truth_matches_the_audio(built: tuple[Path, dict[str, Any]]) -> None:
    root, manifest = built
    checked_clean = checked_noisy = 0
    for t in all_turns(manifest):
        audio = read(root / t["wav"])
        assert t["duration_s"] == pytest.approx(len(audio) / 16_000, abs=1e-3)
        start, end = t["speech_start_t"], t["speech_end_t"]
        assert start == pytest.approx(ts.LEAD_S, abs=0.021)  # the voice's own padding is trimmed
        assert t["duration_s"] - end == pytest.approx(ts.TAIL_S, abs=1e-3)
        env = frame_rms(audio)
        spans = t["piece_spans"]
        assert len(spans) == len(t["pieces"]) and spans[0][0] == start and spans[-1][1] == end
        if t["noise_snr_db"] is None:
            checked_clean += 1
            # silent exactly outside the speech, loud everywhere inside each piece
            assert np.abs(audio[: int((start - 0.02) * 16_000)]).max() == 0
            assert np.abs(audio[int((end + 0.02) * 16_000) :]).max() == 0
            for s, e in spans:
                assert env[round(s * 100) + 2 : round(e * 100) - 2].min() > 0.05, (t["id"], s, e)
            # every silence of 0.25 s or more inside the turn is a recorded pause, and back
            long_quiet = [(s, e) for s, e in quiet_runs(audio, start, end) if e - s >= 0.25]
            assert len(long_quiet) == len(t["pauses"]), t["id"]
            for (qs, qe), (ps, pe) in zip(long_quiet, t["pauses"], strict=True):
                assert qs == pytest.approx(ps, abs=0.011) and qe == pytest.approx(pe, abs=0.011)
            assert (t["kind"] == "paused") == bool(t["pauses"])
        else:
            checked_noisy += 1
            # the noise covers the silences too, at the SNR the manifest says
            noise = np.concatenate([audio[: int(start * 16_000)], audio[int((end + 0.05) * 16_000) :]])
            p_noise = float(np.mean(noise**2))
            assert env[: round(start * 100)].min() > 0
            mixed = np.concatenate([audio[round(s * 16_000) : round(e * 16_000)] for s, e in spans])
            snr = 10 * np.log10((float(np.mean(mixed**2)) - p_noise) / p_noise)
            assert snr == pytest.approx(t["noise_snr_db"], abs=1.0), t["id"]
    assert checked_clean >= 60 and checked_noisy >= 15


def test_the_set_has_the_planned_shape(built: tuple[Path, dict[str, Any]]) -> None:
    _, manifest = built
    turns = all_turns(manifest)
    assert manifest["version"] == 1 and manifest["sample_rate"] == 16_000
    assert len(turns) >= 84
    assert {v["name"] for v in manifest["voices"]} == {"piper", "espeak", "flite"}
    assert all(2 <= len(c["turns"]) <= 5 for c in manifest["conversations"])
    ids = [t["id"] for t in turns]
    assert len(set(ids)) == len(ids)
    for c in manifest["conversations"]:
        assert [t["index"] for t in c["turns"]] == list(range(len(c["turns"])))
        assert {t["conversation"] for t in c["turns"]} == {c["id"]}
    paused = [t for t in turns if t["kind"] == "paused"]
    assert len(paused) >= len(turns) / 3
    marked = [p for t in paused for p in t["pauses"]]
    assert all(0.3 - 1e-3 <= e - s <= 1.5 + 1e-3 for s, e in marked)
    assert max(e - s for s, e in marked) > 1.2 and min(e - s for s, e in marked) < 0.5
    # the hard cases: a complete sentence before the pause
    hard = [t for t in paused if t["pieces"][0].endswith((".", "?", "!"))]
    assert len(hard) >= 6
    # every voice speaks both kinds, at several rates, clean and noisy
    for v in ts.VOICES:
        mine = [t for t in turns if t["voice"] == v]
        assert {t["kind"] for t in mine} == {"complete", "paused"}
        assert len({t["rate"] for t in mine}) >= 3
        assert any(t["noise_snr_db"] for t in mine) and any(t["noise_snr_db"] is None for t in mine)
    noisy = [t for t in turns if t["noise_snr_db"] is not None]
    assert 0.2 <= len(noisy) / len(turns) <= 0.3
    assert all(10 <= t["noise_snr_db"] <= 25 for t in noisy)
    assert {t["noise"] for t in noisy} == {"white", "pink", "babble"}
    # the text is the pieces, without pause marks
    for t in turns:
        assert "|" not in t["text"] and " ".join(t["pieces"]) == t["text"]


def test_splits_are_balanced_and_deterministic(built: tuple[Path, dict[str, Any]]) -> None:
    root, manifest = built
    convs = manifest["conversations"]
    assert {c["split"] for c in convs} == {"dev", "test"}
    n_dev = sum(c["split"] == "dev" for c in convs)
    assert abs(n_dev - (len(convs) - n_dev)) <= 2
    dev, test = ts.turns(manifest, "dev"), ts.turns(manifest, "test")
    assert len(dev) + len(test) == len(ts.turns(manifest))
    assert abs(len(dev) - len(test)) <= 0.15 * len(ts.turns(manifest))
    for part in (dev, test):
        assert {t["kind"] for t in part} == {"complete", "paused"}
        assert len({t["voice"] for t in part}) == 3
    assert ts.script() == ts.script()
    assert [(c["id"], c["split"]) for c in ts.script()] == [(c["id"], c["split"]) for c in convs]
    # turns() gives absolute paths to the WAVs
    for t in dev:
        assert Path(t["path"]).is_absolute() and Path(t["path"]).is_file() and t["split"] == "dev"
    moved = {k: v for k, v in manifest.items() if k != "root"}
    assert ts.turns(moved, root=root)[0]["path"] == ts.turns(manifest)[0]["path"]


def test_rates_reach_the_voices(tmp_path: Path) -> None:
    calls: list[tuple[str, float]] = []
    manifest = ts.build_turnset(tmp_path, log=lambda _m: None, voices=fake_voices(calls), progress=False)
    assert {r for _, r in calls} == set(ts.RATES)
    # a faster rate gives shorter speech for the same text
    by_rate = {}
    for t in all_turns(manifest):
        if t["noise_snr_db"] is None and not t["pauses"]:
            by_rate.setdefault(t["rate"], []).append(
                (t["speech_end_t"] - t["speech_start_t"]) / len(t["text"])
            )
    assert np.mean(by_rate[max(by_rate)]) < np.mean(by_rate[min(by_rate)])


def test_cache_is_reused_and_rebuilt_when_stale(tmp_path: Path) -> None:
    first = ts.build_turnset(tmp_path, log=lambda _m: None, voices=fake_voices(), progress=False)

    def broken(text: str, rate: float) -> tuple[np.ndarray, int]:
        raise AssertionError("resynthesized a cached set")

    same = ts.build_turnset(tmp_path, log=lambda _m: None, voices=dict.fromkeys(ts.VOICES, broken))
    assert same == first
    assert ts.load_turnset(tmp_path, voices=dict.fromkeys(ts.VOICES, broken)) == first
    stored = json.loads((tmp_path / "manifest.json").read_text())
    assert "root" not in stored and stored["conversations"] == first["conversations"]
    # a missing WAV, another version or another set of voices: built again
    (tmp_path / first["conversations"][3]["turns"][1]["wav"]).unlink()
    calls: list[tuple[str, float]] = []
    again = ts.build_turnset(tmp_path, log=lambda _m: None, voices=fake_voices(calls), progress=False)
    assert calls and again["conversations"] == first["conversations"]
    stored["version"] = 0
    (tmp_path / "manifest.json").write_text(json.dumps(stored))
    with pytest.raises(AssertionError, match="resynthesized"):
        ts.build_turnset(tmp_path, log=lambda _m: None, voices=dict.fromkeys(ts.VOICES, broken))


def test_silence_a_voice_puts_inside_a_piece_is_a_pause() -> None:
    def gappy(text: str, rate: float) -> tuple[np.ndarray, int]:
        t = np.arange(int(0.5 * FAKE_SR)) / FAKE_SR
        s = (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
        return np.concatenate([s, np.zeros(int(0.4 * FAKE_SR), np.float32), s]), FAKE_SR

    turn = {"id": "x", "pieces": ["Okay, good to know."], "gaps": [0.0], "rate": 1.0, "noise": None}
    audio, truth = ts.assemble(turn, gappy, 0)
    assert truth["kind"] == "paused" and len(truth["pauses"]) == 1
    s, e = truth["pauses"][0]
    assert s == pytest.approx(ts.LEAD_S + 0.5, abs=0.021) and e - s == pytest.approx(0.4, abs=0.041)
    assert truth["speech_end_t"] == pytest.approx(ts.LEAD_S + 1.4, abs=0.021)
    assert np.abs(audio[int((s + 0.02) * 16_000) : int((e - 0.02) * 16_000)]).max() == 0


def test_noises_have_their_character() -> None:
    rng = np.random.default_rng(0)
    n = 16_000 * 4
    spectra = {}
    for kind in ts.NOISE_KINDS:
        x = ts.make_noise(kind, n, rng)
        assert x.dtype == np.float32 and np.sqrt(np.mean(x**2)) == pytest.approx(1.0, rel=1e-3)
        spec = np.abs(np.fft.rfft(x)) ** 2
        f = np.fft.rfftfreq(n, 1 / 16_000)
        spectra[kind] = spec[(f > 100) & (f < 500)].mean() / spec[(f > 4000) & (f < 6000)].mean()
    assert spectra["white"] == pytest.approx(1.0, rel=0.2)
    assert spectra["pink"] > 5 and spectra["babble"] > spectra["pink"]
    # babble comes and goes (syllables), white noise does not
    env = frame_rms(ts.make_noise("babble", n, rng), 1600)
    assert env.std() / env.mean() > 0.15
    env = frame_rms(ts.make_noise("white", n, rng), 1600)
    assert env.std() / env.mean() < 0.05
    with pytest.raises(ValueError, match="unknown noise"):
        ts.make_noise("brown", 10, rng)


def test_default_root_is_under_speclive_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLIVE_HOME", str(tmp_path))
    assert ts.default_root() == tmp_path / "turnset-v1"
