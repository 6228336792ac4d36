"""The TTS protocol sessions use: text in, mono float32 audio out, timed.

A voice chat speaks sentence by sentence, so the unit of synthesis is one sentence and what
matters is how long it takes (it adds to audio latency unless it was pre-synthesized).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass
class Audio:
    samples: np.ndarray  # float32, mono, in [-1, 1]
    sample_rate: int
    #: wall seconds the synthesis took
    synth_s: float

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate if self.sample_rate else 0.0


class TTS(Protocol):
    name: str
    sample_rate: int

    def synthesize(self, text: str) -> Audio: ...


def timed(fn, text: str, sample_rate: int) -> Audio:
    """Run ``fn(text) -> samples`` and wrap the result with its wall time."""
    t0 = time.perf_counter()
    samples = np.asarray(fn(text), dtype=np.float32)
    return Audio(samples, sample_rate, time.perf_counter() - t0)


def write_wav(path, audio: Audio) -> None:
    """16-bit PCM WAV of ``audio``."""
    import wave

    pcm = (np.clip(audio.samples, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(audio.sample_rate)
        w.writeframes(pcm.tobytes())
