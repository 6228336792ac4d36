"""Peer generators the decode benchmark runs side by side with speclive's own loop.

Every peer turns the same prompt token ids into greedy output token ids and is timed the same
way as our decoder: wall time of the whole call, prefill included, end-of-sequence tokens not
counted.

- ``LlamaCppPythonPeer``: llama-cpp-python's own ``Llama.generate`` on the same GGUF file.
- ``LlamaPromptLookupPeer``: the same with llama-cpp-python's own prompt-lookup drafting
  (``LlamaPromptLookupDecoding`` passed as ``draft_model=`` to ``Llama``), the speculative
  decoding a llama.cpp user picks first. ``num_pred_tokens`` 2 is what its documentation
  recommends for CPU-only machines (10, its default, for GPUs). It counts the target's ``eval``
  calls (τ) and the drafted tokens.
- ``HFGeneratePeer``: transformers ``model.generate(do_sample=False)``, optionally with an
  ``assistant_model`` (assisted generation; with two tokenizers: universal assisted generation)
  or ``prompt_lookup_num_tokens`` (prompt lookup decoding). It counts target forwards with a
  forward pre-hook, so τ (tokens per target forward) is comparable with ours.
- ``VllmPeer``: vLLM (CPU build) in its own virtual environment, driven through
  ``speclive_bench/vllm_peer.py`` in a subprocess (one engine start per method).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclive.backends.cpu_linear import stock_linears
from speclive_bench.reference import LlamaReference


@dataclass
class PeerOutput:
    """One peer generation: new tokens (EOS stripped), wall time, target forwards if known."""

    token_ids: list[int]
    wall_s: float
    target_forwards: int | None = None
    finish_reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def strip_eos(ids: Sequence[int], eos: Collection[int], max_tokens: int) -> tuple[list[int], str]:
    """Cut ``ids`` at the first EOS (not included) and at ``max_tokens``; say why it ended."""
    out: list[int] = []
    for t in ids:
        if int(t) in eos:
            return out, "eos"
        out.append(int(t))
        if len(out) >= max_tokens:
            return out, "length"
    return out, "length" if len(out) >= max_tokens else "other"


class Peer(ABC):
    """A generator to compare with: ``generate(prompt_ids, max_tokens) -> PeerOutput``."""

    name = "peer"
    backend = "none"

    @abstractmethod
    def generate(self, prompt_ids: Sequence[int], max_tokens: int) -> PeerOutput: ...

    def close(self) -> None:
        """Free what the peer holds."""


class LlamaCppPythonPeer(Peer):
    """llama-cpp-python's high-level greedy generation (``LlamaReference``) on the same GGUF."""

    name = "llama-cpp-python"
    backend = "llamacpp"

    def __init__(
        self,
        gguf: str | os.PathLike[str],
        eos_ids: Collection[int],
        n_ctx: int = 4096,
        threads: int | None = None,
    ):
        self.ref = LlamaReference(gguf, n_ctx=n_ctx, n_threads=threads)
        self.eos = set(int(t) for t in eos_ids)

    def generate(self, prompt_ids: Sequence[int], max_tokens: int) -> PeerOutput:
        t0 = time.perf_counter()
        ids = self.ref.greedy(prompt_ids, max_tokens, stop_ids=self.eos)
        wall = time.perf_counter() - t0
        out, why = strip_eos(ids, self.eos, max_tokens)
        return PeerOutput(out, wall, target_forwards=len(ids), finish_reason=why)

    def close(self) -> None:
        self.ref.close()


#: method name -> num_pred_tokens of llama-cpp-python's prompt-lookup drafting
LLAMACPP_PLD: dict[str, int] = {"llama-cpp-pld": 2, "llama-cpp-pld10": 10}


class LlamaPromptLookupPeer(Peer):
    """llama-cpp-python with ``draft_model=LlamaPromptLookupDecoding(...)`` (module docstring)."""

    backend = "llamacpp"

    def __init__(
        self,
        gguf: str | os.PathLike[str],
        eos_ids: Collection[int],
        n_ctx: int = 4096,
        threads: int | None = None,
        num_pred_tokens: int = 2,
        max_ngram_size: int = 2,
        name: str = "llama-cpp-pld",
    ):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.name = name
        self.drafted = 0
        pld = LlamaPromptLookupDecoding(max_ngram_size=max_ngram_size, num_pred_tokens=num_pred_tokens)

        def draft(input_ids: Any, /, **kw: Any) -> Any:
            out = pld(input_ids, **kw)
            self.drafted += len(out)
            return out

        self.ref = LlamaReference(gguf, n_ctx=n_ctx, n_threads=threads, draft_model=draft)
        llm = self.ref.llm
        self.evals = 0
        plain_eval = llm.eval

        def counted_eval(tokens: Any) -> Any:
            self.evals += 1
            return plain_eval(tokens)

        llm.eval = counted_eval  # type: ignore[method-assign]
        self.eos = set(int(t) for t in eos_ids)
        self.num_pred_tokens = num_pred_tokens

    def generate(self, prompt_ids: Sequence[int], max_tokens: int) -> PeerOutput:
        self.evals = self.drafted = 0
        t0 = time.perf_counter()
        ids = self.ref.greedy(prompt_ids, max_tokens, stop_ids=self.eos)
        wall = time.perf_counter() - t0
        out, why = strip_eos(ids, self.eos, max_tokens)
        # evals: the prompt's (one call), then one per verification, each committing the
        # accepted drafts + 1 token
        forwards = max(1, self.evals - 1)
        extra = {
            "num_draft_tokens": self.drafted,
            "num_accepted_tokens": max(0, len(out) - forwards),
            "num_pred_tokens": self.num_pred_tokens,
        }
        return PeerOutput(out, wall, target_forwards=forwards, finish_reason=why, extra=extra)

    def close(self) -> None:
        self.ref.close()


class _ForwardCounter:
    """Counts forward calls of a torch module (a pre-hook, removed by ``close``)."""

    def __init__(self, module: Any):
        self.n = 0
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.n += 1

    def close(self) -> None:
        self._handle.remove()


class HFGeneratePeer(Peer):
    """transformers ``generate`` (greedy), plain / assisted / prompt lookup (see module docstring)."""

    backend = "hf"

    def __init__(
        self,
        name: str,
        model: Any,
        eos_ids: Collection[int],
        pad_id: int | None = None,
        assistant_model: Any = None,
        tokenizer: Any = None,
        assistant_tokenizer: Any = None,
        prompt_lookup_num_tokens: int | None = None,
    ):
        import torch

        self.torch = torch
        self.name = name
        self.model = model
        self.eos = sorted(int(t) for t in eos_ids)
        self.pad_id = int(pad_id) if pad_id is not None else (self.eos[0] if self.eos else 0)
        self.kwargs: dict[str, Any] = {}
        if assistant_model is not None:
            self.kwargs["assistant_model"] = assistant_model
            if tokenizer is not None and assistant_tokenizer is not None:
                self.kwargs["tokenizer"] = tokenizer
                self.kwargs["assistant_tokenizer"] = assistant_tokenizer
        if prompt_lookup_num_tokens:
            self.kwargs["prompt_lookup_num_tokens"] = int(prompt_lookup_num_tokens)

    def _config(self, max_tokens: int) -> Any:
        from transformers import GenerationConfig

        return GenerationConfig(
            do_sample=False,
            num_beams=1,
            max_new_tokens=max_tokens,
            eos_token_id=self.eos,
            pad_token_id=self.pad_id,
            repetition_penalty=1.0,
            temperature=None,
            top_k=None,
            top_p=None,
        )

    def generate(self, prompt_ids: Sequence[int], max_tokens: int) -> PeerOutput:
        torch = self.torch
        device = next(self.model.parameters()).device
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        mask = torch.ones_like(ids)
        counter = _ForwardCounter(self.model)
        try:
            t0 = time.perf_counter()
            # transformers as shipped: our dual-layout linears are swapped out for the call
            with torch.inference_mode(), stock_linears(self.model, self.kwargs.get("assistant_model")):
                seq = self.model.generate(
                    ids, attention_mask=mask, generation_config=self._config(max_tokens), **self.kwargs
                )
            wall = time.perf_counter() - t0
        finally:
            counter.close()
        new = [int(t) for t in seq[0, ids.shape[1] :].tolist()]
        out, why = strip_eos(new, set(self.eos), max_tokens)
        return PeerOutput(out, wall, target_forwards=counter.n, finish_reason=why)


# ---------------------------------------------------------------------------------------- vLLM
VLLM_METHODS: dict[str, str] = {
    "vllm-ar": "none",
    "vllm-ngram": "ngram",
    "vllm-suffix": "suffix",
    "vllm-draft": "draft",
}


def vllm_python(root: Path | None = None) -> Path | None:
    """The interpreter of the vLLM venv, if it exists.

    ``$VLLM_VENV`` (the variable ``benchmarks/setup_vllm.sh`` installs into) wins; otherwise
    ``.venv-vllm`` under ``root``, the working directory or this checkout's root.
    """
    env = os.environ.get("VLLM_VENV")
    if env:
        py = Path(env).expanduser() / "bin" / "python"
        return py if py.is_file() else None
    here = Path(__file__).resolve()
    candidates = [root] if root else []
    candidates += [Path.cwd(), here.parents[2]]
    for base in candidates:
        py = Path(base) / ".venv-vllm" / "bin" / "python"
        if py.is_file():
            return py
    return None


def vllm_forwards(tokens: int, num_drafts: float | None, num_accepted: float | None) -> int | None:
    """Target forwards (prefill included) of one vLLM request from its speculative counters.

    Every engine step is one target forward committing its accepted draft tokens + 1, so
    ``tokens - accepted`` forwards; but vLLM counts accepted tokens cut off by ``max_tokens``
    too, so at least ``num_drafts`` verification steps + the prefill ran.
    """
    if tokens <= 0:
        return None
    est = tokens - int(num_accepted or 0)
    if num_drafts:
        est = max(est, int(num_drafts) + 1)
    return max(1, est)


class VllmPeer:
    """One vLLM speculative method over a whole prompt list, in a subprocess (batch interface)."""

    backend = "vllm"

    def __init__(
        self,
        name: str,
        python: Path,
        model_dir: Path,
        draft_dir: Path | None = None,
        eos_ids: Collection[int] = (),
        timeout_s: float = 3600.0,
        num_speculative_tokens: int | None = None,
        enforce_eager: bool = False,
    ):
        if name not in VLLM_METHODS:
            raise ValueError(f"unknown vLLM method {name!r}; known: {', '.join(VLLM_METHODS)}")
        self.name = name
        self.python = python
        self.model_dir = model_dir
        self.draft_dir = draft_dir
        self.eos = sorted(int(t) for t in eos_ids)
        self.timeout_s = timeout_s
        self.k = num_speculative_tokens
        self.enforce_eager = enforce_eager

    def command(self, prompts_json: Path, out_json: Path, max_tokens: int) -> list[str]:
        """The ``vllm_peer.py`` command line of this method."""
        cmd = [
            str(self.python),
            str(Path(__file__).with_name("vllm_peer.py")),
            "--model",
            str(self.model_dir),
            "--method",
            VLLM_METHODS[self.name],
            "--prompts-json",
            str(prompts_json),
            "--max-tokens",
            str(max_tokens),
            "--out",
            str(out_json),
            "--stop-ids",
            ",".join(map(str, self.eos)),
        ]
        if self.draft_dir is not None:
            cmd += ["--draft", str(self.draft_dir)]
        if self.k:
            cmd += ["--num-speculative-tokens", str(self.k)]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        return cmd

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        ncpu = os.cpu_count() or 1
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{ncpu - 1}" if ncpu > 1 else "0")
        iomp = self.python.parent.parent / "lib" / "libiomp5.so"
        if iomp.is_file() and "LD_PRELOAD" not in env:
            env["LD_PRELOAD"] = str(iomp)
        return env

    def run_all(
        self,
        prompts: Sequence[tuple[str, Sequence[int]]],
        max_tokens: int,
        log: Any = None,
        warmup: Sequence[Sequence[int]] = (),
        warmup_tokens: int = 16,
    ) -> tuple[dict[str, PeerOutput], dict[str, Any]]:
        """Generate for every ``(key, prompt_ids)``; returns outputs by key and run facts.

        ``warmup`` prompts run first (``warmup_tokens`` each, not reported). They should not be
        benchmark prompts: vLLM's prefix cache, and the suffix method's cache of earlier outputs,
        would make the measured run of the same prompt a replay.
        """
        items: list[dict[str, Any]] = [
            {"id": f"warmup\t{i}", "prompt_ids": list(map(int, ids)), "max_tokens": warmup_tokens}
            for i, ids in enumerate(warmup)
        ]
        items += [{"id": k, "prompt_ids": list(map(int, ids))} for k, ids in prompts]
        with tempfile.TemporaryDirectory(prefix="speclive-vllm-") as tmp:
            pj = Path(tmp) / "prompts.json"
            pj.write_text(json.dumps(items))
            outj = Path(tmp) / "out.json"
            cmd = self.command(pj, outj, max_tokens)
            t0 = time.perf_counter()
            proc = subprocess.run(
                cmd,
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
            )
            elapsed = time.perf_counter() - t0
            if proc.returncode != 0 or not outj.is_file():
                tail = (proc.stderr or "")[-3000:]
                raise RuntimeError(f"{self.name} failed (rc={proc.returncode}): {tail}")
            data = json.loads(outj.read_text())
        if log is not None:
            log(f"{self.name}: engine start {data.get('startup_s', 0):.0f}s, total {elapsed:.0f}s")
        outs: dict[str, PeerOutput] = {}
        for r in data["results"]:
            ids, why = strip_eos(r["token_ids"], set(self.eos), max_tokens)
            extra = {k: r[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens") if k in r}
            forwards = vllm_forwards(len(ids), r.get("num_drafts"), r.get("num_accepted_tokens"))
            outs[r["id"]] = PeerOutput(ids, float(r["wall_s"]), forwards, why, extra)
        facts = {k: v for k, v in data.items() if k != "results"}
        facts["subprocess_s"] = elapsed
        return outs, facts
