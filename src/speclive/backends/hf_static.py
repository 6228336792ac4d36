"""transformers models on a static KV cache, every decode and verification pass a CUDA graph.

On a GPU an eager transformers step of a small model is bound by kernel launches and Python,
not by the GPU: the step takes many times longer than reading the model's weights from the
GPU's memory. ``StaticHFBackend`` removes that overhead the way gpt-fast and vLLM do:

- Each state owns a preallocated KV cache ``[layers, 1, kv_heads, capacity, head_dim]``
  (``capacity`` = ``n_ctx`` plus one bucket of scratch rows). A pass writes its rows in place
  with ``index_copy_``; ``keep`` moves the accepted tree rows down; ``truncate`` only shortens
  the logical length (masked rows are never read).
- A pass of ``n`` rows is padded to a row bucket (1, 2, 4, ... 64) and attends over a context
  bucket (256, 512, ... capacity) that covers the cache, under a boolean mask built on the host
  (prefix + the node's ancestors; a padding row sees only itself and writes a dead row). For
  each (state cache, rows, context) the forward is captured once as a CUDA graph and then
  replayed: one launch per pass. Longer chains (a prompt) go through in 64-row chunks; a tree
  of more than 64 nodes runs the same forward without a graph.
- The forward is the model's own modules (embedding, RMSNorm, rotary embedding, projections,
  MLP, head) in transformers' order; only attention is ours (``scaled_dot_product_attention``
  over the static cache), so outputs agree with the eager backend up to float rounding (tested
  greedy-identical on the prompts; a flip can only come at a near-tie).
- Caches are pooled: a released state's cache, with its captured graphs, serves the next
  ``new_state``. A state dropped without ``release`` returns its cache when collected.

Supported: decoder-only Llama-family models (``llama``, ``qwen2``, ``mistral``); others use the
eager ``HFBackend`` (``hf_load.load_hf`` chooses). Without CUDA (CPU tests) the same static forward
runs without graphs.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from speclive.backends.base import BackendState, rows_to_move
from speclive.backends.hf import HFBackend
from speclive.errors import ConfigError

#: the model families whose decoder layers this forward reproduces
SUPPORTED = ("llama", "qwen2", "mistral")
#: row buckets a pass is padded to (the largest is also the prefill chunk)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
#: the smallest context bucket; larger ones double up to the capacity
MIN_CTX = 256
#: default context when the model's own is larger (a cache is allocated at full size per state)
DEFAULT_N_CTX = 4096


def unsupported_reason(model: Any) -> str | None:
    """Why this forward cannot run ``model`` (None: it can)."""
    cfg = model.config
    kind = getattr(cfg, "model_type", "?")
    if kind not in SUPPORTED:
        return f"model type {kind!r} (supported: {', '.join(SUPPORTED)})"
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        return "sliding-window attention"
    attn = model.model.layers[0].self_attn
    if not all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return "attention without q/k/v/o projections"
    return None


class _Cache:
    """One state's static keys and values, and the graphs captured over them."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, device: Any, torch: Any):
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        #: (rows, ctx) -> (graph, output logits)
        self.graphs: dict[tuple[int, int], tuple[Any, Any]] = {}


@dataclass(eq=False)
class StaticState(BackendState):
    cache: _Cache | None = None

    __hash__ = object.__hash__


class _Inputs:
    """Static input buffers of one (rows, ctx) shape, shared by every cache's graph of it."""

    def __init__(self, rows: int, ctx: int, device: Any, torch: Any):
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.write = torch.zeros(rows, dtype=torch.long, device=device)
        self.mask = torch.ones(rows, ctx, dtype=torch.bool, device=device)


class StaticHFBackend(HFBackend):
    """``HFBackend`` over a static KV cache with CUDA-graph passes (module docstring)."""

    kind = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        name: str = "model",
        n_ctx: int | None = None,
        threads: int | None = None,
        fast_linear: bool = True,
        graphs: bool | None = None,
    ):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ConfigError(f"the static-cache backend does not run {reason}")
        native = int(getattr(model.config, "max_position_embeddings", DEFAULT_N_CTX) or DEFAULT_N_CTX)
        super().__init__(
            model,
            tokenizer,
            name=name,
            n_ctx=n_ctx or min(native, DEFAULT_N_CTX),
            threads=threads,
            fast_linear=fast_linear,
        )
        torch = self.torch
        if graphs is None:
            graphs = self.device.type == "cuda"
        if graphs and self.device.type != "cuda":
            raise ConfigError(f"CUDA graphs need a CUDA device (this model is on {self.device})")
        #: passes are captured and replayed as CUDA graphs (else the static forward runs eagerly)
        self.graphs = graphs
        cfg = model.config
        inner = model.model
        self._layers = list(inner.layers)
        attn = self._layers[0].self_attn
        self.head_dim = int(getattr(attn, "head_dim", cfg.hidden_size // cfg.num_attention_heads))
        self.n_heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", self.n_heads) or self.n_heads)
        self.scale = float(getattr(attn, "scaling", self.head_dim**-0.5))
        self.capacity = self.n_ctx + ROW_BUCKETS[-1]
        self._rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        self._free: list[_Cache] = []
        self._inputs: dict[tuple[int, int], _Inputs] = {}
        self._pool = torch.cuda.graph_pool_handle() if graphs else None
        self._stream = torch.cuda.Stream(device=self.device) if graphs else None
        #: graphs captured so far (each costs one warm-up pass and one capture)
        self.captures = 0

    # ---- caches ---------------------------------------------------------------------
    def _take_cache(self) -> _Cache:
        if self._free:
            return self._free.pop()
        shape = (len(self._layers), 1, self.kv_heads, self.capacity, self.head_dim)
        return _Cache(shape, self.dtype, self.device, self.torch)

    def new_state(self) -> StaticState:  # type: ignore[override]
        st = StaticState(cache=self._take_cache())
        weakref.finalize(st, self._free.append, st.cache)
        return st

    def release(self, state: BackendState) -> None:
        assert isinstance(state, StaticState)
        state.tokens.clear()
        state.pending = state.pending_parents = None
        # the cache returns to the pool when the state object is collected (its finalizer);
        # until then a released state may still be extended from empty

    def fork(self, state: BackendState) -> StaticState:
        assert isinstance(state, StaticState) and state.cache is not None
        if state.pending is not None:
            raise RuntimeError("cannot fork a state with a pending tree extension")
        new = self.new_state()
        assert new.cache is not None
        n = len(state.tokens)
        new.cache.k[:, :, :, :n].copy_(state.cache.k[:, :, :, :n])
        new.cache.v[:, :, :, :n].copy_(state.cache.v[:, :, :, :n])
        new.tokens = list(state.tokens)
        return new

    def _compact(self, state: BackendState, keep_idx: list[int]) -> None:
        assert isinstance(state, StaticState) and state.cache is not None
        base, rows = rows_to_move(keep_idx)
        if not rows:
            return
        idx = self.torch.tensor(rows, dtype=self.torch.long, device=self.device)
        c, m = state.cache, len(rows)
        c.k[:, :, :, base : base + m] = c.k.index_select(3, idx)
        c.v[:, :, :, base : base + m] = c.v.index_select(3, idx)

    def _truncate(self, state: BackendState, n: int) -> None:
        pass  # rows past the logical length are masked out and overwritten by later passes

    # ---- passes ---------------------------------------------------------------------
    def _extend(
        self, state: BackendState, tokens: list[int], parents: list[int] | None, last_only: bool = False
    ) -> np.ndarray:
        assert isinstance(state, StaticState) and state.cache is not None
        past, n = len(state.tokens), len(tokens)
        chunk = ROW_BUCKETS[-1]
        if parents is None and n > chunk:  # a long chain (a prompt): 64-row passes
            # with last_only each chunk hands back one row (a prompt's other logits are not
            # copied to the host); the last chunk's is the answer
            outs = [
                self._pass(state.cache, past + lo, tokens[lo : lo + chunk], None, last_only)
                for lo in range(0, n, chunk)
            ]
            return outs[-1] if last_only else np.concatenate(outs)
        return self._pass(state.cache, past, tokens, parents, last_only)

    def _pass(
        self, cache: _Cache, past: int, tokens: list[int], parents: list[int] | None, last_only: bool
    ) -> np.ndarray:
        torch = self.torch
        n = len(tokens)
        rows = next((b for b in ROW_BUCKETS if b >= n), n)
        ctx = MIN_CTX
        while ctx < past + rows:
            ctx *= 2
        ctx = min(ctx, self.capacity)
        ids, pos, write, mask = _layout(tokens, parents, past, rows, ctx)
        use_graph = self.graphs and rows in ROW_BUCKETS
        if not use_graph:
            dev = self.device
            with torch.inference_mode():
                out = self._forward(
                    cache,
                    torch.from_numpy(ids).to(dev),
                    torch.from_numpy(pos).to(dev),
                    torch.from_numpy(write).to(dev),
                    torch.from_numpy(mask).to(dev),
                    ctx,
                )
        else:
            inp = self._inputs_for(rows, ctx)
            graph, out = self._graph(cache, rows, ctx, inp)  # (captured over scratch inputs)
            inp.ids.copy_(torch.from_numpy(ids))
            inp.pos.copy_(torch.from_numpy(pos))
            inp.write.copy_(torch.from_numpy(write))
            inp.mask.copy_(torch.from_numpy(mask))
            graph.replay()
        sel = out[n - 1 : n] if last_only else out[:n]
        return sel.float().cpu().numpy()

    def _inputs_for(self, rows: int, ctx: int) -> _Inputs:
        inp = self._inputs.get((rows, ctx))
        if inp is None:
            inp = self._inputs[(rows, ctx)] = _Inputs(rows, ctx, self.device, self.torch)
        return inp

    def _graph(self, cache: _Cache, rows: int, ctx: int, inp: _Inputs) -> tuple[Any, Any]:
        """The captured pass of this cache and shape (captured on first use)."""
        hit = cache.graphs.get((rows, ctx))
        if hit is not None:
            return hit
        torch = self.torch
        # capture with inputs that write only the scratch rows past n_ctx (never live); the
        # caller fills in the real inputs afterwards
        inp.write.copy_(torch.arange(self.n_ctx, self.n_ctx + rows, device=self.device))
        inp.mask.fill_(True)
        stream = self._stream
        assert stream is not None
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.inference_mode():
            with torch.cuda.stream(stream):  # warm-up off the capture (cuBLAS workspaces, autotune)
                self._forward(cache, inp.ids, inp.pos, inp.write, inp.mask, ctx)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self._forward(cache, inp.ids, inp.pos, inp.write, inp.mask, ctx)
        cache.graphs[(rows, ctx)] = (graph, out)
        self.captures += 1
        return graph, out

    def _forward(self, cache: _Cache, ids: Any, pos: Any, write: Any, mask: Any, ctx: int) -> Any:
        """Logits ``[rows, vocab]`` of one pass; writes the rows' keys and values at ``write``."""
        torch = self.torch
        F = torch.nn.functional
        inner = self.model.model
        rows = ids.shape[0]
        hd = self.head_dim
        x = inner.embed_tokens(ids)[None]
        cos, sin = inner.rotary_emb(x, pos[None])
        attn_mask = mask[None, None]
        groups = self.n_heads // self.kv_heads
        for li, layer in enumerate(self._layers):
            att = layer.self_attn
            h = layer.input_layernorm(x)
            q = att.q_proj(h).view(1, rows, -1, hd).transpose(1, 2)
            k = att.k_proj(h).view(1, rows, -1, hd).transpose(1, 2)
            v = att.v_proj(h).view(1, rows, -1, hd).transpose(1, 2)
            q, k = self._rope(q, k, cos, sin)
            ck, cv = cache.k[li], cache.v[li]
            ck.index_copy_(2, write, k)
            cv.index_copy_(2, write, v)
            keys, values = ck[:, :, :ctx], cv[:, :, :ctx]
            if groups > 1:
                keys = keys.repeat_interleave(groups, dim=1)
                values = values.repeat_interleave(groups, dim=1)
            a = F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask, scale=self.scale)
            x = x + att.o_proj(a.transpose(1, 2).reshape(1, rows, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = inner.norm(x)
        return self.model.lm_head(x)[0]


def _layout(
    tokens: list[int], parents: list[int] | None, past: int, rows: int, ctx: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Host-side inputs of one pass padded to ``rows``: ids, positions, cache rows to write and
    the ``[rows, ctx]`` attention mask (each node: the prefix, its ancestors and itself; a
    padding row: only the dead row it writes)."""
    n = len(tokens)
    ids = np.zeros(rows, dtype=np.int64)
    ids[:n] = tokens
    write = np.arange(past, past + rows, dtype=np.int64)
    mask = np.zeros((rows, ctx), dtype=bool)
    mask[:n, :past] = True
    pos = np.zeros(rows, dtype=np.int64)
    if parents is None:
        pos[:n] = np.arange(past, past + n)
        mask[:n, past : past + n] = np.tril(np.ones((n, n), dtype=bool))
    else:
        depth = np.zeros(n, dtype=np.int64)
        for i, p in enumerate(parents):
            if p >= 0:
                depth[i] = depth[p] + 1
                mask[i, past : past + n] = mask[p, past : past + n]
            mask[i, past + i] = True
        pos[:n] = past + depth
    for j in range(n, rows):
        mask[j, past + j] = True
    return ids, pos, write, mask
