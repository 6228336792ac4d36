"""Whisper as a speclive ``Backend``: the decoder with a static self-attention KV cache.

``WhisperBackend`` wraps a transformers ``WhisperForConditionalGeneration`` (converted from the
shipped CTranslate2 weights, see ``asr.ct2``, or loaded from any HF folder / hub id) and
implements the engine's cache protocol (``extend`` with trees, ``keep``, ``truncate``,
``fork``) over the *decoder*, so every decoding method runs through ``SpeculativeDecoder``.

- ``set_audio(audio)`` runs the encoder once per segment and precomputes every layer's
  cross-attention keys/values into an ``AudioContext``; it invalidates the caches of all states
  bound to that context (their tokens were conditioned on the previous audio).
- The decoder forward is written out over fused weights (one QKV matmul per layer, each weight
  kept in both layouts so one-row steps and multi-row passes each get the fast GEMM,
  ``cpu_linear.DualLinear``) with
  preallocated per-state KV tensors ``[layers, heads, n_ctx, head_dim]``: a step writes its
  rows in place, ``keep`` moves the accepted tree rows down, ``truncate`` only shortens the
  logical length. This keeps Python and allocation overhead small, which on a CPU decides
  whether speculation pays.
- On the CPU the encoder runs with oneDNN off (``_onednn_off``): oneDNN builds and caches a
  kernel for every new input length, and a live server encodes a new length at nearly every
  pass (docs/server.md).
- ``shallow(n)`` returns a self-draft sharing the model, the audio context and the LM head but
  running only the first ``n`` decoder layers: same vocabulary, no second encoder pass.
- Whisper's logit rules (``suppress_tokens``, ``begin_suppress_tokens`` at the first generated
  position, no timestamps in ``<|notimestamps|>`` mode) are applied inside ``extend``, so greedy
  AR and every speculative method see the same logits and stay token-identical.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speclive.asr.ct2 import load_ct2_whisper, read_ct2_config
from speclive.backends.base import Backend, BackendState, rows_to_move
from speclive.backends.cpu_linear import DualLinear, split_plan
from speclive.backends.hf import check_device
from speclive.errors import ConfigError
from speclive.models.resolve import resolve
from speclive.tokenizer import Tokenizer

# t(k)/t(1) prior for a small Whisper decoder on a CPU (weight reads dominate small k);
# replaced online by measurements
_WHISPER_PRIOR = {1: 1.0, 2: 1.05, 4: 1.4, 8: 1.75, 16: 2.5, 32: 3.6, 64: 5.3}
#: rows from which a projection multiplies ``W @ x.T`` instead of ``x @ W.T`` (``DualLinear``):
#: a one-row step runs against the transposed copy, a pass of two or more rows against the
#: row-major weight
_SPLIT = 2
#: on a GPU a small Whisper decoder's step is bound by kernel launches: a pass of a few dozen
#: tokens costs about one step (measurements replace it)
_WHISPER_GPU_PRIOR = {1: 1.0, 16: 1.05, 32: 1.1, 64: 1.2}


@dataclass
class WhisperSpecials:
    """Special token ids and the logit rules of one Whisper vocabulary."""

    sot: int
    eos: int
    no_timestamps: int
    #: decoder prompt (start of transcript, language, task, no timestamps)
    prompt: list[int]
    #: ids never generated
    suppress: list[int] = field(default_factory=list)
    #: ids not allowed as the first generated token (blank, end of text)
    suppress_begin: list[int] = field(default_factory=list)


class AudioContext:
    """Encoder output of the current segment, shared by backends on one model."""

    def __init__(self) -> None:
        self.cross_k: list[Any] = []
        self.cross_v: list[Any] = []
        self.encoder_out: Any = None
        self.epoch = 0
        self.encode_s = 0.0
        self.states: weakref.WeakSet[WhisperState] = weakref.WeakSet()

    @property
    def ready(self) -> bool:
        return bool(self.cross_k)


@dataclass(eq=False)
class WhisperState(BackendState):
    k: Any = None
    v: Any = None

    __hash__ = object.__hash__


class _Int8Linear:
    """``y = x @ W.T + b`` with W quantized to int8 per output channel (fbgemm dynamic linear).

    For drafts only: the target verifies every drafted token in float32, so a quantized draft
    changes acceptance, never the output. Decoding is bound by reading weights, and a quarter of
    the bytes makes a draft step several times cheaper than the float32 GEMM on a CPU.
    """

    __slots__ = ("packed",)

    def __init__(self, w: Any, b: Any, torch: Any):
        import warnings

        w = w.detach().float().contiguous()
        scale = (w.abs().amax(1) / 127.0).clamp_min(1e-12).double()
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # torch flags its quantized tensor API as deprecated
            warnings.simplefilter("ignore")
            qw = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(
                qw, None if b is None else b.detach().float().contiguous()
            )

    def __call__(self, x: Any) -> Any:
        import torch

        return torch.ops.quantized.linear_dynamic(x, self.packed, True)


class _PlainLinear:
    """``y = x @ W.T + b`` through torch's own kernel: off the CPU the layout tricks of
    ``DualLinear`` buy nothing (a GPU's GEMMs take any row count alike)."""

    __slots__ = ("w", "b")

    def __init__(self, w: Any, b: Any):
        self.w = w.detach().contiguous()
        self.b = None if b is None else b.detach().contiguous()

    def __call__(self, x: Any) -> Any:
        import torch

        return torch.nn.functional.linear(x, self.w, self.b)


def _linear(w: Any, b: Any, torch: Any, int8: bool) -> DualLinear | _Int8Linear | _PlainLinear:
    if int8:
        return _Int8Linear(w, b, torch)
    if w.device.type != "cpu":
        return _PlainLinear(w, b)
    return DualLinear(w, b, split_plan(_SPLIT), pad_block=None)


def int8_available() -> bool:
    """Whether torch has the fbgemm/x86 quantized engine ``_Int8Linear`` needs."""
    import torch

    return any(e in torch.backends.quantized.supported_engines for e in ("x86", "fbgemm"))


class _Layer:
    """Fused float32 (or int8, for drafts) weights of one decoder layer."""

    def __init__(self, layer: Any, torch: Any, int8: bool = False):
        sa, ca = layer.self_attn, layer.encoder_attn

        def b(lin: Any) -> Any:
            if lin.bias is not None:
                return lin.bias
            return torch.zeros(lin.out_features, dtype=lin.weight.dtype, device=lin.weight.device)

        with torch.no_grad():
            qkv_w = torch.cat([sa.q_proj.weight, sa.k_proj.weight, sa.v_proj.weight])
            qkv_b = torch.cat([b(sa.q_proj), b(sa.k_proj), b(sa.v_proj)])
            self.ckv_w = torch.cat([ca.k_proj.weight, ca.v_proj.weight]).contiguous()
            self.ckv_b = torch.cat([b(ca.k_proj), b(ca.v_proj)]).contiguous()
            self.qkv = _linear(qkv_w, qkv_b, torch, int8)
            self.o = _linear(sa.out_proj.weight, b(sa.out_proj), torch, int8)
            self.cq = _linear(ca.q_proj.weight, b(ca.q_proj), torch, int8)
            self.co = _linear(ca.out_proj.weight, b(ca.out_proj), torch, int8)
            self.fc1 = _linear(layer.fc1.weight, layer.fc1.bias, torch, int8)
            self.fc2 = _linear(layer.fc2.weight, layer.fc2.bias, torch, int8)
        self.ln1 = (layer.self_attn_layer_norm.weight, layer.self_attn_layer_norm.bias)
        self.ln2 = (layer.encoder_attn_layer_norm.weight, layer.encoder_attn_layer_norm.bias)
        self.ln3 = (layer.final_layer_norm.weight, layer.final_layer_norm.bias)
        self.eps = layer.self_attn_layer_norm.eps


#: held while a thread has torch's oneDNN switched off (the switch is process-wide)
_ONEDNN_SWITCH = threading.Lock()


@contextlib.contextmanager
def _onednn_off(torch: Any, device: Any) -> Iterator[None]:
    """torch's CPU operators without oneDNN while the block runs (elsewhere: no change).

    oneDNN builds a kernel for every input shape it meets and keeps it in a cache of 1,024.
    The trimmed encoder's input grows with the audio, so a live server meets a new length at
    nearly every pass, and the kernels of its convolutions and matrix products kept memory
    that grew for as long as the cache filled. torch's own kernels keep nothing per shape and
    are no slower on this encoder (docs/server.md). The switch is global to the process, so
    threads take turns with it."""
    if getattr(device, "type", device) != "cpu":
        yield
        return
    # the switch alone: torch.backends.mkldnn.flags() also sets TF32 and warns about it
    mkldnn = torch.backends.mkldnn
    with _ONEDNN_SWITCH:
        was = mkldnn.enabled
        mkldnn.enabled = False
        try:
            yield
        finally:
            mkldnn.enabled = was


class WhisperBackend(Backend):
    """A Whisper decoder behind the engine's Backend protocol (module docstring)."""

    kind = "whisper"

    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer,
        specials: WhisperSpecials,
        name: str = "whisper",
        n_layers: int | None = None,
        context: AudioContext | None = None,
        vocab_limit: int | None = None,
        int8: bool = False,
        audio_margin_s: float | None = None,
        _layers: list[_Layer] | None = None,
        _head: DualLinear | _Int8Linear | _PlainLinear | None = None,
    ):
        import torch

        self.torch = torch
        self.F = torch.nn.functional
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.specials = specials
        cfg = model.config
        dec = model.model.decoder
        self.vocab_size = int(cfg.vocab_size)
        self.n_ctx = int(cfg.max_target_positions)
        self.n_heads = int(cfg.decoder_attention_heads)
        self.d_model = int(cfg.d_model)
        self.head_dim = self.d_model // self.n_heads
        #: the torch device the model lives on (``load_whisper(device=...)``)
        self.device = next(model.parameters()).device
        self._check_int8(int8)
        self.int8 = int8
        total = len(dec.layers)
        self.n_layers = total if n_layers is None else int(n_layers)
        if not 1 <= self.n_layers <= total:
            raise ConfigError(f"n_layers must be in [1, {total}], got {n_layers}")
        if int8:  # own quantized copies of the layers it runs (a shallow draft: only those)
            _layers = [_Layer(layer, torch, int8=True) for layer in dec.layers[: self.n_layers]]
            _head = None
        self.all_layers = _layers or [_Layer(layer, torch) for layer in dec.layers]
        self.layers = self.all_layers[: self.n_layers]
        self.name = name if self.n_layers == total else f"{name}[:{self.n_layers}]"
        self.embed = dec.embed_tokens.weight
        self.pos = dec.embed_positions.weight
        self.ln_f = (dec.layer_norm.weight, dec.layer_norm.bias)
        self._set_head(model.proj_out.weight, vocab_limit, _head, int8)
        if int8:
            self.name += "/int8"
        self._set_audio_margin(audio_margin_s)
        self.context = context or AudioContext()
        self.prompt_len = len(specials.prompt)
        self._suppress = torch.tensor(sorted(set(specials.suppress)), dtype=torch.long, device=self.device)
        self._suppress_begin = torch.tensor(
            sorted(set(specials.suppress_begin)), dtype=torch.long, device=self.device
        )
        self._fe: Any = None
        super().__init__()

    def _check_int8(self, int8: bool) -> None:
        """Int8 drafts need the CPU and torch's quantized engine."""
        if int8 and self.device.type != "cpu":
            raise ConfigError(f"int8 drafts run on the CPU only (this model is on {self.device})")
        if int8 and not int8_available():
            raise ConfigError("int8 drafts need torch's x86/fbgemm quantized engine")

    def _set_head(
        self,
        head_w: Any,
        vocab_limit: int | None,
        shared: DualLinear | _Int8Linear | _PlainLinear | None,
        int8: bool,
    ) -> None:
        """The LM head: ``shared`` (a shallow draft's full-vocabulary head) or one built from
        ``head_w``, restricted to ``vocab_limit`` ids when given."""
        torch = self.torch
        # a draft may score only the ``vocab_limit`` most frequent BPE ids (low ids = early
        # merges) plus the special tokens: a much cheaper LM head, only draft quality changes
        self._head_ids: Any = None
        if vocab_limit is not None:
            if vocab_limit < 1:
                raise ConfigError(f"vocab_limit must be >= 1, got {vocab_limit}")
            ids = sorted(
                set(range(min(vocab_limit, self.vocab_size))) | set(range(self.specials.eos, self.vocab_size))
            )
            self._head_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
            head_w = head_w.index_select(0, self._head_ids)
            self.name += f"/v{vocab_limit}"
        if shared is not None and vocab_limit is None:
            self.head = shared
        else:
            with torch.no_grad():
                self.head = _linear(head_w, None, torch, int8)

    def _set_audio_margin(self, audio_margin_s: float | None) -> None:
        if audio_margin_s is not None and audio_margin_s < 0:
            raise ConfigError(f"audio_margin_s must be >= 0, got {audio_margin_s}")
        #: None: encode Whisper's full 30 s window (the model's trained input). A number
        #: (drafts only): encode only the audio plus this much padding, so the encoder and
        #: every decoder step's cross-attention run over those frames, not 1500
        self.audio_margin_s = audio_margin_s
        if audio_margin_s is not None:
            self.name += f"/ctx+{audio_margin_s:g}s"

    def default_cost_prior(self) -> dict[int, float]:
        return _WHISPER_PRIOR if self.device.type == "cpu" else _WHISPER_GPU_PRIOR

    # ---- construction ---------------------------------------------------------------
    def shallow(self, n_layers: int, vocab_limit: int | None = None, int8: bool = False) -> WhisperBackend:
        """A self-draft: the first ``n_layers`` decoder layers and the same (optionally
        vocabulary-limited, optionally int8) head, sharing this backend's audio context (no second
        encoder pass)."""
        return WhisperBackend(
            self.model,
            self.tokenizer,
            self.specials,
            name=self.name,
            n_layers=n_layers,
            context=self.context,
            vocab_limit=vocab_limit,
            int8=int8,
            _layers=self.all_layers,
            _head=self.head if self._head_ids is None else None,
        )

    @property
    def feature_extractor(self) -> Any:
        if self._fe is None:
            from transformers import WhisperFeatureExtractor

            self._fe = WhisperFeatureExtractor(feature_size=int(self.model.config.num_mel_bins))
        return self._fe

    # ---- audio ----------------------------------------------------------------------
    def set_audio(self, audio: np.ndarray) -> float:
        """Encode one segment (16 kHz mono, at most 30 s); returns the encoder seconds.

        Every state bound to this audio context is emptied: its tokens belonged to other audio.
        """
        torch = self.torch
        t0 = time.perf_counter()
        feats = self.feature_extractor(
            np.asarray(audio, dtype=np.float32), sampling_rate=16_000, return_tensors="pt"
        ).input_features
        with torch.inference_mode():
            enc = self._encode(feats.to(self.device, self.embed.dtype), len(audio))
            ctx = self.context
            ctx.encoder_out = enc
            ctx.cross_k, ctx.cross_v = [], []
            h, hd = self.n_heads, self.head_dim
            for layer in self.all_layers:
                kv = self.F.linear(enc, layer.ckv_w, layer.ckv_b)
                k, v = kv.split(self.d_model, dim=-1)
                # keys stored transposed [heads, head_dim, frames] and pre-scaled by 1/sqrt(head_dim):
                # a step's cross-attention is then two plain batched GEMMs over 1500 frames
                kt = k.reshape(-1, h, hd).permute(1, 2, 0) * (hd**-0.5)
                ctx.cross_k.append(kt.contiguous())
                ctx.cross_v.append(v.reshape(-1, h, hd).transpose(0, 1).contiguous())
        ctx.epoch += 1
        for st in list(ctx.states):
            st.tokens.clear()
            st.pending = st.pending_parents = None
        ctx.encode_s = time.perf_counter() - t0
        return ctx.encode_s

    @property
    def full_frames(self) -> int:
        """Encoder frames of Whisper's whole 30 s window."""
        return int(self.model.config.max_source_positions)

    def encoder_frames(self, n_samples: int) -> int:
        """Encoder frames this backend encodes for ``n_samples`` of 16 kHz audio."""
        full = self.full_frames
        if self.audio_margin_s is None:
            return full
        # 160 samples per mel frame, two mel frames per encoder frame (conv stride 2)
        need = int(np.ceil((n_samples + self.audio_margin_s * 16_000) / 320.0))
        return max(1, min(full, need))

    def _encode(self, feats: Any, n_samples: int) -> Any:
        """Encoder output ``[frames, d_model]``: transformers' encoder over the whole window,
        or ``encode_window`` when ``audio_margin_s`` trims it."""
        frames = self.encoder_frames(n_samples)
        with _onednn_off(self.torch, self.device):
            if frames == self.full_frames:
                return self.model.model.encoder(feats).last_hidden_state[0]
            return self.encode_window(feats, frames)

    def encode_window(self, feats: Any, frames: int) -> Any:
        """The encoder over the first ``2 * frames`` mel frames only (whisper.cpp's
        ``audio_ctx``): the same convolutions, the first ``frames`` positional embeddings and the
        same layers, which take any length (transformers' forward insists on 3000 mel frames)."""
        enc = self.model.model.encoder
        F = self.F
        x = F.gelu(enc.conv1(feats[..., : 2 * frames]))
        x = F.gelu(enc.conv2(x)).permute(0, 2, 1)
        x = x + enc.embed_positions.weight[: x.shape[1]]
        for layer in enc.layers:
            x = layer(x, None)
        return enc.layer_norm(x)[0]

    # ---- protocol -------------------------------------------------------------------
    def new_state(self) -> WhisperState:
        torch = self.torch
        shape = (len(self.all_layers), self.n_heads, self.n_ctx, self.head_dim)
        st = WhisperState(k=torch.zeros(shape, device=self.device), v=torch.zeros(shape, device=self.device))
        self.context.states.add(st)
        return st

    def _extend(
        self, state: BackendState, tokens: list[int], parents: list[int] | None, last_only: bool = False
    ) -> np.ndarray:
        torch, F = self.torch, self.F
        assert isinstance(state, WhisperState)
        if not self.context.ready:
            raise RuntimeError(f"{self.name}: call set_audio() before decoding")
        past = len(state.tokens)
        n = len(tokens)
        end = past + n
        dev = self.device
        ids = torch.tensor(tokens, dtype=torch.long, device=dev)
        mask = None
        if parents is None:
            pos_list = list(range(past, end))
            if n > 1:
                allowed = np.ones((n, end), dtype=bool)
                allowed[:, past:] = np.tril(np.ones((n, n), dtype=bool))
                mask = torch.from_numpy(allowed).to(dev)
        else:
            depth = [0] * n
            allowed = np.zeros((n, end), dtype=bool)
            allowed[:, :past] = True
            for i, p in enumerate(parents):
                if p >= 0:
                    depth[i] = depth[p] + 1
                    allowed[i, past:] = allowed[p, past:]
                allowed[i, past + i] = True
            pos_list = [past + d for d in depth]
            mask = torch.from_numpy(allowed).to(dev)
        h, hd = self.n_heads, self.head_dim
        with torch.inference_mode():
            x = self.embed[ids] + self.pos[torch.tensor(pos_list, dtype=torch.long, device=dev)]
            ck, cv = self.context.cross_k, self.context.cross_v
            for li, L in enumerate(self.layers):
                y = F.layer_norm(x, (self.d_model,), *L.ln1, L.eps)
                qkv = L.qkv(y).view(n, 3, h, hd).permute(1, 2, 0, 3)
                state.k[li, :, past:end] = qkv[1]
                state.v[li, :, past:end] = qkv[2]
                a = F.scaled_dot_product_attention(
                    qkv[0][None], state.k[li, None, :, :end], state.v[li, None, :, :end], attn_mask=mask
                )[0]
                x = x + L.o(a.transpose(0, 1).reshape(n, self.d_model))
                y = F.layer_norm(x, (self.d_model,), *L.ln2, L.eps)
                q = L.cq(y).view(n, h, hd).transpose(0, 1)
                a = torch.softmax(torch.bmm(q, ck[li]), dim=-1).bmm(cv[li])
                x = x + L.co(a.transpose(0, 1).reshape(n, self.d_model))
                y = F.layer_norm(x, (self.d_model,), *L.ln3, L.eps)
                x = x + L.fc2(F.gelu(L.fc1(y)))
            if last_only:
                x = x[-1:]
                pos_list = pos_list[-1:]
            x = F.layer_norm(x, (self.d_model,), *self.ln_f, self.layers[0].eps)
            logits = self.head(x)
            if self._head_ids is not None:
                full = torch.full((logits.shape[0], self.vocab_size), float("-inf"), device=dev)
                full[:, self._head_ids] = logits
                logits = full
            self._apply_rules(logits, pos_list)
        return logits.float().cpu().numpy()

    def _apply_rules(self, logits: Any, positions: list[int]) -> None:
        """Whisper's logit suppression (in place), identical for every decoding method."""
        ninf = float("-inf")
        if len(self._suppress):
            logits.index_fill_(1, self._suppress, ninf)
        first = self.prompt_len - 1  # the node at this position predicts the first output token
        if len(self._suppress_begin) and first in positions:
            rows = [i for i, p in enumerate(positions) if p == first]
            logits[rows] = logits[rows].index_fill(1, self._suppress_begin, ninf)
        ts = self.specials.no_timestamps + 1
        if self.specials.no_timestamps in self.specials.prompt and ts < logits.shape[1]:
            logits[:, ts:] = ninf

    def _compact(self, state: BackendState, keep_idx: list[int]) -> None:
        assert isinstance(state, WhisperState)
        base, rows = rows_to_move(keep_idx)
        if not rows:
            return
        idx = self.torch.tensor(rows, dtype=self.torch.long, device=self.device)
        m = len(rows)
        state.k[:, :, base : base + m] = state.k.index_select(2, idx)
        state.v[:, :, base : base + m] = state.v.index_select(2, idx)

    def _truncate(self, state: BackendState, n: int) -> None:
        pass  # rows past len(state.tokens) are dead and get overwritten by the next extend

    def fork(self, state: BackendState) -> WhisperState:
        assert isinstance(state, WhisperState)
        if state.pending is not None:
            raise RuntimeError("cannot fork a state with a pending tree extension")
        new = WhisperState(tokens=list(state.tokens), k=state.k.clone(), v=state.v.clone())
        self.context.states.add(new)
        return new

    def release(self, state: BackendState) -> None:
        assert isinstance(state, WhisperState)
        state.tokens.clear()
        state.pending = state.pending_parents = None

    # ---- reference ------------------------------------------------------------------
    def reference_logits(self, tokens: list[int]) -> np.ndarray:
        """Logits of a fresh full forward through transformers' own decoder (for checks)."""
        torch = self.torch
        if self.n_layers != len(self.all_layers):
            raise ConfigError("reference_logits is for the full model only")
        enc = self.context.encoder_out
        with torch.inference_mode():
            ids = torch.tensor([tokens], device=self.device)
            out = self.model(encoder_outputs=(enc[None],), decoder_input_ids=ids)
        with torch.inference_mode():
            logits = out.logits[0].float()
            self._apply_rules(logits, list(range(len(tokens))))
        return logits.cpu().numpy()


# ---- loading ----------------------------------------------------------------------------
def _specials_from_tokenizer(hf_tok: Any, vocab_size: int) -> WhisperSpecials:
    def tid(tok: str) -> int | None:
        i = hf_tok.convert_tokens_to_ids(tok)
        return i if isinstance(i, int) and i >= 0 and i != hf_tok.unk_token_id else None

    sot, eos, nots = tid("<|startoftranscript|>"), tid("<|endoftext|>"), tid("<|notimestamps|>")
    if sot is None or eos is None or nots is None:
        raise ConfigError("tokenizer lacks Whisper's special tokens (<|startoftranscript|> ...)")
    en, transcribe = tid("<|en|>"), tid("<|transcribe|>")
    multilingual = vocab_size >= 51865 and en is not None and transcribe is not None
    prompt = [sot, en, transcribe, nots] if multilingual else [sot, nots]  # type: ignore[list-item]
    return WhisperSpecials(sot=sot, eos=eos, no_timestamps=nots, prompt=prompt)


def load_whisper(
    spec: str | Path,
    name: str | None = None,
    threads: int | None = None,
    vocab_limit: int | None = None,
    int8: bool = False,
    audio_margin_s: float | None = None,
    device: str = "cpu",
) -> WhisperBackend:
    """A Whisper backend from a registry name, a CTranslate2 or HF folder, or a hub id.

    ``vocab_limit`` (drafts only) scores just the most frequent ids plus the special tokens;
    ``int8`` (drafts only) quantizes the decoder's projections and LM head to int8;
    ``audio_margin_s`` encodes just the audio plus that margin, not 30 s (drafts; a live target);
    ``device``: any torch device ("cpu", "cuda", "cuda:1"), checked before loading.
    """
    import torch

    check_device(device)

    if threads:
        torch.set_num_threads(threads)
    ref = resolve(str(spec))
    folder = ref.path
    is_ct2 = folder is not None and (folder / "model.bin").exists()
    if is_ct2:
        from transformers import PreTrainedTokenizerFast

        assert folder is not None
        hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
        ct2_cfg = read_ct2_config(folder)
        probe = _specials_from_tokenizer(hf_tok, len(hf_tok))
        model = load_ct2_whisper(folder, {"eos": probe.eos, "sot": probe.sot})
        specials = _specials_from_tokenizer(hf_tok, int(model.config.vocab_size))
        specials.suppress = [int(i) for i in ct2_cfg.get("suppress_ids", [])]
        specials.suppress_begin = [int(i) for i in ct2_cfg.get("suppress_ids_begin", [])]
    else:
        from transformers import AutoTokenizer, WhisperForConditionalGeneration

        src = str(folder) if folder is not None else str(ref.hub_id or spec)
        model = WhisperForConditionalGeneration.from_pretrained(src, dtype=torch.float32)
        hf_tok = AutoTokenizer.from_pretrained(src)
        specials = _specials_from_tokenizer(hf_tok, int(model.config.vocab_size))
        gen = getattr(model, "generation_config", None)
        specials.suppress = [int(i) for i in (getattr(gen, "suppress_tokens", None) or [])]
        specials.suppress_begin = [int(i) for i in (getattr(gen, "begin_suppress_tokens", None) or [])]
    return WhisperBackend(
        model.float().eval().to(device),
        Tokenizer(hf_tok),
        specials,
        name=name or ref.name,
        vocab_limit=vocab_limit,
        int8=int8,
        audio_margin_s=audio_margin_s,
    )
