"""The asynchronous hybrid drafter on toy Markov "models" (no weights, runs in a second).

Target and draft are deterministic second-order Markov chains over 40 tokens, so greedy
decoding is fully known; the draft disagrees with the target on a few contexts, giving partial
acceptance. Both backends sleep per call (releasing the GIL like ``llama_decode``), so the
background draft job really overlaps verification. Checked: output identical to AR, drafts
from background jobs reused (pre- and post-verify), stats consistent, settings restored.
"""

from __future__ import annotations

import time

import numpy as np

from speclive.backends.base import Backend, BackendState
from speclive.decoder import GenerationConfig, SpeculativeDecoder
from speclive.drafting.asyncdraft import AsyncHybridDrafter
from speclive.drafting.hybrid import HybridConfig, HybridDrafter

V = 40


class _Tok:
    vocab_size = V
    eos_ids: set[int] = set()

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))

    def encode(self, text, add_special_tokens=False):
        return [int(x) % V for x in text.split() if x.isdigit()] or [1, 2]


class MarkovLM(Backend):
    """next(prev2, prev1) = (3*prev2 + 5*prev1 + 1) % V, unless ``wrong`` says otherwise."""

    kind = "fake"
    settable_threads = True
    n_threads = 2

    def __init__(self, name: str, sleep: float, wrong: int | None = None):
        self.name, self.sleep, self.wrong = name, sleep, wrong
        self.tokenizer = _Tok()
        self.vocab_size = V
        self.n_ctx = 4096
        self.calls: list[int] = []  # the length of every extension
        super().__init__()

    def set_threads(self, n: int) -> None:
        self.n_threads = n

    def next_token(self, prev2: int, prev1: int) -> int:
        t = (3 * prev2 + 5 * prev1 + 1) % V
        if self.wrong is not None and prev1 % self.wrong == 0:
            t = (t + 1) % V
        return t

    def new_state(self) -> BackendState:
        return BackendState()

    def _extend(self, state, tokens, parents, last_only=False):
        self.calls.append(len(tokens))
        time.sleep(self.sleep)
        prev = state.tokens[-1] if state.tokens else 0
        rows = []
        for i, t in enumerate(tokens):
            if parents is None:
                p2 = tokens[i - 1] if i > 0 else prev
            else:
                p2 = tokens[parents[i]] if parents[i] >= 0 else prev
            row = np.zeros(V, dtype=np.float32)
            row[self.next_token(p2, t)] = 5.0
            rows.append(row)
        out = np.stack(rows)
        return out[-1:] if last_only else out

    def _compact(self, state, keep_idx):
        pass

    def _truncate(self, state, n):
        pass

    def fork(self, state):
        return BackendState(tokens=list(state.tokens))


def _ar(target, prompt, n):
    return SpeculativeDecoder(target).run(prompt, GenerationConfig(max_tokens=n, ignore_eos=True)).token_ids


def test_async_hybrid_matches_ar_and_reuses_background_drafts():
    target = MarkovLM("target", sleep=0.004)
    draft = MarkovLM("draft", sleep=0.001, wrong=7)
    prompt = [3, 9, 4, 1, 8]
    ref = _ar(target, prompt, 80)
    d = AsyncHybridDrafter(draft, None, HybridConfig(model_max_len=6))
    dec = SpeculativeDecoder(target, d)
    res = dec.run(prompt, GenerationConfig(max_tokens=80, ignore_eos=True))
    st = d.async_stats
    d.close()
    assert res.token_ids == ref
    # the last step (budget 0) does not ask the drafter
    assert res.stats.target_forwards - 1 <= st.steps <= res.stats.target_forwards
    assert st.pre_verify > 0 and st.post_verify > 0, st
    assert st.jobs_reused > 0 and st.tokens_reused > 0, st
    assert res.stats.accepted_by_source.get("model", 0) > 0
    assert res.stats.mean_accepted > 1.5
    assert 0 < st.draft_busy_s < st.wall_s and st.target_side_s > 0
    # thread settings and the target's cost model are restored
    assert target.n_threads == 2 and draft.n_threads == 2


def test_sync_hybrid_always_model_matches_ar():
    target = MarkovLM("target", sleep=0.0)
    draft = MarkovLM("draft", sleep=0.0, wrong=5)
    prompt = [7, 7, 2]
    ref = _ar(target, prompt, 60)
    d = HybridDrafter(draft, None, HybridConfig(always_model=True, model_max_len=5))
    res = SpeculativeDecoder(target, d).run(prompt, GenerationConfig(max_tokens=60, ignore_eos=True))
    assert res.token_ids == ref
    assert res.stats.accepted_by_source.get("model", 0) > 0


def test_the_decoder_applies_the_declared_target_threads_and_restores_them():
    """The drafter declares ``target_threads``; the decoder sets them for the generation and
    restores them; the drafter sets its draft's. The drafter is handed the cost curve of that
    thread count, into which the decoder's passes are timed: the shared backend's own curve is
    neither swapped nor fed."""
    target = MarkovLM("target", sleep=0.0)
    draft = MarkovLM("draft", sleep=0.0, wrong=7)
    cost = target.cost
    d = AsyncHybridDrafter(draft, None, HybridConfig(model_max_len=4))
    assert d.target_threads == 1
    dec = SpeculativeDecoder(target, d)
    cfg = GenerationConfig(max_tokens=12, ignore_eos=True)
    during = {
        (target.n_threads, target.cost is cost, d.target.cost is dec.state.cost, draft.n_threads)
        for _ in dec.generate([3, 9, 4], cfg)
    }
    d.close()
    assert during == {(1, True, True, 1)}
    assert (target.n_threads, target.cost, draft.n_threads) == (2, cost, 2)
    assert d.target.cost is not cost and d.adaptive.target_cost is d.target.cost
    assert sum(d.target.cost.observed.values()) > 0 and not cost.observed
    assert dec.state.cost is None  # back to the backend's curve after the generation
