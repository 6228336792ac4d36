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

Overload (``capacity.py``): a new session, and each turn of a session when it ends, is admitted
by the chat worker's measured wait; past ``max_wait_s`` a new session is closed with 1013 at
once (as when every slot is taken), a turn gets an ``error`` event (``server_overloaded``) and
close 1013. A pipeline unit that raises gets an ``error``
and the session goes on with a fresh pipeline. A client that leaves mid-answer stops the
answer's compute after the decoder step in progress (``SessionClock``).

Limits (``ServerConfig``): events over the session's rate are dropped with an ``error``
(``rate_limit_exceeded``, at most one a second); a turn longer than ``max_turn_s`` is ended
there and answered (``turn_too_long``); audio that piles up
unprocessed past ``MAX_BACKLOG_S`` is refused (``audio_backlog``); a session idle for
``realtime_idle_s`` (no client event, and no turn or answer in progress) gets
``session_idle_timeout`` and a 1000 close; a client that does not take
an event for ``realtime_send_timeout_s`` (it stopped reading) is closed with 1008. Frames over
uvicorn's WebSocket size limit (16 MiB) close with 1009.

This module is the route: the handshake, the receive loop, the close. The rest lives in
``realtime_session.py`` (a connection and the table of client events),
``realtime_conversation.py`` (the table of pipeline events -> server events: items, responses),
``realtime_settings.py`` (``session.update`` and the pipeline it asks for) and
``realtime_protocol.py`` (the protocol's error, ids, beta names and close codes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from speclive.live.build import LiveModels, LiveModelsConfig
from speclive.server.errors import APIError
from speclive.server.realtime_protocol import CLOSE_IDLE, CLOSE_OVERLOADED, CLOSE_SLOW
from speclive.server.realtime_session import RealtimeSession

log = logging.getLogger("speclive.server")
router = APIRouter()


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
        svc.admission.check_realtime("chat", "chat")
        slot = svc.sessions.acquire("realtime")
    except APIError as e:
        if e.code != "server_overloaded":
            svc.metrics.refusals.labels(kind="realtime", reason="sessions").inc()
        await _refuse(svc, ws, e)
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
        await session.send_session("session.created")
        compute = asyncio.create_task(session.compute_loop())
        receive = asyncio.create_task(_receive_loop(ws, session, svc.config.realtime_idle_s))
        tasks = [compute, receive]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    except WebSocketDisconnect:
        pass
    finally:
        abort = await _end_session(svc, session, tasks)
        code, reason = (session.close_with if session is not None else None) or (1000, "")
        svc.metrics.realtime_closes.labels(code=str(code)).inc()
        # (a client that stopped reading cannot take the close frame either: do not wait on it)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(code=code, reason=reason), timeout=1 if code == CLOSE_SLOW else 5)
        if abort is not None:  # the slot (a KV state) is free once the pipeline let go of it
            with contextlib.suppress(Exception):
                await abort
        slot.release()


async def _refuse(svc: Any, ws: WebSocket, e: APIError) -> None:
    """A session refused before it starts (every slot taken, or over capacity): close 1013
    ("try again later") at once, the reason saying why; clients retry later on 1013."""
    svc.metrics.realtime_closes.labels(code=str(CLOSE_OVERLOADED)).inc()
    await ws.close(code=CLOSE_OVERLOADED, reason=e.message[:120])


async def _end_session(
    svc: Any, session: RealtimeSession | None, tasks: list[asyncio.Task]
) -> asyncio.Future | None:
    """Stop the session's loops (``tasks``: the compute loop, then the receive loop), tell the
    client of a failure, and drop the pipeline's work in progress: the pipeline's abort,
    submitted to the worker (its future; the connection can close meanwhile)."""
    failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
    if session is not None and failed and not isinstance(failed[0].exception(), WebSocketDisconnect):
        # the pipeline failed (a bug): the client is told before the connection closes
        await session.error("server_error", "the session failed on the server and ends")
        session.close_with = (1011, "internal error")
    if session is not None:
        session.stop_compute()
    for task in tasks:
        if not task.done():
            if task is tasks[-1]:  # the receive loop: nothing more to take in
                task.cancel()
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=30)
        if task.done() and not task.cancelled() and task.exception() is not None:
            if not isinstance(task.exception(), WebSocketDisconnect):
                log.error("realtime session failed", exc_info=task.exception())
    if session is None or session.pipeline is None:
        return None
    # the client is gone: the work in progress is dropped, not finished
    try:
        return asyncio.wrap_future(svc.worker("chat").submit(session.pipeline.abort))
    except RuntimeError:  # the worker is closed (shutdown): nothing runs on it any more
        return None
