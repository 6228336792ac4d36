"""The server's prompt cache (``speclive.server.prompt_cache``): which parked state a request
reuses or forks, on a fake backend (the server tests check a next turn on SmolLM2)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from speclive.backends.base import BackendState
from speclive.server.prompt_cache import PromptCache


@dataclass
class _State(BackendState):
    evicted: bool = False
    parked: bool = False


class _Backend:
    """What PromptCache asks of a backend: park, unpark, fork, release."""

    def __init__(self) -> None:
        self.released: list[_State] = []
        self.forked: list[_State] = []

    def park(self, st: _State) -> None:
        st.parked = True

    def unpark(self, st: _State) -> None:
        st.parked = False

    def fork(self, st: _State) -> _State:
        self.forked.append(st)
        st.parked = False  # as llama.cpp's: using a state ends its parking
        return _State(tokens=list(st.tokens))

    def release(self, st: _State) -> None:
        st.tokens.clear()
        self.released.append(st)


def _state(tokens: list[int]) -> _State:
    return _State(tokens=list(tokens))


def _cache(capacity: int = 4) -> tuple[PromptCache, _Backend]:
    be = _Backend()
    return PromptCache(be, capacity=capacity), be  # type: ignore[arg-type]


CONV = list(range(100, 120))  # a conversation's prompt and answer so far: 20 tokens


def test_a_next_turn_takes_the_state_it_continues() -> None:
    cache, be = _cache()
    a, b = _state(CONV), _state([1, 2, 9, 9])
    cache.park(a)
    cache.park(b)
    assert a.parked and b.parked and len(cache) == 2
    # the next turn of a's conversation: its prompt begins with all of a's tokens
    got = cache.take([*CONV, 7, 8])
    assert got is a and not a.parked and len(cache) == 1 and not be.forked
    assert cache.hits == 1 and cache.reused_tokens == 20


def test_a_repeated_prompt_gets_a_fork_and_the_parked_state_stays() -> None:
    """The same prompt again: the state also holds the earlier answer, so the prompt shares
    less than half of it; the request gets a fork and the conversation keeps its cache."""
    cache, be = _cache()
    prompt = CONV[:9]
    a = _state([*prompt, *range(500, 520)])  # 9 prompt tokens + a 20-token answer
    cache.park(a)
    got = cache.take(prompt + [0])  # the decoder keeps at most prompt[:-1]: 9 shared tokens
    assert got is not None and got is not a and be.forked == [a]
    assert got.tokens == a.tokens  # the decoder trims the fork to the common prefix
    assert a.parked and len(cache) == 1 and cache.reused_tokens == 9


def test_a_short_common_prefix_is_not_worth_a_state() -> None:
    cache, be = _cache()
    a = _state(CONV)
    cache.park(a)
    assert cache.take([*CONV[:7], 5, 5, 5]) is None  # 7 < MIN_TOKENS shared
    assert len(cache) == 1 and a.parked and cache.hits == 0 and not be.forked
    # the last prompt token is never part of the match
    assert cache.take(CONV[:8]) is None
    assert cache.take(CONV[:9]) is not None


def test_the_longest_match_wins_and_capacity_releases_the_oldest() -> None:
    cache, be = _cache(capacity=2)
    a, b, c = _state(CONV[:10]), _state(CONV[:15]), _state([8] * 10)
    for st in (a, b, c):
        cache.park(st)
    assert be.released == [a] and len(cache) == 2  # past capacity: the oldest goes
    assert cache.take([*CONV, 1]) is b


def test_evicted_pending_and_empty_states_are_released_not_kept() -> None:
    cache, be = _cache()
    pending = _state(CONV)
    pending.pending = [3]
    empty = _state([])
    for st in (pending, empty):
        cache.park(st)
    assert len(cache) == 0 and be.released == [pending, empty]
    a = _state(CONV)
    cache.park(a)
    a.evicted = True  # the backend gave its cells to another state meanwhile
    assert cache.take([*CONV, 5]) is None and len(cache) == 0 and be.released[-1] is a
    with pytest.raises(ValueError):
        PromptCache(be, capacity=0)  # type: ignore[arg-type]
