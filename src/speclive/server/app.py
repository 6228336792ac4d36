"""``create_app(config)``: the FastAPI application of ``speclive serve``.

Routes: the OpenAI-compatible REST API (``openai_api.py``), ``WS /v1/realtime``
(``realtime.py``), ``GET /health`` (open, no auth), ``GET /metrics`` (Prometheus text) and the
web page at ``/`` with its ES modules under ``/static/`` (open: they hold no data).
Middleware (``middleware.py``): metrics + error boundary, API-key auth, body-size limit. While it
runs, freed heap memory goes back to the OS every ``memory_trim_s`` seconds (``memory.py``). No CORS
middleware: the web page that uses the API is served from this same origin.

Models load lazily on first use, or at startup with ``ServerConfig.preload`` (what ``serve``
does, so the first request is fast). Tests pass already-loaded objects: ``backend`` (an LLM
``Backend``), ``transcriber`` (an ``asr.transcribe.Transcriber``), ``tts`` (a TTS voice), or
ready engines (``chat``, ``stt``, ``speech``, e.g. fakes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

from speclive.server.chat import ChatEngine
from speclive.server.config import ServerConfig
from speclive.server.errors import install_error_handlers
from speclive.server.memory import MemoryTrimmer, freeze_loaded, unfreeze
from speclive.server.middleware import AuthMiddleware, BodyLimitMiddleware, ObserveMiddleware, route_label
from speclive.server.openai_api import router as openai_router
from speclive.server.realtime import router as realtime_router
from speclive.server.services import Services
from speclive.server.speech import SpeechToText, TextToSpeech

__all__ = ["ServerConfig", "create_app"]

log = logging.getLogger("speclive.server")

STATIC = Path(__file__).with_name("static")


def create_app(
    config: ServerConfig | None = None,
    *,
    backend: Any = None,
    transcriber: Any = None,
    live_transcriber: Any = None,
    tts: Any = None,
    chat: Any = None,
    stt: Any = None,
    speech: Any = None,
) -> FastAPI:
    config = config or ServerConfig()
    if backend is not None and chat is None:
        chat = ChatEngine(backend, config)
    if transcriber is not None and stt is None:
        stt = SpeechToText(transcriber)
    if tts is not None and speech is None:
        speech = TextToSpeech(tts)
    services = Services(config, chat=chat, transcription=stt, speech=speech)
    services.live_transcriber = live_transcriber
    app = FastAPI(
        title="speclive",
        description="OpenAI-compatible speech + LLM API, fast by speculative decoding",
        lifespan=_lifespan(services),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.speclive = services
    install_error_handlers(app)
    _add_routes(app, services)
    # added last = outermost: observe (metrics, error boundary) -> auth -> body limit -> routes
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    if config.api_key:
        app.add_middleware(AuthMiddleware, api_key=config.api_key)
    app.add_middleware(ObserveMiddleware, metrics=services.metrics, endpoint=route_label)
    return app


def _lifespan(services: Services) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the event-loop watch and the memory trimmer while it runs, the models
    loaded at startup with ``preload``, the workers closed at shutdown."""
    config = services.config

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services.metrics.watch_loop(asyncio.get_running_loop())
        trimmer = None
        if config.memory_trim_s > 0:
            trimmer = MemoryTrimmer(config.memory_trim_s, on_release=services.metrics.trimmed.inc)
            trimmer.start()
        if config.preload:
            await services.load_all()
            frozen = freeze_loaded()  # the models' objects: out of every later collection
            log.info("%d objects of the loaded models moved out of the cycle collector's way", frozen)
            ws_url = config.url.replace("http", "ws", 1)
            print(
                f"speclive serve: ready. Open {config.url}/ for the web page (microphone); "
                f"OpenAI-compatible API at {config.url}/v1, realtime at {ws_url}/v1/realtime",
                flush=True,
            )
        yield
        if trimmer is not None:
            await trimmer.stop()
        if config.preload:
            unfreeze()
        services.close()

    return lifespan


def _add_routes(app: FastAPI, services: Services) -> None:
    """``/health``, ``/metrics``, the REST API, ``WS /v1/realtime``, the web page and its files."""

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "models": services.status(), "live_sessions": services.sessions.live}

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(services.metrics.render(), media_type=services.metrics.content_type)

    app.include_router(openai_router)
    app.include_router(realtime_router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        """The web page: microphone, voice chat, live translation and transcription views."""
        return FileResponse(STATIC / "index.html", media_type="text/html")
