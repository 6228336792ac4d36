"""Admission by measured capacity: how long new work would wait for a model worker.

Every model call runs on one worker thread per model (``worker.py``), which serves its
foreground turns one at a time in a FIFO queue (calls once, streams one item per turn and back
to the tail). So the wait of a new unit of work is the work queued ahead of it, and the worker
can price that work itself:

- ``TurnCosts``: the worker times every turn it runs. A call's duration goes into an
  exponential moving average per kind of call (the function it runs: a realtime session's
  pipeline step, a Piper synthesis, a model load); a stream's turn into the stream's own
  average (a chat completion's decoder steps; a batched verification round is shared out
  among the streams it served), seeded by the average of all stream turns.
- ``ModelWorker.wait_s()``: the rest of the turn in progress plus one turn of everything
  queued in the foreground: when a unit submitted now would start. Background work
  (speculation) is left out: a new foreground turn goes ahead of it.

``Admission`` turns that into a decision. A REST request starts with one turn (a chat
completion's first step, a synthesis, a transcription's first segment): its wait is the
worker's ``wait_s``. A realtime answer is many turns, each queued behind everyone else's
(a session's pushes and pipeline steps are calls that go back to the tail): its wait for its
first output is ``wait_s`` times the number of turns from the end of a turn to the first audio,
measured by the sessions themselves (``observe_turns``; 1 until a turn was measured). The
turns of a loaded worker cost more than the averages of quieter moments said, so a realtime
estimate is also calibrated by what followed: each admitted turn tells how long it really
waited for its first output (``observe_wait``), and the moving average of real wait over
estimate (learned only from estimates of at least ``CALIBRATE_FROM_S``, at least 1) scales
later estimates. Work
whose estimated wait exceeds the bound (``ServerConfig.max_wait_s``) is refused at once with
``Overloaded``: a REST 503 with ``Retry-After``, a realtime ``error`` event and close 1013.
An idle worker has nothing queued, so it admits everything whatever the machine's speed.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from speclive.server.errors import APIError

#: weight of a new sample in the moving averages
ALPHA = 0.2
#: realtime estimates shorter than this do not teach the calibration (an idle worker's estimate
#: is near 0, so a ratio to it says nothing about a loaded one)
CALIBRATE_FROM_S = 1.0
#: the largest correction the calibration applies
MAX_SCALE = 4.0


class Overloaded(APIError):
    """The server cannot start this work within its bound: 503 with ``Retry-After``."""

    def __init__(self, what: str, wait_s: float, bound_s: float):
        self.wait_s = wait_s
        self.retry_after = max(1, math.ceil(wait_s))
        super().__init__(
            503,
            f"The server is overloaded: a {what} would wait about {wait_s:.1f} s to start "
            f"(the limit is {bound_s:g} s); retry in {self.retry_after} s.",
            code="server_overloaded",
            headers={"Retry-After": str(self.retry_after)},
        )


def ema(old: float | None, sample: float, alpha: float = ALPHA) -> float:
    """An exponential moving average updated with ``sample`` (the sample itself at first)."""
    return sample if old is None else (1 - alpha) * old + alpha * sample


class TurnCosts:
    """What one worker's turns take, in seconds: moving averages per kind of call and over all
    stream turns. Thread-safe (the worker writes, admission and ``/metrics`` read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, float] = {}
        self._any_call: float | None = None
        self._stream: float | None = None

    def observe_call(self, key: str, seconds: float) -> None:
        with self._lock:
            self._calls[key] = ema(self._calls.get(key), seconds)
            self._any_call = ema(self._any_call, seconds)

    def observe_stream(self, seconds: float) -> None:
        with self._lock:
            self._stream = ema(self._stream, seconds)

    def call_s(self, key: str) -> float:
        """A call of kind ``key``: its average, else that of any call (0 before any)."""
        with self._lock:
            cost = self._calls.get(key, self._any_call)
        return cost or 0.0

    def stream_s(self, own: float | None = None) -> float:
        """A stream's turn: its own average ``own``, else that of all stream turns."""
        if own is not None:
            return own
        with self._lock:
            return self._stream or 0.0


def wait_estimate(current: tuple[float, float] | None, queued: list[float]) -> float:
    """When a unit submitted now starts: what is left of the turn in progress (``current``:
    its expected cost and the seconds it has run; none left once it overran) plus one turn
    of each queued unit (``queued``: their costs)."""
    left = max(0.0, current[0] - current[1]) if current is not None else 0.0
    return left + sum(queued)


class Admission:
    """Admits REST requests and realtime turns by their estimated wait (module docstring).

    ``wait_of(worker)`` gives the named worker's ``wait_s`` (0 for a worker not started yet);
    ``on_refuse(kind)`` counts a refusal.
    """

    def __init__(
        self,
        max_wait_s: float,
        wait_of: Callable[[str], float],
        on_refuse: Callable[[str], None] | None = None,
    ):
        #: the bound in seconds (0: no bound, everything is admitted)
        self.max_wait_s = max_wait_s
        self._wait_of = wait_of
        self._on_refuse = on_refuse
        self._lock = threading.Lock()
        #: realtime mode -> average worker turns from the end of a turn to its first output
        self._turns: dict[str, float] = {}
        #: realtime mode -> moving average of real wait / estimated wait (``observe_wait``)
        self._scale: dict[str, float] = {}

    def turns_to_first_output(self, mode: str) -> float:
        with self._lock:
            return self._turns.get(mode, 1.0)

    def observe_turns(self, mode: str, turns: int) -> None:
        """A realtime turn of ``mode`` waited ``turns`` worker turns for its first output."""
        if turns >= 1:
            with self._lock:
                self._turns[mode] = ema(self._turns.get(mode), float(turns))

    def wait_s(self, worker: str, turns: float = 1.0) -> float:
        """The estimated wait of new work on ``worker`` that needs ``turns`` turns to its first output."""
        return self._wait_of(worker) * max(1.0, turns)

    def observe_wait(self, mode: str, estimate_s: float, real_s: float) -> None:
        """An admitted realtime turn of ``mode``, estimated at ``estimate_s``, waited ``real_s``
        for its first output."""
        if estimate_s >= CALIBRATE_FROM_S:
            with self._lock:
                ratio = min(MAX_SCALE, max(1.0, real_s / estimate_s))
                self._scale[mode] = ema(self._scale.get(mode), ratio)

    def scale(self, mode: str) -> float:
        """The calibration of ``mode``'s realtime estimates (1 until a loaded turn was measured)."""
        with self._lock:
            return self._scale.get(mode, 1.0)

    def realtime_wait_s(self, worker: str, mode: str) -> float:
        return self.wait_s(worker, self.turns_to_first_output(mode)) * self.scale(mode)

    def admit(self, kind: str, worker: str, turns: float = 1.0, scale: float = 1.0) -> float:
        """Refuse (``Overloaded``) ``kind`` work whose estimated wait exceeds the bound; returns
        the estimate of admitted work."""
        wait = self.wait_s(worker, turns) * scale
        if self.max_wait_s <= 0:
            return wait
        if wait > self.max_wait_s:
            if self._on_refuse is not None:
                self._on_refuse(kind)
            what = "realtime turn" if kind == "realtime" else f"{kind} request"
            raise Overloaded(what, wait, self.max_wait_s)
        return wait

    def admit_realtime(self, worker: str, mode: str) -> float:
        return self.admit("realtime", worker, self.turns_to_first_output(mode), self.scale(mode))
