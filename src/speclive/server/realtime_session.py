"""One realtime connection: its settings, its live pipeline, and the client events it takes.

``RealtimeSession.CLIENT_EVENTS`` is the table of the protocol's client events: event type ->
handler (``session.update``, ``input_audio_buffer.append`` / ``.commit`` / ``.clear``,
``response.create`` / ``.cancel``, ``conversation.item.create``). What the pipeline emits goes
out through the session's ``Conversation`` (``realtime_conversation.py``).

The compute loop also keeps the server's promises about turns:

- **Admission.** When the pipeline ends a turn, the answer becomes foreground work the user
  waits for. Before the pipeline computes it, the turn is admitted by measured capacity
  (``capacity.Admission``): one whose user would wait past ``max_wait_s`` for its first output
  (counted from the arrival of the audio where their speech ended) is refused with an ``error``
  event (``server_overloaded``) and close 1013. An admitted turn is never refused again (a turn
  the user takes up again stays admitted); it is answered, or cancelled by its client.
- **Order on the worker.** Incoming audio goes ahead of everything (``URGENT``). Until its
  first output (the answer's audio), an admitted turn's units are owed from its admission, so
  the turns admitted after it wait for it rather than share the worker with it, and its steps
  run in units of up to ``ADMITTED_SLICE_S`` that let the other sessions' audio through between
  steps; the seconds its steps take are the turn's measured work. After its first output the rest of
  the answer queues like any other work.
- **Faults.** A pipeline unit that raises (a model failing mid-answer) does not end the
  session: the client gets an ``error`` event (``server_error``), the response in progress ends
  as ``failed``, and a fresh pipeline with the same settings and the conversation so far takes
  the next turn. Only ``MAX_FAILURES`` failures in a row end the session (close 1011).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import numpy as np
from fastapi import WebSocket, WebSocketDisconnect

from speclive.live import events as ev
from speclive.live.build import LiveModels
from speclive.live.pipeline import LivePipeline
from speclive.live.vad import TurnConfig
from speclive.server.audio import resample
from speclive.server.capacity import Overloaded, Reservation
from speclive.server.ratelimit import TokenBucket
from speclive.server.realtime_conversation import Conversation
from speclive.server.realtime_protocol import BETA_NAMES, CLOSE_OVERLOADED, CLOSE_SLOW, ProtocolError, new_id
from speclive.server.realtime_settings import SessionClock, SessionSettings, apply_update, pipeline_for
from speclive.server.worker import URGENT

log = logging.getLogger("speclive.server")

#: one step of the pipeline computes at most this long before new audio is taken in
STEP_S = 0.1
#: an admitted turn waiting for its first output runs its steps in units of about this long
ADMITTED_SLICE_S = 1.0
#: largest audio payload of one append event (OpenAI's limit is 15 MiB of base64)
MAX_APPEND_BYTES = 15 * 1024 * 1024
#: received audio not yet taken by the pipeline, past which appends are refused
MAX_BACKLOG_S = 30.0
#: pipeline units failing one after the other past which the session ends (close 1011)
MAX_FAILURES = 3


def decode_audio(b64: Any, rate: int) -> np.ndarray:
    """base64 PCM16 LE mono at ``rate`` -> float32 at 16 kHz."""
    if not isinstance(b64, str):
        raise ProtocolError("invalid_type", "audio must be a base64 string", "audio")
    if len(b64) > MAX_APPEND_BYTES:
        raise ProtocolError("invalid_value", f"audio payload over {MAX_APPEND_BYTES} bytes", "audio")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ProtocolError("invalid_audio", f"audio is not valid base64: {e}", "audio") from e
    if len(raw) % 2:
        raise ProtocolError("invalid_audio", "PCM16 audio must have an even number of bytes", "audio")
    x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    return resample(x, rate, 16_000) if rate != 16_000 else x


class RealtimeSession:
    """One WebSocket connection: settings, a pipeline, and the event mapping."""

    def __init__(self, ws: WebSocket, services: Any, models: LiveModels, model_name: str, beta: bool = False):
        self.ws = ws
        cfg = services.config
        self.events = TokenBucket(cfg.realtime_events_per_s, 2 * cfg.realtime_events_per_s)
        self.send_timeout_s = cfg.realtime_send_timeout_s
        #: when the last rate-limit error was sent (one a second at most)
        self.rate_error_t = float("-inf")
        #: why the server closes the connection: (code, reason)
        self.close_with: tuple[int, str] | None = None
        #: the client speaks the beta protocol (its event names for response audio)
        self.beta = beta
        self.svc = services
        self.models = models
        self.model_name = model_name
        self.id = new_id("sess")
        self.settings = SessionSettings()
        self.pipeline: LivePipeline | None = None
        self.audio: list[np.ndarray] = []
        #: when each chunk of ``audio`` arrived (``time.monotonic``)
        self.arrived: list[float] = []
        #: (end sample in the pipeline's input, arrival time) of the chunks pushed lately
        self.pushed: deque[tuple[int, float]] = deque(maxlen=2048)
        #: the input time (s) where the speech of the turn the pipeline just ended stopped
        self.turn_end_audio_t: float | None = None
        self.wake = asyncio.Event()
        self.closed = False
        self.conversation = Conversation(self.send, self.error, lambda: self.settings)
        self.lock = asyncio.Lock()  # one send at a time
        #: a session.update that needs a new pipeline, waiting for the turn in progress to end
        self.pending: SessionSettings | None = None
        #: the pipeline ended a turn that is not admitted yet
        self.admitting = False
        #: the last turn admitted (the pipeline's turn object)
        self.admitted_turn: Any = None
        #: the admitted turn's reservation while it waits for its first output
        self.reservation: Reservation | None = None
        #: when that turn's units are owed from on the worker (its admission, worker clock)
        self.owed_since: float | None = None
        #: why the turn that just ended was refused
        self.refused: Overloaded | None = None

    def busy(self) -> bool:
        """A turn is open, or its answer is still being worked out or sent."""
        return self.pipeline is not None and self.pipeline.working

    # ---- sending ----------------------------------------------------------------------
    async def send(self, type_: str, **payload: Any) -> None:
        if self.closed:
            return
        if self.beta:
            type_ = BETA_NAMES.get(type_, type_)
        msg = {"type": type_, "event_id": new_id("event"), **payload}
        async with self.lock:
            if self.closed:
                return
            try:
                await asyncio.wait_for(self.ws.send_text(json.dumps(msg)), self.send_timeout_s)
            except (WebSocketDisconnect, RuntimeError):
                pass
            except TimeoutError:
                # the client stopped reading: nothing more goes to it, the session ends
                log.warning(
                    "realtime session %s: client not reading for %.0f s", self.id, self.send_timeout_s
                )
                self.closed = True
                self.close_with = (CLOSE_SLOW, "client is not reading events")
                self.wake.set()

    async def error(
        self,
        code: str,
        message: str,
        param: str | None = None,
        event_id: str | None = None,
        type_: str = "invalid_request_error",
    ) -> None:
        self.svc.metrics.realtime_errors.labels(code=code).inc()
        await self.send(
            "error",
            error={
                "type": type_,
                "code": code,
                "message": message,
                "param": param,
                "event_id": event_id,
            },
        )

    async def send_session(self, type_: str) -> None:
        """``session.created`` / ``session.updated``: the session's settings now."""
        await self.send(type_, session=self.settings.describe(self.id, self.model_name))

    # ---- the pipeline -----------------------------------------------------------------
    async def start_pipeline(self, keep_history: bool = False) -> None:
        """A new pipeline for the settings (the old one is dropped); ``keep_history``: it goes on
        with the old one's conversation history (where the pipeline keeps one)."""
        old, self.pipeline = self.pipeline, None
        self.pushed.clear()  # the new pipeline's input starts again at 0
        worker = self.svc.worker("chat")
        await self.conversation.drop_pipeline()  # every response.created gets its response.done
        if old is not None:  # a session.update that needs another pipeline, or a failed one: free it
            try:
                await worker.call(old.abort)
            except Exception:
                log.exception("realtime session %s: dropping its pipeline failed", self.id)
        self.pipeline = await worker.call(
            pipeline_for,
            self.settings,
            self.models,
            TurnConfig(max_turn_s=self.svc.config.max_turn_s, end_s=self.settings.end_s),
        )
        history = getattr(old, "history", None)
        if keep_history and history and hasattr(self.pipeline, "history"):
            self.pipeline.history = list(history)

    def stop_compute(self) -> None:
        """The session ends: the pipeline unit in progress returns after its current piece of
        work (its clock passes every deadline), and no other unit starts."""
        self.closed = True
        self.wake.set()
        self._withdraw()
        clock = getattr(self.pipeline, "clock", None)
        if isinstance(clock, SessionClock):
            clock.expire()

    async def compute_loop(self) -> None:
        """Push the audio that arrived, let the pipeline compute in short slices, send what it
        emits; sleep while there is nothing to do. A turn that ends is admitted first; a unit
        that fails is reported and the session goes on (module docstring)."""
        worker = self.svc.worker("chat")
        try:
            failures = 0
            while not self.closed:
                try:
                    events, out = await self._compute(worker)
                except Exception:
                    failures += 1
                    log.exception("realtime session %s: the pipeline failed", self.id)
                    if failures >= MAX_FAILURES:
                        raise
                    await self._recover()
                    continue
                failures = 0
                for e in events:
                    self._observe_output(e)
                    await self.conversation.on_event(e)
                if self.refused is not None:
                    await self._refuse(self.refused)
                    return
                if self.pending is not None and not self.busy():
                    self.settings, self.pending = self.pending, None
                    await self.start_pipeline()
                    await self.send_session("session.updated")
                    continue
                if not events and not self.audio and out is None:
                    self.wake.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), timeout=0.5)
        finally:
            self._withdraw()  # however the loop ends, its turn no longer owes

    async def _compute(self, worker: Any) -> tuple[list[ev.Event], list[ev.Event] | None]:
        """The audio that arrived into the pipeline, a turn it ended admitted, then one unit of
        compute: all the events, and the unit's (None: nothing was computed)."""
        pipe = self.pipeline
        chunks, self.audio = self.audio, []
        arrived, self.arrived = self.arrived, []
        events: list[ev.Event] = []
        if pipe is None:
            return events, None
        if chunks:
            self._note_arrivals(pipe, chunks, arrived)
            events += await worker.call_since(URGENT, pipe.push, np.concatenate(chunks))
        self._note_turn_end(events)
        if self.admitting and not self._admit(pipe, worker):
            return events, None
        out = await self._step(worker, pipe)
        self._note_turn_end(out)
        return events + (out or []), out

    # ---- admission and faults -----------------------------------------------------------
    def _note_arrivals(self, pipe: LivePipeline, chunks: list[np.ndarray], arrived: list[float]) -> None:
        """Where the chunks about to be pushed end in the pipeline's input, and when they came."""
        end = getattr(pipe, "received", 0)
        for chunk, t in zip(chunks, arrived, strict=True):
            end += len(chunk)
            self.pushed.append((end, t))

    def _note_turn_end(self, events: list[ev.Event] | None) -> None:
        """The pipeline ended a turn: it is to be admitted; where its speech stopped."""
        for e in events or ():
            if isinstance(e, ev.SpeechStopped) and e.end_of_turn:
                self.admitting = True
                self.turn_end_audio_t = e.audio_t

    def _waited(self) -> float:
        """Seconds since the audio where the ended turn's speech stopped arrived (0: unknown)."""
        if self.turn_end_audio_t is None:
            return 0.0
        sample = self.turn_end_audio_t * 16_000
        came = next((t for end, t in self.pushed if end >= sample), None)
        return max(0.0, time.monotonic() - came) if came is not None else 0.0

    def _admit(self, pipe: LivePipeline, worker: Any) -> bool:
        """Admit the turn the pipeline just ended, or note why it is refused (``refused``)."""
        self.admitting = False
        if self.closed:
            return False
        turn = getattr(pipe, "turn", None)
        if turn is not None and turn is self.admitted_turn:
            return True  # taken up again and ended again: it was admitted already
        self._withdraw()
        try:
            res = self.svc.admission.admit_realtime("chat", self.settings.mode, self._waited())
        except Overloaded as refusal:
            self.refused = refusal
            return False
        self.admitted_turn, self.reservation, self.owed_since = turn, res, worker.now()
        log.debug("realtime session %s: turn admitted, estimated wait %.2f s", self.id, res.estimate_s)
        return True

    def _withdraw(self) -> None:
        """The admitted turn will not produce its first output: its reservation closes."""
        if self.reservation is not None:
            self.svc.admission.withdraw(self.reservation)
        self.reservation = self.owed_since = None

    async def _refuse(self, refusal: Overloaded) -> None:
        """The turn that just ended cannot be answered in time: ``error`` and close 1013."""
        await self.error("server_overloaded", refusal.message, type_="server_error")
        self.close_with = (CLOSE_OVERLOADED, f"server overloaded; retry in {refusal.retry_after} s")
        self.closed = True

    def _first_output(self) -> tuple[type[ev.Event], ...]:
        """The events that are a turn's first output in this session's mode."""
        mode = self.settings.mode
        if mode == "chat":
            if not self.settings.speak or self.models.tts is None:
                return (ev.AnswerDelta,)
            return (ev.AudioChunk,)
        return (ev.TranslationUpdate,) if mode == "translate" else (ev.TranscriptFinal,)

    def _observe_output(self, e: ev.Event) -> None:
        """The admitted turn's first output closes its reservation (admission learns from it)."""
        if self.reservation is None:
            return
        if isinstance(e, self._first_output()):
            self.svc.admission.first_output(self.reservation)
            self.reservation = self.owed_since = None
        elif isinstance(e, ev.TurnMetrics | ev.Interrupted):
            self._withdraw()  # the turn ended without that output

    async def _recover(self) -> None:
        """A pipeline unit raised: the client is told, the answer in progress ends as failed,
        and a fresh pipeline with the conversation so far takes the next turn."""
        what = "the server failed while computing this turn; the session goes on"
        await self.error("server_error", what, type_="server_error")
        await self.conversation.fail_response()
        self.admitting, self.admitted_turn = False, None
        self._withdraw()
        await self.start_pipeline(keep_history=True)

    def _admitted_unit(self, worker: Any, pipe: LivePipeline) -> list[ev.Event] | None:
        """Steps of an admitted turn that waits for its first output, run on the worker as one
        unit: until that output, a step without events, or for ``ADMITTED_SLICE_S`` (the
        session's own audio waits for it). Between the steps the other sessions' incoming audio
        runs (``run_urgent``), so their VADs keep time, and no other turn's unit gets in between.
        The steps' time is the turn's work."""
        res, first = self.reservation, self._first_output()
        out: list[ev.Event] | None = None
        t_end = time.perf_counter() + ADMITTED_SLICE_S
        while not self.closed:
            t0 = time.perf_counter()
            try:
                events = pipe.step(pipe.clock() + STEP_S)
            finally:
                if res is not None:
                    res.work_s += time.perf_counter() - t0
            if events is None:
                break
            out = [*(out or []), *events]
            if not events or any(isinstance(e, first) for e in events) or time.perf_counter() >= t_end:
                break  # (no events: the step may wait for something else, such as audio)
            worker.run_urgent()
        return out

    async def _step(self, worker: Any, pipe: LivePipeline) -> list[ev.Event] | None:
        """One unit of the pipeline's compute. Speculation (``pipe.background``) waits for the
        turns other users wait on; while it is still queued, audio that arrives goes first (the
        VAD must hear the end of the turn on time) and the unit is asked for again after it."""

        def unit(p: Any = pipe) -> list[ev.Event] | None:
            if self.closed:  # the session ended while this unit waited for its turn
                return None
            return p.step(p.clock() + STEP_S)

        if not pipe.background:
            if self.owed_since is not None:  # set and cleared with the reservation
                return await worker.call_since(self.owed_since, self._admitted_unit, worker, pipe)
            return await worker.call(unit)
        fut = worker.submit_background(unit)
        while not fut.running() and not fut.done():
            if self.audio or self.closed:
                if fut.cancel():
                    return None
                break
            self.wake.clear()
            waiter = asyncio.ensure_future(self.wake.wait())
            await asyncio.wait([asyncio.wrap_future(fut), waiter], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        return await asyncio.wrap_future(fut)

    # ---- client events ------------------------------------------------------------------
    async def within_rate(self) -> bool:
        """Count one client event against the rate; an event over it gets (at most one a second)
        an error and is dropped."""
        if self.events.take():
            return True
        now = asyncio.get_running_loop().time()
        if now - self.rate_error_t >= 1.0:
            self.rate_error_t = now
            await self.error(
                "rate_limit_exceeded",
                f"more than {self.events.rate:g} events per second: events are being dropped",
            )
        return False

    async def handle(self, raw: str) -> None:
        try:
            msg = json.loads(raw)
        except ValueError:
            await self.error("invalid_json", "the event is not valid JSON")
            return
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            await self.error("invalid_event", "an event must be a JSON object with a string 'type'")
            return
        kind, event_id = msg["type"], msg.get("event_id")
        if not isinstance(event_id, str | None):
            event_id = None
        try:
            await self.dispatch(kind, msg)
        except ProtocolError as e:
            await self.error(e.code, e.message, e.param, event_id)
        except Exception:
            # a bug met by this event: the client is told, the session goes on, the log says why
            log.exception("realtime session %s: %s event failed", self.id, kind)
            await self.error("server_error", "the server failed to handle this event", None, event_id)

    async def dispatch(self, kind: str, msg: dict) -> None:
        """Client event ``msg`` of type ``kind`` to its handler in ``CLIENT_EVENTS``."""
        handler = self.CLIENT_EVENTS.get(kind)
        if handler is None:
            raise ProtocolError("unknown_event", f"unknown event type {kind!r}", "type")
        await handler(self, msg)

    async def _session_update(self, msg: dict) -> None:
        new = apply_update(self.settings, msg.get("session"))
        rebuild = new.turn_key() != self.settings.turn_key()
        if rebuild and self.busy():
            # a new pipeline starts between turns: this turn finishes as it began
            self.pending = new
            return
        self.settings = new
        self.pending = None
        if rebuild:
            await self.start_pipeline()
        await self.send_session("session.updated")

    async def _append(self, msg: dict) -> None:
        x = decode_audio(msg.get("audio"), self.settings.input_rate)
        if sum(map(len, self.audio)) + len(x) > MAX_BACKLOG_S * 16_000:
            raise ProtocolError(
                "audio_backlog",
                f"over {MAX_BACKLOG_S:g} s of audio wait to be processed: this append is dropped",
                "audio",
            )
        self.audio.append(x)
        self.arrived.append(time.monotonic())
        self.wake.set()

    async def _commit(self, msg: dict) -> None:
        if not self.settings.server_vad:
            # the client says the turn is over: the VAD hears the silence that ends a turn
            end_s = self.pipeline.cfg.turn.end_s if self.pipeline is not None else 0.5
            self.audio.append(np.zeros(int((end_s + 0.2) * 16_000), np.float32))
            self.arrived.append(time.monotonic())
            self.wake.set()

    async def _clear(self, msg: dict) -> None:
        self.audio, self.arrived = [], []
        await self.send("input_audio_buffer.cleared")

    async def _response_create(self, msg: dict) -> None:
        pass  # answers follow each turn by themselves

    async def _response_cancel(self, msg: dict) -> None:
        await self.conversation.cancel_response()

    async def _item_create(self, msg: dict) -> None:
        raise ProtocolError("unsupported_event", "text conversation items are not supported: send audio")

    CLIENT_EVENTS: ClassVar[dict[str, Callable[[RealtimeSession, dict], Awaitable[None]]]] = {
        "session.update": _session_update,
        "input_audio_buffer.append": _append,
        "input_audio_buffer.commit": _commit,
        "input_audio_buffer.clear": _clear,
        "response.create": _response_create,
        "response.cancel": _response_cancel,
        "conversation.item.create": _item_create,
    }
