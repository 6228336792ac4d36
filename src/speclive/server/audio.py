"""Audio bytes in and out of HTTP: uploaded files -> 16 kHz samples, samples -> WAV / PCM."""

from __future__ import annotations

import io
import wave
from math import gcd

import numpy as np

from speclive.asr.audio import AudioError, to_mono_16k

#: sample rate of OpenAI's ``pcm`` speech format (what its clients play it at)
PCM_RATE = 24_000


def decode_upload(data: bytes) -> np.ndarray:
    """An uploaded file (WAV, FLAC, OGG, MP3: whatever libsndfile reads) as 16 kHz mono float32."""
    if not data:
        raise AudioError("the file is empty")
    import soundfile as sf

    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as exc:  # soundfile raises LibsndfileError / RuntimeError with a reason
        raise AudioError(f"{exc} (send WAV, FLAC, OGG or MP3)") from exc
    return to_mono_16k(samples, rate)


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    if rate == target or not len(samples):
        return np.asarray(samples, dtype=np.float32)
    from scipy.signal import resample_poly

    g = gcd(int(rate), int(target))
    return resample_poly(samples, target // g, rate // g).astype(np.float32)


def pcm16(samples: np.ndarray) -> bytes:
    """Raw 16-bit little-endian mono PCM."""
    return (np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * 32767).astype("<i2").tobytes()


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    """A 16-bit PCM mono WAV file."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(rate))
        w.writeframes(pcm16(samples))
    return buf.getvalue()
