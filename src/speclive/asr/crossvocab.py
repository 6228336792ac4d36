"""Cross-vocabulary drafting between Whisper models (tiny.en -> base).

tiny.en and base tokenize English the same way but number their special tokens differently
(vocab 51,864 vs 51,865), and each needs its own decoder prompt. The committed target tokens
after the target's prompt are rendered to text, re-tokenized behind the *draft's* prompt, the
draft continues greedily (stopping at the first position whose top probability is below
``threshold``), and its text is re-tokenized for the target behind the last few committed
target tokens (``drafting.crossvocab.retokenize``). The last re-tokenized id is dropped (it may
be a cut-off word) unless the draft ended the transcript, in which case the target's
end-of-text id is appended. The draft runs its own encoder on the same audio.
"""

from __future__ import annotations

from collections.abc import Sequence

from speclive.asr.whisper import WhisperBackend
from speclive.backends.base import Backend
from speclive.drafting.base import AdaptiveConfig, Drafter
from speclive.drafting.crossvocab import retokenize
from speclive.drafting.model import draft_chain
from speclive.drafting.tree import DraftTree
from speclive.errors import ConfigError


class WhisperCrossVocabDrafter(Drafter):
    name = "crossvocab"

    def __init__(
        self,
        draft: WhisperBackend,
        max_len: int = 24,
        threshold: float = 0.4,
        fixed_len: int | None = None,
        tail_tokens: int = 4,
    ):
        if not 0.0 <= threshold < 1.0:
            raise ConfigError(f"confidence threshold must be in [0, 1), got {threshold}")
        n = fixed_len or max_len
        super().__init__(AdaptiveConfig(max_len=n, fixed=True))
        self.draft = draft
        self.max_len = n
        self.threshold = 0.0 if fixed_len else threshold
        self.tail_tokens = tail_tokens
        self.state = draft.new_state()
        self.detail = f"draft={draft.name}"
        self.draft_steps = 0

    def bind(self, target: Backend) -> None:
        super().bind(target)
        if not isinstance(target, WhisperBackend):
            raise ConfigError("the Whisper cross-vocabulary drafter needs a Whisper target")

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        target = self.target
        assert isinstance(target, WhisperBackend), "bind() the drafter to a Whisper target first"
        k = min(budget, self.max_len)
        if k <= 0:
            return DraftTree()
        out = list(context[target.prompt_len :])
        text = target.tokenizer.decode(out, skip_special_tokens=True)
        draft_ids = self.draft.specials.prompt + self.draft.tokenizer.encode(text)
        before = self.draft.forward_calls
        logits = self.draft.sync(self.state, draft_ids)[-1]
        d = draft_chain(self.draft, self.state, logits, k + 1, self.threshold)
        self.draft_steps += self.draft.forward_calls - before
        toks = d.tokens
        ended = bool(toks) and toks[-1] == self.draft.specials.eos
        if ended:
            toks = toks[:-1]
        draft_text = self.draft.tokenizer.decode(toks, skip_special_tokens=True) if toks else ""
        ids = retokenize(target.tokenizer, out[-self.tail_tokens :], draft_text) if draft_text else []
        if ended:
            ids = ids + [target.specials.eos]
        elif len(ids) > 1:
            ids = ids[:-1]
        else:
            ids = []
        ids = [t for t in ids[:k] if 0 <= t < target.vocab_size]
        return DraftTree.chain(ids, source=self.name)

    def close(self) -> None:
        self.draft.release(self.state)
