"""What one app serves: the three engines (chat, transcription, speech), their workers, the
session limiter, admission by measured capacity (``capacity.py``), the model names and the
metrics.

An engine is loaded on first use (or at startup with ``ServerConfig.preload``) on its worker
thread, so a load never blocks the event loop; tests hand in engines already loaded. A failed
load answers 503 ``model_unavailable`` (and is logged) and is retried on the next request.

Whisper (torch) and a local LLM (llama.cpp's CPU backend, or torch) share one worker thread.
Both parallelize with the same OpenMP runtime (GNU libgomp; torch ships it and llama.cpp's
library binds to the copy already loaded), which keeps a pool of team threads for every thread
that ever opened a parallel region, for as long as that thread lives. Once the pools hold more
threads than the machine has CPUs, libgomp cuts its busy-wait at every barrier from about
300,000 spins to 100 and its threads sleep in the kernel instead: a Whisper pool on a second
worker made every llama.cpp token about 30 % slower on two cores, whether or not Whisper was
running. One thread for both keeps one pool. Piper (onnxruntime, its own thread pool) keeps its
worker; so does Whisper beside a remote (vLLM) LLM, whose worker waits on the network.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from speclive.asr.transcribe import TranscribeConfig, Transcriber
from speclive.errors import ConfigError
from speclive.live.build import KINDS as LIVE_MODES
from speclive.models.install import is_installed, verify
from speclive.models.registry import REGISTRY
from speclive.server.capacity import Admission
from speclive.server.chat import ChatEngine
from speclive.server.config import ServerConfig
from speclive.server.errors import APIError
from speclive.server.metrics import Metrics
from speclive.server.names import ModelNames
from speclive.server.sessions import Session, SessionLimiter
from speclive.server.speech import SpeechToText, TextToSpeech
from speclive.server.worker import ModelWorker

log = logging.getLogger("speclive.server")

KINDS = ("chat", "transcription", "speech")


class Services:
    def __init__(
        self,
        config: ServerConfig,
        chat: Any = None,
        transcription: Any = None,
        speech: Any = None,
    ):
        self.config = config
        self.metrics = Metrics()
        self.names = ModelNames(config)
        self.sessions = SessionLimiter(config.max_sessions, self.metrics.sessions)
        self._engines: dict[str, Any] = {"chat": chat, "transcription": transcription, "speech": speech}
        self._workers: dict[str, ModelWorker] = {}
        self.admission = Admission(config.max_wait_s, self._wait_of, self._refused_for_capacity)
        self._watch_admission()
        self._locks: dict[str, asyncio.Lock] = {}
        #: the Whisper of realtime sessions (their own: the transcription endpoint's runs on
        #: another worker); loaded with the first realtime session
        self.live_transcriber: Any = None
        if chat is not None:
            self.names.llm_name = chat.name
            self._observe(chat)

    def _observe(self, chat: Any) -> None:
        """The chat engine reports its batched verifications to the metrics."""
        if hasattr(chat, "on_batch"):
            chat.on_batch = self.metrics.batch.observe
        backend = getattr(chat, "backend", None)
        if backend is not None and hasattr(backend, "cell_evictions"):
            self.metrics.watch_kv(backend, getattr(chat, "prompt_cache", None))

    # ---- workers ------------------------------------------------------------------------
    def worker_name(self, kind: str) -> str:
        """The worker that runs ``kind``'s engine: Whisper runs on the chat worker when the LLM
        is in-process (one OpenMP thread pool, module docstring)."""
        if kind == "transcription" and self.config.engine == "local":
            return "chat"
        return kind

    def worker(self, kind: str) -> ModelWorker:
        name = self.worker_name(kind)
        w = self._workers.get(name)
        if w is None:
            w = self._workers[name] = ModelWorker(name)
            self.metrics.watch_queue(name, lambda w=w: w.pending, w.wait_s)
        return w

    # ---- admission ----------------------------------------------------------------------
    def _wait_of(self, name: str) -> float:
        """Worker ``name``'s estimated wait (0 before it started: nothing is queued on it)."""
        w = self._workers.get(name)
        return w.wait_s() if w is not None else 0.0

    def _refused_for_capacity(self, kind: str) -> None:
        self.metrics.refusals.labels(kind=kind, reason="capacity").inc()

    def _watch_admission(self) -> None:
        """The bound, the estimated waits, the reservations and the calibration, read at each scrape."""
        m = self.metrics
        m.max_wait.set(self.config.max_wait_s)
        for kind in KINDS:
            m.admission_wait.labels(kind=kind).set_function(
                lambda k=kind: self.admission.wait_s(self.worker_name(k))
            )
        m.admission_wait.labels(kind="realtime").set_function(
            lambda: self.admission.realtime_wait_s("chat", "chat")
        )
        m.reserved.labels(worker="chat").set_function(lambda: self.admission.reserved_s("chat"))
        m.open_turns.labels(worker="chat").set_function(lambda: self.admission.open_turns("chat"))
        for mode in LIVE_MODES:
            m.work_to_output.labels(mode=mode).set_function(lambda mode=mode: self.admission.work_s(mode))
            m.calibration.labels(mode=mode).set_function(lambda mode=mode: self.admission.scale(mode))

    def admit(self, kind: str) -> None:
        """Refuse a ``kind`` request at once (503 ``server_overloaded`` with ``Retry-After``)
        when it would wait past the bound for its worker."""
        self.admission.admit(kind, self.worker_name(kind))

    async def slot(self, kind: str, kind_limit: int | None = None) -> Session:
        """A session slot for a ``kind`` REST request, waiting in line up to ``queue_wait_s``."""
        try:
            return await self.sessions.acquire_waiting(kind, kind_limit, self.config.queue_wait_s)
        except APIError:
            self.metrics.refusals.labels(kind=kind, reason="sessions").inc()
            raise

    # ---- engines ------------------------------------------------------------------------
    def loaded(self, kind: str) -> bool:
        return self._engines[kind] is not None

    def _loader(self, kind: str) -> Callable[[ServerConfig], Any]:
        if kind == "chat":
            return ChatEngine.load
        return SpeechToText.load if kind == "transcription" else TextToSpeech.load

    async def engine(self, kind: str) -> Any:
        """The ``kind`` engine, loading it on its worker first if needed."""
        eng = self._engines[kind]
        if eng is not None:
            return eng
        lock = self._locks.setdefault(kind, asyncio.Lock())
        async with lock:
            if self._engines[kind] is None:
                try:
                    eng = await self.worker(kind).call(self._loader(kind), self.config)
                except Exception as exc:
                    log.exception("loading the %s model failed", kind)
                    raise APIError(
                        503,
                        f"The {kind} model could not be loaded: {exc}",
                        code="model_unavailable",
                    ) from exc
                self._engines[kind] = eng
                if kind == "chat":
                    self.names.llm_name = eng.name
                    self._observe(eng)
                log.info("%s model ready: %s", kind, eng.name)
        return self._engines[kind]

    async def load_all(self) -> None:
        """Load every engine (``preload``). The chat model must load (a server without it is
        useless: startup fails); a speech model that fails is logged and its endpoint answers
        503 until a later request loads it."""
        await asyncio.to_thread(verify_installed, self._model_names())
        await self.engine("chat")
        for kind in KINDS[1:]:
            try:
                await self.engine(kind)
            except APIError as exc:
                log.warning("%s (its endpoint answers 503 until it loads)", exc.message)
        try:
            await self.live_whisper()
        except Exception:
            log.exception("the realtime sessions' Whisper could not be loaded (it is retried per session)")

    def _model_names(self) -> list[str]:
        c = self.config
        draft = c.asr_draft if not c.asr_draft.startswith("self:") else None
        return [n for n in (c.model, c.draft_model, c.asr_model, draft, c.tts_voice) if n]

    async def live_whisper(self) -> Any:
        """The Whisper of realtime sessions, loaded once on the chat worker (which runs them)."""
        if self.live_transcriber is None:
            cfg = self.config
            tc = TranscribeConfig(
                model=cfg.asr_model,
                draft=cfg.asr_draft,
                method=cfg.asr_method,
                threads=cfg.threads,
                target_audio_margin_s=1.0,  # a live turn is seconds long, not Whisper's 30 s window
            )
            lock = self._locks.setdefault("live", asyncio.Lock())
            async with lock:
                if self.live_transcriber is None:
                    self.live_transcriber = await self.worker("chat").call(Transcriber, tc)
        return self.live_transcriber

    def status(self) -> dict[str, str | None]:
        return {k: (e.name if e is not None else None) for k, e in self._engines.items()}

    def close(self) -> None:
        for w in self._workers.values():
            w.close()
        chat = self._engines.get("chat")
        if hasattr(chat, "close"):
            chat.close()  # type: ignore[union-attr]


def verify_installed(names: list[str]) -> None:
    """Re-hash every file of the installed registry models among ``names`` before they load;
    a file that fails its SHA-256 stops the server (``ConfigError``). Paths, hub ids and models
    not installed yet (the installer hashes them as it writes them) are left out."""
    t0 = time.perf_counter()
    checked = 0
    for name in dict.fromkeys(names):
        if name not in REGISTRY or not is_installed(name):
            continue
        bad = [(f, detail) for f, ok, detail in verify(name) if not ok]
        if bad:
            raise ConfigError(
                f"model {name!r} fails its integrity check: {bad[0][0]}: {bad[0][1]} "
                f"(reinstall it: speclive models install {name} --force)"
            )
        checked += 1
    log.info("SHA-256 checked %d installed models in %.1f s", checked, time.perf_counter() - t0)
