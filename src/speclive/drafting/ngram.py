"""Prompt-lookup n-gram drafter: copy what followed the last occurrence of the context suffix.

Free to run (a dictionary lookup), so it pays whenever the output repeats the input or
itself: code edits, quoting, re-translation. The n-gram index is updated incrementally as
the context grows (O(max_n) per new token) instead of rescanning the context every step.
"""

from __future__ import annotations

from collections.abc import Sequence

from speclive.drafting.base import AdaptiveConfig, Drafter
from speclive.drafting.tree import DraftTree
from speclive.errors import ConfigError


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, max_n: int = 4, min_n: int = 2, adaptive: AdaptiveConfig | None = None):
        if not 1 <= min_n <= max_n:
            raise ConfigError(f"ngram drafter needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        super().__init__(adaptive or AdaptiveConfig(max_len=16, prior_alpha=0.5))
        self.max_n, self.min_n = max_n, min_n
        self._ctx: list[int] = []
        # n -> {ngram: start index of the token that followed its latest occurrence}
        self._index: dict[int, dict[tuple[int, ...], int]] = {}

    def begin(self, context: Sequence[int]) -> None:
        self._ctx = []
        self._index = {n: {} for n in range(self.min_n, self.max_n + 1)}
        self._sync(context)

    def _sync(self, context: Sequence[int]) -> None:
        ctx = self._ctx
        if len(context) < len(ctx) or (ctx and context[len(ctx) - 1] != ctx[-1]):
            self.begin(context)  # context was rewritten: rebuild
            return
        for j in range(len(ctx), len(context)):
            ctx.append(int(context[j]))
            # index every n-gram that now has a follower: the one ending at j-1, followed by j
            for n, table in self._index.items():
                if j - n >= 0:
                    table[tuple(ctx[j - n : j])] = j

    def lookup(self, k: int) -> list[int]:
        ctx = self._ctx
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(ctx) < n:
                continue
            start = self._index[n].get(tuple(ctx[-n:]))
            if start is not None:
                return ctx[start : start + k]
        return []

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        self._sync(context)
        k = min(budget, self.adaptive.length())
        if k <= 0:
            return DraftTree()
        return DraftTree.chain(self.lookup(k), source=self.name)
