"""Build backends and drafters from names: the glue between the CLI and the engine.

A model is named by a registry name (installed on first use from the offline bundle), a
local ``.gguf`` file, a local HF folder or a hub id (``speclive.models.resolve``). Both
backends use the HF tokenizer of the model, so token ids agree across backends.
"""

from __future__ import annotations

import functools
from pathlib import Path

from speclive.backends import cost_calibration
from speclive.backends.base import Backend
from speclive.backends.hf_load import load_hf
from speclive.backends.llamacpp import LlamaCppBackend
from speclive.drafting.asyncdraft import AsyncHybridDrafter
from speclive.drafting.base import Drafter
from speclive.drafting.crossvocab import CrossVocabDrafter
from speclive.drafting.hybrid import HybridConfig, HybridDrafter
from speclive.drafting.model import ModelDrafter
from speclive.drafting.ngram import NGRAM_MAX_DRAFT, NgramDrafter
from speclive.drafting.priors import cost_curve
from speclive.drafting.suffix import SuffixConfig, SuffixDrafter, load_datastore
from speclive.errors import ConfigError
from speclive.models.convert import hf_dir_for_gguf, tokenizer_dir_for_gguf
from speclive.models.install import speclive_home
from speclive.models.resolve import ModelRef, resolve
from speclive.tokenizer import Tokenizer

BACKENDS = ("hf", "llamacpp")
DRAFTERS = ("none", "ngram", "model", "crossvocab", "suffix", "hybrid", "hybrid-async")

#: same-tokenizer draft model used by ``--drafter model`` when none is named
DEFAULT_DRAFT = {
    "qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-0.5b-instruct",
}
#: other-tokenizer draft model used by ``--drafter crossvocab`` when none is named
DEFAULT_CROSS_DRAFT = "smollm2-135m-instruct"
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"


def _choice(kind: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"invalid {kind} {value!r}; allowed values: {', '.join(allowed)}")
    return value


def tokenizer_for(ref: ModelRef) -> Tokenizer:
    if ref.gguf is not None:
        name = ref.name if ref.source == "registry" else None
        return Tokenizer.from_pretrained(tokenizer_dir_for_gguf(ref.gguf, name))
    return Tokenizer.from_pretrained(str(ref.path or ref.hub_id))


def load_backend(
    model: str = DEFAULT_MODEL,
    backend: str = "llamacpp",
    n_ctx: int | None = None,
    threads: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    max_states: int | None = None,
) -> Backend:
    """Load ``model`` on ``backend`` (cached per process: backends are heavy).

    ``device`` places the transformers backend ("cuda", "cuda:1", ...); the llama.cpp build
    speclive installs is CPU-only, so it takes "cpu" alone. ``max_states``: KV states the
    llama.cpp backend holds at once (default 4); each one past the first adds ``n_ctx / 4``
    KV cells to the shared cache.
    """
    # one cache key however the arguments were spelled (keyword or default)
    return _load_backend(model, backend, n_ctx, threads, dtype, device, max_states)


@functools.lru_cache(maxsize=8)
def _load_backend(
    model: str,
    backend: str,
    n_ctx: int | None,
    threads: int | None,
    dtype: str,
    device: str,
    max_states: int | None = None,
) -> Backend:
    _choice("backend", backend, BACKENDS)
    if backend == "llamacpp" and device != "cpu":
        raise ConfigError(f"--device {device}: the llamacpp backend runs on the CPU only (use --backend hf)")
    ref = resolve(model)
    if ref.kind not in (None, "llm-gguf"):
        raise ConfigError(f"{model!r} is a {ref.kind} model, not a causal language model")
    if backend == "llamacpp":
        if ref.gguf is None:
            raise ConfigError(
                f"the llamacpp backend needs a GGUF file; {model!r} has none (use --backend hf)"
            )
        ctx = n_ctx or 4096
        states = (
            {}
            if max_states is None
            else {"max_states": max_states, "n_cells": ctx + (max_states - 1) * ctx // 4}
        )
        # the cost model starts from the curve calibrated on the committed benchmarks
        # (docs/coldstart.md), then from this machine's own, measured once (cost_calibration)
        backend = LlamaCppBackend(
            ref.gguf,
            tokenizer_for(ref),
            name=ref.name,
            n_ctx=ctx,
            n_threads=threads,
            cost_prior=cost_curve(),
            **states,
        )
        if cost_calibration.enabled():
            settings = {
                "backend": "llamacpp",
                "threads": backend.n_threads,
                "flash_attn": backend.flash_attn,
                "repacked": backend.repacked,
                "n_batch": backend.n_batch,
                "llama_cpp": _llama_cpp_version(),
            }
            curves = speclive_home() / "cost-curves.json"
            cost_calibration.calibrate(backend, Path(ref.gguf), settings, curves)
        return backend
    if ref.gguf is not None:
        path: str | Path = hf_dir_for_gguf(ref.gguf, ref.name if ref.source == "registry" else None)
    else:
        path = ref.path or ref.hub_id  # type: ignore[assignment]
    return load_hf(str(path), name=ref.name, dtype=dtype, device=device, n_ctx=n_ctx, threads=threads)


def _llama_cpp_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _draft_device(target: Backend, backend: str) -> str:
    """A transformers draft model goes where an hf target is (a CPU draft for a GPU target
    would cost more than it saves); everything else runs on the CPU."""
    return str(target.device) if backend == "hf" and target.kind == "hf" else "cpu"


def make_drafter(
    name: str,
    target: Backend,
    draft_model: str | None = None,
    backend: str | None = None,
    max_len: int | None = None,
    threshold: float = 0.4,
    datastore: str | None = None,
    datastore_max_mb: float | None = None,
) -> Drafter | None:
    """A drafter by CLI name; ``none`` gives None (plain autoregressive decoding).

    ``datastore``: a global suffix datastore (``speclive datastore build``) for the suffix and
    hybrid drafters; without one they retrieve from the request's own tokens only.
    """
    _choice("drafter", name, DRAFTERS)
    if name == "none":
        return None
    if name in ("suffix", "hybrid", "hybrid-async"):
        return _talon_drafter(
            name, target, draft_model, backend, max_len, threshold, datastore, datastore_max_mb
        )
    if name == "ngram":
        return NgramDrafter(max_len=max_len or NGRAM_MAX_DRAFT)
    backend = backend or target.kind
    if name == "model":
        draft_name = draft_model or DEFAULT_DRAFT.get(target.name)
        if draft_name is None:
            raise ConfigError(
                f"--drafter model needs --draft-model for target {target.name!r} "
                f"(defaults exist for: {', '.join(DEFAULT_DRAFT)})"
            )
        draft = load_backend(draft_name, backend, n_ctx=target.n_ctx, device=_draft_device(target, backend))
        return ModelDrafter(draft, max_len=max_len or 24, threshold=threshold)
    draft = load_backend(
        draft_model or DEFAULT_CROSS_DRAFT,
        backend,
        n_ctx=max(target.n_ctx, 2048),
        device=_draft_device(target, backend),
    )
    return CrossVocabDrafter(draft, max_len=max_len or 16, threshold=threshold)


def _talon_drafter(
    name: str,
    target: Backend,
    draft_model: str | None,
    backend: str | None,
    max_len: int | None,
    threshold: float,
    datastore: str | None,
    datastore_max_mb: float | None,
) -> Drafter:
    """The Talon drafters: suffix retrieval, hybrid (model + retrieval), asynchronous hybrid."""
    store = load_datastore(datastore, target, datastore_max_mb)
    scfg = SuffixConfig(depth=max_len or 16, chain_depth=max_len or 16)
    if name == "suffix":
        return SuffixDrafter(store, scfg)
    draft_name = draft_model or DEFAULT_DRAFT.get(target.name)
    if draft_name is None:
        raise ConfigError(
            f"--drafter {name} needs --draft-model for target {target.name!r} "
            f"(defaults exist for: {', '.join(DEFAULT_DRAFT)})"
        )
    hcfg = HybridConfig(threshold=threshold)
    backend = backend or target.kind
    if name == "hybrid":
        draft = load_backend(draft_name, backend, n_ctx=target.n_ctx, device=_draft_device(target, backend))
        return HybridDrafter(draft, store, hcfg, scfg)
    # a draft backend of its own: its thread count is changed while the drafter runs
    draft = load_backend(
        draft_name, backend, n_ctx=target.n_ctx, threads=1, device=_draft_device(target, backend)
    )
    return AsyncHybridDrafter(draft, store, hcfg, scfg)
