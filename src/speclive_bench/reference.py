"""References the lossless modes are checked against, used by the benchmarks and the tests.

- ``greedy_steps``: plain autoregressive greedy decoding on a speclive backend, one forward per
  token (with teacher forcing along a known output);
- ``greedy_reference``: its output with the top-2 logit gap at every position;
- ``LlamaReference`` / ``llama_reference_greedy``: llama-cpp-python's own ``Llama`` generation,
  the peer generator of the comparisons.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from speclive.backends.base import Backend
from speclive.backends.llamacpp import llama_cpp_lib
from speclive.backends.llamacpp_buffers import extra_buffers_safe


def greedy_steps(
    backend: Backend,
    prompt_ids: Sequence[int],
    max_tokens: int,
    *,
    follow: Sequence[int] = (),
    split_prompt: bool = False,
) -> Iterator[tuple[np.ndarray, int]]:
    """Plain autoregressive greedy decoding, one target forward per token, in a state of its own:
    the reference every lossless mode of ``SpeculativeDecoder`` must reproduce token for token.

    Yields ``(row, token)`` per output position, at most ``max_tokens``: the logits row that
    chooses the token there and the token that is fed on, as a one-token step: the row's argmax,
    or ``follow[i]`` while ``i < len(follow)`` (teacher forcing along a known output; a followed
    token never ends the run). The run ends after an argmax that is an end-of-sequence token.

    ``split_prompt``: evaluate ``prompt_ids[:-1]`` first and the last prompt token as a step of
    its own (the shapes of the loop's prefill and first verification for a prompt too long to
    fuse), instead of the whole prompt in one batch. On a quantized backend the logits of a
    batch differ slightly from those of one-token steps.
    """
    prompt = [int(t) for t in prompt_ids]
    eos = backend.tokenizer.eos_ids
    state = backend.new_state()
    try:
        if split_prompt:
            if len(prompt) > 1:
                backend.extend(state, prompt[:-1], last_only=True)
            row = backend.extend(state, prompt[-1:])[-1]
        else:
            row = backend.extend(state, prompt)[-1]
        for i in range(max_tokens):
            tok = int(follow[i]) if i < len(follow) else int(np.argmax(row))
            yield row, tok
            if i >= len(follow) and tok in eos:
                return
            if i + 1 < max_tokens:
                row = backend.extend(state, [tok])[-1]
    finally:
        backend.release(state)


def top2_gap(row: np.ndarray) -> float:
    """The largest logit of ``row`` minus the second largest (0 at a tie)."""
    top = np.partition(row, -2)[-2:]
    return float(top[1] - top[0])


def greedy_reference(
    backend: Backend, prompt_ids: Sequence[int], max_tokens: int
) -> tuple[list[int], list[float]]:
    """Greedy output of ``greedy_steps`` (whole prompt in one batch) and the top-2 logit gap at
    every position: ``(token_ids, gaps)``. An end-of-sequence token ends the output (it is not
    included, its gap is: ``len(gaps)`` is ``len(token_ids) + 1`` then)."""
    eos = backend.tokenizer.eos_ids
    out: list[int] = []
    gaps: list[float] = []
    for row, tok in greedy_steps(backend, prompt_ids, max_tokens):
        gaps.append(top2_gap(row))
        if tok not in eos:
            out.append(tok)
    return out, gaps


@contextlib.contextmanager
def _repack_as_speclive(gguf: Path) -> Iterator[None]:
    """``Llama`` loads with llama.cpp's default model parameters; where the repacked weight
    buffers crash on this CPU, hand it defaults with them off, as ``LlamaCppBackend`` loads."""
    if extra_buffers_safe(gguf):
        yield
        return
    import llama_cpp.llama as high

    plain = high.llama_cpp.llama_model_default_params

    def defaults() -> Any:
        params = plain()
        params.use_extra_bufts = False
        return params

    high.llama_cpp.llama_model_default_params = defaults
    try:
        yield
    finally:
        high.llama_cpp.llama_model_default_params = plain


class LlamaReference:
    """llama-cpp-python's own ``Llama`` object, used as the peer generator in comparisons."""

    def __init__(
        self,
        gguf_path: str | os.PathLike[str],
        n_ctx: int = 4096,
        n_threads: int | None = None,
        draft_model: Any = None,
    ):
        """``draft_model``: llama-cpp-python's own speculative drafter (a ``LlamaDraftModel``,
        e.g. ``LlamaPromptLookupDecoding``), passed to ``Llama(draft_model=...)``."""
        llama_cpp_lib()
        from llama_cpp import Llama

        threads = int(n_threads or os.cpu_count() or 1)
        with _repack_as_speclive(Path(gguf_path)):
            self.llm = Llama(
                model_path=str(gguf_path),
                n_ctx=n_ctx,
                n_threads=threads,
                n_threads_batch=threads,
                logits_all=False,
                flash_attn=True,  # as LlamaCppBackend runs
                verbose=False,
                draft_model=draft_model,
            )

    def greedy(
        self, prompt_ids: Sequence[int], max_tokens: int, stop_ids: Collection[int] | None = None
    ) -> list[int]:
        """Greedy continuation of ``prompt_ids`` (a stop token, if met, is included and ends it)."""
        llm = self.llm
        llm.reset()  # no prefix reuse from an earlier call: every call starts from the prompt
        out: list[int] = []
        if max_tokens <= 0:
            return out
        stops = set(stop_ids or ())
        gen = llm.generate(
            [int(t) for t in prompt_ids], temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0
        )
        for tok in gen:
            out.append(int(tok))
            if len(out) >= max_tokens or tok in stops:
                break
        gen.close()
        return out

    def close(self) -> None:
        self.llm.close()


def llama_reference_greedy(
    gguf_path: str | os.PathLike[str],
    prompt_ids: Sequence[int],
    max_tokens: int,
    n_threads: int | None = None,
    n_ctx: int = 4096,
    stop_ids: Collection[int] | None = None,
) -> list[int]:
    """llama-cpp-python's own greedy generation (``Llama.generate`` with temp 0) of ``max_tokens``."""
    ref = LlamaReference(gguf_path, n_ctx=n_ctx, n_threads=n_threads)
    try:
        return ref.greedy(prompt_ids, max_tokens, stop_ids)
    finally:
        ref.close()
