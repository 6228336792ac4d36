"""Prompt-lookup drafter: longest-match retrieval and per-bucket adaptive lengths."""

from __future__ import annotations

from speclive.backends.base import CostModel
from speclive.drafting.base import AdaptiveConfig
from speclive.drafting.ngram import NgramDrafter


class _Target:
    """Only what a drafter reads from its target: the verification-cost curve (flat here)."""

    def __init__(self, ratio: float = 1.0):
        self.cost = CostModel({1: 1.0, 64: ratio})


def test_longest_match_beats_latest_short_match():
    d = NgramDrafter()
    d.bind(_Target())
    #             long passage 1 2 3 4 5 -> 6 ;  later the short 4 5 -> 9
    ctx = [1, 2, 3, 4, 5, 6, 7, 0, 4, 5, 9, 8, 0, 1, 2, 3, 4, 5]
    d.begin(ctx)
    m, start = d.match()
    assert m == 5 and ctx[start] == 6  # the 5-token match wins over the later 2-token one
    assert d.lookup(3) == [6, 7, 0]


def test_no_match_no_draft_and_rebuild_on_rewrite():
    d = NgramDrafter()
    d.bind(_Target())
    d.begin([1, 2, 3])
    assert len(d.propose([1, 2, 3], 8)) == 0
    # a rewritten context (not an extension) rebuilds the index
    tree = d.propose([5, 6, 7, 8, 5, 6, 7], 8)
    assert d.last_match == 3 and tree.tokens[:1] == [8]


def test_buckets_learn_separately():
    d = NgramDrafter(adaptive=AdaptiveConfig(max_len=8))
    d.bind(_Target(ratio=1.0))  # free verification: any positive acceptance pays
    long_b, short_b = d.by_bucket[16], d.by_bucket[2]
    for _ in range(20):
        long_b.update(8, 8)
        short_b.update(8, 0)
    assert long_b.length() == 8
    assert short_b.alpha < 0.05 and long_b.alpha > 0.95

