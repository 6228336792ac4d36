"""The server's prompt cache (``speclive.server.prompt_cache``): which parked state a request
reuses, on a fake backend; and on SmolLM2 (llama.cpp), that a chat's next turn prefills only
its new tokens and answers as from a fresh state."""

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
    """What PromptCache asks of a backend: park, unpark, release."""

    def __init__(self) -> None:
        self.released: list[_State] = []

    def park(self, st: _State) -> None:
        st.parked = True

    def unpark(self, st: _State) -> None:
        st.parked = False

    def release(self, st: _State) -> None:
        st.tokens.clear()
        self.released.append(st)


def _state(tokens: list[int]) -> _State:
    return _State(tokens=list(tokens))


def test_a_request_takes_the_state_its_prompt_continues() -> None:
    be = _Backend()
    cache = PromptCache(be, capacity=4)  # type: ignore[arg-type]
    a, b = _state([1, 2, 3, 4, 5, 6]), _state([1, 2, 9, 9])
    cache.park(a)
    cache.park(b)
    assert a.parked and b.parked and len(cache) == 2
    # the next turn of a's conversation: its prompt begins with all of a's tokens
    got = cache.take([1, 2, 3, 4, 5, 6, 7, 8])
    assert got is a and not a.parked and len(cache) == 1
    assert cache.hits == 1 and cache.reused_tokens == 6


def test_a_short_shared_prefix_leaves_the_parked_states_alone() -> None:
    """A shared system prompt (2 of 6 tokens) is not worth another conversation's cache."""
    be = _Backend()
    cache = PromptCache(be, capacity=4)  # type: ignore[arg-type]
    a = _state([1, 2, 3, 4, 5, 6])
    cache.park(a)
    assert cache.take([1, 2, 7, 7, 7, 7, 7]) is None
    assert len(cache) == 1 and a.parked and cache.hits == 0
    # the last prompt token is never part of the match (the decoder keeps prompt[:-1])
    assert cache.take([1, 2, 3]) is None
    assert cache.take([1, 2, 3, 4]) is a


def test_the_longest_match_wins_and_capacity_releases_the_oldest() -> None:
    be = _Backend()
    cache = PromptCache(be, capacity=2)  # type: ignore[arg-type]
    a, b, c = _state([1, 2, 3]), _state([1, 2, 3, 4, 5]), _state([8, 8])
    for st in (a, b, c):
        cache.park(st)
    assert be.released == [a] and len(cache) == 2  # past capacity: the oldest goes
    assert cache.take([1, 2, 3, 4, 5, 6]) is b


def test_evicted_pending_and_empty_states_are_released_not_kept() -> None:
    be = _Backend()
    cache = PromptCache(be, capacity=4)  # type: ignore[arg-type]
    pending = _state([1, 2])
    pending.pending = [3]
    empty = _state([])
    for st in (pending, empty):
        cache.park(st)
    assert len(cache) == 0 and be.released == [pending, empty]
    a = _state([1, 2, 3, 4])
    cache.park(a)
    a.evicted = True  # the backend gave its cells to another state meanwhile
    assert cache.take([1, 2, 3, 4, 5]) is None and len(cache) == 0 and be.released[-1] is a
    with pytest.raises(ValueError):
        PromptCache(be, capacity=0)  # type: ignore[arg-type]
