"""Retrieval trees: frequency-counted continuation tries, calibration and cost-aware selection.

Pieces shared by the suffix and hybrid drafters (Talon's retrieval tree T_r and its fusion):

- ``RequestIndex`` — the per-request store: every ``min_n``-gram of prompt + output so far
  indexes where it ended; a lookup extends each occurrence backwards to find the longest
  matching suffix (Algorithm 1's first non-empty ℓ) and returns what followed *all* occurrences
  of that length.
- ``count_tree`` — counts continuations into a trie (Algorithm 1's (t_j, f_j) pairs turned into
  a tree whose node counts are the occurrence frequencies); ``top_nodes`` prunes it to the ``m``
  most frequent nodes (a node is never more frequent than its parent, so the result is a tree).
- ``Calibrator`` — empirical path probabilities (count / matches) overstate acceptance for short
  matches and understate it for long ones; per (source, match-length bucket) it learns the ratio
  of accepted nodes to predicted ones and rescales.
- ``Candidates`` — fuses several scored trees by longest-prefix matching (a node reached by
  several trees keeps the highest score), then ``select`` picks the node set maximising
  expected tokens per unit time, ``(1 + Σ P_i) / (r(n + 1) + c_draft)`` with r the target's
  measured verification-cost curve — on a CPU where 8 verified tokens cost 5.6 single steps a
  fixed-size tree would lose, so the tree is only as large as it pays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from speclive.drafting.datastore import SEP
from speclive.drafting.tree import DraftTree

#: match-length bucket lower bounds used to calibrate retrieval scores
BUCKETS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def bucket(length: int) -> int:
    return max((b for b in BUCKETS if b <= length), default=BUCKETS[0])


class RequestIndex:
    """Suffix matches within one request's own tokens (prompt + output so far)."""

    def __init__(self, min_n: int = 2, max_len: int = 32, max_candidates: int = 64):
        self.min_n, self.max_len, self.max_candidates = min_n, max_len, max_candidates
        self.ctx: list[int] = []
        self._index: dict[tuple[int, ...], list[int]] = {}
        #: tokens of the request's prompt (the context at ``reset``)
        self.prompt_len = 0
        #: where the continuation of each row of the last ``lookup`` starts in ``ctx``
        self.last_starts: list[int] = []

    def reset(self, context: Sequence[int]) -> None:
        self.ctx, self._index = [], {}
        self.prompt_len = len(context)
        self.sync(context)

    def sync(self, context: Sequence[int]) -> None:
        ctx = self.ctx
        if len(context) < len(ctx) or (ctx and int(context[len(ctx) - 1]) != ctx[-1]):
            self.reset(context)
            return
        n = self.min_n
        for j in range(len(ctx), len(context)):
            ctx.append(int(context[j]))
            if j + 1 >= n:  # the n-gram ending at j; its continuation starts at j + 1
                self._index.setdefault(tuple(ctx[j + 1 - n : j + 1]), []).append(j)

    def lookup(self, depth: int) -> tuple[int, np.ndarray]:
        """(longest match length, int32[s, depth] continuations of all occurrences of that length)."""
        ctx, n = self.ctx, self.min_n
        end = len(ctx) - 1
        empty = np.zeros((0, depth), dtype=np.int32)
        self.last_starts = []
        if end < n:
            return 0, empty
        ends = self._index.get(tuple(ctx[end + 1 - n :]))
        if not ends:
            return 0, empty
        best, found = 0, []
        for j in reversed(ends[-self.max_candidates - 1 :]):
            if j >= end:
                continue
            m = n
            while m < self.max_len and j - m >= 0 and ctx[j - m] == ctx[end - m]:
                m += 1
            if m > best:
                best, found = m, [j]
            elif m == best:
                found.append(j)
        if not found:
            return 0, empty
        out = np.full((len(found), depth), SEP, dtype=np.int32)
        self.last_starts = [j + 1 for j in found]
        for r, j in enumerate(found):
            seg = ctx[j + 1 : j + 1 + depth]
            out[r, : len(seg)] = seg
        return best, out


@dataclass
class CountTree:
    """A continuation trie: flat arrays, parents before children, ``counts`` = occurrences."""

    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    parents: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    depth: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    total: float = 0.0  # number of continuations counted (the root's count)

    def __len__(self) -> int:
        return len(self.tokens)

    def edge_probs(self, prior: float = 1.0, deep_prior: float = 0.1) -> np.ndarray:
        """P(child | parent) with pseudo-counts of "something else": ``prior`` at the first level
        (does the match continue at all?), ``deep_prior`` below it.

        The same pseudo-count at every level would score a continuation seen once at
        (1/(1+prior))^depth: 0.5^d, while such copies are accepted ~90 % per token on code
        (the n-gram drafter measures it); one occurrence is evidence for the whole run.
        """
        root = self.parents < 0
        parent_count = np.where(root, self.total, self.counts[np.maximum(self.parents, 0)])
        return self.counts / (parent_count + np.where(root, prior, deep_prior))


#: at most this many continuation cells are counted in plain Python (NumPy's per-call overhead
#: dominates small tries: a per-request lookup has a handful of rows)
SMALL_TRIE_CELLS = 512


def count_tree(conts: np.ndarray, weights: np.ndarray | None = None) -> CountTree:
    """Count the rows of ``conts`` (``SEP`` ends a row) into a trie, level by level.

    Nodes are numbered level by level, within a level by (parent, token).
    """
    if conts.size <= SMALL_TRIE_CELLS:
        return _count_tree_small(conts, weights)
    return _count_tree_numpy(conts, weights)


def _count_tree_small(conts: np.ndarray, weights: np.ndarray | None = None) -> CountTree:
    rows = conts.tolist()
    w = [1.0] * len(rows) if weights is None else [float(x) for x in weights]
    total = float(sum(w)) if rows else 0.0
    toks: list[int] = []
    pars: list[int] = []
    cnts: list[float] = []
    deps: list[int] = []
    parent = [-1] * len(rows)
    alive = list(range(len(rows)))
    depth = conts.shape[1] if conts.ndim == 2 else 0
    for k in range(depth):
        alive = [r for r in alive if rows[r][k] >= 0]
        if not alive:
            break
        level: dict[tuple[int, int], float] = {}
        for r in alive:
            key = (parent[r], rows[r][k])
            level[key] = level.get(key, 0.0) + w[r]
        base = len(toks)
        where = {}
        for j, key in enumerate(sorted(level)):
            where[key] = base + j
            pars.append(key[0])
            toks.append(key[1])
            cnts.append(level[key])
            deps.append(k)
        for r in alive:
            parent[r] = where[(parent[r], rows[r][k])]
    return CountTree(
        np.asarray(toks, dtype=np.int64),
        np.asarray(pars, dtype=np.int64),
        np.asarray(cnts, dtype=np.float64),
        np.asarray(deps, dtype=np.int64),
        total,
    )


def _count_tree_numpy(conts: np.ndarray, weights: np.ndarray | None = None) -> CountTree:
    s = conts.shape[0]
    w = np.ones(s) if weights is None else np.asarray(weights, dtype=np.float64)
    total = float(w.sum()) if s else 0.0
    if s == 0:
        return CountTree(total=total)
    parent = np.full(s, -1, dtype=np.int64)
    alive = np.ones(s, dtype=bool)
    big = np.int64(1) << 32
    toks, pars, cnts, deps = [], [], [], []
    n = 0
    for k in range(conts.shape[1]):
        col = conts[:, k].astype(np.int64)
        alive &= col >= 0
        if not alive.any():
            break
        keys = (parent[alive] + 1) * big + col[alive]
        uniq, inv = np.unique(keys, return_inverse=True)
        toks.append(uniq % big)
        pars.append(uniq // big - 1)
        cnts.append(np.bincount(inv, weights=w[alive]))
        deps.append(np.full(len(uniq), k, dtype=np.int64))
        parent[alive] = n + inv
        n += len(uniq)
    if not toks:  # every continuation ended at once (matches at the ends of documents)
        return CountTree(total=total)
    return CountTree(
        np.concatenate(toks), np.concatenate(pars), np.concatenate(cnts), np.concatenate(deps), total
    )


def top_nodes(tree: CountTree, m: int) -> list[int]:
    """The ``m`` most frequent nodes (ties: shallower first), closed under parent, increasing."""
    if len(tree) <= m:
        return list(range(len(tree)))
    order = np.lexsort((np.arange(len(tree)), tree.depth, -tree.counts))
    return sorted(int(i) for i in order[:m])


class Calibrator:
    """Learned ratio of accepted to predicted draft nodes per key (EMA of both sums).

    Keys are ``"store:bucket"``; every update also feeds the store's own key (``"store"``),
    and a bucket not seen yet borrows its store's ratio instead of the prior: a store whose
    drafts keep failing (the corpus store on chat) is not retried afresh in every new bucket.
    The first updates of a key are averaged (weight 1/(n+1), the prior counting as one
    observation) before the EMA takes over, so one verification already moves the ratio.
    """

    def __init__(self, ema: float = 0.1, floor: float = 0.05, ceil: float = 1.5, prior: float = 1.0):
        self.ema, self.floor, self.ceil, self.prior = ema, floor, ceil, prior
        self._acc: dict[str, float] = {}
        self._pred: dict[str, float] = {}
        self._n: dict[str, int] = {}

    def _ratio(self, key: str) -> float | None:
        pred = self._pred.get(key)
        return min(self.ceil, max(self.floor, self._acc[key] / pred)) if pred else None

    def scale(self, key: str) -> float:
        r = self._ratio(key)
        if r is None and ":" in key:
            r = self._ratio(key.split(":", 1)[0])
        return self.prior if r is None else r

    def update(self, predicted: dict[str, float], accepted: dict[str, float]) -> None:
        pooled_pred: dict[str, float] = {}
        pooled_acc: dict[str, float] = {}
        for key, pred in predicted.items():
            if pred <= 0:
                continue
            self._step(key, pred, accepted.get(key, 0.0))
            if ":" in key:
                store = key.split(":", 1)[0]
                pooled_pred[store] = pooled_pred.get(store, 0.0) + pred
                pooled_acc[store] = pooled_acc.get(store, 0.0) + accepted.get(key, 0.0)
        for store, pred in pooled_pred.items():
            self._step(store, pred, pooled_acc[store])

    def _step(self, key: str, pred: float, acc: float) -> None:
        n = self._n.get(key, 0)
        if n == 0:  # the prior ratio (borrowed from the store where known) as one observation
            start = self.scale(key)
            self._pred[key], self._acc[key] = pred, pred * start
        e = max(self.ema, 1.0 / (n + 2))
        self._n[key] = n + 1
        self._pred[key] = (1 - e) * self._pred[key] + e * pred
        self._acc[key] = (1 - e) * self._acc[key] + e * acc

    def snapshot(self) -> dict[str, float]:
        return {k: round(self.scale(k), 3) for k in sorted(self._pred)}

    def state(self) -> dict[str, dict[str, float]]:
        """The learned sums per key (JSON-able; ``load_state`` restores them)."""
        return {k: {"acc": self._acc[k], "pred": self._pred[k], "n": self._n.get(k, 0)} for k in self._pred}

    def load_state(self, data: dict[str, dict[str, float]]) -> None:
        acc, pred, n = {}, {}, {}
        for k, v in data.items():
            a, p, c = float(v["acc"]), float(v["pred"]), int(v["n"])
            if a < 0 or p <= 0 or c < 0:
                raise ValueError(f"bad calibration entry {k!r}: {v}")
            acc[str(k)], pred[str(k)], n[str(k)] = a, p, c
        self._acc, self._pred, self._n = acc, pred, n


class Candidates:
    """Scored candidate nodes of several trees fused by longest-prefix matching."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.score: list[float] = []  # calibrated probability that the path to the node is accepted
        self.raw: list[float] = []  # the same before calibration (what the calibrator learns from)
        self.q: list[float] = []  # draft probability of the node's token given its parent
        self.key: list[str] = []  # calibration key of the tree that first proposed the node
        self.source: list[str] = []
        #: root-anchored chains whose accepted prefix their drafter wants reported (name -> nodes)
        self.chains: dict[str, list[int]] = {}
        #: nodes a source asks to verify when nothing else is selected (its own probe)
        self.probe: list[int] = []
        self._child: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def add(
        self,
        tokens: Sequence[int],
        parents: Sequence[int],
        path_probs: Sequence[float],
        edge_probs: Sequence[float],
        key: str,
        source: str,
        scale: float = 1.0,
    ) -> list[int]:
        """Fuse one tree (raw path probabilities, calibrated here by ``scale``) into the set.

        A node already present keeps its place; if the new tree scores it higher, the node is
        attributed to the new tree (score, calibration key, source).
        """
        where: dict[int, int] = {}
        for i, (t, p) in enumerate(zip(tokens, parents, strict=True)):
            parent = -1 if p < 0 else where[p]
            raw = float(path_probs[i])
            score = min(1.0, scale * raw)
            j = self._child.get((parent, int(t)))
            if j is None:
                j = len(self.tokens)
                self._child[(parent, int(t))] = j
                self.tokens.append(int(t))
                self.parents.append(parent)
                self.score.append(score)
                self.raw.append(raw)
                self.q.append(float(edge_probs[i]))
                self.key.append(key)
                self.source.append(source)
            elif score > self.score[j]:
                self.score[j], self.raw[j], self.key[j], self.source[j] = score, raw, key, source
                self.q[j] = max(self.q[j], float(edge_probs[i]))
            where[i] = j
        return [where[i] for i in range(len(tokens))]

    def add_chain(
        self, tokens: Sequence[int], probs: Sequence[float], scale: float, key: str, source: str
    ) -> list[int]:
        path, acc = [], 1.0
        for p in probs:
            acc *= float(p)
            path.append(acc)
        return self.add(tokens, list(range(-1, len(tokens) - 1)), path, probs, key, source, scale)

    def add_counts(
        self, tree: CountTree, keep: Sequence[int], prior: float, scale: float, key: str, source: str
    ) -> list[int]:
        sub = {old: new for new, old in enumerate(keep)}
        edge = tree.edge_probs(prior)
        toks, pars, path, qs = [], [], [], []
        for old in keep:
            p = int(tree.parents[old])
            toks.append(int(tree.tokens[old]))
            pars.append(-1 if p < 0 else sub[p])
            parent_path = 1.0 if p < 0 else path[sub[p]]
            path.append(parent_path * float(edge[old]))
            qs.append(float(edge[old]))
        return self.add(toks, pars, path, qs, key, source, scale)

    def select(
        self,
        budget: int,
        cost: Callable[[int], float],
        draft_cost: float = 0.0,
        max_leaves: int | None = None,
        min_gain: float = 1.0,
        force: int = 0,
    ) -> tuple[list[int], float]:
        """Nodes to verify (parents first) and their expected gain over one AR step.

        Nodes enter by decreasing score; the prefix of that order maximising
        ``(1 + Σ score) / (cost(n + 1) + draft_cost)`` wins if its gain is at least ``min_gain``
        (else nothing, unless ``force`` > 0 asks for that many nodes: a probe, returned with gain 0).
        """
        if budget <= 0 or not self.tokens:
            return [], 1.0 / (1.0 + draft_cost)
        depth: list[int] = []
        for p in self.parents:
            depth.append(0 if p < 0 else depth[p] + 1)
        order = sorted(range(len(self.tokens)), key=lambda i: (-self.score[i], depth[i], i))
        chosen: list[int] = []
        in_tree: set[int] = set()
        child_count: dict[int, int] = {}
        leaves = 0
        total = 1.0
        best_n, best_gain = 0, 1.0 / (cost(1) + draft_cost)
        for i in order:
            if len(chosen) >= budget:
                break
            p = self.parents[i]
            if p >= 0 and p not in in_tree:
                continue
            new_leaf = p < 0 or child_count.get(p, 0) > 0
            if max_leaves is not None and new_leaf and leaves >= max_leaves:
                continue
            chosen.append(i)
            in_tree.add(i)
            if new_leaf:
                leaves += 1
            if p >= 0:
                child_count[p] = child_count.get(p, 0) + 1
            total += self.score[i]
            gain = total / (cost(len(chosen) + 1) + draft_cost)
            if gain > best_gain:
                best_n, best_gain = len(chosen), gain
        if best_n == 0 or best_gain < min_gain:
            if force <= 0:
                return [], best_gain
            return sorted(chosen[: min(force, len(chosen))]), 0.0  # a probe: no expected gain
        return sorted(chosen[:best_n]), best_gain

    def tree(self, nodes: Sequence[int]) -> DraftTree:
        """The selected nodes as a ``DraftTree`` (probs = q, sources kept)."""
        where = {old: new for new, old in enumerate(nodes)}
        out = DraftTree()
        for old in nodes:
            p = self.parents[old]
            out.add(self.tokens[old], -1 if p < 0 else where[p], prob=self.q[old], source=self.source[old])
        return out
