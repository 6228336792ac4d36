"""Cross-vocabulary bridge between Whisper models (tiny.en drafts for base).

tiny.en and base tokenize English differently (vocab 51,864 vs 51,865; other merges and other
special-token ids) and each needs its own decoder prompt. ``WhisperBridge`` lets the SpecASR
drafter run in tiny.en's token space: the committed target tokens after the target's prompt
are rendered to text and re-tokenized behind the *draft's* prompt; a drafted path is rendered
to text and re-tokenized for the target behind the last few committed target tokens
(``drafting.crossvocab.retokenize``). The last re-tokenized id is dropped (it may be a cut-off
word) unless the draft ended the transcript, in which case the target's end-of-text id is
appended. The target verifies every id, so the transcript is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

from speclive.asr.whisper import WhisperBackend
from speclive.drafting.crossvocab import retokenize
from speclive.drafting.specasr import VocabBridge


class WhisperBridge(VocabBridge):
    def __init__(self, draft: WhisperBackend, target: WhisperBackend, tail_tokens: int = 4):
        self.draft = draft
        self.target = target
        self.tail_tokens = tail_tokens
        self._memo: tuple[tuple[int, ...], list[int]] | None = None

    def draft_eos(self) -> set[int]:
        return {self.draft.specials.eos}

    def to_draft(self, context: Sequence[int]) -> list[int]:
        key = tuple(context)
        if self._memo is not None and self._memo[0] == key:
            return list(self._memo[1])
        out = list(context[self.target.prompt_len :])
        text = self.target.tokenizer.decode(out, skip_special_tokens=True)
        ids = self.draft.specials.prompt + (self.draft.tokenizer.encode(text) if text else [])
        self._memo = (key, ids)
        return list(ids)

    def to_target(self, context: Sequence[int], path: Sequence[int]) -> list[int]:
        toks = list(path)
        ended = bool(toks) and toks[-1] == self.draft.specials.eos
        if ended:
            toks = toks[:-1]
        text = self.draft.tokenizer.decode(toks, skip_special_tokens=True) if toks else ""
        tail = list(context[self.target.prompt_len :])[-self.tail_tokens :]
        ids = retokenize(self.target.tokenizer, tail, text) if text else []
        if ended:
            ids = ids + [self.target.specials.eos]
        else:
            ids = ids[:-1]
        return [t for t in ids if 0 <= t < self.target.vocab_size]
