"""The transformers backend on a CUDA GPU: lossless speculation and SSBD sessions there.

Skipped on machines without a CUDA GPU (CI has none); run on a lent GPU machine with
``pytest tests/test_gpu.py`` (the default model, Qwen 0.5B, dequantized to fp32 on the GPU).

On the GPU a k-token pass may use other kernels than a one-token step, so an output may flip
where the reference's top-2 logit gap is tiny (as on llama.cpp); the test accepts identity or
a first divergence at a gap below ``NEAR_TIE`` and counts such flips. A wrong mask, position
or rollback diverges at a clear margin and fails. The device checks run everywhere.
"""

from __future__ import annotations

import pytest
from prompts import ALL
from test_exactness import NEAR_TIE, NoisyTreeDrafter, first_divergence, greedy_reference

from speclive.decoder import GenerationConfig, SpeculativeDecoder
from speclive.drafting.ngram import NgramDrafter
from speclive.errors import ConfigError

torch = pytest.importorskip("torch")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
MAX_TOKENS = 32


def test_llamacpp_backend_refuses_a_gpu_device():
    from speclive.loader import load_backend

    with pytest.raises(ConfigError, match="CPU only"):
        load_backend("smollm2-135m-instruct", "llamacpp", device="cuda")


def test_bad_devices_are_clear_errors():
    from speclive.backends.hf import check_device

    check_device("cpu")
    with pytest.raises(ConfigError, match="invalid device"):
        check_device("warp-drive")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            check_device("cuda")
    else:
        with pytest.raises(ConfigError, match="CUDA device"):
            check_device(f"cuda:{torch.cuda.device_count()}")


def test_device_spelling_shares_one_loaded_backend(hf_smol):
    from speclive.loader import _draft_device, load_backend

    # the default device, written out or not, is the same cached backend (no second load)
    assert load_backend("smollm2-135m-instruct", "hf", device="cpu") is hf_smol
    assert _draft_device(hf_smol, "hf") == "cpu"


@pytest.fixture(scope="module")
def cuda_qwen(gpu_model):
    from speclive.loader import load_backend

    return load_backend(gpu_model, "hf", device="cuda")


@needs_cuda
def test_cuda_backend_is_on_the_gpu_with_a_flat_cost_prior(cuda_qwen):
    from speclive.loader import _draft_device

    assert cuda_qwen.device.type == "cuda"
    assert _draft_device(cuda_qwen, "hf").startswith("cuda")  # hf drafts follow the target
    assert next(cuda_qwen.model.parameters()).is_cuda
    prior = cuda_qwen.default_cost_prior()
    assert prior[32] < 2.0  # launch-bound: a 32-token pass is not a CPU's 4-13 steps


@needs_cuda
def test_cuda_lossless_drafters_up_to_near_ties(cuda_qwen):
    flips, bugs, accepted = [], [], {"ngram": 0, "noisy-tree": 0}
    for text in ALL:
        prompt = cuda_qwen.tokenizer.chat([{"role": "user", "content": text}])
        ref, gaps = greedy_reference(cuda_qwen, prompt, MAX_TOKENS)
        for name, drafter in (
            ("ngram", NgramDrafter()),
            ("noisy-tree", NoisyTreeDrafter(ref, cuda_qwen.vocab_size)),
        ):
            dec = SpeculativeDecoder(cuda_qwen, drafter)
            res = dec.run(prompt, GenerationConfig(max_tokens=MAX_TOKENS))
            dec.close()
            accepted[name] += res.stats.accepted
            if res.token_ids != ref:
                j, gap = first_divergence(res.token_ids, ref, gaps)
                (flips if gap < NEAR_TIE else bugs).append((name, text, j, gap))
    print(f"cuda near-tie flips: {len(flips)}/{2 * len(ALL)} runs")
    assert not bugs, bugs
    assert len(flips) <= len(ALL) // 2, flips
    assert all(v > 0 for v in accepted.values()), accepted


@needs_cuda
def test_cuda_ssbd_session_reuses_the_previous_output(cuda_qwen):
    from speclive.sessions.retranslate import ReTranslator
    from speclive.sessions.simulate import lag_k_prefixes

    prefixes = lag_k_prefixes("The old lighthouse keeper climbed the stairs every evening at dusk.", 3)
    runs = {}
    for name, kw in (("ar", {"baseline": True}), ("lossless", {"beta": 0.0}), ("ssbd", {"beta": 0.2})):
        s = ReTranslator(cuda_qwen, target_lang="de", max_tokens=64, **kw)
        for p in prefixes[:-1]:
            s.update(p)
        s.finish(prefixes[-1])
        runs[name] = (s.updates, s.metrics())
        s.close()
    ar_updates, ar_m = runs["ar"]
    ll_updates, ll_m = runs["lossless"]
    # β = 0 verifies greedily: every update is AR's, up to a near-tie flip on the GPU
    same = sum(a.token_ids == b.token_ids for a, b in zip(ar_updates, ll_updates, strict=True))
    assert same >= len(ar_updates) - 1, (same, len(ar_updates))
    _, ssbd_m = runs["ssbd"]
    assert ssbd_m["accepted"] > 0 and ssbd_m["target_forwards"] < ar_m["target_forwards"]


def test_whisper_device_is_checked_before_loading():
    from speclive.asr.whisper import load_whisper

    with pytest.raises(ConfigError, match="invalid device"):
        load_whisper("whisper-tiny.en", device="warp-drive")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            load_whisper("whisper-tiny.en", device="cuda")


@needs_cuda
def test_cuda_whisper_speculation_matches_ar():
    """SpecASR and plain SD on the GPU against AR there (clips: ``SPECLIVE_CLIPS``, a folder that
    ``speclive bench asr --save-clips`` wrote; a GPU machine has no Piper)."""
    import os
    from pathlib import Path

    from speclive.asr.transcribe import TranscribeConfig, Transcriber
    from speclive.asr.whisper import load_whisper
    from speclive_bench.asr import clips_from

    folder = os.environ.get("SPECLIVE_CLIPS")
    if not folder:
        pytest.skip("SPECLIVE_CLIPS names no clips folder (speclive bench asr --save-clips DIR)")
    clips = clips_from(Path(folder))
    target = load_whisper("whisper-base", device="cuda")
    assert target.device.type == "cuda" and target.default_cost_prior()[32] < 2.0
    ar = Transcriber(TranscribeConfig(model="whisper-base", method="ar"), target=target)
    runs = {
        "specasr": Transcriber(TranscribeConfig(model="whisper-base", method="specasr"), target=target),
        "sd-self": Transcriber(TranscribeConfig(method="sd", draft="self:2"), target=target),
    }
    for c in clips:
        want = ar.transcribe(c.audio).token_ids
        for name, tr in runs.items():
            assert tr.transcribe(c.audio).token_ids == want, (name, c.name)
    assert not runs["specasr"].draft_backend.int8  # float32 drafts off the CPU
