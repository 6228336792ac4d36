"""``ContextLM``: a tiny deterministic fake LM whose every prediction depends on its whole cache.

A real KV cache holds one row per cached token, computed with that token's own context, and
attention reads every row. The fake holds one *hash* per cached token instead (the rolling hash
of every token up to it), and a node "attends" to all rows it can see: its prediction is a
function of the hash of those rows, read from the cache on every call. ``extend`` computes each
new node's row from its parent's (a tree node sees the cached prefix plus its own ancestors
only), ``_compact`` keeps the chosen rows, ``_truncate`` drops rows. So a wrong mask, a stale
or corrupted row or a kept sibling changes the prediction, as it would on a real model; a
decoding bug that a model's numerics would hide shows up here as a clear divergence.

Greedy output is known without any cache: ``reference_greedy`` recomputes every hash from
scratch. Two kinds of contexts:

- plain ones: the next token is a pseudo-random function of the whole context;
- "translation" prompts ``... USER w1 .. wn ASSISTANT o1 .. om``: the model copies the source
  word by word (``o_j = mapped(w_j)`` plus a salt from everything before ``USER``) and ends with
  EOS, so re-translating a growing source repeats the previous output's prefix, as a real
  translation model mostly does. The copied word still depends on the cached rows: the salt
  and the source are read back from the cache content the hashes were built from.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from speclive.backends.base import Backend, BackendState

V = 64
EOS = 0
USER = 1
ASSISTANT = 2
FIRST_WORD = 3
_MOD = (1 << 61) - 1


def _roll(h: int, tok: int) -> int:
    return (h * 1_000_003 + tok + 7) % _MOD


def _mix(h: int) -> int:
    h ^= h >> 29
    h = (h * 0xBF58476D1CE4E5B9) % _MOD
    return h ^ (h >> 31)


class WordTok:
    """Words to ids (a stable hash), ids to words; ``chat`` renders system/user as a prompt."""

    vocab_size = V
    eos_ids = {EOS}
    has_chat_template = True

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [FIRST_WORD + sum(map(ord, w)) * 31 % (V - FIRST_WORD) for w in text.split()]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return " ".join(f"w{i}" for i in ids if i >= FIRST_WORD)

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        ids: list[int] = []
        for m in messages:
            if m["role"] == "user":
                ids.append(USER)
            ids += self.encode(m["content"])
        return ids + [ASSISTANT]


def next_token(context: Sequence[int], h: int) -> tuple[int, float]:
    """(greedy next token, its logit margin) after ``context`` whose rows hash to ``h``."""
    if ASSISTANT in context:
        a = len(context) - 1 - list(reversed(context)).index(ASSISTANT)
        u = max((i for i in range(a) if context[i] == USER), default=-1)
        if u >= 0:
            salt = 0
            for t in context[:u]:
                salt = _roll(salt, t)
            src, out = context[u + 1 : a], context[a + 1 :]
            if len(out) >= len(src):
                return EOS, 3.0
            w = src[len(out)]
            return FIRST_WORD + (w * 5 + salt % 7) % (V - FIRST_WORD), 3.0
    m = _mix(h)
    return FIRST_WORD + m % (V - FIRST_WORD), 0.5 + (m >> 20) % 100 / 40


def logits_row(context: Sequence[int], h: int) -> np.ndarray:
    tok, margin = next_token(context, h)
    m = _mix(h ^ 0x5DEECE66D)
    row = np.array([((m >> (j % 50)) & 0xFF) / 256 for j in range(V)], dtype=np.float32) * 2.0
    row[tok] = row.max() + margin
    return row


def reference_greedy(prompt: Sequence[int], n: int, eos: bool = True, n_ctx: int | None = None) -> list[int]:
    """Plain greedy decoding from scratch (no cache): at most ``n`` tokens, stopping at EOS
    unless ``eos`` is False, and where ``n_ctx`` leaves no slot to evaluate the newest token."""
    ctx: list[int] = []
    row = att = 0
    out: list[int] = []

    def push(t: int) -> None:
        nonlocal row, att
        ctx.append(t)
        row = _roll(row, t)
        att = _roll(att, row)

    for t in prompt:
        push(t)
    while len(out) < n:
        if n_ctx is not None and len(ctx) > n_ctx:
            break
        tok, _ = next_token(ctx, att)
        if eos and tok == EOS:
            break
        out.append(tok)
        push(tok)
    return out


class HashState(BackendState):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []  # one hash per cached (committed + pending) token
        self.seen: list[int] = []  # the committed tokens those rows were computed from
        self.pending_ctx: list[list[int]] | None = None


class ContextLM(Backend):
    kind = "fake"

    def __init__(self, n_ctx: int = 4096):
        self.name = "context-lm"
        self.tokenizer = WordTok()
        self.vocab_size = V
        self.n_ctx = n_ctx
        super().__init__()

    def new_state(self) -> HashState:
        return HashState()

    def _extend(self, state, tokens, parents, last_only=False):
        base = len(state.rows)
        assert base == len(state.tokens), "the cache rows and the committed tokens disagree"
        prev = state.rows[-1] if state.rows else 0
        seen = 0  # what attention reads: every cached row, on every call
        for r in state.rows:
            seen = _roll(seen, r)
        hashes: list[int] = []
        atts: list[int] = []
        ctxs: list[list[int]] = []
        for i, t in enumerate(tokens):
            p = (i - 1) if parents is None else parents[i]
            h = _roll(hashes[p] if p >= 0 else prev, t)
            hashes.append(h)
            atts.append(_roll(atts[p] if p >= 0 else seen, h))
            ctxs.append((ctxs[p] if p >= 0 else state.seen) + [t])
        state.rows += hashes
        if parents is None:
            state.seen = ctxs[-1]
        else:
            state.pending_ctx = ctxs  # the nodes' contexts, until keep() picks a path
        rows = np.stack([logits_row(c, a) for c, a in zip(ctxs, atts, strict=True)])
        return rows[-1:] if last_only else rows

    def _compact(self, state, keep_idx):
        base = len(state.tokens)
        state.rows = [state.rows[i] for i in keep_idx]
        kept = [i - base for i in keep_idx if i >= base]
        state.seen = state.pending_ctx[kept[-1]] if kept else state.seen
        state.pending_ctx = None

    def keep(self, state, path):
        if state.pending is not None and list(path) == list(range(len(state.pending))):
            # the whole pending tree is one chain: no compaction, just commit it
            state.seen = state.pending_ctx[-1] if path else state.seen
        super().keep(state, path)

    def _truncate(self, state, n):
        del state.rows[n:]
        state.seen = state.seen[:n]

    def fork(self, state):
        f = HashState()
        f.tokens, f.rows, f.seen = list(state.tokens), list(state.rows), list(state.seen)
        return f
