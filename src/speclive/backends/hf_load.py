"""Load a transformers causal LM as a speclive backend, eager or on a static KV cache.

``load_hf`` picks the backend class: ``StaticHFBackend`` (``hf_static``: static KV cache, each
pass a CUDA graph) on a CUDA device for the model families it supports, else the eager
``HFBackend`` (``hf``). It lives above both modules, so ``hf_static`` builds on ``hf`` and
``hf`` needs nothing of ``hf_static``.
"""

from __future__ import annotations

import os

from speclive.backends.hf import HFBackend, check_device
from speclive.backends.hf_static import StaticHFBackend, unsupported_reason
from speclive.tokenizer import Tokenizer


def load_hf(
    path: str,
    tokenizer: Tokenizer | None = None,
    name: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    n_ctx: int | None = None,
    threads: int | None = None,
    static: bool | None = None,
) -> HFBackend:
    """Load an HF folder or hub id (safetensors); GGUF files go through ``models.convert``.

    ``device``: any torch device ("cpu", "cuda", "cuda:1", "mps"); checked before loading.
    ``static``: run on a static KV cache with CUDA-graph passes (``hf_static``); None: on a
    CUDA device for the model families it supports, unless ``SPECLIVE_CUDA_GRAPHS=0``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    check_device(device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device)
    tok = tokenizer or Tokenizer.from_pretrained(path)
    name = name or os.path.basename(str(path).rstrip("/"))
    if static is None:
        static = (
            torch.device(device).type == "cuda"
            and os.environ.get("SPECLIVE_CUDA_GRAPHS", "1") != "0"
            and unsupported_reason(model) is None
        )
    if static:
        return StaticHFBackend(model, tok, name=name, n_ctx=n_ctx, threads=threads)
    return HFBackend(model, tok, name=name, n_ctx=n_ctx, threads=threads)
