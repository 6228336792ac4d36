"""``WS /v1/realtime``: the OpenAI Realtime event protocol over speclive's live pipelines.

A thin shell: a session owns one live pipeline (``speclive.live``: voice chat, live translation
or transcription) and maps protocol events to pipeline calls and pipeline events back to
protocol events. Nothing here decides what to transcribe, speculate or say.

Client -> server: ``session.update`` (the GA shape ``audio.input.format.rate``,
``audio.input.turn_detection``, ``audio.output.voice``, ``output_modalities``, or the beta
shape ``modalities``, ``voice``, ``input_audio_format`` /
``output_audio_format`` ``pcm16``, ``turn_detection`` ``{"type": "server_vad"}``,
``{"type": "semantic_vad", "eagerness": "low" | "medium" | "high" | "auto"}`` or null, and
speclive's own ``speclive`` object: ``mode`` chat | translate | transcribe, ``method`` (chat:
predgen | cascade | prefill | preemptive; translate: ssbd | ar | cascade), ``verifier``,
``target_lang``, ``sample_rate`` 16000 | 24000), ``input_audio_buffer.append`` (base64 PCM16 mono
little-endian at the session's rate; 24 kHz unless told 16 kHz, as OpenAI's), ``.commit`` (ends
the turn when server VAD is off), ``.clear``, ``response.create`` (answers come by themselves
with server VAD: accepted and ignored), ``response.cancel``.

Server -> client: ``session.created`` / ``session.updated``, ``input_audio_buffer.speech_started``
/ ``speech_stopped`` / ``committed`` / ``cleared``, ``conversation.item.created``,
``conversation.item.input_audio_transcription.delta`` / ``.completed``, ``response.created``,
``response.output_item.added``, ``response.content_part.added``,
``response.output_audio_transcript.delta``, ``response.output_audio.delta`` (base64 PCM16 at the
session's rate; the beta protocol's ``response.audio.*`` names when the client asks for the
beta), their ``.done`` events,
``response.done`` and ``error``. speclive's own: ``speclive.speculation`` (the answer speculated
while the user speaks), ``speclive.transcript`` (stable / tentative words), ``speclive.translation``
(stable / tentative text), ``speclive.turn_prediction`` (semantic_vad: the end-of-turn
probabilities at a pause and the decision), ``speclive.notice`` and ``speclive.turn_metrics``
(per-turn latency).

Compute: every push and step of the pipeline is one turn of the chat model's worker, so
realtime sessions and chat completions share the LLM fairly and one at a time (a llama.cpp
context is not thread-safe). Bad input (malformed JSON, a binary frame, an unknown event, audio
that is not base64 PCM16) gets an ``error`` event and the session goes on; too many sessions
close with 1013, a missing or wrong API key with 1008 (``middleware.AuthMiddleware``).

Limits (``ServerConfig``): events over the session's rate are dropped with an ``error``
(``rate_limit_exceeded``, at most one a second); a turn longer than ``max_turn_s`` is ended
there and answered (``turn_too_long``); audio that piles up
unprocessed past ``MAX_BACKLOG_S`` is refused (``audio_backlog``); a session idle for
``realtime_idle_s`` (no client event, and no turn or answer in progress) gets
``session_idle_timeout`` and a 1000 close; a client that does not take
an event for ``realtime_send_timeout_s`` (it stopped reading) is closed with 1008. Frames over
uvicorn's WebSocket size limit (16 MiB) close with 1009.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from speclive.errors import ConfigError
from speclive.live import events as ev
from speclive.live.build import KINDS, LiveModels, LiveModelsConfig, make_pipeline
from speclive.live.clock import WallClock
from speclive.live.turnpolicy import EAGERNESS, TurnPolicyConfig
from speclive.live.vad import TurnConfig
from speclive.server.audio import pcm16, resample
from speclive.server.errors import APIError
from speclive.server.ratelimit import TokenBucket

log = logging.getLogger("speclive.server")
router = APIRouter()

RATES = (16_000, 24_000)
#: one step of the pipeline computes at most this long before new audio is taken in
STEP_S = 0.1
#: largest audio payload of one append event (OpenAI's limit is 15 MiB of base64)
MAX_APPEND_BYTES = 15 * 1024 * 1024
#: audio per response.output_audio.delta event
DELTA_S = 0.2
#: received audio not yet taken by the pipeline, past which appends are refused
MAX_BACKLOG_S = 30.0
#: close codes: a client that stopped reading, an idle session
CLOSE_SLOW, CLOSE_IDLE = 1008, 1000
#: the beta protocol's names of the events the GA protocol renamed (a client asks for the beta
#: with the ``OpenAI-Beta: realtime=v1`` header or the ``openai-beta.realtime-v1`` subprotocol)
BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass
class SessionSettings:
    mode: str = "chat"
    method: str | None = None
    verifier: str = "greedy"
    target_lang: str = "de"
    input_rate: int = 24_000
    output_rate: int = 24_000
    voice: str = "alloy"
    server_vad: bool = True
    #: silence that ends a turn (OpenAI's ``turn_detection.silence_duration_ms``)
    end_s: float = 0.5
    #: ``semantic_vad``: the end-of-turn policy ends a turn, as readily as ``eagerness`` says
    semantic: bool = False
    eagerness: str = "auto"
    speak: bool = True
    instructions: str = ""

    def describe(self, session_id: str, model: str) -> dict[str, Any]:
        """The session object of ``session.created`` / ``session.updated`` (OpenAI's shape)."""
        return {
            "id": session_id,
            "object": "realtime.session",
            "model": model,
            "modalities": ["text", "audio"] if self.speak else ["text"],
            "instructions": self.instructions,
            "voice": self.voice,
            "input_audio_format": "pcm16",
            "output_audio_format": "pcm16",
            "input_audio_transcription": {"model": "whisper-1"},
            "turn_detection": self.turn_detection(),
            "speclive": {
                "mode": self.mode,
                "method": self.method,
                "verifier": self.verifier,
                "target_lang": self.target_lang,
                "sample_rate": self.input_rate,
            },
        }

    def turn_detection(self) -> dict[str, Any] | None:
        if not self.server_vad:
            return None
        if self.semantic:
            return {"type": "semantic_vad", "eagerness": self.eagerness}
        return {"type": "server_vad", "silence_duration_ms": int(self.end_s * 1000)}

    def turn_key(self) -> tuple[Any, ...]:
        """What a pipeline is built for: a change needs a new one."""
        return (
            self.mode,
            self.method,
            self.verifier,
            self.target_lang,
            self.speak,
            self.end_s,
            self.semantic,
            self.eagerness,
        )


def _turn_detection(new: SessionSettings, td: Any, param: str) -> None:
    """``turn_detection`` (``server_vad``, ``semantic_vad`` or null) into ``new``."""
    if td is not None and not (isinstance(td, dict) and td.get("type") in ("server_vad", "semantic_vad")):
        raise ProtocolError(
            "invalid_value", "turn_detection must be {'type': 'server_vad' | 'semantic_vad'} or null", param
        )
    new.server_vad = td is not None
    new.semantic = isinstance(td, dict) and td.get("type") == "semantic_vad"
    if new.semantic:
        eager = td.get("eagerness", "auto")
        if eager not in EAGERNESS:
            raise ProtocolError("invalid_value", f"eagerness must be one of {', '.join(EAGERNESS)}", param)
        new.eagerness = eager
    if isinstance(td, dict) and "silence_duration_ms" in td:
        ms = td["silence_duration_ms"]
        if not isinstance(ms, int | float) or isinstance(ms, bool) or not 200 <= ms <= 5000:
            msg = "silence_duration_ms must be a number from 200 to 5000"
            raise ProtocolError("invalid_value", msg, param)
        new.end_s = ms / 1000


class ProtocolError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def _apply_update(s: SessionSettings, session: Any) -> SessionSettings:
    """A new ``SessionSettings`` from a ``session.update`` payload (unknown fields ignored)."""
    if not isinstance(session, dict):
        raise ProtocolError("invalid_value", "session must be an object", "session")
    new = SessionSettings(**s.__dict__)
    for key in ("input_audio_format", "output_audio_format"):
        fmt = session.get(key)
        if fmt is not None and fmt != "pcm16":
            raise ProtocolError("invalid_value", f"{key} {fmt!r} is not supported; use 'pcm16'", key)
    if "voice" in session:
        if not isinstance(session["voice"], str):
            raise ProtocolError("invalid_type", "voice must be a string", "voice")
        new.voice = session["voice"]
    if "modalities" in session:
        mods = session["modalities"]
        if not isinstance(mods, list) or not all(m in ("text", "audio") for m in mods):
            raise ProtocolError(
                "invalid_value", "modalities must be a list of 'text' and 'audio'", "modalities"
            )
        new.speak = "audio" in mods
    if "instructions" in session and isinstance(session["instructions"], str):
        new.instructions = session["instructions"]
    if "turn_detection" in session:
        _turn_detection(new, session["turn_detection"], "turn_detection")
    # the GA shape: session.audio.{input,output}, output_modalities
    audio = session.get("audio")
    if isinstance(audio, dict):
        inp, outp = audio.get("input") or {}, audio.get("output") or {}
        if isinstance(inp, dict):
            fmt = inp.get("format")
            if isinstance(fmt, dict):
                if fmt.get("type") not in (None, "audio/pcm"):
                    raise ProtocolError(
                        "invalid_value", "only audio/pcm input is supported", "session.audio.input"
                    )
                if "rate" in fmt:
                    if fmt["rate"] not in RATES:
                        raise ProtocolError(
                            "invalid_value", "rate must be 16000 or 24000", "session.audio.input"
                        )
                    new.input_rate = new.output_rate = int(fmt["rate"])
            if "turn_detection" in inp:
                _turn_detection(new, inp["turn_detection"], "session.audio.input.turn_detection")
        if isinstance(outp, dict) and isinstance(outp.get("voice"), str):
            new.voice = outp["voice"]
    if isinstance(session.get("output_modalities"), list):
        new.speak = "audio" in session["output_modalities"]
    own = session.get("speclive") or {}
    if not isinstance(own, dict):
        raise ProtocolError("invalid_type", "speclive must be an object", "session.speclive")
    if "mode" in own:
        if own["mode"] not in KINDS:
            raise ProtocolError(
                "invalid_value", f"mode must be one of {', '.join(KINDS)}", "session.speclive.mode"
            )
        if own["mode"] != new.mode:
            new.method = None
        new.mode = own["mode"]
    if "method" in own:
        new.method = own["method"]
    if "verifier" in own:
        new.verifier = str(own["verifier"])
    if "target_lang" in own:
        new.target_lang = str(own["target_lang"])
    if "sample_rate" in own:
        if own["sample_rate"] not in RATES:
            raise ProtocolError(
                "invalid_value", "sample_rate must be 16000 or 24000", "session.speclive.sample_rate"
            )
        new.input_rate = new.output_rate = int(own["sample_rate"])
    return new


def _pipeline_for(s: SessionSettings, models: LiveModels, turn: TurnConfig):
    from speclive.live.voicechat import voice_predgen
    from speclive.sessions.retranslate import RetranslateConfig

    semantic = {
        "turn_detection": "semantic" if s.semantic and s.server_vad else "server_vad",
        "policy": TurnPolicyConfig(eagerness=s.eagerness),
    }
    try:
        if s.mode == "chat":
            return make_pipeline(
                "chat",
                models,
                mode=s.method,
                clock=WallClock(),
                turn=turn,
                predgen=voice_predgen(verifier=s.verifier),  # the voice prompt, VOICE_MAX_TOKENS
                speak=s.speak,
                **semantic,
            )
        if s.mode == "translate":
            return make_pipeline(
                "translate",
                models,
                mode=s.method,
                clock=WallClock(),
                turn=turn,
                retranslate=RetranslateConfig(target_lang=s.target_lang),
                speak=False,
                **semantic,
            )
        return make_pipeline("transcribe", models, clock=WallClock(), turn=turn, **semantic)
    except (ConfigError, TypeError, ValueError) as e:
        raise ProtocolError(
            "invalid_value", f"cannot start a {s.mode} session: {e}", "session.speclive"
        ) from e


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


@dataclass
class _Response:
    id: str
    item_id: str
    text: list[str] = field(default_factory=list)
    audio_s: float = 0.0
    cancelled: bool = False
    started: bool = False


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
        self.id = _id("sess")
        self.settings = SessionSettings()
        self.pipeline = None
        self.audio: list[np.ndarray] = []
        self.wake = asyncio.Event()
        self.closed = False
        self.user_item: str | None = None
        self.prev_item: str | None = None
        self.response: _Response | None = None
        #: the client cancelled this turn's answer: the pipeline's further answer text and
        #: audio of the turn are dropped (not sent as a new response) until its metrics arrive
        self.dropping = False
        self.sent_transcript = ""
        self.lock = asyncio.Lock()  # one send at a time
        #: a session.update that needs a new pipeline, waiting for the turn in progress to end
        self.pending: SessionSettings | None = None

    def busy(self) -> bool:
        """A turn is open, or its answer is still being worked out or sent."""
        return self.pipeline is not None and self.pipeline.working

    # ---- sending ----------------------------------------------------------------------
    async def send(self, type_: str, **payload: Any) -> None:
        if self.closed:
            return
        if self.beta:
            type_ = BETA_NAMES.get(type_, type_)
        msg = {"type": type_, "event_id": _id("event"), **payload}
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
        self, code: str, message: str, param: str | None = None, event_id: str | None = None
    ) -> None:
        self.svc.metrics.realtime_errors.labels(code=code).inc()
        await self.send(
            "error",
            error={
                "type": "invalid_request_error",
                "code": code,
                "message": message,
                "param": param,
                "event_id": event_id,
            },
        )

    # ---- the pipeline -----------------------------------------------------------------
    async def start_pipeline(self) -> None:
        old, self.pipeline = self.pipeline, None
        if old is not None:  # a session.update that needs another pipeline: free the old one
            await self.svc.worker("chat").call(old.abort)
        self.pipeline = await self.svc.worker("chat").call(
            _pipeline_for,
            self.settings,
            self.models,
            TurnConfig(max_turn_s=self.svc.config.max_turn_s, end_s=self.settings.end_s),
        )

    async def compute_loop(self) -> None:
        """Push the audio that arrived, let the pipeline compute in short slices, send what it
        emits; sleep while there is nothing to do."""
        worker = self.svc.worker("chat")
        while not self.closed:
            pipe = self.pipeline
            chunks, self.audio = self.audio, []
            events: list[ev.Event] = []
            if chunks and pipe is not None:
                events += await worker.call(pipe.push, np.concatenate(chunks))
            out = None
            if pipe is not None:
                out = await self._step(worker, pipe)
                events += out or []
            for e in events:
                await self.on_event(e)
            if self.pending is not None and not self.busy():
                self.settings, self.pending = self.pending, None
                await self.start_pipeline()
                await self.send("session.updated", session=self.settings.describe(self.id, self.model_name))
                continue
            if not events and not self.audio and out is None:
                self.wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=0.5)

    async def _step(self, worker: Any, pipe: Any) -> list[ev.Event] | None:
        """One unit of the pipeline's compute. Speculation (``pipe.background``) waits for the
        turns other users wait on; while it is still queued, audio that arrives goes first (the
        VAD must hear the end of the turn on time) and the unit is asked for again after it."""

        def unit(p: Any = pipe) -> list[ev.Event] | None:
            return p.step(p.clock() + STEP_S)

        if not pipe.background:
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

    # ---- pipeline events -> protocol events ---------------------------------------------
    async def on_event(self, e: ev.Event) -> None:
        if isinstance(e, ev.SpeechStarted):
            self.user_item = _id("item")
            self.sent_transcript = ""
            await self.send(
                "input_audio_buffer.speech_started",
                audio_start_ms=int(e.audio_t * 1000),
                item_id=self.user_item,
            )
        elif isinstance(e, ev.SpeechStopped):
            await self.send(
                "input_audio_buffer.speech_stopped",
                audio_end_ms=int(e.audio_t * 1000),
                item_id=self.user_item,
            )
            if e.end_of_turn:
                await self.send(
                    "input_audio_buffer.committed", item_id=self.user_item, previous_item_id=self.prev_item
                )
                await self.send(
                    "conversation.item.created",
                    previous_item_id=self.prev_item,
                    item={
                        "id": self.user_item,
                        "object": "realtime.item",
                        "type": "message",
                        "role": "user",
                        "status": "completed",
                        "content": [{"type": "input_audio", "transcript": None}],
                    },
                )
                self.prev_item = self.user_item
        elif isinstance(e, ev.TranscriptPartial):
            text = e.text
            delta = text[len(self.sent_transcript) :] if text.startswith(self.sent_transcript) else ""
            if delta:
                await self.send(
                    "conversation.item.input_audio_transcription.delta",
                    item_id=self.user_item,
                    content_index=0,
                    delta=delta,
                )
                self.sent_transcript = text
            await self.send(
                "speclive.transcript", item_id=self.user_item, stable=e.stable, tentative=e.tentative
            )
        elif isinstance(e, ev.TranscriptFinal):
            await self.send(
                "conversation.item.input_audio_transcription.completed",
                item_id=self.user_item,
                content_index=0,
                transcript=e.text,
            )
        elif isinstance(e, ev.Speculation):
            await self.send(
                "speclive.speculation",
                item_id=self.user_item,
                partial=e.partial,
                candidate=e.candidate,
                first_sentence=e.first_sentence,
                drafted=e.drafted,
                accepted=e.accepted,
                presynthesized=e.presynthesized,
            )
        elif isinstance(e, (ev.AnswerDelta, ev.AudioChunk)) and self.dropping:
            pass
        elif isinstance(e, ev.AnswerDelta):
            r = await self.begin_response()
            r.text.append(e.text)
            if not r.cancelled:
                await self.send(
                    "response.output_audio_transcript.delta",
                    response_id=r.id,
                    item_id=r.item_id,
                    output_index=0,
                    content_index=0,
                    delta=e.text,
                )
        elif isinstance(e, ev.AudioChunk):
            r = await self.begin_response()
            if not r.cancelled and self.settings.speak:
                await self.send_audio(r, e)
        elif isinstance(e, ev.TranslationUpdate):
            await self.send(
                "speclive.translation",
                item_id=self.user_item,
                stable=e.stable,
                tentative=e.tentative,
                source=e.source,
                final=e.final,
            )
        elif isinstance(e, ev.TurnPrediction):
            await self.send(
                "speclive.turn_prediction",
                item_id=self.user_item,
                audio_p=e.audio_p,
                text_p=e.text_p,
                score=e.score,
                bar=e.bar,
                silence_s=round(e.silence_s, 3),
                end=e.end,
            )
        elif isinstance(e, ev.Interrupted):
            await self.send("speclive.interrupted", played=e.played)
            if self.response is not None:
                self.response.cancelled = True
                await self.end_response("cancelled")
        elif isinstance(e, ev.Notice):
            await self.send("speclive.notice", code=e.code, message=e.message)
            if e.code == "max_speech":  # a limit the client hit: also an error, as OpenAI's
                await self.error("turn_too_long", e.message)
        elif isinstance(e, ev.TurnMetrics):
            metrics = {k: v for k, v in e.to_json().items() if k not in ("type", "extra")}
            await self.send("speclive.turn_metrics", item_id=self.user_item, **metrics)
            self.dropping = False
            if self.response is not None:
                await self.end_response("cancelled" if self.response.cancelled else "completed")

    async def begin_response(self) -> _Response:
        if self.response is None:
            self.response = _Response(_id("resp"), _id("item"))
        r = self.response
        if not r.started:
            r.started = True
            await self.send(
                "response.created",
                response={"id": r.id, "object": "realtime.response", "status": "in_progress", "output": []},
            )
            item = {
                "id": r.item_id,
                "object": "realtime.item",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            await self.send("response.output_item.added", response_id=r.id, output_index=0, item=item)
            await self.send(
                "response.content_part.added",
                response_id=r.id,
                item_id=r.item_id,
                output_index=0,
                content_index=0,
                part={"type": "audio", "transcript": ""},
            )
        return r

    async def send_audio(self, r: _Response, chunk: ev.AudioChunk) -> None:
        rate = self.settings.output_rate
        samples = (
            resample(chunk.samples, chunk.sample_rate, rate) if chunk.sample_rate != rate else chunk.samples
        )
        step = int(DELTA_S * rate)
        for i in range(0, len(samples), step):
            data = base64.b64encode(pcm16(samples[i : i + step])).decode("ascii")
            await self.send(
                "response.output_audio.delta",
                response_id=r.id,
                item_id=r.item_id,
                output_index=0,
                content_index=0,
                delta=data,
            )
        r.audio_s += len(samples) / rate

    async def end_response(self, status: str) -> None:
        r, self.response = self.response, None
        if r is None or not r.started:
            return
        text = "".join(r.text)
        base = {"response_id": r.id, "item_id": r.item_id, "output_index": 0, "content_index": 0}
        await self.send("response.output_audio.done", **base)
        await self.send("response.output_audio_transcript.done", **base, transcript=text)
        await self.send("response.content_part.done", **base, part={"type": "audio", "transcript": text})
        item = {
            "id": r.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": "completed" if status == "completed" else "incomplete",
            "content": [{"type": "audio", "transcript": text}],
        }
        await self.send("response.output_item.done", response_id=r.id, output_index=0, item=item)
        await self.send(
            "response.done",
            response={
                "id": r.id,
                "object": "realtime.response",
                "status": status,
                "output": [item],
                "usage": None,
            },
        )
        self.prev_item = r.item_id

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
        if kind == "session.update":
            new = _apply_update(self.settings, msg.get("session"))
            rebuild = new.turn_key() != self.settings.turn_key()
            if rebuild and self.busy():
                # a new pipeline starts between turns: this turn finishes as it began
                self.pending = new
                return
            self.settings = new
            self.pending = None
            if rebuild:
                await self.start_pipeline()
            await self.send("session.updated", session=self.settings.describe(self.id, self.model_name))
        elif kind == "input_audio_buffer.append":
            x = decode_audio(msg.get("audio"), self.settings.input_rate)
            if sum(map(len, self.audio)) + len(x) > MAX_BACKLOG_S * 16_000:
                raise ProtocolError(
                    "audio_backlog",
                    f"over {MAX_BACKLOG_S:g} s of audio wait to be processed: this append is dropped",
                    "audio",
                )
            self.audio.append(x)
            self.wake.set()
        elif kind == "input_audio_buffer.commit":
            if not self.settings.server_vad:
                # the client says the turn is over: the VAD hears the silence that ends a turn
                end_s = self.pipeline.cfg.turn.end_s if self.pipeline is not None else 0.5
                self.audio.append(np.zeros(int((end_s + 0.2) * 16_000), np.float32))
                self.wake.set()
        elif kind == "input_audio_buffer.clear":
            self.audio = []
            await self.send("input_audio_buffer.cleared")
        elif kind == "response.create":
            pass  # answers follow each turn by themselves
        elif kind == "response.cancel":
            if self.response is not None:
                self.response.cancelled = True
                self.dropping = True
                await self.end_response("cancelled")
        elif kind == "conversation.item.create":
            raise ProtocolError("unsupported_event", "text conversation items are not supported: send audio")
        else:
            raise ProtocolError("unknown_event", f"unknown event type {kind!r}", "type")


async def _live_models(svc: Any) -> tuple[LiveModels, str]:
    """The models realtime sessions share: the chat LLM, a Whisper of their own (loaded once)
    and the speech endpoint's voice."""
    chat = await svc.engine("chat")
    tts = None
    with contextlib.suppress(APIError):
        tts = getattr(await svc.engine("speech"), "tts", None)
    transcriber = await svc.live_whisper()
    mcfg = LiveModelsConfig(
        model=chat.name,
        asr_model=svc.config.asr_model,
        asr_draft=svc.config.asr_draft,
        stream_draft=svc.config.stream_draft,
    )
    return LiveModels(mcfg, transcriber, chat.backend, tts), chat.name


async def _receive_loop(ws: WebSocket, session: RealtimeSession, idle_s: float) -> None:
    """Take client events until the client leaves or stays silent for ``idle_s`` seconds."""
    while not session.closed:
        try:
            msg = await asyncio.wait_for(ws.receive(), idle_s or None)
        except TimeoutError:
            if session.audio or session.busy():
                continue  # still working on what the client sent: not idle
            await session.error("session_idle_timeout", f"no event for {idle_s:g} s: the session ends")
            session.close_with = (CLOSE_IDLE, "idle timeout")
            return
        if msg["type"] == "websocket.disconnect":
            return
        if not await session.within_rate():
            continue
        if msg.get("text") is not None:
            await session.handle(msg["text"])
        else:
            await session.error("binary_frame", "binary frames are not accepted: send JSON text events")


def origin_allowed(origin: str | None, host: str | None, allowed: Sequence[str] = ()) -> bool:
    """Whether a WebSocket handshake may proceed. Browsers send ``Origin``; a page from another
    site must not drive a local server with its visitor's microphone and compute, so a browser
    connection is taken only from the server's own page (``Origin`` naming the ``Host`` the
    request came to) or from an origin in ``allowed`` ("*": any). Clients that send no
    ``Origin`` (SDKs, command-line tools) are not browsers and are let through."""
    if not origin:
        return True
    o = origin.strip().rstrip("/").lower()
    allow = {a.strip().rstrip("/").lower() for a in allowed}
    if "*" in allow or o in allow:
        return True
    parts = urlsplit(o)
    return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host.strip().lower()


@router.websocket("/v1/realtime")
async def realtime(ws: WebSocket) -> None:
    svc = ws.app.state.speclive
    if not origin_allowed(ws.headers.get("origin"), ws.headers.get("host"), svc.config.allow_origins):
        # refused before the handshake: the browser sees HTTP 403
        svc.metrics.realtime_closes.labels(code="403").inc()
        await ws.close(code=1008, reason="cross-origin connection refused (see --allow-origin)")
        return
    offered = ws.scope.get("subprotocols") or []
    sub = "realtime" if "realtime" in offered else None
    beta = "openai-beta.realtime-v1" in offered or "realtime=v1" in (ws.headers.get("openai-beta") or "")
    await ws.accept(subprotocol=sub)
    try:
        slot = svc.sessions.acquire("realtime")
    except APIError as e:
        svc.metrics.realtime_closes.labels(code="1013").inc()
        await ws.close(code=1013, reason=e.message[:120])
        return
    session: RealtimeSession | None = None
    tasks: list[asyncio.Task] = []
    try:
        try:
            models, name = await _live_models(svc)
        except APIError as e:
            svc.metrics.realtime_closes.labels(code="1011").inc()
            await ws.close(code=1011, reason=e.message[:120])
            return
        session = RealtimeSession(ws, svc, models, name, beta=beta)
        await session.start_pipeline()
        await session.send("session.created", session=session.settings.describe(session.id, name))
        compute = asyncio.create_task(session.compute_loop())
        receive = asyncio.create_task(_receive_loop(ws, session, svc.config.realtime_idle_s))
        tasks = [compute, receive]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    except WebSocketDisconnect:
        pass
    finally:
        failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
        if session is not None and failed and not isinstance(failed[0].exception(), WebSocketDisconnect):
            # the pipeline failed (a bug): the client is told before the connection closes
            await session.error("server_error", "the session failed on the server and ends")
            session.close_with = (1011, "internal error")
        if session is not None:
            session.closed = True
            session.wake.set()
        for task in tasks:
            if not task.done():
                if task is tasks[-1]:  # the receive loop: nothing more to take in
                    task.cancel()
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(task, timeout=30)
            if task.done() and not task.cancelled() and task.exception() is not None:
                if not isinstance(task.exception(), WebSocketDisconnect):
                    log.error("realtime session failed", exc_info=task.exception())
        if session is not None and session.pipeline is not None:
            # the client is gone: the work in progress is dropped, not finished
            with contextlib.suppress(Exception):
                await svc.worker("chat").call(session.pipeline.abort)
        slot.release()
        code, reason = (session.close_with if session is not None else None) or (1000, "")
        svc.metrics.realtime_closes.labels(code=str(code)).inc()
        # (a client that stopped reading cannot take the close frame either: do not wait on it)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(code=code, reason=reason), timeout=1 if code == CLOSE_SLOW else 5)
