"""Previous-output drafter: the last answer to a shorter input drafts the answer to the longer one.

Streaming sessions (SSBD re-translation, PredGen input-time speculation) regenerate their
output every time the input grows, and the new output mostly repeats the old one. This drafter
turns that into drafts at no model cost:

1. **First step: the whole previous output** (``source="history"``), verified in one target
   pass. Sessions pair it with a rule that may bias acceptance towards it (SSBD eq. 5 via
   ``SourceRule``) or accept it from the target's top-k (PredGen).
2. **After the first divergence: recycling.** The old output often resumes a few tokens after
   the point where the new one departs from it (a word inserted, a phrase reordered). An
   ``NgramDrafter`` over ``previous output + [separator] + context`` finds the longest match of
   what has been produced since and proposes what followed it (``source="recycled"``);
   recycled drafts are verified losslessly unless a session's rule says otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

from speclive.backends.base import Backend
from speclive.drafting.base import AdaptiveConfig, Drafter
from speclive.drafting.ngram import NgramDrafter
from speclive.drafting.tree import DraftTree

#: never a real token id: keeps matches from running across the history/context boundary
_SEPARATOR = -1


class HistoryDrafter(Drafter):
    name = "history"

    def __init__(self, recycle: bool = True, max_history: int = 1024):
        super().__init__(AdaptiveConfig(fixed=True, max_len=max_history))
        self.history: list[int] = []
        self.forced = 0
        self.max_history = max_history
        self.recycler = NgramDrafter() if recycle else None
        self._first = True
        self._recycled = False

    def set_history(self, tokens: Sequence[int], forced: int = 0) -> None:
        """The previous output (token ids, without end-of-sequence) to draft from.

        The first ``forced`` tokens are tagged ``forced`` instead of ``history``, for a rule
        that accepts them without looking (PredGen's reflection verifier).
        """
        self.history = [int(t) for t in tokens][: self.max_history]
        self.forced = max(0, min(int(forced), len(self.history)))

    def bind(self, target: Backend) -> None:
        super().bind(target)
        if self.recycler is not None:
            self.recycler.bind(target)

    def begin(self, context: Sequence[int]) -> None:
        self._first = True
        if self.recycler is not None:
            self.recycler.begin([*self.history, _SEPARATOR, *context])

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        self._recycled = False
        if self._first:
            self._first = False
            if self.history:
                tree = DraftTree.chain(self.history[:budget], source="history")
                if tree.sources is not None:
                    tree.sources[: self.forced] = ["forced"] * min(self.forced, len(tree))
                return tree
        if self.recycler is None or not self.history:
            return DraftTree()
        tree = self.recycler.propose([*self.history, _SEPARATOR, *context], budget)
        toks = tree.tokens
        if _SEPARATOR in toks:
            toks = toks[: toks.index(_SEPARATOR)]
        if not toks:
            return DraftTree()
        self._recycled = True
        return DraftTree.chain(toks, source="recycled")

    def feedback(self, tree: DraftTree, accepted_nodes: Sequence[int], bonus: int) -> None:
        if self._recycled and self.recycler is not None:
            self.recycler.feedback(tree, accepted_nodes, bonus)

    def observe_step(self, drafted: int, seconds: float, committed: int = 1) -> None:
        if self._recycled and self.recycler is not None:
            self.recycler.observe_step(drafted, seconds, committed)
