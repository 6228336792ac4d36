"""The options many commands share, each declared once: the CLI's commands, ``ServerConfig`` and
the benchmarks build their options dataclasses from these field factories.

A factory returns a dataclass field that carries its flag, type, help and usual default
(``speclive.options.option``); a command passes another default only where it means another one
(a benchmark's shorter answers, the server's cap on a completion). ``EngineOptions`` and
``RemoteOptions`` group the language model's options for the commands that load one model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from speclive.errors import ConfigError
from speclive.loader import BACKENDS, DEFAULT_MODEL, DRAFTERS
from speclive.options import OptionSet, option

ENGINES = ("local", "vllm")
MODEL_HELP = "registry name, .gguf path, HF folder or hub id"


# ---------------------------------------------------------------------------- the language model
def model_option(default: str | None = DEFAULT_MODEL, *, help: str = f"LLM: {MODEL_HELP}", **kw: Any) -> Any:
    return option(default, "--model", help=help, **kw)


def backend_option(default: str = "llamacpp", **kw: Any) -> Any:
    return option(default, "--backend", choices=BACKENDS, help="how the LLM runs", **kw)


def drafter_option(default: str = "ngram", choices: tuple[str, ...] = DRAFTERS, **kw: Any) -> Any:
    return option(default, "--drafter", choices=choices, help="the speculator (none = plain greedy)", **kw)


def draft_model_option(
    default: str | None = None, *, help: str = "draft model for --drafter model|crossvocab", **kw: Any
) -> Any:
    return option(default, "--draft-model", help=help, **kw)


def max_draft_option(
    default: int | None = None, *, help: str = "longest draft (adaptive below it)", **kw: Any
) -> Any:
    return option(default, "--max-draft", parse=int, help=help, **kw)


def threshold_option(**kw: Any) -> Any:
    return option(0.4, "--threshold", parse=float, help="draft confidence cut-off (model drafters)", **kw)


def n_ctx_option(**kw: Any) -> Any:
    return option(None, "--n-ctx", parse=int, help="context window in tokens", **kw)


def datastore_option(**kw: Any) -> Any:
    return option(None, "--datastore", help="global suffix datastore (--drafter suffix|hybrid*)", **kw)


def knowledge_option(default: bool = True, **kw: Any) -> Any:
    return option(
        default,
        "--no-knowledge",
        help="neither load nor save what the drafter learned ($SPECLIVE_HOME/knowledge; "
        "see `speclive knowledge`)",
        **kw,
    )


def max_tokens_option(default: int, *, help: str = "most tokens to generate", **kw: Any) -> Any:
    return option(default, "--max-tokens", parse=int, help=help, **kw)


def threads_option(
    default: int | None = None, *, help: str = "CPU threads (none: all cores)", **kw: Any
) -> Any:
    return option(default, "--threads", parse=int, help=help, **kw)


def device_option(
    default: str = "cpu", *, help: str = "torch device of --backend hf (cpu, cuda, cuda:1, ...)", **kw: Any
) -> Any:
    return option(default, "--device", help=help, **kw)


def engine_option(**kw: Any) -> Any:
    return option(
        "local",
        "--engine",
        choices=ENGINES,
        help="local: the model in this process (--backend); vllm: `vllm serve` replicas (--vllm-url)",
        **kw,
    )


def vllm_urls_option(**kw: Any) -> Any:
    return option(
        (),
        "--vllm-url",
        repeat=True,
        metavar="URL",
        help="base URL of a `vllm serve` replica, e.g. http://127.0.0.1:8100 (repeat, or "
        "comma-separate, for several replicas)",
        **kw,
    )


def vllm_top_k_option(**kw: Any) -> Any:
    return option(20, "--vllm-top-k", parse=int, help="log-probs per position of a vLLM verification", **kw)


def voice_option(**kw: Any) -> Any:
    return option("piper-joe-medium", "--voice", help="Piper voice: registry name or .onnx path", **kw)


# ------------------------------------------------------------------------------------- speech
def asr_model_option(
    default: str = "whisper-base", *, help: str = "Whisper target: registry name, folder or hub id", **kw: Any
) -> Any:
    return option(default, "--asr-model", help=help, **kw)


def asr_draft_option(
    default: str = "whisper-tiny.en", *, help: str = "SpecASR draft (a Whisper model or self:N)", **kw: Any
) -> Any:
    return option(default, "--asr-draft", help=help, **kw)


def stream_draft_option(**kw: Any) -> Any:
    return option(
        True,
        "--no-stream-draft",
        help="decode every streaming transcription pass from scratch instead of drafting it with "
        "the previous passes' hypotheses (the baseline; the transcripts are the same)",
        **kw,
    )


def stream_partials_option(**kw: Any) -> Any:
    return option(
        "target",
        "--stream-partials",
        choices=("target", "draft"),
        help="the model of the streaming partial passes: the Whisper target, or the draft "
        "(tiny.en: less CPU per pass, rougher partials; the final pass stays on the target)",
        **kw,
    )


def check_remote(engine: str, vllm_urls: Sequence[str]) -> None:
    """``ConfigError`` unless ``--engine vllm`` and ``--vllm-url`` come together."""
    if engine not in ENGINES:
        raise ConfigError(f"invalid engine {engine!r}; allowed values: {', '.join(ENGINES)}")
    if engine == "vllm" and not vllm_urls:
        raise ConfigError("--engine vllm needs --vllm-url URL (a `vllm serve` replica)")
    if engine != "vllm" and vllm_urls:
        raise ConfigError("--vllm-url needs --engine vllm")


# ------------------------------------------------------------------------------- option groups
@dataclass
class EngineOptions:
    """The language model and its speculator, as ``speclive generate`` and ``serve`` load them."""

    model: str = model_option()
    backend: str = backend_option()
    drafter: str = drafter_option()
    draft_model: str | None = draft_model_option()
    max_draft: int | None = max_draft_option()
    threshold: float = threshold_option()
    threads: int | None = threads_option()
    device: str = device_option()
    n_ctx: int | None = n_ctx_option()
    datastore: str | None = datastore_option()
    knowledge: bool = knowledge_option()
    max_tokens: int = max_tokens_option(256)


@dataclass
class RemoteOptions:
    """Where the LLM runs: in this process, or in ``vllm serve`` replicas."""

    engine: str = engine_option()
    vllm_urls: tuple[str, ...] = vllm_urls_option()
    vllm_top_k: int = vllm_top_k_option()

    def __post_init__(self) -> None:
        check_remote(self.engine, self.vllm_urls)


@dataclass
class SpeechOptions:
    """The speech models of the live pipelines: Whisper target and draft, streaming, the voice."""

    asr_model: str = asr_model_option()
    asr_draft: str = asr_draft_option()
    stream_draft: bool = stream_draft_option()
    stream_partials: str = stream_partials_option()
    voice: str = voice_option()


#: ``speclive generate``'s engine options
ENGINE = OptionSet(EngineOptions)
#: the LLM options of the session commands (which speculate in their own way)
SESSION_LLM = OptionSet(EngineOptions, only=("model", "backend", "device", "threads", "max_tokens"))
REMOTE = OptionSet(RemoteOptions)
SPEECH = OptionSet(SpeechOptions)
VOICE = OptionSet(SpeechOptions, only=("voice",))
STREAMING = OptionSet(SpeechOptions, only=("stream_draft", "stream_partials"))
