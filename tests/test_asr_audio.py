"""Bad and unusual audio input: clear errors or correct handling."""

from __future__ import annotations

import re
import wave

import numpy as np
import pytest
from asr_fixtures import clips_16k, piper_clips, tiny

from speclive.asr.audio import SAMPLE_RATE, AudioError, load_audio, split_segments
from speclive.asr.transcribe import TranscribeConfig, Transcriber


def _wav(path, samples: np.ndarray, rate: int, channels: int = 1) -> None:
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


@pytest.fixture(scope="module")
def ar():
    return Transcriber(TranscribeConfig(model="whisper-tiny.en", method="ar"), target=tiny())


def test_non_audio_and_missing_files(tmp_path):
    txt = tmp_path / "notes.wav"
    txt.write_text("this is not audio at all\n" * 10)
    with pytest.raises(AudioError, match="cannot read"):
        load_audio(txt)
    with pytest.raises(AudioError, match="no such"):
        load_audio(tmp_path / "missing.wav")
    with pytest.raises(AudioError, match="folder"):
        load_audio(tmp_path)


def test_truncated_wav(tmp_path):
    _, samples, rate = piper_clips()[0]
    full = tmp_path / "full.wav"
    _wav(full, samples, rate)
    data = full.read_bytes()
    head = tmp_path / "head.wav"
    head.write_bytes(data[:30])  # cut inside the header
    with pytest.raises(AudioError):
        load_audio(head)
    body = tmp_path / "body.wav"
    body.write_bytes(data[: len(data) // 2])  # cut inside the samples: what is there is read
    got = load_audio(body)
    want = len(samples) / rate / 2
    assert abs(len(got) / SAMPLE_RATE - want) < 0.05


def test_resampling_and_stereo(tmp_path, ar):
    text, samples, rate = piper_clips()[0]
    assert rate != SAMPLE_RATE
    mono = tmp_path / "mono.wav"
    _wav(mono, samples, rate)
    a = load_audio(mono)
    assert abs(len(a) / SAMPLE_RATE - len(samples) / rate) < 0.01
    stereo = tmp_path / "stereo.wav"
    _wav(stereo, np.stack([samples, samples * 0.5], axis=1).reshape(-1), rate, channels=2)
    b = load_audio(stereo)
    assert b.ndim == 1 and abs(len(b) - len(a)) <= 1
    n = min(len(a), len(b))
    # the mix-down is the channels' mean: 0.75 of the mono signal, to int16 rounding
    assert np.max(np.abs(b[:n] - 0.75 * a[:n])) < 1e-3
    # Whisper's words survive the resampling (its casing may flip with the level: a near-tie)
    ref = _words(ar.transcribe(clips_16k()[0][1]).text)
    assert ref and _words(ar.transcribe(a).text) == ref
    assert _words(ar.transcribe(b).text) == ref


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def test_empty_and_silent_audio(tmp_path, ar):
    empty = tmp_path / "empty.wav"
    _wav(empty, np.zeros(0, dtype=np.float32), SAMPLE_RATE)
    e = load_audio(empty)
    assert e.size == 0
    r = ar.transcribe(e)
    assert r.text == "" and r.segments == []
    r = ar.transcribe(np.zeros(SAMPLE_RATE * 3, dtype=np.float32))
    assert r.text == "" and r.stats.target_forwards == 0


def test_long_audio_is_segmented(ar):
    _, a = clips_16k()[0]
    gap = np.zeros(SAMPLE_RATE * 4, dtype=np.float32)
    long = np.concatenate([a, gap] * 7)  # ~50 s: more than one 30 s window
    segs = split_segments(long)
    assert len(segs) == 2 and all(s.end - s.start <= 30 * SAMPLE_RATE for s in segs)
    assert segs[0].end == segs[1].start and segs[-1].end == len(long)
    r = ar.transcribe(long)
    assert len(r.segments) == 2
    assert r.text.lower().count("fox") >= 6
    assert r.segments[1].start == pytest.approx(segs[1].start / SAMPLE_RATE)
