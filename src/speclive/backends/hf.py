"""transformers / PyTorch backend: the exactness reference and the GPU-ready path.

Trees are evaluated in one forward pass with a 4-D additive attention mask (every node sees
the cached prefix and its own ancestors) and explicit per-node positions; ``keep`` compacts
the ``DynamicCache`` tensors to the accepted path with one ``index_select`` per layer.

On CPU in float32 every ``nn.Linear`` is swapped for a dual-layout one (``cpu_linear``): the
stock kernels are slow at the 1–32 row shapes of decoding and verification.

``hf_load.load_hf`` loads a model and picks this backend or ``hf_static``'s.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from speclive.backends.base import Backend, BackendState
from speclive.backends.cpu_linear import install
from speclive.errors import ConfigError
from speclive.tokenizer import Tokenizer

# the cost model's prior t(k)/t(1) for an fp32 model on a CPU (docs/engine.md); replaced online
# by measurements
_HF_FP32_PRIOR = {1: 1.0, 2: 2.17, 4: 2.85, 8: 2.56, 16: 2.95, 32: 4.32}
# on a GPU a small model's step is launch-bound: verifying a few dozen tokens costs about one
# step (benchmarks/results/archive/costcurve-qwen2.5-coder-0.5b-instruct-hf-cuda.md); measurements
# replace it
_HF_GPU_PRIOR = {1: 1.0, 16: 1.04, 32: 1.05, 64: 1.17}


def check_device(device: str) -> None:
    """Raise ``ConfigError`` for a device torch does not know or cannot use here."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"invalid device {device!r}: {e}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r}: torch {torch.__version__} sees no CUDA GPU here")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {device!r}: MPS is not available here")


@dataclass
class HFState(BackendState):
    cache: Any = None


class HFBackend(Backend):
    kind = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer,
        name: str = "model",
        n_ctx: int | None = None,
        threads: int | None = None,
        fast_linear: bool = True,
    ):
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.model = model.eval()
        #: what ``cpu_linear.install`` did (fp32 CPU models get dual-layout linears)
        self.linear_info: dict[str, Any] = {"installed": False, "why": "disabled"}
        if fast_linear:
            self.linear_info = install(self.model)
        self.tokenizer = tokenizer
        self.name = name
        cfg = model.config
        self.vocab_size = int(cfg.vocab_size)
        self.n_ctx = int(n_ctx or getattr(cfg, "max_position_embeddings", 4096) or 4096)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        super().__init__()

    def default_cost_prior(self) -> dict[int, float]:
        return _HF_FP32_PRIOR if self.device.type == "cpu" else _HF_GPU_PRIOR

    # ---- protocol -------------------------------------------------------------------
    def new_state(self) -> HFState:
        from transformers import DynamicCache

        return HFState(cache=DynamicCache(config=self.model.config))

    def _extend(
        self, state: BackendState, tokens: list[int], parents: list[int] | None, last_only: bool = False
    ) -> np.ndarray:
        torch = self.torch
        assert isinstance(state, HFState)
        past = len(state.tokens)
        n = len(tokens)
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        if parents is None:
            pos = torch.arange(past, past + n, device=self.device).unsqueeze(0)
            mask = None
        else:
            depth = np.zeros(n, dtype=np.int64)
            allowed = np.zeros((n, n), dtype=bool)
            for i, p in enumerate(parents):
                if p >= 0:
                    depth[i] = depth[p] + 1
                    allowed[i] = allowed[p]
                allowed[i, i] = True
            pos = torch.from_numpy(past + depth).to(self.device).unsqueeze(0)
            full = np.ones((n, past + n), dtype=bool)
            full[:, past:] = allowed
            mask = torch.zeros((1, 1, n, past + n), dtype=self.dtype, device=self.device)
            mask.masked_fill_(
                ~torch.from_numpy(full).to(self.device)[None, None], torch.finfo(self.dtype).min
            )
        with torch.inference_mode():
            out = self.model(
                input_ids=ids,
                position_ids=pos,
                attention_mask=mask,
                past_key_values=state.cache,
                use_cache=True,
                logits_to_keep=1 if last_only else 0,
            )
        state.cache = out.past_key_values
        return out.logits[0].float().cpu().numpy()

    def _layers(self, state: HFState) -> list[Any]:
        return [layer for layer in state.cache.layers if getattr(layer, "keys", None) is not None]

    def _compact(self, state: BackendState, keep_idx: list[int]) -> None:
        assert isinstance(state, HFState)
        idx = self.torch.tensor(keep_idx, dtype=self.torch.long, device=self.device)
        for layer in self._layers(state):
            layer.keys = layer.keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)

    def _truncate(self, state: BackendState, n: int) -> None:
        assert isinstance(state, HFState)
        for layer in self._layers(state):
            layer.keys = layer.keys[..., :n, :]
            layer.values = layer.values[..., :n, :]

    def fork(self, state: BackendState) -> HFState:
        assert isinstance(state, HFState)
        if state.pending is not None:
            raise RuntimeError("cannot fork a state with a pending tree extension")
        new = HFState(tokens=list(state.tokens), cache=copy.deepcopy(state.cache))
        return new

    def release(self, state: BackendState) -> None:
        assert isinstance(state, HFState)
        state.tokens.clear()
        state.pending = state.pending_parents = None
        state.cache = None
