"""The draft -> verify -> commit loop, property-based, on a fake LM that reads its whole cache.

``ContextLM`` (tests/context_lm.py) predicts from a hash of every cached token, so a wrong tree
mask, a kept sibling, a stale row after a rollback or a mis-fused prompt tail changes the
output, and greedy output is known without any cache. Hypothesis draws prompts, draft trees
(right tokens, wrong siblings, wrong deeper nodes, missing continuations, trees larger than
the budget), ``max_draft_nodes``, prefill fusion, context windows and EOS handling; every run
must give the cache-free greedy reference token for token. This is the fast tier of the
exactness tests: ``test_exactness``/``test_talon_exactness`` keep the same property on real
models with the product's drafters, on fewer and shorter runs.

Sessions reuse one decoder and its cache across prompts that grow, shrink and get rewritten
(the streaming case), and the SSBD re-translation session at beta = 0 must equal its AR
baseline update for update.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from context_lm import ASSISTANT, EOS, USER, ContextLM, V, reference_greedy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speclive.decoder import GenerationConfig, SpeculativeDecoder, drain
from speclive.drafting.base import AdaptiveConfig, AdaptiveLength, Drafter
from speclive.drafting.tree import DraftTree
from speclive.sessions.retranslate import ReTranslator

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class RandomTreeDrafter(Drafter):
    """Trees around the true greedy continuation: right tokens with wrong siblings before or
    after them, wrong nodes under right ones, a right token left out (the walk must stop), and
    sometimes more nodes than the budget (the decoder truncates)."""

    name = "random-tree"

    def __init__(self, seed: int, p_wrong: float, depth: int, oversize: bool):
        super().__init__(AdaptiveLength(AdaptiveConfig(fixed=True)))
        self.rng = np.random.default_rng(seed)
        self.p_wrong, self.depth, self.oversize = p_wrong, depth, oversize
        self.proposed = 0

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        self.proposed += 1
        rng, ctx = self.rng, list(context)
        limit = budget + (3 if self.oversize else 0)
        tree = DraftTree()
        # a few independent root branches, the true one among them (or not)
        frontier = [(-1, ctx)]
        for _ in range(self.depth):
            if not frontier or len(tree) >= limit:
                break
            parent, c = frontier.pop(0)
            truth = reference_greedy(c, 1, eos=False)[0]
            r = rng.random()
            if r < self.p_wrong:  # a wrong sibling first
                tree.add(int(rng.integers(0, V)), parent)
            if r < self.p_wrong / 3:  # the right token is missing: the walk stops here
                continue
            node = tree.add(truth, parent)
            if rng.random() < self.p_wrong:  # a dead end under a right node
                tree.add(int(rng.integers(0, V)), node)
            frontier.append((node, c + [truth]))
        return tree


prompts = st.lists(st.integers(min_value=0, max_value=V - 1), min_size=1, max_size=24)


def _check_run(lm, dec, prompt, cfg, ref):
    events: list = []
    res = drain(dec.generate(prompt, cfg), events)
    ids, stats = res.token_ids, res.stats
    assert events[-1].stats is stats  # the events carry the result's totals
    assert ids == ref
    assert [t for e in events for t in e.tokens] == ids
    assert stats.new_tokens == len(ids) and stats.target_forwards == len(events)
    assert 0 <= stats.accepted <= stats.drafted
    assert sum(e.accepted for e in events) == stats.accepted
    # every step commits its accepted tokens plus one, but the last may cut them short
    assert len(ids) <= stats.accepted + stats.target_forwards
    assert stats.finish_reason in ("eos", "length", "context")
    # the fake's own cache rows agree with the committed tokens (no pending tree left)
    assert dec.state.pending is None
    assert len(dec.state.rows) == len(dec.state.tokens) and dec.state.seen == dec.state.tokens
    return res


@SETTINGS
@given(
    prompt=prompts,
    max_tokens=st.integers(1, 40),
    max_nodes=st.integers(1, 24),
    fuse=st.sampled_from([0, 3, 32]),
    p_wrong=st.floats(0.0, 0.9),
    depth=st.integers(1, 12),
    oversize=st.booleans(),
    ignore_eos=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_any_tree_gives_the_greedy_reference(
    prompt, max_tokens, max_nodes, fuse, p_wrong, depth, oversize, ignore_eos, seed
):
    lm = ContextLM()
    d = RandomTreeDrafter(seed, p_wrong, depth, oversize)
    dec = SpeculativeDecoder(lm, d)
    cfg = GenerationConfig(
        max_tokens=max_tokens, max_draft_nodes=max_nodes, fuse_prefill=fuse, ignore_eos=ignore_eos
    )
    ref = reference_greedy(prompt, max_tokens, eos=not ignore_eos)
    stats = _check_run(lm, dec, prompt, cfg, ref).stats
    if stats.finish_reason == "length" and max_tokens > 1:
        assert d.proposed > 0


@SETTINGS
@given(prompt=prompts, n_ctx=st.integers(2, 40), depth=st.integers(1, 8), seed=st.integers(0, 999))
def test_the_context_window_ends_a_run_at_the_same_token(prompt, n_ctx, depth, seed):
    if len(prompt) >= n_ctx:
        prompt = prompt[: n_ctx - 1]
    lm = ContextLM(n_ctx=n_ctx)
    dec = SpeculativeDecoder(lm, RandomTreeDrafter(seed, 0.3, depth, oversize=True))
    cfg = GenerationConfig(max_tokens=60, ignore_eos=True)
    ref = reference_greedy(prompt, 60, eos=False, n_ctx=n_ctx)
    stats = _check_run(lm, dec, prompt, cfg, ref).stats
    assert stats.finish_reason == ("length" if len(ref) == 60 else "context")
    assert len(dec.state.tokens) <= n_ctx


edits = st.lists(
    st.tuples(st.integers(0, 30), st.lists(st.integers(0, V - 1), max_size=10)), min_size=1, max_size=6
)


@SETTINGS
@given(prompt=prompts, edits=edits, fuse=st.sampled_from([0, 4, 32]), seed=st.integers(0, 999))
def test_one_decoder_across_edited_prompts(prompt, edits, fuse, seed):
    """A streaming session: each prompt keeps a prefix of the last one and appends new tokens
    (or the last output); the decoder reuses its cache and must still match the reference."""
    lm = ContextLM()
    dec = SpeculativeDecoder(lm, RandomTreeDrafter(seed, 0.4, 6, oversize=False))
    cfg = GenerationConfig(max_tokens=12, fuse_prefill=fuse, ignore_eos=True)
    cur, last_out = list(prompt), []
    for keep, extra in edits:
        cur = (cur[: max(1, keep)] + (extra or last_out))[:60] or [5]
        before = lm.forward_calls
        last_out = _check_run(lm, dec, cur, cfg, reference_greedy(cur, 12, eos=False)).token_ids
        assert lm.forward_calls > before
    dec.prefill(cur + [7, 8])  # a prefill alone leaves the cache at the prompt minus its last token
    assert dec.state.tokens == cur + [7]


def test_the_fake_reads_its_whole_cache():
    """The fake is a fair judge: a corrupted early row changes its predictions."""
    lm = ContextLM()
    prompt = [5, 9, 11, 4, 30, 17]
    s = lm.new_state()
    good = lm.extend(s, prompt)[-1]
    s.rows[1] ^= 1  # one wrong cache row, far back
    s.seen[1] = 12
    lm.truncate(s, 5)
    bad = lm.extend(s, prompt[5:])[-1]
    assert int(np.argmax(good)) != int(np.argmax(bad))
    assert [int(np.argmax(good))] == reference_greedy(prompt, 1, eos=False)


# ---- the re-translation session -------------------------------------------------------------
WORDS = "the old keeper climbed up every stair of the tall white tower at dusk to light lamp".split()


@settings(max_examples=25, deadline=None)
@given(
    cuts=st.lists(st.integers(1, len(WORDS)), min_size=1, max_size=6),
    rewrite=st.booleans(),
    chunked=st.booleans(),
    mask_k=st.integers(0, 3),
    display_only=st.booleans(),
)
def test_retranslation_at_beta0_equals_its_ar_baseline(cuts, rewrite, chunked, mask_k, display_only):
    lm = ContextLM()
    sources = [" ".join(WORDS[:c]) for c in cuts]
    if rewrite:  # an ASR revision: a word in the middle changes
        sources = [s.replace("tall", "small") if i % 2 else s for i, s in enumerate(sources)]
    kw = dict(target_lang="de", max_tokens=24, mask_k=mask_k, display_only=display_only)
    sd = ReTranslator(lm, beta=0.0, chunked=chunked, **kw)
    ar = ReTranslator(lm, baseline=True, **kw)
    for s in sources:
        u, r = sd.update(s), ar.update(s)
        assert u.token_ids == r.token_ids and u.display == r.display
        # the fake translates word by word: the reference is known without the session
        assert u.token_ids == reference_greedy(sd.prompt_ids(s), 24)
    assert sd.finish().token_ids == ar.finish().token_ids
    m_sd, m_ar = sd.metrics(), ar.metrics()
    assert m_sd["output_tokens"] == m_ar["output_tokens"] and m_sd["updates"] == m_ar["updates"]
    assert m_ar["drafted"] == 0 and m_ar["target_forwards"] >= m_ar["output_tokens"]
    # single-pass drafting (chunks follow measured costs): a source that only grew keeps the
    # whole previous translation as an accepted draft
    if not chunked and not (mask_k and not display_only):
        for i in range(1, len(sources)):
            if sources[i].startswith(sources[i - 1]):
                assert sd.updates[i].accepted >= len(sd.updates[i - 1].token_ids)
    sd.close()
    ar.close()


def test_the_fake_translation_prompt_shape():
    lm = ContextLM()
    s = ReTranslator(lm, target_lang="de", max_tokens=24, beta=0.0)
    ids = s.prompt_ids("a b c")
    assert ids[-1] == ASSISTANT and USER in ids
    out = reference_greedy(ids, 24)
    assert len(out) == 3 and EOS not in out  # one output word per source word, then EOS
    s.close()


class _TruthDrafter(Drafter):
    """Drafts the true next two tokens and records the seconds of every step's feedback."""

    name = "truth"

    def __init__(self) -> None:
        super().__init__(AdaptiveLength(AdaptiveConfig(fixed=True)))
        self.seconds: list[float | None] = []

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        return DraftTree.chain(reference_greedy(list(context), 2, eos=False)[:budget], source=self.name)

    def feedback(self, step) -> None:
        self.seconds.append(step.seconds)


def test_a_steps_measured_time_is_its_own_pass_not_the_callers_other_work():
    """The drafter learns its step cost from drafting, its own pass and accepting: a caller
    that runs other work between handing out a pass and sending its logits (the server's
    worker serving other requests) does not make drafting look dearer; a pass that shared a
    decode with other states' passes is no measurement at all."""
    import time

    lm = ContextLM()
    d = _TruthDrafter()
    dec = SpeculativeDecoder(lm, d)
    steps = dec.stepwise([5, 9, 11, 4], GenerationConfig(max_tokens=9, ignore_eos=True, fuse_prefill=0))
    item, n = next(steps), 0
    while True:
        n += 1
        time.sleep(0.05)  # other requests' work on the worker
        logits = lm.extend(item.state, item.tokens, item.parents, skip=item.skip)
        if n % 2 == 0:
            item.state.pass_s = None  # what a shared decode leaves behind
        steps.send(logits)  # -> this step's event
        try:
            item = next(steps)
        except StopIteration:
            break
    assert len(d.seconds) == n >= 3
    alone, shared = d.seconds[0::2], d.seconds[1::2]
    assert all(s is not None and 0 < s < 0.05 for s in alone), alone
    assert all(s is None for s in shared), shared
