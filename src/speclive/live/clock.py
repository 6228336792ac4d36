"""Clocks and the driver that plays audio into a live pipeline in real time.

A pipeline reads time from a clock; the driver hands it input chunks at their arrival times
and lets it compute (``step``) in between. Two clocks, one driver:

- ``WallClock``: real time; the driver sleeps until each chunk is due (a file played at 1x,
  or a microphone).
- ``VirtualClock``: an honest simulated clock. It runs with real time while the pipeline
  computes, so every second of compute is charged, and it jumps over idle gaps instead of
  sleeping (a benchmark runs as fast as the machine computes, with the same timeline).

Either way compute is sequential: audio that arrives while the pipeline is busy waits, and
``PlayResult.max_lag_s`` says for how long at most.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from speclive.asr.audio import SAMPLE_RATE
from speclive.live.events import Event


class Clock(Protocol):
    def __call__(self) -> float: ...

    def wait_until(self, t: float) -> None: ...

    def to_perf(self, t: float) -> float:
        """``t`` as a ``time.perf_counter()`` value (deadlines for the engine)."""
        ...


class WallClock:
    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self._t0

    def wait_until(self, t: float) -> None:
        dt = t - self()
        if dt > 0:
            time.sleep(dt)

    def to_perf(self, t: float) -> float:
        return self._t0 + t


class VirtualClock:
    """Real time while computing; idle gaps skipped (see the module docstring)."""

    def __init__(self) -> None:
        self._base = 0.0
        self._real = time.perf_counter()

    def __call__(self) -> float:
        return self._base + (time.perf_counter() - self._real)

    def wait_until(self, t: float) -> None:
        if t > self():
            self._base, self._real = t, time.perf_counter()

    def to_perf(self, t: float) -> float:
        return self._real + (t - self._base)


class Pipeline(Protocol):
    clock: Clock

    def push(self, chunk: np.ndarray) -> list[Event]: ...

    def step(self, deadline: float | None = None) -> list[Event] | None: ...

    def close(self) -> list[Event]: ...


@dataclass
class PlayResult:
    events: list[Event] = field(default_factory=list)
    #: longest wait of an input chunk (arrival -> handed to the pipeline)
    max_lag_s: float = 0.0
    input_s: float = 0.0


def chunks_of(audio: np.ndarray, chunk_s: float = 0.1) -> Iterable[np.ndarray]:
    n = max(1, int(round(chunk_s * SAMPLE_RATE)))
    for i in range(0, len(audio), n):
        yield audio[i : i + n]


def play(
    pipeline: Pipeline, audio: np.ndarray | Iterable[np.ndarray], chunk_s: float = 0.1, on_event=None
) -> PlayResult:
    """Feed 16 kHz ``audio`` to ``pipeline`` in ``chunk_s`` chunks at their arrival times on the
    pipeline's clock, let it compute in between, then ``close()`` it (which finishes the work
    in progress). ``on_event`` sees each event as it is emitted. ``audio`` may also be an
    iterable of chunks, read one at a time: a source that decides what comes next from the
    events so far (a caller who talks over the answer once it is heard)."""
    clock = pipeline.clock
    res = PlayResult()
    if isinstance(audio, np.ndarray):
        audio = chunks_of(np.asarray(audio, np.float32), chunk_s)

    def emit(evs: list[Event] | None) -> None:
        for ev in evs or []:
            res.events.append(ev)
            if on_event is not None:
                on_event(ev)

    arrived = 0
    for chunk in audio:
        chunk = np.asarray(chunk, np.float32)
        due = (arrived + len(chunk)) / SAMPLE_RATE
        while clock() < due:
            evs = pipeline.step(deadline=due)
            if evs is None:  # nothing to do: idle until the chunk arrives
                break
            emit(evs)
        clock.wait_until(due)
        res.max_lag_s = max(res.max_lag_s, clock() - due)
        emit(pipeline.push(chunk))
        arrived += len(chunk)
    res.input_s = arrived / SAMPLE_RATE
    emit(pipeline.close())
    return res
