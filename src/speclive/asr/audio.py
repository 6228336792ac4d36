"""Audio input for ASR: read a file into 16 kHz mono float32, and cut long audio into segments.

Whatever the file holds (any sample rate, stereo, 8/16/24/32-bit PCM or float) comes out as
mono 16 kHz in [-1, 1]. Files that are not audio, or are cut off mid-header, raise
``AudioError`` with the reason; an empty file with a valid header gives an empty array.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speclive.errors import SpecliveError

SAMPLE_RATE = 16_000


class AudioError(SpecliveError):
    """The input is not readable audio."""


def to_mono_16k(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mix down to mono (``[frames, channels]`` input) and resample to 16 kHz (polyphase)."""
    a = np.asarray(audio, dtype=np.float32)
    if a.ndim == 2:
        a = a.mean(axis=1)
    elif a.ndim != 1:
        raise AudioError(f"audio must be 1-D or [frames, channels], got shape {a.shape}")
    if sample_rate <= 0:
        raise AudioError(f"invalid sample rate {sample_rate}")
    if sample_rate != SAMPLE_RATE and a.size:
        from math import gcd

        from scipy.signal import resample_poly

        g = gcd(SAMPLE_RATE, int(sample_rate))
        a = resample_poly(a, SAMPLE_RATE // g, int(sample_rate) // g).astype(np.float32)
    return np.ascontiguousarray(a)


def load_audio(path: str | Path) -> np.ndarray:
    """Read ``path`` as 16 kHz mono float32 (see the module docstring for the error cases)."""
    import soundfile as sf

    p = Path(path)
    if not p.exists():
        raise AudioError(f"no such audio file: {p}")
    if p.is_dir():
        raise AudioError(f"{p} is a folder, not an audio file")
    try:
        data, sr = sf.read(str(p), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises LibsndfileError / RuntimeError with a reason
        raise AudioError(f"cannot read {p} as audio: {exc}") from exc
    return to_mono_16k(data, sr)


@dataclass
class Segment:
    """A piece of the input: samples ``[start, end)`` at 16 kHz."""

    start: int
    end: int

    @property
    def start_s(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def end_s(self) -> float:
        return self.end / SAMPLE_RATE


def split_segments(audio: np.ndarray, max_s: float = 30.0, search_s: float = 5.0) -> list[Segment]:
    """Cut ``audio`` into pieces of at most ``max_s`` seconds (Whisper's window).

    Each cut is placed at the quietest 100 ms frame within the last ``search_s`` seconds of the
    window, so words are rarely split.
    """
    n = len(audio)
    max_n = int(max_s * SAMPLE_RATE)
    frame = SAMPLE_RATE // 10
    out: list[Segment] = []
    start = 0
    while n - start > max_n:
        lo = start + max_n - int(search_s * SAMPLE_RATE)
        hi = start + max_n
        n_frames = (hi - lo) // frame
        energies = [
            float(np.mean(audio[lo + i * frame : lo + (i + 1) * frame] ** 2)) for i in range(n_frames)
        ]
        cut = lo + (int(np.argmin(energies)) + 1) * frame if energies else hi
        out.append(Segment(start, cut))
        start = cut
    if n - start > 0:
        out.append(Segment(start, n))
    return out
