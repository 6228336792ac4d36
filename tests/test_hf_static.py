"""The static-cache transformers backend (``hf_static``) against the eager one it replaces.

On the CPU it runs without CUDA graphs (the same forward, the same cache operations); the
conformance suite runs it too (``any_smol``). On a CUDA GPU the graph tests compare the graphed
backend with the eager backend on the same weights.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from prompts import ALL
from test_exactness import NEAR_TIE, NoisyTreeDrafter, first_divergence, greedy_reference

from speclive.backends.hf_static import StaticHFBackend, _layout
from speclive.decoder import GenerationConfig, SpeculativeDecoder
from speclive.drafting.ngram import NgramDrafter
from speclive.errors import ConfigError

torch = pytest.importorskip("torch")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


def _logprobs(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_layout_masks_prefix_ancestors_and_padding():
    ids, pos, write, mask = _layout([5, 6, 7], [-1, 0, 0], past=2, rows=4, ctx=8)
    assert ids.tolist() == [5, 6, 7, 0] and pos.tolist() == [2, 3, 3, 0]
    assert write.tolist() == [2, 3, 4, 5]
    assert mask[0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert mask[2].tolist() == [1, 1, 1, 0, 1, 0, 0, 0]  # sibling of node 1: not it
    assert mask[3].tolist() == [0, 0, 0, 0, 0, 1, 0, 0]  # padding sees only its own dead row
    _, pos, _, mask = _layout([1, 2], None, past=0, rows=2, ctx=4)
    assert pos.tolist() == [0, 1] and mask[:, :2].tolist() == [[1, 0], [1, 1]]


def test_static_matches_eager_logits_on_a_long_prompt(hf_smol, static_smol):
    n = 1
    while len(prompt := hf_smol.tokenizer.chat([{"role": "user", "content": " ".join(ALL[:n])}])) <= 70:
        n += 1  # past the 64-row chunk: the prompt goes in pieces
    a, b = hf_smol.new_state(), static_smol.new_state()
    want = hf_smol.extend(a, prompt)
    got = static_smol.extend(b, prompt)
    assert np.abs(_logprobs(got) - _logprobs(want)).max() < 2e-3
    last = static_smol.extend(static_smol.new_state(), prompt, last_only=True)
    assert np.abs(_logprobs(last) - _logprobs(want[-1:])).max() < 2e-3
    hf_smol.release(a)


def test_static_speculation_is_greedy_identical_to_eager(hf_smol, static_smol):
    for text in ALL[:3]:
        prompt = hf_smol.tokenizer.chat([{"role": "user", "content": text}])
        ref, gaps = greedy_reference(hf_smol, prompt, 16)
        for drafter in (NgramDrafter(), NoisyTreeDrafter(ref, hf_smol.vocab_size)):
            dec = SpeculativeDecoder(static_smol, drafter)
            res = dec.run(prompt, GenerationConfig(max_tokens=16))
            dec.close()
            if res.token_ids != ref:
                j, gap = first_divergence(res.token_ids, ref, gaps)
                assert gap < NEAR_TIE, (text, j, gap)


def test_caches_are_pooled_and_limits_are_clear(hf_smol, static_smol):
    st = static_smol.new_state()
    cache = st.cache
    static_smol.extend(st, [1, 2, 3])
    static_smol.release(st)
    del st
    gc.collect()
    again = static_smol.new_state()
    assert again.cache is cache and len(again) == 0  # the collected state's cache serves again
    with pytest.raises(ConfigError, match="CUDA"):
        StaticHFBackend(hf_smol.model, hf_smol.tokenizer, graphs=True)
    with pytest.raises(Exception, match="context window"):
        static_smol.extend(again, [1] * (static_smol.n_ctx + 1))


@pytest.fixture(scope="module")
def cuda_pair(gpu_model):
    """(eager, graphed) backends on one copy of the CUDA tests' model's weights on the GPU."""
    from speclive.backends.hf import HFBackend
    from speclive.loader import load_backend

    graphed = load_backend(gpu_model, "hf", device="cuda")
    assert isinstance(graphed, StaticHFBackend) and graphed.graphs
    eager = HFBackend(graphed.model, graphed.tokenizer, name=graphed.name, n_ctx=graphed.n_ctx)
    return eager, graphed


@needs_cuda
def test_cuda_graphs_are_greedy_identical_to_eager(cuda_pair):
    eager, graphed = cuda_pair
    flips, bugs = [], []
    for text in ALL:
        prompt = eager.tokenizer.chat([{"role": "user", "content": text}])
        ref, gaps = greedy_reference(eager, prompt, 32)
        for drafter in (None, NgramDrafter(), NoisyTreeDrafter(ref, eager.vocab_size)):
            if drafter is None:
                out, _ = greedy_reference(graphed, prompt, 32)
            else:
                dec = SpeculativeDecoder(graphed, drafter)
                out = dec.run(prompt, GenerationConfig(max_tokens=32)).token_ids
                dec.close()
            if out != ref:
                j, gap = first_divergence(out, ref, gaps)
                (flips if gap < NEAR_TIE else bugs).append((text, j, gap))
    print(f"graphs vs eager near-tie flips: {len(flips)}/{3 * len(ALL)} runs; captures {graphed.captures}")
    assert not bugs, bugs
    assert len(flips) <= len(ALL) // 2, flips
    assert graphed.captures > 0
