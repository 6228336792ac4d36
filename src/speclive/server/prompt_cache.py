"""Finished chat completions' KV caches, kept for the next request that begins the same way.

A client of an OpenAI server sends the whole conversation with every request, so a chat's
next turn repeats the previous prompt and answer before its new message (llama-server keeps
each slot's last prompt for this; vLLM caches prefix blocks). When a completion ends, its KV
state is *parked* here instead of released (``Backend.park``). The server turns on
``offload_parked``: on llama.cpp a parked state's cache then waits in host memory, holding no
KV cells or sequence id that a realtime conversation or a running request could need (and whose
cells would slow their passes); a backend that keeps parked states in place evicts them before
any other.

A new request starts from the parked state that shares the longest prefix with its prompt
(at least ``MIN_TOKENS``); the decoder keeps the common part and prefills only the rest
(``SpeculativeDecoder._prefill``):

- when that prefix is at least half of what the state holds (a conversation's next turn), the
  request takes the state itself: its conversation has moved on to this request;
- otherwise (the same prompt asked again, whose earlier answer the state also holds; a system
  prompt shared with another conversation) the request gets a *fork* of it (``Backend.fork``;
  on llama.cpp the host copy is written into the fork's cells) and the parked state stays for
  its own conversation.

Greedy answers are those of a fresh state, up to llama.cpp's batch-shape numerics
(docs/engine.md, exactness).
"""

from __future__ import annotations

from collections.abc import Sequence

from speclive.backends.base import Backend, BackendState, common_prefix_len

#: a request takes a parked state itself when its prompt shares this fraction of the state's
#: tokens; a shorter common prefix gets a fork of it
MIN_SHARED = 0.5
#: the shortest common prefix worth starting from (the rest of the prompt is prefilled anyway)
MIN_TOKENS = 8


class PromptCache:
    """At most ``capacity`` parked states of ``backend``, least recently parked first."""

    def __init__(self, backend: Backend, capacity: int):
        if capacity < 1:
            raise ValueError(f"a prompt cache holds at least one state, not {capacity}")
        self.backend = backend
        self.capacity = capacity
        self._parked: list[BackendState] = []
        #: requests that started from a parked state, and the prompt tokens they did not prefill
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._parked)

    def take(self, prompt: Sequence[int]) -> BackendState | None:
        """The state to start ``prompt`` from: a parked state (no longer parked) or a fork of
        one (module docstring); None: start from a new state. States the backend evicted
        meanwhile are released here."""
        self._drop_evicted()
        head = list(prompt[:-1])  # the decoder keeps at most prompt[:-1] of a cache
        best, shared = None, 0
        for st in reversed(self._parked):  # ties: the most recently parked
            n = common_prefix_len(st.tokens, head)
            if n > shared:
                best, shared = st, n
        if best is None or shared < MIN_TOKENS:
            return None
        self.hits += 1
        self.reused_tokens += shared
        if shared >= MIN_SHARED * len(best.tokens):
            self._parked.remove(best)
            self.backend.unpark(best)
            return best
        state = self.backend.fork(best)
        self.backend.park(best)  # the fork used it: parked again, for its own conversation
        return state

    def park(self, state: BackendState) -> None:
        """Keep ``state``'s cache for a later request, or release it (a pending tree extension,
        or no tokens); past ``capacity`` the least recently parked state is released."""
        if state.pending is not None or not state.tokens or getattr(state, "evicted", False):
            self.backend.release(state)
            return
        self.backend.park(state)
        self._parked.append(state)
        while len(self._parked) > self.capacity:
            self.backend.release(self._parked.pop(0))

    def clear(self) -> None:
        """Release every parked state (the server is shutting down: the backend may outlive it)."""
        while self._parked:
            self.backend.release(self._parked.pop())

    def _drop_evicted(self) -> None:
        for st in [s for s in self._parked if getattr(s, "evicted", False)]:
            self._parked.remove(st)
            self.backend.release(st)
