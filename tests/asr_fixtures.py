"""Shared ASR test material: whisper-tiny.en (bundle) and Piper-synthesized clips with known text."""

from __future__ import annotations

import functools

import numpy as np

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Please write a short story about a robot who learns to paint.",
)


@functools.cache
def tiny():
    from speclive.asr.whisper import load_whisper

    return load_whisper("whisper-tiny.en")


@functools.cache
def piper_clips() -> tuple[tuple[str, np.ndarray, int], ...]:
    """(text, samples at the voice's 22.05 kHz, rate) per sentence. The voice's random variation
    is off, so every test process hears the same clips (with it, Whisper's output on them moved
    between near-tie alternatives from run to run)."""
    from speclive.tts.piper import PiperTTS

    tts = PiperTTS("piper-joe-medium", varied=False)
    out = []
    for s in SENTENCES:
        a = tts.synthesize(s)
        out.append((s, a.samples, a.sample_rate))
    return tuple(out)


@functools.cache
def clips_16k() -> tuple[tuple[str, np.ndarray], ...]:
    from speclive.asr.audio import to_mono_16k

    return tuple((t, to_mono_16k(a, sr)) for t, a, sr in piper_clips())
