"""Tests of ``speclive.live.smartturn``: Smart Turn v3.2's window, features, input checks and
probabilities (the model tests skip when ``smart-turn-v3.2`` is not installed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from speclive.asr.audio import AudioError
from speclive.errors import ConfigError
from speclive.live.smartturn import (
    MODEL_NAME,
    THRESHOLD,
    WINDOW,
    SmartTurn,
    as_float_audio,
    log_mel,
    model_path,
    window_audio,
)
from speclive.sysinfo import cpu_flags, cpu_isa

#: Pipecat 1.14's own analyzer (``LocalSmartTurnAnalyzerV3._predict_endpoint``) on the inputs of
#: ``synthetic()`` (benchmarks/smart_turn_check.py), by CPU class. The model is int8, and
#: onnxruntime's int8 kernels give other probabilities where the CPU has VNNI dot products: on
#: the AVX2 host without them (results/archive/smart-turn-check.json) and on the AVX-512 host
#: with them (Pipecat's analyzer run there on the same arrays, 2026-12-01: the same numbers as
#: SmartTurn bit for bit) they differ by up to 0.8.
PIPECAT_P_BY_CLASS = {
    "avx2": {
        "silence-1s": 0.9875311851501465,
        "syllables-3s": 0.08002513647079468,
        "voice-3s": 0.8595805764198303,
        "voice-fading-3s": 0.5196834206581116,
    },
    "avx512f+vnni": {
        "silence-1s": 0.9870367050170898,
        "syllables-3s": 0.8857588768005371,
        "voice-3s": 0.20124173164367676,
        "voice-fading-3s": 0.08916738629341125,
    },
}


def cpu_class() -> str:
    """This CPU's widest ISA, with "+vnni" where it has VNNI int8 dot products."""
    vnni = any("vnni" in f for f in cpu_flags())
    return (cpu_isa() or "") + ("+vnni" if vnni else "")


def synthetic() -> dict[str, np.ndarray]:
    """The fixed int16 inputs of benchmarks/smart_turn_check.py, by their short names (one
    definition: the check that measured ``PIPECAT_P_BY_CLASS`` and this test read the same
    samples)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "smart_turn_check.py"
    spec = importlib.util.spec_from_file_location("smart_turn_check", path)
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    return {name.removeprefix("synthetic/"): pcm for name, pcm in check.synthetic().items()}


@pytest.fixture(scope="module")
def turn() -> SmartTurn:
    from speclive.models.install import is_installed

    if not is_installed(MODEL_NAME):
        pytest.skip(f"{MODEL_NAME} is not installed (speclive models install {MODEL_NAME})")
    return SmartTurn()


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * 16_000)
    t = np.arange(n) / 16_000
    env = np.clip(np.sin(2 * np.pi * 1.7 * t), 0, None)
    return (0.2 * env * np.sin(2 * np.pi * 150 * t) + 0.01 * rng.standard_normal(n)).astype(np.float32)


# -------------------------------------------------------------------------------- without a model


def test_window_keeps_the_end_and_pads_in_front() -> None:
    short = np.arange(1, 11, dtype=np.float32)
    w = window_audio(short)
    assert w.shape == (WINDOW,) and not w[:-10].any() and np.array_equal(w[-10:], short)
    long = np.arange(WINDOW + 500, dtype=np.float32)
    assert np.array_equal(window_audio(long), long[-WINDOW:])
    exact = np.ones(WINDOW, np.float32)
    assert window_audio(exact) is exact


def test_features_shape_range_and_silence() -> None:
    f = log_mel(window_audio(speech_like(3.0)))
    assert f.shape == (80, 800) and f.dtype == np.float32
    assert f.max() - f.min() <= 2.0 + 1e-6  # clamped to 8 decades below the peak, / 4
    silent = log_mel(np.zeros(WINDOW, np.float32))
    assert np.all(silent == np.float32(-1.5))  # log10(1e-10) = -10 -> (-10 + 4) / 4
    with pytest.raises(AudioError, match="128000"):
        log_mel(np.zeros(100, np.float32))


def test_features_match_transformers_whisper_feature_extractor() -> None:
    transformers = pytest.importorskip("transformers")
    fe = transformers.WhisperFeatureExtractor(chunk_length=8)
    w = window_audio(speech_like(5.0, seed=3))
    ref = fe(
        w,
        sampling_rate=16_000,
        padding="max_length",
        max_length=WINDOW,
        truncation=True,
        do_normalize=True,
        return_tensors="np",
    ).input_features[0]
    assert np.abs(ref - log_mel(w)).max() < 1e-5


def test_input_validation() -> None:
    pcm = np.array([0, 16384, -32768, 32767], np.int16)
    assert np.array_equal(as_float_audio(pcm), pcm.astype(np.float32) / 32768.0)
    assert as_float_audio(np.array([0.5, -0.25])).dtype == np.float32
    with pytest.raises(AudioError, match="empty"):
        as_float_audio(np.zeros(0, np.float32))
    with pytest.raises(AudioError, match="1-D"):
        as_float_audio(np.zeros((100, 2), np.float32))
    with pytest.raises(AudioError, match="dtype int32"):
        as_float_audio(np.zeros(100, np.int32))
    with pytest.raises(AudioError, match="NaN"):
        as_float_audio(np.array([0.0, np.nan], np.float32))


def test_model_path_refuses_other_kinds_and_unknown_names() -> None:
    with pytest.raises(ConfigError, match="not an end-of-turn model"):
        model_path("whisper-tiny.en")
    with pytest.raises(ConfigError, match="neither an ONNX file"):
        model_path("no-such-turn-model")
    with pytest.raises(ConfigError, match="threads"):
        SmartTurn(threads=0)


# ----------------------------------------------------------------------------------- with the model


def test_silence_gives_a_probability(turn: SmartTurn) -> None:
    p = turn.predict(np.zeros(16_000, np.float32))
    assert isinstance(p, float) and 0.0 <= p <= 1.0
    assert turn.last_ms > 0.0


def test_only_the_last_8_seconds_count(turn: SmartTurn) -> None:
    a = speech_like(11.0, seed=1)
    a[: 3 * 16_000] = 0.9 * np.sign(a[: 3 * 16_000])  # the first 3 s differ wildly
    assert turn.predict(a) == turn.predict(a[-WINDOW:])
    assert turn.predict(a) == turn.predict(np.concatenate([speech_like(2.0, seed=9), a[-WINDOW:]]))


def test_deterministic_and_int16_is_pcm(turn: SmartTurn) -> None:
    a = speech_like(4.0, seed=2)
    assert turn.predict(a) == turn.predict(a.copy())
    pcm = (a * 32767).astype(np.int16)
    assert turn.predict(pcm) == turn.predict(pcm.astype(np.float32) / 32768.0)
    assert turn.predict(a.astype(np.float64)) == turn.predict(a)
    with pytest.raises(AudioError):
        turn.predict(np.zeros(0, np.float32))


def test_probabilities_match_pipecat(turn: SmartTurn) -> None:
    """A preprocessing change (padding side, normalization, mel filters, ...) moves these."""
    want = PIPECAT_P_BY_CLASS.get(cpu_class())
    if want is None:
        pytest.skip(
            f"no Pipecat probabilities measured on a {cpu_class()} CPU: benchmarks/smart_turn_check.py"
        )
    for name, pcm in synthetic().items():
        assert turn.predict(pcm) == pytest.approx(want[name], abs=1e-4), name
    assert turn.is_complete(synthetic()["voice-3s"]) == (want["voice-3s"] > THRESHOLD)


def test_explicit_file_and_threads(turn: SmartTurn) -> None:
    other = SmartTurn(turn.path, threads=2)
    a = speech_like(2.0, seed=4)
    assert other.threads == 2
    assert other.predict(a) == pytest.approx(turn.predict(a), abs=1e-6)
