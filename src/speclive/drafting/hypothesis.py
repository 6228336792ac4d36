"""Previous-pass drafter: streaming ASR's last hypotheses draft the next pass over the same audio.

A streaming recognizer transcribes the growing buffer again and again; each pass mostly repeats
the one before and adds the newest words. This drafter proposes, at no model cost:

1. **The remaining tokens of each earlier hypothesis that the output still follows**, ending with
   end-of-text (``source="previous"``). With one hypothesis this is a chain; when the last two
   disagree it is a tree, one branch each, merged on their common prefix. The whole rest is
   proposed at once: a hypothesis that holds is then verified in ONE target pass, and a pass
   over audio that only gained silence (the final pass) costs one pass in all.
2. **Re-alignment after a divergence** (``source="realigned"``): a word changed or was inserted,
   and the old hypothesis resumes after it. The last tokens produced are looked up in each
   hypothesis (the longest match of up to ``max_match`` tokens; a single token only near its
   aligned position) and what followed them there is proposed (after a match of one or two
   tokens at most ``realigned_len`` tokens).
3. **Otherwise the tail drafter** (``tail``, e.g. SpecASR's drafter) for the words no earlier
   pass heard; without one the target decodes them one step at a time.

Verification is the decoder's greedy rule, so the transcript is the plain greedy transcript of
the pass's audio whatever is drafted.
"""

from __future__ import annotations

from collections.abc import Sequence

from speclive.drafting.base import Drafter, DraftTarget, StepFeedback
from speclive.drafting.tree import DraftTree


class HypothesisDrafter(Drafter):
    name = "previous-pass"

    def __init__(
        self, tail: Drafter | None = None, max_match: int = 4, window: int = 2, realigned_len: int = 8
    ):
        super().__init__(None)
        self.tail = tail
        self.max_match = max_match
        #: most tokens proposed after a re-alignment on fewer than three tokens (it may be
        #: chance: a long proposal would cost verification rows that are likely rejected)
        self.realigned_len = realigned_len
        #: a one-token match counts only this close to its aligned position
        self.window = window
        self.hypotheses: list[list[int]] = []
        self._start = 0
        self._from_tail = False

    def set_hypotheses(self, hypotheses: Sequence[Sequence[int]], eos: int | None = None) -> None:
        """The earlier passes' token ids (newest first, without end-of-text); ``eos`` is
        appended to each, so a pass that ends where an earlier one ended needs no extra step."""
        out: list[list[int]] = []
        for h in hypotheses:
            ids = [int(t) for t in h]
            if eos is not None:
                ids.append(int(eos))
            if ids and ids not in out:
                out.append(ids)
        self.hypotheses = out

    def start(self, target: DraftTarget, context: Sequence[int]) -> None:
        super().start(target, context)
        self._start = len(context)
        self._from_tail = False
        if self.tail is not None:
            self.tail.start(target, context)

    def _realign(self, hyp: list[int], produced: Sequence[int]) -> tuple[int, int] | None:
        """Index in ``hyp`` right after the longest match of the end of ``produced``, and the
        match's length."""
        pos = len(produced)
        for n in range(min(self.max_match, pos), 0, -1):
            key = list(produced[pos - n :])
            best: int | None = None
            for j in range(n, len(hyp)):
                if hyp[j - n : j] != key:
                    continue
                if n == 1 and abs(j - pos) > self.window:
                    continue
                if best is None or abs(j - pos) < abs(best - pos):
                    best = j
            if best is not None:
                return best, n
        return None

    def _branches(self, produced: Sequence[int]) -> list[tuple[list[int], str]]:
        pos = len(produced)
        out: list[tuple[list[int], str]] = []
        for h in self.hypotheses:
            if pos < len(h) and h[:pos] == list(produced):
                out.append((h[pos:], "previous"))
                continue
            found = self._realign(h, produced)
            if found is not None and found[0] < len(h):
                j, n = found
                # a long match re-aligns for sure: the whole rest; a short one may be chance
                end = len(h) if n >= 3 else j + self.realigned_len
                out.append((h[j:end], "realigned"))
        return out

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        self._from_tail = False
        if budget <= 0:
            return DraftTree()
        produced = context[self._start :]
        tree = DraftTree()
        for tokens, source in self._branches(produced):
            branch = DraftTree.chain(tokens, source=source)
            tree = branch if not tree.tokens else tree.merge(branch)
        if tree.tokens:
            return tree.truncated(budget)
        if self.tail is None:
            return DraftTree()
        self._from_tail = True
        return self.tail.propose(context, budget)

    def feedback(self, step: StepFeedback) -> None:
        if self._from_tail and self.tail is not None:
            self.tail.feedback(step)

    def end(self) -> None:
        if self.tail is not None:
            self.tail.end()

    def close(self) -> None:
        if self.tail is not None:
            self.tail.close()
