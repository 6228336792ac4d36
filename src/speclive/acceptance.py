"""Acceptance rules: which part of a verified draft tree the target keeps.

Every rule walks the *verification tree* (node 0 = the last committed token, whose KV was
computed in the same pass; then the draft nodes) from the root, using the target's logits at
each node to pick at most one child to descend into, and returns the accepted path plus the
bonus token the target produces after the last accepted node.

- ``GreedyRule`` — lossless for greedy decoding: descend while a child equals the argmax.
- ``TopKRule`` — PredGen's relaxed check: a child is accepted if it is in the target's top-k.
- ``BiasedRule`` — SSBD eq. 5: P' = (1-β)P + β·onehot(draft); accept when the draft token is
  the argmax of P'.
- ``SpeculativeSamplingRule`` — lossless in distribution, over chains and trees: siblings are
  tried in order with the recursive rejection scheme (SpecInfer); a node with a stored draft
  distribution q is accepted with probability min(1, p/q) and the residual max(p-q, 0) becomes
  the new target; a deterministic draft (no q) counts as a point mass, so its token is accepted
  with probability p(x) and then removed from p. The bonus token is drawn from what remains.
- ``RatioRule`` — Talon: accept a node if p(x)/q(x) >= τ, siblings tried depth-first;
  q is the node's draft probability (1 for drafts that carry none).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from speclive.errors import ConfigError


@dataclass
class Verdict:
    path: list[int]  # accepted nodes of the verification tree, starting with node 0
    bonus: int  # the target's token after the last accepted node


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = logits.astype(np.float64) / max(temperature, 1e-6)
    z -= z.max()
    e = np.exp(z)
    return e / e.sum()


def _children(parents: Sequence[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    return kids


class AcceptanceRule(ABC):
    name = "rule"
    lossless = False

    @abstractmethod
    def accept(
        self,
        tokens: Sequence[int],
        parents: Sequence[int],
        logits: np.ndarray,
        probs: Sequence[float] | None = None,
        dists: Sequence[np.ndarray | None] | None = None,
        rng: np.random.Generator | None = None,
        sources: Sequence[str | None] | None = None,
    ) -> Verdict: ...


class WalkRule(AcceptanceRule):
    """A deterministic rule defined by which child (if any) it accepts at each node."""

    def accept(
        self,
        tokens: Sequence[int],
        parents: Sequence[int],
        logits: np.ndarray,
        probs: Sequence[float] | None = None,
        dists: Sequence[np.ndarray | None] | None = None,
        rng: np.random.Generator | None = None,
        sources: Sequence[str | None] | None = None,
    ) -> Verdict:
        kids = _children(parents)
        path = [0]
        cur = 0
        self._sources = sources
        while True:
            nxt = self.choose(cur, kids[cur], tokens, logits, probs)
            if nxt < 0:
                return Verdict(path, int(np.argmax(logits[cur])))
            path.append(nxt)
            cur = nxt

    @abstractmethod
    def choose(
        self,
        cur: int,
        kids: list[int],
        tokens: Sequence[int],
        logits: np.ndarray,
        probs: Sequence[float] | None,
    ) -> int:
        """The child of ``cur`` to accept, or -1."""


class GreedyRule(WalkRule):
    name = "greedy"
    lossless = True

    def choose(self, cur, kids, tokens, logits, probs):
        best = int(np.argmax(logits[cur]))
        for c in kids:
            if tokens[c] == best:
                return c
        return -1


class TopKRule(WalkRule):
    name = "topk"

    def __init__(self, k: int = 3):
        if k < 1:
            raise ConfigError(f"top-k acceptance needs k >= 1, got {k}")
        self.k = k

    def choose(self, cur, kids, tokens, logits, probs):
        row = logits[cur]
        if not kids:
            return -1
        kth = np.partition(row, -self.k)[-self.k] if self.k < row.shape[0] else -np.inf
        ok = [c for c in kids if row[tokens[c]] >= kth]
        return max(ok, key=lambda c: row[tokens[c]]) if ok else -1


class BiasedRule(WalkRule):
    name = "biased"

    def __init__(self, beta: float = 0.2):
        if not 0.0 <= beta < 1.0:
            raise ConfigError(f"bias beta must be in [0, 1), got {beta}")
        self.beta = beta

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.beta == 0.0

    def choose(self, cur, kids, tokens, logits, probs):
        if not kids:
            return -1
        p = softmax(logits[cur])
        order = np.argsort(p)[::-1]
        top1, top2 = int(order[0]), int(order[1])
        best, best_p = -1, -1.0
        for c in kids:
            t = tokens[c]
            rival = p[top2] if t == top1 else p[top1]
            if (1 - self.beta) * p[t] + self.beta >= (1 - self.beta) * rival and p[t] > best_p:
                best, best_p = c, p[t]
        return best


class ForcedRule(WalkRule):
    """Accept every draft child unconditionally (a decision made elsewhere, e.g. PredGen's
    self-reflection verifier judged the whole sentence consistent with the prompt)."""

    name = "forced"

    def choose(self, cur, kids, tokens, logits, probs):
        return kids[0] if kids else -1


class SourceRule(WalkRule):
    """Judge each draft node by the rule of the drafter that proposed it.

    SSBD biases verification towards the *previous output* only: nodes tagged ``history`` go
    through ``BiasedRule(β)`` while nodes from any other drafter (e.g. an n-gram continuation)
    stay under the lossless greedy rule. Children are tried in order; the first accepted wins.
    """

    name = "by-source"

    def __init__(self, rules: dict[str, WalkRule], default: WalkRule | None = None):
        self.rules = dict(rules)
        self.default = default or GreedyRule()
        self._sources: Sequence[str | None] | None = None

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.default.lossless and all(r.lossless for r in self.rules.values())

    def choose(self, cur, kids, tokens, logits, probs):
        srcs = self._sources
        for c in kids:
            rule = self.rules.get(srcs[c] or "", self.default) if srcs else self.default
            if rule.choose(cur, [c], tokens, logits, probs) == c:
                return c
        return -1


class RatioRule(WalkRule):
    name = "ratio"

    def __init__(self, tau: float = 0.3, temperature: float = 1.0):
        if tau <= 0:
            raise ConfigError(f"ratio threshold tau must be > 0, got {tau}")
        self.tau, self.temperature = tau, temperature

    def choose(self, cur, kids, tokens, logits, probs):
        if not kids:
            return -1
        p = softmax(logits[cur], self.temperature)
        for c in kids:
            q = 1.0 if probs is None else max(float(probs[c]), 1e-9)
            if p[tokens[c]] / q >= self.tau:
                return c
        return -1


class SpeculativeSamplingRule(AcceptanceRule):
    name = "sample"
    lossless = True  # in distribution

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0):
        if temperature <= 0:
            raise ConfigError("speculative sampling needs temperature > 0; use GreedyRule for 0")
        self.temperature = temperature
        self.top_p = top_p

    def target_dist(self, row: np.ndarray) -> np.ndarray:
        p = softmax(row, self.temperature)
        if self.top_p < 1.0:
            order = np.argsort(p)[::-1]
            csum = np.cumsum(p[order])
            cut = int(np.searchsorted(csum, self.top_p)) + 1
            keep = np.zeros_like(p)
            keep[order[:cut]] = p[order[:cut]]
            p = keep / keep.sum()
        return p

    def accept(self, tokens, parents, logits, probs=None, dists=None, rng=None, sources=None):
        rng = rng or np.random.default_rng()
        kids = _children(parents)
        path = [0]
        cur = 0
        while True:
            p = self.target_dist(logits[cur])
            nxt = -1
            for c in kids[cur]:
                x = tokens[c]
                q = None if dists is None else dists[c]
                if q is None:  # deterministic draft: point mass at x
                    if rng.random() < p[x]:
                        nxt = c
                        break
                    p = p.copy()
                    p[x] = 0.0
                else:
                    if rng.random() < min(1.0, p[x] / max(q[x], 1e-12)):
                        nxt = c
                        break
                    p = np.maximum(p - q, 0.0)
                s = p.sum()
                if s <= 0:  # numerically exhausted: fall back to the plain target
                    p = self.target_dist(logits[cur])
                else:
                    p = p / s
            if nxt < 0:
                return Verdict(path, int(rng.choice(p.shape[0], p=p)))
            path.append(nxt)
            cur = nxt


def make_rule(spec: str | None, temperature: float = 0.0) -> AcceptanceRule:
    """Build a rule from a short spec: greedy | topk:K | biased:B | ratio:T | sample."""
    spec = (spec or ("greedy" if temperature == 0 else "sample")).strip().lower()
    name, _, arg = spec.partition(":")
    try:
        if name == "greedy":
            return GreedyRule()
        if name == "topk":
            return TopKRule(int(arg or 3))
        if name == "biased":
            return BiasedRule(float(arg or 0.2))
        if name == "ratio":
            return RatioRule(float(arg or 0.3), temperature=temperature or 1.0)
        if name == "sample":
            return SpeculativeSamplingRule(temperature=temperature or 1.0)
    except ValueError as e:
        raise ConfigError(f"bad argument in acceptance rule {spec!r}: {e}") from None
    raise ConfigError(f"unknown acceptance rule {spec!r}; allowed: greedy, topk:K, biased:B, ratio:T, sample")
