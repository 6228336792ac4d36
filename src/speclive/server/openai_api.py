"""The OpenAI-compatible REST endpoints: models, chat completions, transcriptions, speech.

Every handler validates and resolves the model name first (cheap errors before any work),
then is admitted by measured capacity (503 ``server_overloaded`` with ``Retry-After`` at once
when its worker's estimated wait exceeds ``max_wait_s``, ``capacity.py``), then takes a session
slot (503 when full), then hands the compute to the model's worker and awaits it. A stream is
*primed*: its first step runs before the response starts, so an error there (a prompt longer
than the context window) is still a proper 400 and not a broken stream; an error later in a
stream is sent as an ``{"error": ...}`` event, as OpenAI does. When a client disconnects
mid-stream the response task is cancelled, and its ``finally`` cancels the worker stream (the
decoder state is released on the worker's next turn: no decoder step starts after the cancel)
and frees the session.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import anyio
import numpy as np
from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from speclive.asr.transcribe import Transcript
from speclive.server.audio import PCM_RATE, decode_upload, pcm16, resample, wav_bytes
from speclive.server.chat import ChatDone, ChatParams
from speclive.server.errors import APIError, translate
from speclive.server.middleware import INTERNAL_ERROR
from speclive.server.schemas import ChatCompletionRequest, SpeechRequest
from speclive.server.services import Services
from speclive.server.sessions import Session
from speclive.server.speech import SpeechToText, speakable
from speclive.server.worker import ModelWorker, Stream

log = logging.getLogger("speclive.server")
router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
TRANSCRIPTION_FORMATS = ("json", "text", "verbose_json")
SPEECH_FORMATS = ("wav", "pcm")


def _services(request: Request) -> Services:
    return request.app.state.speclive


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response that closes its generator however the response ends.

    When the client disconnects, Starlette cancels the task sending the stream and leaves the
    generator suspended; closing it here runs its ``finally`` (worker stream cancelled, session
    freed) at once instead of whenever it is garbage collected.
    """

    def __init__(self, content: AsyncIterator[str]):
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _stream_error(exc: BaseException) -> dict:
    err = translate(exc)
    if err is None:
        log.error("error in a stream", exc_info=exc)
        err = APIError(500, INTERNAL_ERROR, code="internal_error")
    return err.body()


async def _start(
    worker: ModelWorker, factory: Callable[[], Any], session: Session
) -> tuple[Stream[Any], Any]:
    """Start ``factory``'s iterator on ``worker`` and wait for its first item (priming); on
    failure the stream is cancelled and the session let go before the error propagates."""
    stream: Stream[Any] | None = None
    try:
        stream = worker.stream(factory)
        return stream, await stream.next()
    except BaseException:
        if stream is not None:
            stream.cancel()
        session.release()
        raise


# ---- models ------------------------------------------------------------------------------
@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    return {"object": "list", "data": _services(request).names.cards()}


@router.get("/v1/models/{model:path}")
async def get_model(model: str, request: Request) -> dict:
    return _services(request).names.card(model)


# ---- chat --------------------------------------------------------------------------------
@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    t0 = time.perf_counter()
    svc = _services(request)
    body.check_supported()
    if body.model not in svc.names.chat_names() and not svc.loaded("chat"):
        await svc.engine("chat")  # its registry name is known once it is loaded
    model = svc.names.chat(body.model)
    messages = body.chat_messages()
    params = ChatParams(
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature or 0.0,
        stop=body.stop_strings(),
        seed=body.seed if body.seed is not None else 0,
    )
    engine = await svc.engine("chat")
    svc.admit("chat")
    session = await svc.slot("chat", engine.max_parallel)
    stream, first = await _start(svc.worker("chat"), lambda: engine.generate(messages, params), session)
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"speclive-{svc.config.drafter}",
    }
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventStream(_chat_events(svc, stream, session, first, base, include_usage, t0))
    return await _chat_whole(svc, request, stream, session, first, base, t0)


def _record(svc: Services, done: ChatDone) -> None:
    m, s = svc.metrics, done.stats
    m.prompt_tokens.inc(s.prompt_tokens)
    m.generated.inc(s.new_tokens)
    m.drafted.inc(s.drafted)
    m.accepted.inc(s.accepted)
    m.forwards.inc(s.target_forwards)


async def _chat_whole(
    svc: Services,
    request: Request,
    stream: Stream[Any],
    session: Session,
    item: Any,
    base: dict,
    t0: float,
) -> Response:
    parts: list[str] = []
    try:
        while not isinstance(item, ChatDone):
            if item.text:
                if not parts:
                    svc.metrics.ttft.observe(time.perf_counter() - t0)
                parts.append(item.text)
            if await request.is_disconnected():
                svc.metrics.cancelled.inc()
                return Response(status_code=499)  # nobody is listening
            item = await stream.next()
    finally:
        stream.cancel()
        session.release()
    _record(svc, item)
    return JSONResponse(
        {
            **base,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(parts)},
                    "logprobs": None,
                    "finish_reason": item.finish_reason,
                }
            ],
            "usage": item.usage(),
        }
    )


async def _chat_events(
    svc: Services,
    stream: Stream[Any],
    session: Session,
    item: Any,
    base: dict,
    include_usage: bool,
    t0: float,
) -> AsyncIterator[str]:
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict, finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return sse({**base, "object": "chat.completion.chunk", "choices": [choice], **extra})

    finished = False
    try:
        yield chunk({"role": "assistant", "content": ""})
        first_text = True
        while not isinstance(item, ChatDone):
            if item.text:
                if first_text:
                    svc.metrics.ttft.observe(time.perf_counter() - t0)
                    first_text = False
                yield chunk({"content": item.text})
            item = await stream.next()
        _record(svc, item)
        yield chunk({}, item.finish_reason)
        if include_usage:
            yield sse({**base, "object": "chat.completion.chunk", "choices": [], "usage": item.usage()})
        yield "data: [DONE]\n\n"
        finished = True
    except Exception as exc:
        yield sse(_stream_error(exc))
        finished = True
    finally:
        if not finished:  # the client went away (the task was cancelled)
            svc.metrics.cancelled.inc()
        stream.cancel()
        session.release()


# ---- transcription -----------------------------------------------------------------------
@router.post("/v1/audio/transcriptions")
async def transcriptions(
    request: Request,
    file: Annotated[UploadFile, File()],
    model: Annotated[str, Form()],
    language: Annotated[str | None, Form()] = None,
    prompt: Annotated[str | None, Form()] = None,
    response_format: Annotated[str, Form()] = "json",
    temperature: Annotated[float, Form()] = 0.0,
    stream: Annotated[bool, Form()] = False,
) -> Response:
    """OpenAI's transcription form; ``prompt`` and ``temperature`` are accepted and ignored
    (decoding is greedy, which is what makes SpecASR lossless)."""
    svc = _services(request)
    _check_transcription_form(svc, model, response_format, language)
    audio = await asyncio.to_thread(decode_upload, await file.read())
    duration = len(audio) / 16_000
    if duration > svc.config.max_audio_s:
        raise APIError(
            400,
            f"the audio is {duration:.1f} s long; "
            f"this server transcribes at most {svc.config.max_audio_s:g} s",
            param="file",
            code="audio_too_long",
        )
    engine = await svc.engine("transcription")
    svc.admit("transcription")
    session = await svc.slot("transcription")
    if stream:
        step_s = svc.config.asr_step_s
        partials, first = await _start(
            svc.worker("transcription"), lambda: engine.stream(audio, step_s), session
        )
        return EventStream(_transcript_events(svc, partials, session, first, duration))
    transcript = await _transcribe(svc, engine, audio, session)
    svc.metrics.audio_in.inc(duration)
    return _transcription_response(transcript, duration, response_format)


def _check_transcription_form(svc: Services, model: str, response_format: str, language: str | None) -> None:
    """The form's model, ``response_format`` and ``language``, checked before any work."""
    svc.names.transcription(model)
    if response_format not in TRANSCRIPTION_FORMATS:
        raise APIError(
            400,
            f"response_format {response_format!r} is not supported; "
            f"use one of {', '.join(TRANSCRIPTION_FORMATS)}",
            param="response_format",
            code="invalid_value",
        )
    if language and language.lower() not in ("en", "english"):
        raise APIError(
            400,
            f"language {language!r} is not supported: the served models transcribe English",
            param="language",
        )


async def _transcribe(svc: Services, engine: SpeechToText, audio: np.ndarray, session: Session) -> Transcript:
    """The whole transcript of ``audio``, one segment per turn of the worker (which the chat
    completions share); the session is freed when it ends."""
    steps = svc.worker("transcription").stream(lambda: engine.transcribe_steps(audio))
    transcript = None
    try:
        async for item in steps:
            if item is not None:
                transcript = item
    finally:
        steps.cancel()
        session.release()
    if transcript is None:  # the stream ends with its transcript; a failure raised above
        raise RuntimeError("the transcription ended without a transcript")
    return transcript


def _transcription_response(transcript: Transcript, duration: float, response_format: str) -> Response:
    """The transcript in ``response_format``: ``text``, ``json`` or ``verbose_json``."""
    if response_format == "text":
        return PlainTextResponse(transcript.text + "\n")
    usage = {"type": "duration", "seconds": round(duration, 3)}
    if response_format == "json":
        return JSONResponse({"text": transcript.text, "usage": usage})
    segments = [
        {
            "id": i,
            "seek": 0,
            "start": round(s.start, 3),
            "end": round(s.end, 3),
            "text": s.text,
            "tokens": s.token_ids,
            "temperature": 0.0,
            "avg_logprob": 0.0,
            "compression_ratio": 0.0,
            "no_speech_prob": 0.0,
        }
        for i, s in enumerate(transcript.segments)
    ]
    return JSONResponse(
        {
            "task": "transcribe",
            "language": "english",
            "duration": round(duration, 3),
            "text": transcript.text,
            "segments": segments,
            "usage": usage,
            "speclive": transcript.stats.to_dict(),
        }
    )


async def _transcript_events(
    svc: Services, partials: Stream[Any], session: Session, part: Any, duration: float
) -> AsyncIterator[str]:
    """``transcript.text.delta`` for each newly committed piece, then ``transcript.text.done``."""
    sent = ""
    try:
        while True:
            text = part.text if part.final else part.committed_text
            if text.startswith(sent) and len(text) > len(sent):
                yield sse({"type": "transcript.text.delta", "delta": text[len(sent) :], "logprobs": None})
                sent = text
            if part.final:
                break
            part = await partials.next()
        svc.metrics.audio_in.inc(duration)
        usage = {"type": "duration", "seconds": round(duration, 3)}
        yield sse({"type": "transcript.text.done", "text": part.text, "logprobs": None, "usage": usage})
    except Exception as exc:
        yield sse(_stream_error(exc))
    finally:
        partials.cancel()
        session.release()


# ---- speech ------------------------------------------------------------------------------
@router.post("/v1/audio/speech")
async def speech(body: SpeechRequest, request: Request) -> Response:
    svc = _services(request)
    svc.names.speech(body.model)
    svc.names.voice(body.voice)
    fmt = body.response_format
    if fmt not in SPEECH_FORMATS:
        raise APIError(
            400,
            f"response_format {fmt!r} is not supported; use 'wav' or 'pcm' (16-bit little-endian "
            f"mono at {PCM_RATE} Hz)",
            param="response_format",
            code="invalid_value",
        )
    if body.stream_format not in (None, "audio"):
        raise APIError(400, "only stream_format 'audio' is supported", param="stream_format")
    if len(body.input) > svc.config.max_speech_chars:
        raise APIError(
            400,
            f"input is {len(body.input)} characters; at most {svc.config.max_speech_chars} are allowed",
            param="input",
        )
    text = speakable(body.input)
    if not text:
        raise APIError(400, "input has nothing to speak (only blanks or control characters)", param="input")
    engine = await svc.engine("speech")
    svc.admit("speech")
    with await svc.slot("speech"):
        audio = await svc.worker("speech").call(engine.synthesize, text, body.speed)
    svc.metrics.audio_out.inc(audio.duration_s)
    if fmt == "pcm":
        samples = await asyncio.to_thread(resample, audio.samples, audio.sample_rate, PCM_RATE)
        return Response(pcm16(samples), media_type="audio/pcm", headers={"X-Sample-Rate": str(PCM_RATE)})
    return Response(wav_bytes(audio.samples, audio.sample_rate), media_type="audio/wav")
