"""Differential exactness of the Talon drafters (suffix, hybrid, hybrid-async) on SmolLM2-135M.

The global datastore is built from the reference greedy outputs of *other* prompts of the set
plus some unrelated text, so retrieval proposes deep trees that are partly right and partly
wrong (siblings from other documents). The hybrid drafters use SmolLM2 as their draft model
(on llama.cpp for the fp32 target: ``cheap_draft``) with ``always_model`` so the model chain is
fused into every tree. On fp32 transformers
the outputs must be token-identical to plain greedy decoding; on llama.cpp identical up to
near-tie flips (the rule of ``test_exactness``), in the asynchronous mode too. The greedy
references (16 tokens per prompt) are shared with ``test_exactness``; on fp32 the suffix drafter
runs on all 20 prompts and the model-fused hybrid on every other one.
"""

from __future__ import annotations

import pytest
from prompts import ALL
from test_exactness import MAX_TOKENS, NEAR_TIE, first_divergence, greedy_reference

from speclive.decoder import GenerationConfig, SpeculativeDecoder
from speclive.drafting.asyncdraft import AsyncConfig, AsyncHybridDrafter
from speclive.drafting.datastore import SuffixDatastore
from speclive.drafting.hybrid import HybridConfig, HybridDrafter
from speclive.drafting.suffix import SuffixConfig, SuffixDrafter

NOISE = "The quick brown fox jumps over the lazy dog. def main():\n    print('hello')\n" * 3


def _references(backend, prompts):
    out = []
    for text in prompts:
        prompt = backend.tokenizer.chat([{"role": "user", "content": text}])
        ref, gaps = greedy_reference(backend, prompt, MAX_TOKENS)
        out.append((text, prompt, ref, gaps))
    return out


def _store(backend, refs, skip: int) -> SuffixDatastore:
    tok = backend.tokenizer
    docs = [p + r for i, (_, p, r, _) in enumerate(refs) if i != skip]
    docs.append(tok.encode(NOISE))
    return SuffixDatastore.from_documents(docs, max_depth=16)


class _EagerSuffix(SuffixDrafter):
    """Believes verification is nearly free, so it verifies a tree whenever retrieval finds
    anything. On the real (steep, machine-dependent) cost curve the suffix drafter may decide
    that nothing pays and, its probes being free, verify nothing at all: then the exactness of
    its trees would go untested (and CI's machine decides which)."""

    def _cost(self, k: int) -> float:
        return 1.0 + 0.1 * (k - 1)


def _drafters(draft, store, hybrid: bool):
    scfg = SuffixConfig(min_gain=0.5)
    out = {"suffix": _EagerSuffix(store, scfg)}
    if hybrid:
        out["hybrid"] = HybridDrafter(draft, store, HybridConfig(always_model=True, model_max_len=4), scfg)
    return out


def _run(backend, prompts, with_async=False, hybrid_every=1, draft=None):
    refs = _references(backend, prompts)
    results = []
    for i, (text, prompt, ref, gaps) in enumerate(refs):
        store = _store(backend, refs, skip=i)
        drafters = _drafters(draft or backend, store, hybrid=i % hybrid_every == 0)
        if with_async:
            drafters["hybrid-async"] = AsyncHybridDrafter(
                _async_draft(backend), store, async_config=AsyncConfig(min_job_tokens=2)
            )
        for name, d in drafters.items():
            dec = SpeculativeDecoder(backend, d)
            res = dec.run(prompt, GenerationConfig(max_tokens=MAX_TOKENS))
            dec.close()
            results.append((name, text, ref, gaps, res.token_ids, res.stats, d))
    return results


def _async_draft(backend):
    from speclive.loader import load_backend

    return load_backend("smollm2-135m-instruct", "llamacpp", n_ctx=2048, threads=1)


def test_hf_fp32_talon_drafters_are_token_identical(hf_smol, cheap_draft):
    results = _run(hf_smol, ALL, hybrid_every=2, draft=cheap_draft)
    bad = [(n, t, r, o) for n, t, r, _g, o, _s, _d in results if o != r]
    assert not bad, bad[:3]
    acc: dict[str, int] = {}
    by_src: dict[str, int] = {}
    for n, *_rest, s, _d in results:
        acc[n] = acc.get(n, 0) + s.accepted
        for k, v in s.accepted_by_source.items():
            by_src[k] = by_src.get(k, 0) + v
    assert all(v > 0 for v in acc.values()), acc
    # every store contributed accepted tokens (the fusion really happened); the per-request
    # store's nodes are "request" (count tree) or "chain" (its latest longest match, copied)
    request = by_src.get("request", 0) + by_src.get("chain", 0)
    assert by_src.get("global", 0) > 0 and request > 0 and by_src.get("model", 0) > 0, by_src


def test_llamacpp_talon_drafters_up_to_near_ties(llama_smol):
    results = _run(llama_smol, ALL[::3], with_async=True)
    flips, bugs, acc = [], [], {}
    for name, text, ref, gaps, out, stats, _d in results:
        acc[name] = acc.get(name, 0) + stats.accepted
        if out == ref:
            continue
        j, gap = first_divergence(out, ref, gaps)
        (flips if gap < NEAR_TIE else bugs).append((name, text, j, gap))
    assert not bugs, bugs
    assert len(flips) <= len(results) // 2, flips
    assert all(v > 0 for v in acc.values()), acc


def test_async_drafter_reuses_background_drafts_and_restores_threads(llama_smol):
    draft = _async_draft(llama_smol)
    before = llama_smol.n_threads, draft.n_threads, llama_smol.cost
    # SmolLM2 drafts for itself here, so a draft step costs as much as the 1-token target step:
    # a job stopped at once would usually hold one token, which is never reusable
    d = AsyncHybridDrafter(draft, None, async_config=AsyncConfig(min_job_tokens=2))
    prompt = llama_smol.tokenizer.chat([{"role": "user", "content": "Count from 1 to 30, comma separated."}])
    ref, _ = greedy_reference(llama_smol, prompt, 48)
    dec = SpeculativeDecoder(llama_smol, d)
    res = dec.run(prompt, GenerationConfig(max_tokens=48))
    st = d.async_stats
    d.close()
    assert (llama_smol.n_threads, draft.n_threads, llama_smol.cost) == before
    assert st.steps > 0 and st.pre_verify + st.post_verify == st.steps
    assert st.jobs_reused > 0 and st.tokens_reused > 0, st
    assert st.draft_busy_s > 0 and st.wall_s > 0
    n = min(len(res.token_ids), len(ref))
    assert res.token_ids[:8] == ref[:8] and n >= 8


@pytest.mark.parametrize("name", ["suffix", "hybrid", "hybrid-async"])
def test_make_drafter_names(llama_smol, name, tmp_path):
    from speclive.errors import ConfigError
    from speclive.loader import DRAFTERS, make_drafter

    assert name in DRAFTERS
    if name == "suffix":
        d = make_drafter(name, llama_smol)
        assert isinstance(d, SuffixDrafter)
    else:
        with pytest.raises(ConfigError, match="draft-model"):
            make_drafter(name, llama_smol)
        d = make_drafter(name, llama_smol, draft_model="smollm2-135m-instruct")
        assert isinstance(d, HybridDrafter)
    d.close()
