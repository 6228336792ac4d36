"""Simulated streaming input: lag-k word increments of a finished text.

SSBD's Flores setup: the source arrives k words at a time (k = 3), each prefix an update,
the full text the final one. Real ASR partials drive sessions through the same interface.
"""

from __future__ import annotations

import re
import time
from typing import Any, Protocol


def lag_k_prefixes(text: str, k: int = 3) -> list[str]:
    """Prefixes of ``text`` growing by ``k`` words; the last one is the whole text."""
    if k < 1:
        raise ValueError(f"lag k must be >= 1, got {k}")
    words = text.split()
    if not words:
        return []
    out = [" ".join(words[:i]) for i in range(k, len(words), k)]
    out.append(" ".join(words))
    return out


_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def split_sentences(text: str) -> list[str]:
    """English sentences of ``text`` (split after . ! ? before an upper-case start)."""
    return [s.strip() for s in _SENTENCE.split(" ".join(text.split())) if s.strip()]


def word_arrivals(text: str, cpm: float = 600.0) -> list[tuple[str, float]]:
    """Each word of ``text`` with the time (s) its last character is typed/spoken at ``cpm``."""
    if cpm <= 0:
        raise ValueError(f"characters per minute must be > 0, got {cpm}")
    out, chars = [], 0
    for i, w in enumerate(text.split()):
        chars += len(w) + (1 if i else 0)
        out.append((w, chars * 60.0 / cpm))
    return out


class StreamingSession(Protocol):
    """What ``simulate_user`` drives: ``update`` per partial input, ``finish`` for the final one."""

    #: ``update`` takes a ``deadline`` keyword (a ``time.perf_counter()`` value) and may yield then
    supports_deadline: bool

    def update(self, partial: str, *args: Any, **kwargs: Any) -> Any: ...

    def finish(self, final: str) -> Any: ...


def simulate_user(session: StreamingSession, text: str, cpm: float = 600.0) -> tuple[object, dict]:
    """Feed ``text`` to a session as a user speaking at ``cpm`` characters per minute.

    An honest clock: a partial prompt (whole words only: the word being spoken is dropped)
    is available from the time its last word ends; each ``update`` takes the real time it
    computes, and input that arrived meanwhile waits for the next poll. Sessions that support
    it get a ``deadline`` (the next word's arrival) and may yield then, keeping their work.
    When the user is done, ``finish`` starts as soon as the session is free: an update that
    overran the end of the input delays it, and that wait is part of every latency. Returns
    ``finish()``'s result and the timeline (virtual clock; idle gaps are skipped, not slept).
    """
    arrivals = word_arrivals(text, cpm)
    if not arrivals:
        raise ValueError("empty input: nothing to say")
    words = [w for w, _ in arrivals]
    t_end = arrivals[-1][1]
    now, sent, polls = 0.0, 0, []
    while True:
        ready = sum(1 for _, t in arrivals if t <= now + 1e-9)
        if ready >= len(words):
            break
        if ready == sent:  # nothing new: idle until the next word ends
            now = arrivals[ready][1]
            continue
        t0 = time.perf_counter()
        if session.supports_deadline:
            # the session may yield when the next word ends (it would see new input then)
            session.update(" ".join(words[:ready]), deadline=t0 + (arrivals[ready][1] - now))
        else:
            session.update(" ".join(words[:ready]))
        dt = time.perf_counter() - t0
        polls.append({"at_s": now, "words": ready, "compute_s": dt})
        now += dt
        sent = ready
    wait = max(0.0, now - t_end)
    result = session.finish(" ".join(words))
    return result, {"input_s": t_end, "wait_s": wait, "updates": polls}
