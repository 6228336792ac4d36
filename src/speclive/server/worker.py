"""One compute thread per loaded model: requests take turns on it, fairly.

A llama.cpp context (and a Whisper or Piper session) must be used from one thread at a time,
so every call into a model runs on that model's ``ModelWorker`` thread. The thread serves one
queue of *turns*:

- a **call** (``submit`` / ``call``) is one turn: a function run to completion (a Piper
  synthesis, a whole-file transcription, a model load);
- a **stream** (``stream``) is an iterator advanced by ONE item per turn (one decoder step of a
  chat generation, one pass of a streaming transcription); after its turn it goes back to the
  tail of the queue. Active streams therefore advance round-robin, interleaved with calls in
  arrival order, and one long generation cannot starve the others;
- **what is owed first runs first**: each foreground unit is owed from a moment, by default
  when it was submitted (a stream's next item: when it went back to the queue), and the worker
  takes the unit owed the longest (ties: in the order they came). ``submit_since(since, …)``
  owes a call from an earlier moment: the units of a realtime turn admitted at ``since`` (they
  go ahead of the work that came after the admission), or ``URGENT`` (a session's incoming
  audio, ahead of everything). Without ``since`` the queue is plain FIFO. A long unit may let
  the ``URGENT`` calls through without ending (``run_urgent``);
- a **background call** (``submit_background`` / ``call_background``) is work nobody waits for
  yet: a live session's speculation while its user is still speaking. It runs only when no
  other turn is queued, so on a busy server speculation gives way to the answers users wait
  for, and on an idle one it uses the idle time. A background call that has not started can be
  withdrawn with its future's ``cancel()``.

**Batched steps.** A stream's generator may yield a ``Batched(run, payload)`` instead of an
item: it needs a unit of work that can run together with other streams' (one verification
pass of each chat completion, all in one ``extend_many``). The worker then gives every other
queued stream its turn in the same round, collects the requests with the same ``run``, calls
``run`` once for them and sends each generator its own result (or throws its own exception
into it); what the generators yield next is delivered as their items. Streams still advance
one item per turn, round-robin.

**Costs.** The thread times every turn it runs (``TurnCosts``, ``capacity.py``): a call per
kind of call (the function it runs), a stream in its own moving average. ``wait_s()`` prices
the foreground work queued now: when a unit submitted now would start (admission uses it).

The iterator is created (``factory()``) and closed on the worker thread, so whatever it sets up
and tears down in a ``try/finally`` (a ``SpeculativeDecoder`` and its KV state) lives entirely
on that thread. Items reach the asyncio side through ``loop.call_soon_threadsafe``; awaiting
them never blocks the event loop. ``Stream.cancel()`` (a client went away) is thread-safe: the
worker closes the iterator on the stream's next turn (its ``finally`` releases the state) and
never advances it again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from speclive.server.capacity import TurnCosts, ema, wait_estimate

T = TypeVar("T")
log = logging.getLogger("speclive.server")

#: ``since`` of the work that goes ahead of everything else (ties keep their order)
URGENT = -math.inf


class _End:
    """Marks the normal end of a stream."""


@dataclass
class Batched:
    """A stream's request for work run together with other streams' requests for the same
    ``run``: ``run(payloads)`` returns one result per payload, in order (an exception object in
    place of a payload that failed, which is thrown into that stream's generator)."""

    run: Callable[[list[Any]], list[Any]]
    payload: Any


_NOTHING = object()


_END = _End()


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class StreamCancelled(Exception):
    """Raised by ``Stream.next()`` after the stream was cancelled."""


class _Call:
    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict, future: concurrent.futures.Future):
        self.fn, self.args, self.kwargs, self.future = fn, args, kwargs, future
        #: the kind of call its cost is averaged under: the function it runs
        self.key = getattr(fn, "__qualname__", type(fn).__name__)
        #: when the call is owed from, and its place among calls owed from the same moment
        self.since = 0.0
        self.seq = 0


class Stream(Generic[T]):
    """The asyncio end of an iterator run step by step on a ``ModelWorker``.

    ``await stream.next()`` (or ``async for``) gives the items in order; an exception raised by
    the iterator is re-raised here. ``cancel()`` stops it; ``finished`` tells whether the worker
    is done with it (ended, failed or closed after a cancel).
    """

    def __init__(
        self, worker: ModelWorker, factory: Callable[[], Iterator[T]], loop: asyncio.AbstractEventLoop
    ):
        self._worker = worker
        self._factory = factory
        self._loop = loop
        self._items: asyncio.Queue[Any] = asyncio.Queue()
        self._it: Iterator[T] | None = None
        self._cancelled = threading.Event()
        self._done = threading.Event()
        #: True when the stream was closed by ``cancel()`` before its iterator ended
        self.was_cancelled = False
        #: a ``Batched`` request the stream yielded right after a batched result: taken up in
        #: its next turn
        self._parked: Batched | None = None
        #: moving average of this stream's turns in seconds (None before its first)
        self.turn_s: float | None = None
        #: when its next item is owed from (it went back to the queue), and its place in line
        self.since = 0.0
        self.seq = 0

    # ---- asyncio side -----------------------------------------------------------------
    async def next(self) -> T:
        """The next item; ``StopAsyncIteration`` at the end; the iterator's exception if it failed."""
        item = await self._items.get()
        if item is _END:
            self._items.put_nowait(_END)  # later calls see the end again
            raise StopAsyncIteration
        if isinstance(item, _Failure):
            self._items.put_nowait(_END)
            raise item.exc
        return item

    def __aiter__(self) -> Stream[T]:
        return self

    async def __anext__(self) -> T:
        return await self.next()

    def cancel(self) -> None:
        """Stop the stream (thread-safe, idempotent): the worker closes its iterator."""
        if not self._done.is_set() and not self._cancelled.is_set():
            self._cancelled.set()
            self._worker._wake()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def wait_finished(self, timeout: float | None = None) -> bool:
        """Block until the worker is done with the stream (tests, shutdown)."""
        return self._done.wait(timeout)

    # ---- worker side ------------------------------------------------------------------
    def _deliver(self, item: Any) -> bool:
        """Hand ``item`` to the asyncio side; False when the event loop is gone."""
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
            return True
        except RuntimeError:  # loop closed: nobody will read this stream again
            return False

    def _close(self) -> None:
        it, self._it = self._it, None
        close = getattr(it, "close", None)
        if close is not None:
            try:
                close()  # runs the generator's finally blocks on this (the worker) thread
            except Exception:
                log.exception("closing a cancelled stream failed")
        self._done.set()

    def _turn(self, value: Any = _NOTHING, exc: BaseException | None = None) -> bool | Batched:
        """Advance by one item (sending ``value`` to, or throwing ``exc`` into, a generator that
        waits on a ``Batched`` request) and deliver it. Returns the ``Batched`` request the
        stream now waits on, or whether it wants another turn."""
        if self._parked is not None:
            req, self._parked = self._parked, None
            if not self._cancelled.is_set():
                return req
        if self._cancelled.is_set():
            self.was_cancelled = True
            self._close()
            self._deliver(_Failure(StreamCancelled("the stream was cancelled")))
            return False
        try:
            if self._it is None:
                self._it = iter(self._factory())
            if exc is not None:
                item = self._it.throw(exc)  # type: ignore[attr-defined]
            elif value is not _NOTHING:
                item = self._it.send(value)  # type: ignore[attr-defined]
            else:
                item = next(self._it)
        except StopIteration:
            self._it = None
            self._done.set()
            self._deliver(_END)
            return False
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting request
            self._close()
            self._deliver(_Failure(e))
            return False
        if isinstance(item, Batched):
            return item
        if not self._deliver(item):
            self.was_cancelled = True
            self._close()
            return False
        return True


class ModelWorker:
    """A thread owning one model; see the module docstring for the scheduling."""

    def __init__(self, name: str, clock: Callable[[], float] = time.perf_counter):
        self.name = name
        self._queue: deque[_Call | Stream[Any]] = deque()
        self._background: deque[_Call] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._current: _Call | Stream[Any] | None = None
        #: when the turn in progress began (``clock`` time)
        self._current_t0 = 0.0
        #: the other streams a batched round in progress serves (their turns are part of it)
        self._round: list[Stream[Any]] = []
        #: what the turns take (timed with ``clock``)
        self.costs = TurnCosts()
        self._clock = clock
        self._seq = itertools.count()
        self._thread = threading.Thread(target=self._loop, name=f"speclive-{name}", daemon=True)
        self._thread.start()

    # ---- submitting -------------------------------------------------------------------
    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        """Run ``fn(*args, **kwargs)`` as one turn; a ``concurrent.futures.Future`` of its result."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._put(_Call(fn, args, kwargs, fut))
        return fut

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``submit`` awaited from asyncio (the event loop keeps running meanwhile)."""
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def submit_since(
        self, since: float, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        """``submit``, owed from ``since`` (``now()``'s clock; ``URGENT``: ahead of everything)."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._put(_Call(fn, args, kwargs, fut), since=since)
        return fut

    async def call_since(self, since: float, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``submit_since`` awaited from asyncio."""
        return await asyncio.wrap_future(self.submit_since(since, fn, *args, **kwargs))

    def run_urgent(self) -> float:
        """Run the ``URGENT`` calls queued now, from inside the unit in progress (only on the
        worker thread): a long unit lets them through without ending. Returns their seconds."""
        if threading.current_thread() is not self._thread:
            raise RuntimeError("run_urgent() runs on the worker's own thread, inside a unit")
        spent = 0.0
        while True:
            with self._cv:
                task = next((t for t in self._queue if isinstance(t, _Call) and t.since == URGENT), None)
                if task is None:
                    return spent
                self._queue.remove(task)
            t0 = self._clock()
            if self._run_call(task):
                took = self._clock() - t0
                self.costs.observe_call(task.key, took)
                spent += took

    def now(self) -> float:
        """The worker's clock (what ``since`` is measured on)."""
        return self._clock()

    def submit_background(
        self, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        """Like ``submit``, but the call runs only when no foreground turn is waiting."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._put(_Call(fn, args, kwargs, fut), background=True)
        return fut

    async def call_background(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``submit_background`` awaited from asyncio."""
        return await asyncio.wrap_future(self.submit_background(fn, *args, **kwargs))

    def stream(self, factory: Callable[[], Iterator[T]]) -> Stream[T]:
        """Run ``factory()``'s iterator one item per turn; call from a running event loop."""
        s: Stream[T] = Stream(self, factory, asyncio.get_running_loop())
        self._put(s)
        return s

    @property
    def pending(self) -> int:
        """Turns waiting in the queues (active streams count once; withdrawn calls do not)."""
        with self._cv:
            return len(self._queue) + sum(not c.future.cancelled() for c in self._background)

    def wait_s(self) -> float:
        """Seconds until a foreground unit submitted now would start: the rest of the turn in
        progress plus one turn of each queued foreground unit (``capacity.wait_estimate``)."""
        with self._cv:
            elapsed = self._clock() - self._current_t0
            current = None
            if self._current is not None:
                current = (sum(self._cost(t) for t in [self._current, *self._round]), elapsed)
            queued = [
                self._cost(t) for t in self._queue if not (isinstance(t, _Call) and t.future.cancelled())
            ]
        return wait_estimate(current, queued)

    def _cost(self, task: _Call | Stream[Any]) -> float:
        """The expected seconds of ``task``'s next turn."""
        if isinstance(task, Stream):
            return self.costs.stream_s(task.turn_s)
        return self.costs.call_s(task.key)

    def _owed(self, task: _Call | Stream[Any], since: float | None = None) -> None:
        """``task`` is owed from ``since`` (default: now) and goes after everything owed as long."""
        task.since = self._clock() if since is None else since
        task.seq = next(self._seq)

    def _next(self) -> _Call | Stream[Any]:
        """Take the queued foreground unit owed the longest (called with ``_cv`` held)."""
        task = min(self._queue, key=lambda t: (t.since, t.seq))
        self._queue.remove(task)
        return task

    def _put(self, task: _Call | Stream[Any], background: bool = False, since: float | None = None) -> None:
        with self._cv:
            if self._closed:
                raise RuntimeError(f"the {self.name} worker is closed")
            self._owed(task, since)
            if background:
                assert isinstance(task, _Call)
                # withdrawn calls (cancelled futures) leave the queue here: a busy worker never
                # reaches them, and a session withdraws and resubmits for every audio chunk
                if any(c.future.cancelled() for c in self._background):
                    self._background = deque(c for c in self._background if not c.future.cancelled())
                self._background.append(task)
            else:
                self._queue.append(task)
            self._cv.notify()

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

    # ---- the thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._background and not self._closed:
                    self._cv.wait()
                if not self._queue and not self._background:  # closed and drained
                    return
                task = self._next() if self._queue else self._background.popleft()
                self._current = task
                self._current_t0 = t0 = self._clock()
            again: bool | Batched = False
            if isinstance(task, Stream):
                if self._closed:
                    task.cancel()
                again = task._turn()
                if isinstance(again, Batched):
                    self._batched_round(task, again, t0)
                    again = False
                elif not task.was_cancelled:
                    self._timed(task, self._clock() - t0)
            elif self._run_call(task):
                self.costs.observe_call(task.key, self._clock() - t0)
            with self._cv:
                self._current = None
                if again:
                    self._owed(task)
                    self._queue.append(task)

    def _timed(self, stream: Stream[Any], seconds: float) -> None:
        """One turn of ``stream`` took ``seconds``: its average and that of all streams."""
        stream.turn_s = ema(stream.turn_s, seconds)
        self.costs.observe_stream(seconds)

    def _batched_round(self, first: Stream[Any], request: Batched, t0: float) -> None:
        """``first`` waits on ``request``: every queued stream takes its turn now, the requests
        that share a ``run`` run as one call, each stream gets its result; all go back to the
        tail of the queue in their order. The round's time (from ``t0``) is shared out among
        its streams' turns."""
        with self._cv:
            others = [t for t in self._queue if isinstance(t, Stream)]
            for t in others:
                self._queue.remove(t)
            self._round = others
        waiting: list[tuple[Stream[Any], Batched]] = [(first, request)]
        again: list[Stream[Any]] = []
        for s in others:
            if self._closed:
                s.cancel()
            r = s._turn()
            if isinstance(r, Batched):
                waiting.append((s, r))
            elif r:
                again.append(s)
        groups: dict[Any, list[tuple[Stream[Any], Batched]]] = {}
        for s, r in waiting:
            groups.setdefault(r.run, []).append((s, r))
        for run, members in groups.items():
            try:
                results = run([r.payload for _, r in members])
                if len(results) != len(members):
                    raise RuntimeError(
                        f"a batched run gave {len(results)} results for {len(members)} requests"
                    )
            except BaseException as e:  # noqa: BLE001 - every stream of the batch learns of it
                results = [e] * len(members)
            for (s, _), res in zip(members, results, strict=True):
                r = s._turn(exc=res) if isinstance(res, BaseException) else s._turn(value=res)
                if isinstance(r, Batched):
                    s._parked = r
                    again.append(s)
                elif r:
                    again.append(s)
        served = [first, *others]
        share = (self._clock() - t0) / len(served)
        for s in served:
            self._timed(s, share)
        order = {id(s): i for i, s in enumerate(served)}
        with self._cv:
            self._round = []
            for s in sorted(again, key=lambda s: order[id(s)]):
                self._owed(s)
                self._queue.append(s)

    @staticmethod
    def _run_call(call: _Call) -> bool:
        """Run ``call`` into its future; False when it was withdrawn before it started."""
        if not call.future.set_running_or_notify_cancel():
            return False
        try:
            result = call.fn(*call.args, **call.kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            call.future.set_exception(exc)
        else:
            call.future.set_result(result)
        return True

    def close(self, timeout: float | None = 10.0) -> None:
        """Cancel open streams, finish queued calls, stop the thread."""
        with self._cv:
            self._closed = True
            for task in self._queue:
                if isinstance(task, Stream):
                    task._cancelled.set()
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
