"""Admission control: how many requests may compute at once, and a short queue for the rest.

A *session* is one request that holds model work: a chat generation (stream or not), a
transcription, a synthesis, a realtime voice session. Past ``max_sessions`` (and, for chat,
past the number of KV states the LLM backend holds at once) a REST request waits in a FIFO
queue for up to ``wait_s`` seconds (``acquire_waiting``); a queue without bound would only make
every client wait longer on a CPU box, so after that it is refused with 503 and a
``Retry-After`` header. Realtime sessions are refused at once (``acquire``): a voice caller is
better told to come back than left hanging.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from prometheus_client import Gauge

from speclive.server.errors import APIError


class Session:
    """A held slot; ``release()`` is idempotent (call it in a ``finally``)."""

    def __init__(self, limiter: SessionLimiter, kind: str):
        self._limiter = limiter
        self.kind = kind
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limiter._release(self.kind)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class SessionLimiter:
    def __init__(self, max_sessions: int, gauge: Gauge | None = None):
        self.max_sessions = max_sessions
        self._gauge = gauge
        self._lock = threading.Lock()
        self._by_kind: dict[str, int] = {}
        #: requests waiting for a slot, oldest first: (future, its event loop)
        self._waiters: deque[tuple[asyncio.Future, asyncio.AbstractEventLoop]] = deque()

    @property
    def live(self) -> int:
        with self._lock:
            return sum(self._by_kind.values())

    def acquire(self, kind: str, kind_limit: int | None = None) -> Session:
        """A slot for a ``kind`` request, or ``APIError`` 503 when the server is full."""
        with self._lock:
            total = sum(self._by_kind.values())
            mine = self._by_kind.get(kind, 0)
            if total >= self.max_sessions:
                raise self._busy(f"{total} of {self.max_sessions} sessions are in use")
            if kind_limit is not None and mine >= kind_limit:
                raise self._busy(f"{mine} of {kind_limit} {kind} sessions are in use")
            self._by_kind[kind] = mine + 1
            if self._gauge is not None:
                self._gauge.set(total + 1)
        return Session(self, kind)

    async def acquire_waiting(self, kind: str, kind_limit: int | None = None, wait_s: float = 0.0) -> Session:
        """``acquire``, waiting in line up to ``wait_s`` seconds for a slot (FIFO: a request
        that arrives while others wait queues behind them)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        turn: asyncio.Future | None = None
        while True:
            if turn is not None or not self._waiters:
                try:
                    return self.acquire(kind, kind_limit)
                except APIError as busy:
                    refusal = busy
            else:
                refusal = self._busy("requests are waiting")
            left = deadline - loop.time()
            if left <= 0:
                raise refusal
            turn = loop.create_future()
            entry = (turn, loop)
            with self._lock:
                self._waiters.append(entry)
            try:
                await asyncio.wait_for(turn, left)
            except TimeoutError:
                raise refusal from None
            finally:
                with self._lock:
                    if entry in self._waiters:
                        self._waiters.remove(entry)

    def _release(self, kind: str) -> None:
        with self._lock:
            self._by_kind[kind] = max(0, self._by_kind.get(kind, 0) - 1)
            if self._gauge is not None:
                self._gauge.set(sum(self._by_kind.values()))
        self._wake_first()

    def _wake_first(self) -> None:
        """Let the oldest waiter try again for the slot just freed."""
        with self._lock:
            first = self._waiters.popleft() if self._waiters else None
        if first is not None:
            fut, loop = first
            loop.call_soon_threadsafe(self._resolve, fut)

    def _resolve(self, fut: asyncio.Future) -> None:
        if fut.done():  # that waiter gave up meanwhile: the freed slot goes to the next one
            self._wake_first()
        else:
            fut.set_result(None)

    @staticmethod
    def _busy(what: str) -> APIError:
        return APIError(
            503,
            f"The server is busy ({what}); retry shortly.",
            code="too_many_sessions",
            headers={"Retry-After": "1"},
        )
