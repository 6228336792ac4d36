"""Admission control: how many requests may compute at once; the rest get 503 at once.

A *session* is one request that holds model work: a chat generation (stream or not), a
transcription, a synthesis. Queuing them without bound would only make every client wait
longer on a CPU box, so past ``max_sessions`` (and, for chat, past the number of KV states the
LLM backend holds at once) a request is refused with 503 and a ``Retry-After`` header.
"""

from __future__ import annotations

import threading

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

    def _release(self, kind: str) -> None:
        with self._lock:
            self._by_kind[kind] = max(0, self._by_kind.get(kind, 0) - 1)
            if self._gauge is not None:
                self._gauge.set(sum(self._by_kind.values()))

    @staticmethod
    def _busy(what: str) -> APIError:
        return APIError(
            503,
            f"The server is busy ({what}); retry shortly.",
            code="too_many_sessions",
            headers={"Retry-After": "1"},
        )
