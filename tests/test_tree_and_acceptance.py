"""DraftTree structure and every acceptance rule on hand-built logits; speculative sampling is
checked statistically against the target distribution."""

from __future__ import annotations

import numpy as np
import pytest

from speclive.acceptance import (
    BiasedRule,
    GreedyRule,
    RatioRule,
    SpeculativeSamplingRule,
    TopKRule,
    make_rule,
    softmax,
)
from speclive.drafting.tree import DraftTree
from speclive.errors import ConfigError

V = 8


def _logits(*rows: dict[int, float]) -> np.ndarray:
    out = np.full((len(rows), V), -5.0, dtype=np.float32)
    for i, r in enumerate(rows):
        for t, v in r.items():
            out[i, t] = v
    return out


# ---- DraftTree ------------------------------------------------------------------------
def test_tree_structure():
    t = DraftTree()
    a = t.add(1, -1)
    b = t.add(2, a)
    t.add(3, a)
    t.add(4, -1)
    t.add(5, b)
    assert t.depths() == [0, 1, 1, 0, 2]
    assert sorted(map(tuple, t.paths())) == [(0, 1, 4), (0, 2), (3,)]
    m = t.ancestor_mask()
    assert m[4].tolist() == [True, True, False, False, True]
    assert m[3].tolist() == [False, False, False, True, False]
    assert not t.is_chain() and DraftTree.chain([1, 2, 3]).is_chain()
    assert t.find_child(a, 3) == 2 and t.find_child(-1, 9) == -1
    toks, pars = t.rooted(7)
    assert toks == [7, 1, 2, 3, 4, 5] and pars == [-1, 0, 1, 1, 0, 2]


def test_tree_merge_longest_prefix():
    model = DraftTree.chain([1, 2, 3], source="model")
    retr = DraftTree.chain([1, 2, 9, 9], source="suffix")
    retr.add(4, -1, source="suffix")
    m = model.merge(retr)
    # shared prefix 1,2 verified once; 9,9 hang under the shared 2; 4 is a new root child
    assert m.tokens == [1, 2, 3, 9, 9, 4]
    assert m.parents == [-1, 0, 1, 1, 3, -1]
    assert m.sources == ["model", "model", "model", "suffix", "suffix", "suffix"]


def test_subtree_needs_ancestors():
    t = DraftTree.chain([1, 2, 3])
    assert t.subtree([0, 1]).tokens == [1, 2]
    with pytest.raises(ValueError):
        t.subtree([0, 2])
    with pytest.raises(ValueError):
        t.add(5, 7)


# ---- deterministic rules ----------------------------------------------------------------
def test_greedy_accepts_to_first_mismatch():
    # verification tree: root 0 -> 1 (tok 3) -> 2 (tok 4) -> 3 (tok 6)
    toks, pars = [0, 3, 4, 6], [-1, 0, 1, 2]
    lg = _logits({3: 5}, {4: 5}, {5: 5}, {1: 5})
    v = GreedyRule().accept(toks, pars, lg)
    assert v.path == [0, 1, 2] and v.bonus == 5


def test_greedy_picks_matching_branch():
    toks, pars = [0, 2, 3, 4], [-1, 0, 0, 2]  # root children 2 and 3; 3 -> 4
    lg = _logits({3: 5}, {0: 1}, {4: 5}, {7: 5})
    v = GreedyRule().accept(toks, pars, lg)
    assert v.path == [0, 2, 3] and v.bonus == 7


def test_topk():
    toks, pars = [0, 3], [-1, 0]
    lg = _logits({1: 5, 2: 4, 3: 3}, {6: 5})
    assert TopKRule(3).accept(toks, pars, lg).path == [0, 1]
    v = TopKRule(2).accept(toks, pars, lg)
    assert v.path == [0] and v.bonus == 1
    with pytest.raises(ConfigError):
        TopKRule(0)


def test_biased_rule_matches_ssbd_eq5():
    toks, pars = [0, 2], [-1, 0]
    p_row = {1: np.log(0.5), 2: np.log(0.4)}
    lg = np.full((2, V), -1e9, dtype=np.float32)
    for t, v in p_row.items():
        lg[0, t] = v
    lg[1, 5] = 0.0
    # P'(2) = 0.8*0.4 + 0.2 = 0.52 > 0.8*0.5 = 0.40 -> accepted with beta 0.2
    assert BiasedRule(0.2).accept(toks, pars, lg).path == [0, 1]
    # beta 0 is greedy: 0.4 < 0.5 -> rejected, bonus = argmax
    v = BiasedRule(0.0).accept(toks, pars, lg)
    assert v.path == [0] and v.bonus == 1
    assert BiasedRule(0.0).lossless and not BiasedRule(0.2).lossless
    with pytest.raises(ConfigError):
        BiasedRule(1.0)


def test_ratio_rule():
    toks, pars = [0, 2, 3], [-1, 0, 0]
    lg = np.log(np.array([[0.05, 0.05, 0.3, 0.6, 1e-9, 1e-9, 1e-9, 1e-9]] * 3) + 1e-12).astype(np.float32)
    # q for node 1 (tok 2) = 0.9 -> ratio 0.33 < 0.5; node 2 (tok 3) q = 0.5 -> 1.2 >= 0.5
    v = RatioRule(0.5).accept(toks, pars, lg, probs=[1.0, 0.9, 0.5])
    assert v.path == [0, 2]


def test_make_rule_errors_name_allowed_values():
    assert isinstance(make_rule("greedy"), GreedyRule)
    assert make_rule("topk:5").k == 5
    with pytest.raises(ConfigError, match="allowed"):
        make_rule("bogus")
    with pytest.raises(ConfigError):
        make_rule("topk:x")


# ---- speculative sampling: lossless in distribution ------------------------------------------
@pytest.mark.parametrize("kind", ["chain-with-q", "tree-deterministic"])
def test_speculative_sampling_matches_target(kind):
    rng = np.random.default_rng(1)
    rule = SpeculativeSamplingRule(temperature=1.0)
    root_logits = rng.normal(size=V).astype(np.float32)
    p = rule.target_dist(root_logits)
    if kind == "chain-with-q":
        q = softmax(rng.normal(size=V))
        x = int(rng.choice(V, p=q))  # one iid draft from q
        toks, pars = [0, x], [-1, 0]
        dists = [None, q]
    else:  # three distinct deterministic children (point masses), tried in order
        toks, pars = [0, 1, 2, 3], [-1, 0, 0, 0]
        dists = None
    lg = np.tile(root_logits, (len(toks), 1))
    n = 40000
    if kind == "chain-with-q":  # noqa: SIM108
        # the draft token itself is random: average over fresh drafts from q
        counts = np.zeros(V)
        r2 = np.random.default_rng(2)
        for _ in range(n):
            x = int(r2.choice(V, p=q))
            v = rule.accept([0, x], [-1, 0], lg[:2], dists=[None, q], rng=r2)
            first = x if len(v.path) > 1 else v.bonus
            counts[first] += 1
    else:
        counts = np.zeros(V)
        r2 = np.random.default_rng(3)
        for _ in range(n):
            v = rule.accept(toks, pars, lg, dists=dists, rng=r2)
            first = toks[v.path[1]] if len(v.path) > 1 else v.bonus
            counts[first] += 1
    emp = counts / n
    tv = 0.5 * np.abs(emp - p).sum()
    assert tv < 0.015, (tv, emp, p)


def test_speculative_sampling_rejects_wrong_q_would_bias():
    """Sanity check of the statistical test: claiming the wrong q biases the output."""
    rng = np.random.default_rng(4)
    rule = SpeculativeSamplingRule(temperature=1.0)
    root = rng.normal(size=V).astype(np.float32)
    p = rule.target_dist(root)
    q_true = softmax(rng.normal(size=V) * 3)
    q_claimed = np.full(V, 1.0 / V)
    counts = np.zeros(V)
    r2 = np.random.default_rng(5)
    lg = np.tile(root, (2, 1))
    for _ in range(20000):
        x = int(r2.choice(V, p=q_true))
        v = rule.accept([0, x], [-1, 0], lg, dists=[None, q_claimed], rng=r2)
        counts[x if len(v.path) > 1 else v.bonus] += 1
    assert 0.5 * np.abs(counts / 20000 - p).sum() > 0.03
