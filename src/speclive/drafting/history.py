"""Previous-output drafter: the last answer to a shorter input drafts the answer to the longer one.

Streaming sessions (SSBD re-translation, PredGen input-time speculation) regenerate their
output every time the input grows, and the new output mostly repeats the old one. This drafter
turns that into drafts at no model cost:

1. **The previous output, while the new output follows it** (``source="history"``). The paper
   (SSBD Algorithm 1) verifies the whole previous output in one pass (``chunked=False``). On a
   CPU a k-token verification costs many times one step (the cost curve grows almost linearly
   in k), so by default the previous output is drafted in *chunks* whose length an ``AdaptiveLength``
   controller picks from the measured cost curve and the measured acceptance; the next chunk
   continues as long as every token produced so far equals the previous output (accepted
   drafts, and bonus tokens that happen to agree). Sessions pair it with a rule that may bias
   acceptance towards it (SSBD eq. 5 via ``SourceRule``) or accept from the top-k (PredGen).
2. **After a divergence: recycling.** The old output often resumes a few tokens after the point
   where the new one departs from it (a word inserted, a phrase reordered). An ``NgramDrafter``
   over ``previous output + [separator] + context`` finds the longest match of what has been
   produced and proposes what followed it (``source="recycled"``), verified losslessly unless a
   session's rule says otherwise.

An engine that verifies one draft per request (vLLM) takes the whole previous output at once:
``prepared_draft``.
"""

from __future__ import annotations

from collections.abc import Sequence

from speclive.drafting.base import AdaptiveConfig, AdaptiveLength, Drafter, DraftTarget, StepFeedback
from speclive.drafting.ngram import COPY_ADAPTIVE, NgramDrafter
from speclive.drafting.tree import DraftTree

#: never a real token id: keeps matches from running across the history/context boundary
_SEPARATOR = -1


class HistoryDrafter(Drafter):
    name = "history"

    def __init__(
        self,
        recycle: bool = True,
        chunked: bool = True,
        max_history: int = 1024,
        chunk: AdaptiveLength | None = None,
    ):
        # ``chunk``: the controller of the chunk lengths
        super().__init__(chunk or AdaptiveLength(AdaptiveConfig(max_len=64, prior_alpha=0.85)))
        self.chunked = chunked
        self.history: list[int] = []
        self.forced = self.first_chunk = 0
        self.max_history = max_history
        self.recycler = NgramDrafter(max_len=COPY_ADAPTIVE.max_len) if recycle else None
        self._start = 0
        self._last = ""  # source of the last proposal: "history", "recycled" or ""

    def set_history(self, tokens: Sequence[int], forced: int = 0, first_chunk: int = 0) -> None:
        """The previous output (token ids, without end-of-sequence) to draft from.

        The first ``forced`` tokens are tagged ``forced`` instead of ``history``, for a rule
        that accepts them without looking (PredGen's reflection verifier). The first chunk
        holds at least ``max(forced, first_chunk)`` tokens (PredGen verifies the whole first
        sentence in one pass: that is what decides whether its audio can play at once).
        """
        self.history = [int(t) for t in tokens][: self.max_history]
        self.forced = max(0, min(int(forced), len(self.history)))
        self.first_chunk = max(self.forced, int(first_chunk))

    def start(self, target: DraftTarget, context: Sequence[int]) -> None:
        super().start(target, context)
        self._start = len(context)
        if self.recycler is not None:
            self.recycler.start(target, [*self.history, _SEPARATOR, *context])

    def _chunk(self, pos: int, k: int) -> DraftTree:
        """``history[pos : pos + k]`` as a chain, its tokens before ``forced`` tagged "forced"."""
        tree = DraftTree.chain(self.history[pos : pos + k], source="history")
        if tree.sources is not None and pos < self.forced:
            n = min(self.forced - pos, len(tree))
            tree.sources[:n] = ["forced"] * n
        return tree

    def prepared_draft(self, budget: int) -> DraftTree:
        """The previous output as one chain (what fits in ``budget`` nodes; empty without one)."""
        return self._chunk(0, max(0, budget))

    def _aligned(self, produced: Sequence[int]) -> bool:
        n = len(produced)
        return n < len(self.history) and list(produced) == self.history[:n]

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        self._last = ""
        produced = context[self._start :]
        if self.history and self._aligned(produced):
            pos = len(produced)
            if self.chunked:
                k = self.adaptive.length()
                k = max(k, self.first_chunk - pos)  # forced tokens / a first sentence: one chunk
            else:
                k = len(self.history)
            k = min(k, budget, len(self.history) - pos)
            if k > 0:
                self._last = "history"
                return self._chunk(pos, k)
        if self.recycler is None or not self.history:
            return DraftTree()
        tree = self.recycler.propose([*self.history, _SEPARATOR, *context], budget)
        toks = tree.tokens
        if _SEPARATOR in toks:
            toks = toks[: toks.index(_SEPARATOR)]
        if not toks:
            return DraftTree()
        self._last = "recycled"
        return DraftTree.chain(toks, source="recycled")

    def feedback(self, step: StepFeedback) -> None:
        # the chunk controller learns from chunks of the previous output, the recycler from
        # its own drafts
        if self._last == "history" and self.chunked:
            super().feedback(step)
        elif self._last == "recycled" and self.recycler is not None:
            self.recycler.feedback(step)
