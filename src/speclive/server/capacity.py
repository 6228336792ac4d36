"""Admission by measured capacity: how long new work would wait for a model worker.

Every model call runs on one worker thread per model (``worker.py``). The worker serves its
foreground units in the order of when they are *owed*: a unit is owed from the moment it is
submitted, except the units of a realtime turn that was admitted and has not produced its
first output yet, which are all owed from the moment the turn was admitted (and a session's
incoming audio, which goes ahead of everything: the VAD must hear the ends of turns on time).
So an admitted turn is not slowed by the turns admitted after it, and the wait of new work is
the work owed before it, which the server can price:

- ``TurnCosts``: the worker times every unit it runs. A call's duration goes into an
  exponential moving average per kind of call (the function it runs: a realtime session's
  pipeline step, a Piper synthesis, a model load); a stream's turn into the stream's own
  average (a chat completion's decoder steps; a batched verification round is shared out
  among the streams it served), seeded by the average of all stream turns.
- ``ModelWorker.wait_s()``: the rest of the unit in progress plus one unit of everything
  queued in the foreground. Background work (speculation) is left out: foreground work goes
  ahead of it.
- **Reservations** (``Admission.admit_realtime``): an admitted realtime turn reserves the
  worker seconds a turn of its mode takes from its end to its first output (measured: the
  median of what the last ``WORK_WINDOW`` admitted turns took, ``DEFAULT_WORK_S`` until one
  was measured). What is left of the reservations of turns still waiting for their first
  output is owed before any new work.

``Admission`` turns that into a decision. A REST request starts with one unit (a chat
completion's first step, a synthesis, a transcription's first segment): its wait is the
worker's ``wait_s`` plus the reserved seconds. A realtime turn's wait for its first output is
that plus its own reservation, scaled by a calibration learned from what followed: each
admitted turn tells how long it really waited (``first_output``), and the scale tracks the
``SCALE_QUANTILE`` quantile of real wait over estimate (learned from estimates of at least
``CALIBRATE_FROM_S`` once ``CALIBRATE_AFTER`` turns were measured, kept between 1 and
``MAX_SCALE``). The bound is on the time the user waits, so a realtime turn's estimate is
added to what it has waited already (from the arrival of the audio that ended its speech to
the moment the VAD ended the turn), and it may fill only ``HEADROOM`` of the bound; until
``CALIBRATE_AFTER`` turns of its mode were measured, a turn is admitted only when no other is
waiting for its first output. Work whose estimate exceeds the bound
(``ServerConfig.max_wait_s``) is refused at once with ``Overloaded``: a REST 503 with
``Retry-After``, a realtime ``error`` event and close 1013. Work with nothing owed ahead of it
is always admitted, whatever the machine's speed: it cannot start sooner.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from speclive.server.errors import APIError

#: weight of a new sample in the moving averages
ALPHA = 0.2
#: worker seconds a realtime turn is expected to take to its first output before one was measured
DEFAULT_WORK_S = 1.0
#: the realtime turns whose measured work makes the estimate (its median: a server's first turns
#: pay for warm-ups and must not set the estimate for long)
WORK_WINDOW = 16
#: measured turns of a mode before its waits teach the calibration (until then the estimate is
#: off by whatever ``DEFAULT_WORK_S`` is off, which says nothing about the load)
CALIBRATE_AFTER = 3
#: realtime estimates shorter than this do not teach the calibration (an idle worker's estimate
#: is its own work alone, so a ratio to it says little about a loaded one)
CALIBRATE_FROM_S = 0.5
#: the quantile of real wait over estimate the calibration tracks
SCALE_QUANTILE = 0.98
#: how far one observation moves the calibration (log scale)
SCALE_STEP = 0.2
#: the largest correction the calibration applies
MAX_SCALE = 4.0
#: the share of the bound a realtime turn's estimate may fill: the rest is kept for what the
#: estimate does not see (a unit in progress that runs long, a turn whose first sentence is long)
HEADROOM = 0.8


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


@dataclass(eq=False)
class Reservation:
    """An admitted realtime turn waiting for its first output, and the worker seconds its units
    have taken so far (``work_s``, added by the session as they run)."""

    worker: str
    mode: str
    #: when it was admitted (the admission's clock)
    admitted_t: float
    #: the estimated wait it was admitted with (seconds from admission to its first output)
    estimate_s: float
    #: the same before the calibration's factor
    base_s: float
    #: how many turns of its mode had been measured when it was admitted
    measured: int = 0
    work_s: float = 0.0


class Admission:
    """Admits REST requests and realtime turns by their estimated wait (module docstring).

    ``wait_of(worker)`` gives the named worker's ``wait_s`` (0 for a worker not started yet);
    ``on_refuse(kind)`` counts a refusal; ``clock`` times the realtime turns' real waits.
    """

    def __init__(
        self,
        max_wait_s: float,
        wait_of: Callable[[str], float],
        on_refuse: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        #: the bound in seconds (0: no bound, everything is admitted)
        self.max_wait_s = max_wait_s
        self._wait_of = wait_of
        self._on_refuse = on_refuse
        self._clock = clock
        self._lock = threading.Lock()
        #: realtime mode -> the worker seconds from the end of its last turns to their first output
        self._works: dict[str, deque[float]] = {}
        #: realtime mode -> the calibration of its estimates (``first_output``)
        self._scale: dict[str, float] = {}
        #: admitted realtime turns still waiting for their first output
        self._open: list[Reservation] = []

    # ---- what is owed -------------------------------------------------------------------
    def _work_s(self, mode: str) -> float:
        works = self._works.get(mode)
        return statistics.median(works) if works else DEFAULT_WORK_S

    def work_s(self, mode: str) -> float:
        """Worker seconds a realtime turn of ``mode`` takes to its first output: the median of
        the last ``WORK_WINDOW`` measured."""
        with self._lock:
            return self._work_s(mode)

    def reserved_s(self, worker: str) -> float:
        """What is left of the reservations of ``worker``'s admitted turns still waiting for
        their first output (their units go ahead of any new work)."""
        with self._lock:
            return sum(max(0.0, self._work_s(r.mode) - r.work_s) for r in self._open if r.worker == worker)

    def open_turns(self, worker: str) -> int:
        with self._lock:
            return sum(r.worker == worker for r in self._open)

    def _measured(self, mode: str) -> int:
        with self._lock:
            return len(self._works.get(mode, ()))

    def scale(self, mode: str) -> float:
        """The calibration of ``mode``'s realtime estimates (1 until a loaded turn was measured)."""
        with self._lock:
            return self._scale.get(mode, 1.0)

    def wait_s(self, worker: str) -> float:
        """The estimated wait of a new REST request's first unit on ``worker``."""
        return self._wait_of(worker) + self.reserved_s(worker)

    def _estimate(self, worker: str, mode: str) -> tuple[float, float, float]:
        """A realtime turn of ``mode`` ending now: what is owed ahead of it, its wait for its
        first output before the calibration, and the calibration's factor."""
        ahead = self.wait_s(worker)
        return ahead, ahead + self.work_s(mode), self.scale(mode)

    def realtime_wait_s(self, worker: str, mode: str) -> float:
        """The estimated wait of a realtime turn of ``mode`` ending now for its first output."""
        _, base, scale = self._estimate(worker, mode)
        return base * scale

    # ---- decisions ----------------------------------------------------------------------
    def _refuse(self, kind: str, wait: float) -> Overloaded:
        if self._on_refuse is not None:
            self._on_refuse(kind)
        what = "realtime turn" if kind == "realtime" else f"{kind} request"
        return Overloaded(what, wait, self.max_wait_s)

    def admit(self, kind: str, worker: str) -> float:
        """Refuse (``Overloaded``) a ``kind`` REST request whose estimated wait exceeds the
        bound; returns the estimate of admitted work."""
        wait = self.wait_s(worker)
        if 0 < self.max_wait_s < wait:
            raise self._refuse(kind, wait)
        return wait

    def _checked(self, worker: str, mode: str, waited_s: float) -> tuple[float, float, int]:
        """``_estimate``'s wait before the calibration and its factor, and the turns of ``mode``
        measured so far, for a realtime turn whose user has waited ``waited_s`` already; refused
        (``Overloaded``) when that wait plus its estimate is over the bound."""
        ahead, base, scale = self._estimate(worker, mode)
        measured = self._measured(mode)
        wait = waited_s + base * scale
        # with nothing owed ahead of it the turn cannot start sooner: it is admitted however
        # slow the machine is (the bound limits waiting, and its wait teaches the calibration);
        # until the turns of its mode were measured, only a turn with no other open is
        if self.max_wait_s > 0 and ahead > 0:
            alone = self.open_turns(worker) == 0
            if wait > HEADROOM * self.max_wait_s or not (measured >= CALIBRATE_AFTER or alone):
                raise self._refuse("realtime", wait)
        return base, scale, measured

    def check_realtime(self, worker: str, mode: str, waited_s: float = 0.0) -> float:
        """Refuse (``Overloaded``) a realtime turn of ``mode`` ending now, whose user has waited
        ``waited_s`` already, when that plus its estimate exceeds the bound; returns the sum.
        Reserves nothing (a new session is checked this way when it connects)."""
        base, scale, _ = self._checked(worker, mode, waited_s)
        return waited_s + base * scale

    def admit_realtime(self, worker: str, mode: str, waited_s: float = 0.0) -> Reservation:
        """Admit a realtime turn of ``mode`` that ended now, after its user has waited
        ``waited_s`` already, or refuse it (``Overloaded``) when that plus its estimate exceeds
        the bound. The reservation is open until ``first_output`` or ``withdraw``."""
        base, scale, measured = self._checked(worker, mode, waited_s)
        res = Reservation(worker, mode, self._clock(), base * scale, base, measured)
        with self._lock:
            self._open.append(res)
        return res

    def first_output(self, res: Reservation) -> None:
        """``res``'s turn produced its first output: its reservation closes, its work joins the
        measured turns of its mode and its real wait teaches the calibration."""
        real = self._clock() - res.admitted_t
        with self._lock:
            if res not in self._open:
                return
            self._open.remove(res)
            works = self._works.setdefault(res.mode, deque(maxlen=WORK_WINDOW))
            if res.measured >= CALIBRATE_AFTER and res.base_s >= CALIBRATE_FROM_S:
                old = self._scale.get(res.mode, 1.0)
                up = real > old * res.base_s
                step = SCALE_STEP * (SCALE_QUANTILE if up else SCALE_QUANTILE - 1)
                self._scale[res.mode] = min(MAX_SCALE, max(1.0, old * math.exp(step)))
            if res.work_s > 0:
                works.append(res.work_s)

    def withdraw(self, res: Reservation) -> None:
        """``res``'s turn ended without its first output (cancelled, taken up again, failed, its
        session closed): its reservation closes, teaching nothing."""
        with self._lock:
            if res in self._open:
                self._open.remove(res)
