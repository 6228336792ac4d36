"""Cross-vocabulary drafter: a draft model with another tokenizer drafts *text*.

The committed context (target token ids) is rendered to text, re-tokenized for the draft
model, drafted greedily, and the draft text re-tokenized for the target. The target still
verifies every token, so output is unchanged; only acceptance depends on how well the two
tokenizations line up. This lets SmolLM2-135M draft for Qwen, and Whisper tiny.en for base.

Boundary handling: the draft text is tokenized together with the last few committed target
tokens so that BPE merges across the boundary come out as the target would produce them, and
the final target token of a draft is dropped (it may be a cut-off word).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from speclive.backends.base import Backend
from speclive.drafting.base import AdaptiveConfig, AdaptiveLength, Drafter, DraftTarget
from speclive.drafting.model import DEFAULT_WINDOW, draft_chain, probe_cannot_pay, timed_sync, window_start
from speclive.drafting.tree import DraftTree
from speclive.errors import ConfigError
from speclive.tokenizer import Tokenizer


def retokenize(target: Tokenizer, context_tail: Sequence[int], text: str) -> list[int]:
    """Target token ids of ``text`` appended after ``context_tail``."""
    tail = list(context_tail)
    if tail:
        tail_text = target.decode(tail, skip_special_tokens=False)
        ids = target.encode(tail_text + text)
        if ids[: len(tail)] == tail:
            return ids[len(tail) :]
    return target.encode(text)


#: a switched-off cross-vocabulary drafter is not probed when even this acceptance would not pay
#: for its drafts plus the catch-up of its cache: re-tokenized drafts lose tokens at word
#: boundaries, so a cross-vocabulary draft's per-token acceptance stays below this ceiling
#: (the measured range: docs/coldstart.md, "Cross-vocabulary acceptance")
CEILING_ALPHA = 0.85


class CrossVocabDrafter(Drafter):
    name = "crossvocab"

    def __init__(
        self,
        draft: Backend,
        max_len: int = 16,
        threshold: float = 0.4,
        tail_tokens: int = 4,
        adaptive: AdaptiveLength | None = None,
        window: int | None = DEFAULT_WINDOW,
    ):
        if not 0.0 <= threshold < 1.0:
            raise ConfigError(f"confidence threshold must be in [0, 1), got {threshold}")
        if window is not None and window < 1:
            raise ConfigError(f"draft context window must be >= 1 token (or None), got {window}")
        super().__init__(adaptive or AdaptiveLength(AdaptiveConfig(max_len=max_len, prior_alpha=0.6)))
        self.draft = draft
        self.threshold = threshold
        self.tail_tokens = tail_tokens
        self.state = draft.new_state()
        self.window = window
        self._start = 0
        self.detail = f"draft={draft.name}"

    def start(self, target: DraftTarget, context: Sequence[int]) -> None:
        super().start(target, context)
        # the window (in target tokens, fixed per generation) keeps the draft's prefill short;
        # see drafting/model.py
        self._start = window_start(context, self.window)

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        assert self.target is not None, "start() the drafter on a target first"
        t_d, t_t = self.draft.cost.step_seconds(), self.target.cost.step_seconds()
        if t_d and t_t:
            # a draft token of the other vocabulary covers roughly one target token
            self.adaptive.draft_ratio = t_d / t_t
        k = min(budget, self.adaptive.length())
        if k <= 0:
            return DraftTree()
        tt: Tokenizer = self.target.tokenizer
        text = tt.decode(context[self._start :], skip_special_tokens=False)
        draft_ids = self.draft.tokenizer.encode(text)
        if not draft_ids:
            return DraftTree()
        if probe_cannot_pay(self.adaptive, self.draft, self.state, draft_ids, CEILING_ALPHA):
            return DraftTree()
        logits, oneoff = timed_sync(self.draft, self.state, draft_ids)
        self._oneoff_s += oneoff
        logits = logits[-1]
        # draft one token more than needed: the last target token is dropped below
        d = draft_chain(self.draft, self.state, logits, k + 1, self.threshold)
        if not d.tokens:
            return DraftTree()
        draft_text = self.draft.tokenizer.decode(d.tokens, skip_special_tokens=False)
        ids = retokenize(tt, context[-self.tail_tokens :], draft_text)
        ids = ids[:-1] if len(ids) > 1 else ids
        ids = list(itertools.takewhile(lambda t: 0 <= t < self.target.vocab_size, ids[:k]))
        return DraftTree.chain(ids, source=self.name)

    def close(self) -> None:
        self.draft.release(self.state)
