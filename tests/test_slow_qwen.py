"""The Qwen2.5-Coder pair (0.5B drafts for 1.5B; one tokenizer): exactness at real scale.

Marked slow (``make test-slow``): the 1.5B is a 1.1 GB install and the fp32 0.5B a 2.4 GB
conversion. On llama.cpp the near-tie rule of ``test_exactness`` applies; on the fp32
transformers backend outputs must be token-identical.
"""

from __future__ import annotations

import pytest
from prompts import ALL
from test_exactness import NEAR_TIE, greedy_reference

from speclive.decoder import GenerationConfig, SpeculativeDecoder
from speclive.loader import load_backend, make_drafter

pytestmark = pytest.mark.slow

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
MAX_TOKENS = 32


def _first_divergence(out, ref):
    for i, (a, b) in enumerate(zip(out, ref, strict=False)):
        if a != b:
            return i
    return min(len(out), len(ref))


def test_llamacpp_qwen_pair_lossless_up_to_near_ties():
    target = load_backend(TARGET, "llamacpp", n_ctx=2048)
    drafters = {
        name: make_drafter(name, target, DRAFT if name == "model" else None) for name in ("ngram", "model")
    }
    bugs, flips, accepted = [], [], dict.fromkeys(drafters, 0)
    for text in ALL:
        prompt = target.tokenizer.chat([{"role": "user", "content": text}])
        ref, gaps = greedy_reference(target, prompt, MAX_TOKENS)
        for name, drafter in drafters.items():
            res = SpeculativeDecoder(target, drafter).run(prompt, GenerationConfig(max_tokens=MAX_TOKENS))
            accepted[name] += res.stats.accepted
            if res.token_ids != ref:
                j = _first_divergence(res.token_ids, ref)
                gap = gaps[j] if j < len(gaps) else 0.0
                (flips if gap < NEAR_TIE else bugs).append((name, text, j, gap))
    assert not bugs, bugs
    assert len(flips) <= len(ALL), flips
    assert accepted["model"] > 0


def test_hf_fp32_qwen_half_b_lossless():
    target = load_backend(DRAFT, "hf")
    drafter = make_drafter("ngram", target)
    mismatches = []
    for text in ALL[::2]:
        prompt = target.tokenizer.chat([{"role": "user", "content": text}])
        ref, _ = greedy_reference(target, prompt, MAX_TOKENS)
        res = SpeculativeDecoder(target, drafter).run(prompt, GenerationConfig(max_tokens=MAX_TOKENS))
        if res.token_ids != ref:
            mismatches.append(text)
    assert not mismatches, mismatches
