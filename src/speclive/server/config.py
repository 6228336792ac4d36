"""``ServerConfig``: what ``speclive serve`` serves and the limits it enforces.

Each field that ``speclive serve`` sets carries its flag (``speclive.options.option``), so the
command line is derived from this class (``SERVE_OPTIONS``); the options other commands share
come from ``speclive.common_options``."""

from __future__ import annotations

from dataclasses import dataclass

from speclive.asr.transcribe import METHODS
from speclive.common_options import (
    asr_draft_option,
    asr_model_option,
    backend_option,
    check_remote,
    datastore_option,
    device_option,
    draft_model_option,
    drafter_option,
    engine_option,
    knowledge_option,
    max_draft_option,
    max_tokens_option,
    model_option,
    n_ctx_option,
    stream_draft_option,
    stream_partials_option,
    threads_option,
    threshold_option,
    vllm_top_k_option,
    vllm_urls_option,
    voice_option,
)
from speclive.errors import ConfigError
from speclive.loader import BACKENDS, DRAFTERS
from speclive.options import OptionSet, option

#: drafters the server can run: ``hybrid-async`` drafts on a background thread that would share
#: its draft backend across the interleaved sessions, which the backend does not allow
SERVE_DRAFTERS = tuple(d for d in DRAFTERS if d != "hybrid-async")


@dataclass
class ServerConfig:
    host: str = option("127.0.0.1", "--host", help="address to bind (127.0.0.1: this machine only)")
    port: int = option(8000, "--port", parse=int, help="port to listen on")

    # ---- the language model (``/v1/chat/completions``) --------------------------------
    #: registry name, .gguf path, HF folder or hub id (``speclive.loader.load_backend``)
    model: str = model_option()
    backend: str = backend_option()
    #: speculation is on by default; ``none`` = plain greedy / sampling
    drafter: str = drafter_option(choices=SERVE_DRAFTERS)
    draft_model: str | None = draft_model_option()
    max_draft: int | None = max_draft_option()
    threshold: float = threshold_option()
    datastore: str | None = datastore_option()
    #: keep finished completions' KV caches for requests that begin the same way (a chat's next
    #: turn; ``server/prompt_cache.py``): in-process llama.cpp only; off by default until its
    #: numerics are checked (docs/server.md)
    prompt_cache: bool = option(
        False,
        "--prompt-cache",
        help="reuse the KV cache of an earlier chat request whose prompt this one continues (experimental)",
    )
    #: load/save what the drafter learned across requests and restarts (``speclive.knowledge``;
    #: ``speclive serve`` turns it on unless ``--no-knowledge``)
    knowledge: bool = knowledge_option(default=False)
    n_ctx: int | None = n_ctx_option()
    threads: int | None = threads_option()
    device: str = device_option()
    #: ``local`` (the model in this process) or ``vllm``: chat completions go to these `vllm serve`
    #: replicas (their own speculation, ``--speculative-config``, applies; ``drafter`` is not
    #: used) and the realtime sessions verify through them (``speclive.engines.vllm``)
    engine: str = engine_option()
    vllm_urls: tuple[str, ...] = vllm_urls_option()
    #: log-probs per position of a vLLM verification (at most vLLM's ``--max-logprobs``)
    vllm_top_k: int = vllm_top_k_option()

    # ---- speech (``/v1/audio/transcriptions``, ``/v1/audio/speech``) -------------------
    asr_model: str = asr_model_option()
    asr_draft: str = asr_draft_option()
    asr_method: str = option(
        "specasr", "--asr-method", choices=METHODS, help="how /v1/audio/transcriptions decodes"
    )
    tts_voice: str = voice_option()
    #: seconds of audio per pass of a streaming transcription (``stream=true``)
    asr_step_s: float = 1.0
    #: draft each streaming transcription pass with the previous passes' hypotheses (False:
    #: every pass decodes from scratch; the transcripts are the same)
    stream_draft: bool = stream_draft_option()
    #: the model of the streaming partial passes: "target" or "draft" (``TranscribeConfig``)
    stream_partials: str = stream_partials_option()

    # ---- access and limits -------------------------------------------------------------
    #: origins (``https://app.example``; "*": any) whose pages may open ``/v1/realtime``
    #: besides the server's own page; other browser origins are refused with 403
    allow_origins: tuple[str, ...] = option(
        (),
        "--allow-origin",
        repeat=True,
        metavar="ORIGIN",
        help="a browser origin (https://app.example) whose pages may open /v1/realtime besides the "
        "server's own page; repeat for more, '*' for any (other origins are refused with 403)",
    )
    #: when set, every endpoint but ``/health`` needs ``Authorization: Bearer <api_key>``
    api_key: str | None = option(
        None, "--api-key", help="require 'Authorization: Bearer KEY' (all but /health)"
    )
    #: requests computing at once (chat generations, transcriptions, syntheses); more get 503.
    #: Chat generations are further capped by the llama.cpp backend's KV states (4).
    max_sessions: int = option(
        4, "--max-sessions", parse=int, help="requests computing at once; more wait in line"
    )
    #: seconds a REST request waits in line for a slot before it is refused with 503
    queue_wait_s: float = option(
        30.0, "--queue-wait", parse=float, help="seconds a request waits for a slot before a 503 (0: none)"
    )
    #: the longest a new request or realtime turn may be expected to wait for its first output:
    #: work whose estimated wait (``capacity.py``: the work owed ahead of it, that is the units
    #: queued and what admitted turns still reserve, priced by measured costs; for a realtime
    #: turn also its own work and what its user has waited since their speech stopped) exceeds
    #: it is refused at once (503 with Retry-After; realtime: an ``error`` event and close
    #: 1013). 0: no bound
    max_wait_s: float = option(
        10.0,
        "--max-wait",
        parse=float,
        help="refuse a request or realtime turn at once (503 / close 1013) when its estimated wait "
        "for the model exceeds this many seconds (0: never)",
    )
    #: largest request body (OpenAI's audio upload limit is 25 MB)
    max_body_bytes: int = 25 * 1024 * 1024
    #: longest audio accepted for transcription
    max_audio_s: float = option(
        120.0, "--max-audio", parse=float, help="longest audio to transcribe (seconds)"
    )
    #: longest realtime turn: the turn is ended there and answered
    max_turn_s: float = option(
        30.0, "--max-turn", parse=float, help="longest realtime turn (seconds): it ends there"
    )
    #: a realtime session that sends no event for this long is closed (0: never)
    realtime_idle_s: float = option(
        300.0,
        "--idle-timeout",
        parse=float,
        help="close a realtime session that sends nothing for this many seconds (0: never)",
    )
    #: client events per second one realtime session may send on average (bursts of twice as
    #: many pass); events over the rate are dropped with an ``error`` event
    realtime_events_per_s: float = option(
        200.0,
        "--max-events-per-s",
        parse=float,
        help="realtime client events per second per session (bursts of twice as many pass)",
    )
    #: a realtime client that does not take an event for this long is disconnected (a client
    #: that stopped reading would otherwise hold its session forever)
    realtime_send_timeout_s: float = 20.0
    #: most tokens one chat completion may generate (a request asking for more gets this many)
    max_tokens: int = max_tokens_option(2048, help="most tokens one completion may generate")
    #: longest ``input`` of a speech request (OpenAI's limit)
    max_speech_chars: int = 4096
    #: load every model at startup (``speclive serve``) instead of on first use
    preload: bool = option(False, "--lazy", off=True, help="load each model on first use, not at startup")
    #: seconds between returns of freed heap memory to the OS (``server/memory.py``; 0: never)
    memory_trim_s: float = option(
        60.0,
        "--memory-trim",
        parse=float,
        help="seconds between returns of freed heap memory to the OS (0: never)",
    )

    #: most malloc arenas of the serving process (``server/memory.py``; 0: glibc's default,
    #: eight per core)
    malloc_arenas: int = option(
        2,
        "--malloc-arenas",
        parse=int,
        help="most malloc arenas of the process: fewer keep less freed memory resident (0: glibc's default)",
    )

    #: blocks from this many MiB get mappings of their own (0: glibc's moving threshold). Off
    #: by default: each such block then costs its page faults again (a 1.5 MB logits copy took
    #: 1.5 ms instead of 56 us, docs/server.md), and the serving path makes some every step
    malloc_mmap_threshold_mib: float = option(
        0.0,
        "--malloc-mmap-threshold",
        parse=float,
        help="MiB from which a block gets a mapping of its own, returned to the OS when freed: "
        "less memory held, but each such block is faulted in again (0, the default: glibc's "
        "threshold, which moves up to 32 MiB)",
    )

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"invalid backend {self.backend!r}; allowed values: {', '.join(BACKENDS)}")
        check_remote(self.engine, self.vllm_urls)
        if self.drafter not in SERVE_DRAFTERS:
            raise ConfigError(
                f"drafter {self.drafter!r} cannot be served; allowed values: {', '.join(SERVE_DRAFTERS)}"
            )
        if self.asr_method not in METHODS:
            raise ConfigError(f"invalid ASR method {self.asr_method!r}; allowed values: {', '.join(METHODS)}")
        for name in ("max_sessions", "max_body_bytes", "max_tokens", "max_speech_chars"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.queue_wait_s < 0:
            raise ConfigError(f"queue_wait_s must be >= 0, got {self.queue_wait_s}")
        if self.max_wait_s < 0:
            raise ConfigError(f"max_wait_s must be >= 0, got {self.max_wait_s}")
        if self.asr_step_s <= 0:
            raise ConfigError(f"asr_step_s must be > 0, got {self.asr_step_s}")
        if self.max_audio_s <= 0:
            raise ConfigError(f"max_audio_s must be > 0, got {self.max_audio_s}")
        for name in ("max_turn_s", "realtime_events_per_s", "realtime_send_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.malloc_arenas < 0:
            raise ConfigError(f"malloc_arenas must be >= 0, got {self.malloc_arenas}")
        if not 0 <= self.malloc_mmap_threshold_mib <= 32:
            raise ConfigError(
                f"malloc_mmap_threshold_mib must be in [0, 32], got {self.malloc_mmap_threshold_mib}"
            )
        if self.memory_trim_s < 0:
            raise ConfigError(f"memory_trim_s must be >= 0, got {self.memory_trim_s}")
        if self.realtime_idle_s < 0:
            raise ConfigError(f"realtime_idle_s must be >= 0, got {self.realtime_idle_s}")
        if not 0 < self.port < 65536:
            raise ConfigError(f"invalid port {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ConfigError("api_key must not be empty (leave it unset for an open server)")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


#: ``speclive serve``'s options: every flagged field of ``ServerConfig``; the command turns on
#: what a library user opts into (the drafter's knowledge, loading every model at startup)
SERVE_OPTIONS = OptionSet(ServerConfig, defaults={"knowledge": True, "preload": True})
