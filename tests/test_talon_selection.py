"""What the retrieval/hybrid drafters choose to verify on a steep CPU cost curve.

- the copied chain (latest longest request match, scored by its bucket's learned survival
  curve) keeps long exact copies long once they keep being accepted, where count-based path
  probabilities decay with depth;
- a chain that keeps failing is switched off and probed with exponential back-off;
- probes are free: their outcome is read off the tokens the target commits anyway, with the
  same back-off and calibration as a verified probe;
- the calibrator pools a store's buckets (a new bucket borrows its store's ratio);
- a draft model that cannot pay even at near-perfect acceptance is not probed (a probe would
  re-sync its cache), in the model drafter and in the hybrid.
"""

from __future__ import annotations

import pytest
from test_async_fake import MarkovLM, _ar

from speclive.backends.base import CostModel
from speclive.decoder import GenerationConfig, SpeculativeDecoder
from speclive.drafting.base import AdaptiveConfig, AdaptiveLength, StepFeedback
from speclive.drafting.crossvocab import CrossVocabDrafter
from speclive.drafting.hybrid import HybridConfig, HybridDrafter
from speclive.drafting.model import ModelDrafter, catch_up_cost
from speclive.drafting.retrieval import Calibrator
from speclive.drafting.suffix import SuffixConfig, SuffixDrafter
from speclive.drafting.tree import DraftTree

#: verification-cost curve t(k)/t(1) measured for Qwen2.5-Coder-1.5B on llama.cpp, 2 cores
CPU_CURVE = {
    **{1: 1.0, 2: 1.82, 3: 2.37, 4: 2.47, 5: 3.09, 6: 3.82, 8: 5.96},
    **{10: 6.86, 12: 7.72, 16: 7.71, 20: 10.52, 24: 11.29, 32: 12.74},
}


class CurveTarget:
    """Just what a drafter's ``start`` reads: a measured cost curve."""

    name = "curve"
    kind = "fake"
    max_tree_branches = 16

    def __init__(self) -> None:
        self.cost = CostModel(dict(CPU_CURVE))
        self.cost.observe(1, 0.05)


def _accepted_path(tree: DraftTree, truth: list[int]) -> list[int]:
    return tree.follow(truth)


def _trained(
    copy_chain: bool, truth_ok: bool, rounds: int = 30, free_probes: bool = False
) -> tuple[SuffixDrafter, list[int]]:
    """A suffix drafter after ``rounds`` verifications of the same 20-token copy situation."""
    passage = list(range(100, 160))
    ctx = [7, 8, *passage, 9, *passage[:20]]
    truth = passage[20:] if truth_ok else [1] * 40
    # the context does not grow here, so free probes (resolved by committed tokens) never would
    d = SuffixDrafter(None, SuffixConfig(depth=16, copy_chain=copy_chain, free_probes=free_probes))
    d.start(CurveTarget(), ctx)  # type: ignore[arg-type]
    drafted = 0
    for _ in range(rounds):
        tree = d.propose(ctx, 64)
        drafted += len(tree) > 0
        if len(tree):
            d.feedback(StepFeedback(tree, _accepted_path(tree, truth), truth[0]))
    d.drafted_steps = drafted  # type: ignore[attr-defined]
    return d, ctx


def test_copy_chain_keeps_long_exact_copies_long():
    with_chain, ctx = _trained(copy_chain=True, truth_ok=True)
    tree = with_chain.propose(ctx, 64)
    assert tree.is_chain() and tree.tokens == list(range(120, 120 + len(tree)))
    assert len(tree) >= 12, len(tree)
    assert set(tree.sources or []) <= {"chain", "request"}
    # count-based scores alone (one occurrence, decaying with depth) stop far earlier
    without, ctx = _trained(copy_chain=False, truth_ok=True)
    assert len(without.propose(ctx, 64)) < len(tree)


def test_failing_copy_chain_backs_off():
    d, _ = _trained(copy_chain=True, truth_ok=False, rounds=200)
    # a probe after 8, 16, 32, 64, 128 idle steps (plus the generic retrieval probes)
    assert 1 <= d.drafted_steps <= 12, d.drafted_steps  # type: ignore[attr-defined]
    assert all(c.alpha < 0.45 for b, c in d.chain_ctl.items() if b == 16)


def _scripted(free: bool, fail_steps: int, copy_steps: int = 0):
    """Oracle decoding against a scripted stream: ``fail_steps`` rounds of ``1 2 <fresh>``
    (every 2-gram match continues differently: retrieval always wrong), then a long passage
    that already occurs in the prompt (retrieval right). Yields (drafter, tree, accepted)."""
    passage = list(range(500, 600))
    stream = [t for i in range(fail_steps) for t in (1, 2, 100 + i)] + passage + [3] * 64
    d = SuffixDrafter(None, SuffixConfig(depth=16, free_probes=free))
    ctx = [7, 8, *passage, 9]
    d.start(CurveTarget(), ctx)  # type: ignore[arg-type]
    pos = 0
    while pos < 3 * fail_steps + copy_steps:
        tree = d.propose(ctx, 64)
        path = _accepted_path(tree, stream[pos : pos + 40])
        new = [tree.tokens[i] for i in path] + [stream[pos + len(path)]]
        if len(tree):
            d.feedback(StepFeedback(tree, path, new[-1]))
        ctx += new
        pos += len(new)
        # a free probe is resolved by the next ``propose``; resolving it here, where a paid
        # probe's ``feedback`` ran, lets the test compare both drafters' states step by step
        d._resolve_free_probe(ctx)
        yield d, tree, len(path)


def _state(d: SuffixDrafter) -> tuple:
    chains = tuple((b, round(c.alpha, 9), c.off, c.backoff.wait) for b, c in sorted(d.chain_ctl.items()))
    return d.backoff.wait, d.backoff.off_steps, chains, tuple(sorted(d.calib.snapshot().items()))


def test_free_probes_learn_what_paid_probes_learn_at_no_cost():
    paid_nodes = free_nodes = 0
    for (dp, tp, ap), (df, tf, af) in zip(_scripted(False, 150), _scripted(True, 150), strict=True):
        assert ap == 0 and af == 0  # retrieval is always wrong here: probes all fail...
        paid_nodes += len(tp)
        free_nodes += len(tf)
        assert _state(dp) == _state(df)  # ...and both drafters learn exactly the same from them
    assert paid_nodes > 0 and free_nodes == 0
    assert df.free_probe_stats["probes"] > 0


def test_free_probe_switches_a_copy_back_on():
    steps = list(_scripted(True, 120, copy_steps=80))
    assert sum(len(t) for _, t, _ in steps[:120]) == 0  # nothing verified while nothing pays
    d = steps[-1][0]
    # the failing phase was probed for free (nothing verified)...
    assert d.free_probe_stats["probes"] > 0
    # ...and once the output copies the prompt, long drafts are back: failures of matches
    # within the output do not switch off copies from the prompt, whose calibrated prior
    # drafts a long verbatim match long at once
    assert max(len(t) for _, t, _ in steps[120:]) >= 8


def test_calibrator_pools_buckets_of_a_store():
    cal = Calibrator()
    cal.update({"global:3": 2.0}, {})
    # one failed verification already moves the ratio (no slow EMA start)...
    assert cal.scale("global:3") <= 0.5
    # ...and an unseen bucket of the same store borrows the store's ratio, another store does not
    assert cal.scale("global:4") <= 0.5
    assert cal.scale("request:4") == cal.prior
    for _ in range(30):
        cal.update({"global:3": 1.0}, {"global:3": 1.0})
    assert cal.scale("global:3") > 0.8


def test_adaptive_ceiling():
    a = AdaptiveLength(AdaptiveConfig(max_len=8))
    a.target_cost = CurveTarget().cost
    a.draft_ratio = 0.45
    assert a.ceiling(0.9) < 1.0  # a 0.5B draft of a 1.5B target on this CPU cannot pay
    a.draft_ratio = 0.0
    assert a.ceiling(0.999) > 1.3  # free, perfect drafts would
    assert a.ceiling(0.999, extra=5.0) < a.ceiling(0.999)


def test_catch_up_cost_counts_only_real_catch_up():
    draft = MarkovLM("d", sleep=0.0)
    st = draft.new_state()
    draft.sync(st, [1, 2, 3])
    assert catch_up_cost(draft, st, [1, 2, 3, 4, 5], 0.5) == 0.0  # a normal step
    assert catch_up_cost(draft, st, list(range(1, 60)), 0.5) > 1.0  # a long prefill
    assert catch_up_cost(draft, st, list(range(1, 60)), 0.0) == 0.0  # cost not measured yet


def _slow_draft_run(drafter_for, n: int = 400) -> tuple[list[int], list[int], int]:
    """Output, AR reference and draft-model calls after the first 60 tokens (when the drafter
    has measured that its draft model is too slow to ever pay)."""
    target = MarkovLM("target", sleep=0.001)
    draft = MarkovLM("draft", sleep=0.003, wrong=3)  # 3x the target step: can never pay
    prompt = [3, 9, 4, 1, 8]
    ref = _ar(target, prompt, n)
    d = drafter_for(draft)
    dec = SpeculativeDecoder(target, d)
    out: list[int] = []
    late = None
    for ev in dec.generate(prompt, GenerationConfig(max_tokens=n, ignore_eos=True)):
        out.extend(ev.tokens)
        if late is None and len(out) >= 60:
            late = draft.forward_calls
    d.close()
    return out, ref, draft.forward_calls - (late or 0)


def test_model_drafter_stops_probing_a_draft_that_cannot_pay():
    out, ref, late_calls = _slow_draft_run(lambda dr: ModelDrafter(dr, window=None))
    assert out == ref
    # the back-off offers probes after 8, 16, 32, 64, 128 idle steps: all refused (each would
    # cost a catch-up prefill of the draft cache plus its drafts)
    assert late_calls == 0, late_calls


def test_crossvocab_drafter_stops_probing_a_draft_that_cannot_pay():
    out, ref, late_calls = _slow_draft_run(lambda dr: CrossVocabDrafter(dr, window=None))
    assert out == ref
    assert late_calls == 0, late_calls


def _hybrid_model_runs(draft_step_s: float, context_len: int, calls: int = 300) -> int:
    """Steps (of ``calls``) in which the hybrid would run its draft model, on the CPU curve."""
    target, draft = MarkovLM("target", 0.0), MarkovLM("draft", 0.0)
    target.cost = CurveTarget().cost
    draft.cost.observe(1, draft_step_s)
    h = HybridDrafter(draft, None, HybridConfig(window=None))
    ctx = [i % 40 for i in range(context_len)]
    h.start(target, ctx)
    return sum(h.model_length(1.0, ctx) > 0 for _ in range(calls))


def test_hybrid_keeps_an_unpaying_model_off():
    # a 0.5B draft of a 1.5B target (45% of a target step): never run, not even probed
    assert _hybrid_model_runs(0.0225, 50) == 0
    # a nearly free draft is probed (or run)...
    assert _hybrid_model_runs(0.0005, 50) > 0
    # ...but not when its cache first has to prefill a long context it fell behind on
    assert _hybrid_model_runs(0.0005, 2000) == 0


def test_small_and_numpy_tries_agree():
    import numpy as np

    from speclive.drafting.retrieval import _count_tree_numpy, _count_tree_small

    rng = np.random.default_rng(0)
    for trial in range(200):
        s, d = int(rng.integers(0, 20)), int(rng.integers(1, 17))
        c = rng.integers(0, 4, (s, d)).astype(np.int32)
        for r in range(s):
            c[r, int(rng.integers(0, d + 1)) :] = -1  # rows end early, some at once
        w = None if trial % 2 else rng.random(s)
        a, b = _count_tree_small(c, w), _count_tree_numpy(c, w)
        for f in ("tokens", "parents", "depth"):
            assert getattr(a, f).tolist() == getattr(b, f).tolist(), (trial, f)
        assert np.allclose(a.counts, b.counts) and a.total == pytest.approx(b.total)


def test_survival_controller_learns_bursty_copies():
    """Drafts that are either copied whole or rejected at once: the survival estimate sees
    that a draft surviving its first token survives to the end, and drafts long."""
    surv = AdaptiveLength(AdaptiveConfig(max_len=16, prior_alpha=0.6, survival=True))
    surv.target_cost = CurveTarget().cost
    for i in range(60):
        surv.update(15, 15 if i % 2 else 0)
    assert surv.survival_curve()[0] == pytest.approx(0.5, abs=0.1)
    assert surv.survival_curve()[14] > 0.4  # nearly everything past depth 1 survives
    assert surv.best_length() >= 12
    # a drafter whose copies break at a fixed depth learns to stop there
    edit = AdaptiveLength(AdaptiveConfig(max_len=16, prior_alpha=0.9, survival=True))
    edit.target_cost = CurveTarget().cost
    for _ in range(60):
        edit.update(15, 3)
    assert edit.survival_curve()[2] > 0.8 and edit.survival_curve()[3] < 0.2
    assert edit.best_length() == 3
    # the geometric model cannot represent "always breaks at depth 4": it drafts past it
    geo = AdaptiveLength(AdaptiveConfig(max_len=16, prior_alpha=0.9))
    geo.target_cost = CurveTarget().cost
    for _ in range(60):
        geo.update(15, 3)
    assert geo.best_length() != 3
