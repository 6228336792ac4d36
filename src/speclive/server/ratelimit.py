"""``TokenBucket``: the event-rate limit of a realtime session.

A bucket holds up to ``burst`` tokens and refills at ``rate`` tokens per second; each client
event takes one. An event that finds the bucket empty is over the rate. Time comes from a
monotonic clock (injectable for tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        if rate <= 0 or burst < 1:
            raise ValueError(f"rate must be > 0 and burst >= 1, got {rate}, {burst}")
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = burst
        self._t = clock()

    def take(self) -> bool:
        """Take one token: True when the event is within the rate."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._t) * self.rate)
        self._t = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False
