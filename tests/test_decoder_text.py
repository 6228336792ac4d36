"""The decoder's text side on a fake byte-level model: stop strings, hold-back, finish reasons.

``TextLM`` is a deterministic "model" that continues one fixed UTF-8 text byte by byte (token id
= byte value, EOS = 256), so greedy output is known exactly. A perfect drafter proposes the
next bytes in long chains, so a stop string, an EOS or the length limit lands in the middle of
an accepted draft, where the commit logic has to cut it; the no-drafter runs check the same
contract one token at a time. Checked:

- the streamed deltas concatenate to the final text, and never show a character of a stop
  string, nor half a UTF-8 character (``\\ufffd``);
- a partial match of a stop string ("EN" of "END") is released once it cannot become one;
- ``finish_reason`` is ``stop``, ``eos``, ``length`` or ``context`` as the case is.
"""

from __future__ import annotations

import numpy as np
import pytest

from speclive.backends.base import Backend, BackendState
from speclive.decoder import GenerationConfig, SpeculativeDecoder, drain
from speclive.drafting.base import AdaptiveConfig, AdaptiveLength, Drafter
from speclive.drafting.tree import DraftTree
from speclive.errors import ConfigError, ContextOverflowError

EOS = 256
V = 257
TEXT = "Hi. Caf\u00e9 cr\u00e8me, EN route; the END is near.\n<|x|> tail"


class _ByteTok:
    vocab_size = V
    eos_ids = {EOS}

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def encode(self, text, add_special_tokens=False):
        return list(text.encode("utf-8"))


class TextLM(Backend):
    """Predicts byte ``n`` of ``text`` after any ``n`` tokens, then EOS."""

    kind = "fake"

    def __init__(self, text: str = TEXT, n_ctx: int = 4096):
        self.name = "text-lm"
        self.data = text.encode("utf-8")
        self.tokenizer = _ByteTok()
        self.vocab_size = V
        self.n_ctx = n_ctx
        super().__init__()

    def new_state(self) -> BackendState:
        return BackendState()

    def _extend(self, state, tokens, parents, last_only=False):
        base = len(state.tokens)
        depth: list[int] = []
        for i in range(len(tokens)):
            p = i - 1 if parents is None else parents[i]
            depth.append(depth[p] + 1 if p >= 0 else base + 1)
        rows = np.zeros((len(tokens), V), dtype=np.float32)
        for i, n in enumerate(depth):
            rows[i, self.data[n] if n < len(self.data) else EOS] = 50.0
        return rows[-1:] if last_only else rows

    def _compact(self, state, keep_idx):
        pass

    def _truncate(self, state, n):
        pass

    def fork(self, state):
        return BackendState(tokens=list(state.tokens))


class PerfectDrafter(Drafter):
    """Drafts the true continuation in chains of ``k`` tokens."""

    name = "perfect"

    def __init__(self, data: bytes, k: int):
        super().__init__(AdaptiveLength(AdaptiveConfig(fixed=True, max_len=k)))
        self.data, self.k = data, k

    def propose(self, context, budget):
        n = len(context)
        tree = DraftTree()
        parent = -1
        for b in self.data[n : n + min(self.k, budget)]:
            parent = tree.add(b, parent)
        return tree


PROMPT = list(TEXT.encode("utf-8")[:4])  # "Hi. "


def _generate(drafter_k: int | None, cfg: GenerationConfig, n_ctx: int = 4096):
    lm = TextLM(n_ctx=n_ctx)
    drafter = PerfectDrafter(lm.data, drafter_k) if drafter_k else None
    dec = SpeculativeDecoder(lm, drafter)
    events: list = []
    res = drain(dec.generate(PROMPT, cfg), events)
    return [ev.text for ev in events], res.token_ids, res.stats, res.text


@pytest.mark.parametrize("k", [None, 3, 16])
def test_stop_string_is_cut_and_never_streamed(k):
    deltas, _ids, stats, text = _generate(k, GenerationConfig(max_tokens=200, stop=("END",)))
    assert stats.finish_reason == "stop"
    assert text == "Caf\u00e9 cr\u00e8me, EN route; the "
    assert "".join(deltas) == text  # the partial match "EN" was released
    assert all("\ufffd" not in d for d in deltas)
    if k == 16:
        assert stats.target_forwards < len(text) // 4  # the stop landed inside accepted drafts


@pytest.mark.parametrize("k", [None, 5])
def test_multi_stop_strings_take_the_earliest(k):
    _deltas, _ids, stats, text = _generate(k, GenerationConfig(max_tokens=200, stop=("<|x|>", ";")))
    assert stats.finish_reason == "stop" and text == "Caf\u00e9 cr\u00e8me, EN route"


@pytest.mark.parametrize("k", [None, 4, 32])
def test_eos_length_and_streaming_utf8(k):
    deltas, ids, stats, text = _generate(k, GenerationConfig(max_tokens=500))
    assert stats.finish_reason == "eos"
    assert text == TEXT[4:] and "".join(deltas) == text
    assert ids == list(TEXT.encode("utf-8")[4:])
    assert all("\ufffd" not in d for d in deltas)  # "é" is two bytes: never shown half-decoded

    deltas, ids, stats, text = _generate(k, GenerationConfig(max_tokens=7))
    assert stats.finish_reason == "length" and len(ids) == 7 and stats.new_tokens == 7
    assert text == "Caf\u00e9 c" and "".join(deltas) == text


@pytest.mark.parametrize("k", [None, 8])
def test_context_finish_reason_and_a_prompt_too_long(k):
    deltas, ids, stats, text = _generate(k, GenerationConfig(max_tokens=500), n_ctx=20)
    assert stats.finish_reason == "context"
    # every cache slot is used: the prompt and all output but the last token (never evaluated)
    assert len(PROMPT) + len(ids) - 1 == 20
    assert ids == list(TEXT.encode("utf-8")[4 : 4 + len(ids)])
    assert "".join(deltas) == text
    with pytest.raises(ContextOverflowError, match="context window"):
        _generate(k, GenerationConfig(max_tokens=5), n_ctx=4)
    with pytest.raises(ConfigError, match="max_tokens"):
        _generate(k, GenerationConfig(max_tokens=0))


def test_any_integer_is_a_seed():
    lm = TextLM()
    for seed in (-1, -(2**70), 2**70):
        res = SpeculativeDecoder(lm).run(PROMPT, GenerationConfig(max_tokens=5, temperature=0.7, seed=seed))
        assert res.token_ids == list(TEXT.encode("utf-8")[4:9])  # one-hot logits: sampling is sure
