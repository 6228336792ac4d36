"""``ServerConfig``: what ``speclive serve`` serves and the limits it enforces."""

from __future__ import annotations

from dataclasses import dataclass

from speclive.errors import ConfigError
from speclive.loader import BACKENDS, DEFAULT_MODEL, DRAFTERS

#: drafters the server can run: ``hybrid-async`` drafts on a background thread that would share
#: its draft backend across the interleaved sessions, which the backend does not allow
SERVE_DRAFTERS = tuple(d for d in DRAFTERS if d != "hybrid-async")


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000

    # ---- the language model (``/v1/chat/completions``) --------------------------------
    #: registry name, .gguf path, HF folder or hub id (``speclive.loader.load_backend``)
    model: str = DEFAULT_MODEL
    backend: str = "llamacpp"
    #: speculation is on by default; ``none`` = plain greedy / sampling
    drafter: str = "ngram"
    draft_model: str | None = None
    max_draft: int | None = None
    threshold: float = 0.4
    datastore: str | None = None
    #: load/save what the drafter learned across requests and restarts (``speclive.knowledge``;
    #: ``speclive serve`` turns it on unless ``--no-knowledge``)
    knowledge: bool = False
    n_ctx: int | None = None
    threads: int | None = None
    device: str = "cpu"
    #: ``local`` (the model in this process) or ``vllm``: chat completions go to these `vllm serve`
    #: replicas (their own speculation, ``--speculative-config``, applies; ``drafter`` is not
    #: used) and the realtime sessions verify through them (``speclive.engines.vllm``)
    engine: str = "local"
    vllm_urls: tuple[str, ...] = ()
    #: log-probs per position of a vLLM verification (at most vLLM's ``--max-logprobs``)
    vllm_top_k: int = 20

    # ---- speech (``/v1/audio/transcriptions``, ``/v1/audio/speech``) -------------------
    asr_model: str = "whisper-base"
    asr_draft: str = "whisper-tiny.en"
    asr_method: str = "specasr"
    tts_voice: str = "piper-joe-medium"
    #: seconds of audio per pass of a streaming transcription (``stream=true``)
    asr_step_s: float = 1.0
    #: draft each streaming transcription pass with the previous passes' hypotheses (False:
    #: every pass decodes from scratch; the transcripts are the same)
    stream_draft: bool = True
    #: the model of the streaming partial passes: "target" or "draft" (``TranscribeConfig``)
    stream_partials: str = "target"

    # ---- access and limits -------------------------------------------------------------
    #: origins (``https://app.example``; "*": any) whose pages may open ``/v1/realtime``
    #: besides the server's own page; other browser origins are refused with 403
    allow_origins: tuple[str, ...] = ()
    #: when set, every endpoint but ``/health`` needs ``Authorization: Bearer <api_key>``
    api_key: str | None = None
    #: requests computing at once (chat generations, transcriptions, syntheses); more get 503.
    #: Chat generations are further capped by the llama.cpp backend's KV states (4).
    max_sessions: int = 4
    #: seconds a REST request waits in line for a slot before it is refused with 503
    queue_wait_s: float = 30.0
    #: largest request body (OpenAI's audio upload limit is 25 MB)
    max_body_bytes: int = 25 * 1024 * 1024
    #: longest audio accepted for transcription
    max_audio_s: float = 120.0
    #: longest realtime turn: the turn is ended there and answered
    max_turn_s: float = 30.0
    #: a realtime session that sends no event for this long is closed (0: never)
    realtime_idle_s: float = 300.0
    #: client events per second one realtime session may send on average (bursts of twice as
    #: many pass); events over the rate are dropped with an ``error`` event
    realtime_events_per_s: float = 200.0
    #: a realtime client that does not take an event for this long is disconnected (a client
    #: that stopped reading would otherwise hold its session forever)
    realtime_send_timeout_s: float = 20.0
    #: most tokens one chat completion may generate (a request asking for more gets this many)
    max_tokens: int = 2048
    #: longest ``input`` of a speech request (OpenAI's limit)
    max_speech_chars: int = 4096
    #: load every model at startup (``speclive serve``) instead of on first use
    preload: bool = False
    #: seconds between returns of freed heap memory to the OS (``server/memory.py``; 0: never)
    memory_trim_s: float = 60.0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"invalid backend {self.backend!r}; allowed values: {', '.join(BACKENDS)}")
        if self.engine not in ("local", "vllm"):
            raise ConfigError(f"invalid engine {self.engine!r}; allowed values: local, vllm")
        if (self.engine == "vllm") != bool(self.vllm_urls):
            raise ConfigError("--engine vllm and --vllm-url go together (a `vllm serve` replica URL)")
        if self.drafter not in SERVE_DRAFTERS:
            raise ConfigError(
                f"drafter {self.drafter!r} cannot be served; allowed values: {', '.join(SERVE_DRAFTERS)}"
            )
        from speclive.asr.transcribe import METHODS

        if self.asr_method not in METHODS:
            raise ConfigError(f"invalid ASR method {self.asr_method!r}; allowed values: {', '.join(METHODS)}")
        for name in ("max_sessions", "max_body_bytes", "max_tokens", "max_speech_chars"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.queue_wait_s < 0:
            raise ConfigError(f"queue_wait_s must be >= 0, got {self.queue_wait_s}")
        if self.asr_step_s <= 0:
            raise ConfigError(f"asr_step_s must be > 0, got {self.asr_step_s}")
        if self.max_audio_s <= 0:
            raise ConfigError(f"max_audio_s must be > 0, got {self.max_audio_s}")
        for name in ("max_turn_s", "realtime_events_per_s", "realtime_send_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
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
