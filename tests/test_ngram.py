"""Prompt-lookup drafter: longest-match retrieval and per-bucket adaptive lengths."""

from __future__ import annotations

from speclive.backends.base import CostModel
from speclive.drafting.base import AdaptiveConfig, AdaptiveLength, StepFeedback
from speclive.drafting.ngram import NGRAM_MAX_DRAFT, NgramDrafter


class _Target:
    """Only what a drafter reads from its target: the verification-cost curve (flat here)."""

    def __init__(self, ratio: float = 1.0, cost: CostModel | None = None):
        self.cost = cost or CostModel({1: 1.0, 64: ratio})


def test_longest_match_beats_latest_short_match():
    d = NgramDrafter()
    #             long passage 1 2 3 4 5 -> 6 ;  later the short 4 5 -> 9
    ctx = [1, 2, 3, 4, 5, 6, 7, 0, 4, 5, 9, 8, 0, 1, 2, 3, 4, 5]
    d.start(_Target(), ctx)
    m, start = d.match()
    assert m == 5 and ctx[start] == 6  # the 5-token match wins over the later 2-token one
    assert d.lookup(3) == [6, 7, 0]


def test_no_match_no_draft_and_rebuild_on_rewrite():
    d = NgramDrafter()
    d.start(_Target(), [1, 2, 3])
    assert len(d.propose([1, 2, 3], 8)) == 0
    # a rewritten context (not an extension) rebuilds the index
    tree = d.propose([5, 6, 7, 8, 5, 6, 7], 8)
    assert d.last_match == 3 and tree.tokens[:1] == [8]


def test_buckets_learn_separately():
    d = NgramDrafter(adaptive=AdaptiveLength(AdaptiveConfig(max_len=8)))
    d.start(_Target(ratio=1.0), [])  # free verification: any positive acceptance pays
    long_b, short_b = d.by_bucket[16], d.by_bucket[2]
    for _ in range(20):
        long_b.update(8, 8)
        short_b.update(8, 0)
    assert long_b.length() == 8
    assert short_b.alpha < 0.05 and long_b.alpha > 0.95


def _oracle_decode(
    d: NgramDrafter, target: _Target, prompt: list[int], truth: list[int]
) -> list[tuple[int, int]]:
    """Greedy oracle decoding of ``truth`` after ``prompt``: (drafted, accepted) per step."""
    ctx = list(prompt)
    d.start(target, ctx)
    steps = []
    pos = 0
    while pos < len(truth):
        tree = d.propose(ctx, max(0, len(truth) - pos - 1))
        path = tree.follow(truth[pos:])
        new = [tree.tokens[i] for i in path] + [truth[pos + len(path)]]
        if len(tree):
            d.feedback(StepFeedback(tree, path, new[-1]))
        steps.append((len(tree), len(path)))
        ctx += new
        pos += len(new)
    return steps


def test_cold_drafter_copies_a_long_prompt_passage_in_few_long_drafts():
    """A fresh drafter (no learned state) on an answer that repeats 60 prompt tokens verbatim:
    the long match against the prompt is drafted long from the first step, not grown."""
    from speclive.drafting.priors import cost_curve

    passage = list(range(1000, 1060))
    prompt = [1, 2, 3, *passage, 4, 5]
    # the answer starts with 16 tokens of the passage (cold: short drafts are fine while the
    # match is short), then copies the rest of it
    d = NgramDrafter()
    cold = _Target(cost=CostModel(cost_curve()))  # a cold llama.cpp target: the prior curve only
    steps = _oracle_decode(d, cold, prompt, passage + [7, 8, 9])
    # the first long draft comes as soon as the match reaches 8+ tokens (no growth 3, 4, 6, ...)
    first_long = next(i for i, s in enumerate(steps) if s[0] >= 12)
    assert sum(a + 1 for _, a in steps[:first_long]) <= 12, steps
    assert sum(a for d_, a in steps if d_ >= 12) >= 40, steps  # the copy goes in long drafts
    assert len(steps) <= 12, steps  # 63 tokens in at most 12 verification passes


def test_output_self_matches_have_their_own_controllers():
    d = NgramDrafter()
    prompt = [50, 51, 52]
    d.start(_Target(), prompt)
    # the answer repeats a phrase of its own: the match lies in the output, not the prompt
    ctx = prompt + [1, 2, 3, 4, 5, 9, 1, 2, 3, 4]
    tree = d.propose(ctx, 16)
    assert d.last_match >= 4
    if len(tree):
        d.feedback(StepFeedback(tree, [], 0))
    out_ctl = d.output_buckets[4]
    assert d._last_ctl is out_ctl and d.by_bucket[4] is not out_ctl
    # the calibrated prior trusts a copy of the prompt far more than a repetition of the output
    assert d.by_bucket[16].survival_curve()[7] > d.output_buckets[16].survival_curve()[7] + 0.3


def test_the_product_drafter_copies_whole_with_learned_survival():
    """`--drafter ngram` (``make_drafter``) is the survival-mode drafter with its calibrated copy
    priors, up to 64 tokens unless ``--max-draft`` says otherwise; on a curve where long passes
    cost little more per token than short ones, a long verbatim match drafts the copy whole."""
    from speclive.loader import make_drafter

    d = make_drafter("ngram", None)  # type: ignore[arg-type]
    assert isinstance(d, NgramDrafter)
    assert d.adaptive.cfg.survival and d.adaptive.cfg.max_len == NGRAM_MAX_DRAFT == 64
    assert all(c.cfg.survival and c.cfg.prior_survival is not None for c in d.by_bucket.values())
    assert make_drafter("ngram", None, max_len=8).by_bucket[16].cfg.max_len == 8  # type: ignore[arg-type, union-attr]
    # t(k)/t(1) measured on the AVX-512 host behind a 400-token prompt
    curve = CostModel({1: 1.0, 8: 2.82, 16: 2.99, 17: 4.24, 32: 4.77, 33: 5.44, 48: 6.35, 64: 7.57})
    passage = list(range(100, 170))
    ctx = [*passage, 7, 8, *passage[:20]]
    d.start(_Target(cost=curve), ctx)
    assert len(d.propose(ctx, 63)) >= 48
