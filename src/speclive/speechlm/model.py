"""The delay-pattern speech LM (random-initialised, real architecture) and the model protocol the
engine serves.

``SpeechLM``: a pre-norm decoder-only transformer (RMSNorm, rotary positions, GELU MLP) over the
unified vocabulary of :mod:`speclive.speechlm.vocab`. An input *row* holds S ids (-1 = empty): a
text step fills slot 0, an audio step holds the S tokens just emitted, and the input embedding is
the sum of their embeddings. Output goes through :class:`~speclive.speechlm.heads.CodebookHeads`.

Any model with the same small surface (``embed``, ``backbone``, ``heads``, row ids) can be served;
:mod:`speclive.speechlm.musicgen` adapts transformers' MusicGen to it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from speclive.speechlm.heads import CodebookHeads, HeadLogits
from speclive.speechlm.vocab import BOS, BRIDGE, EOS, NULL, VocabLayout

AttnFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class SpeechModel(Protocol):
    """What the engine needs from a model (``SpeechLM``, ``MusicgenAdapter``)."""

    has_text: bool  #: a text region exists (then ``layout`` is a ``VocabLayout``)
    n_streams: int  #: S
    max_positions: int  #: context window in rows
    kv_shape: tuple[int, int, int]  #: (layers, heads, head_dim)
    eos: int | None
    bridge: tuple[int, ...]

    def null_prompt(self) -> list[list[int]]: ...  # the CFG companion's prompt

    def text_rows(self, tokens: list[int]) -> list[list[int]]: ...

    def audio_row(self, codes: list[int | None]) -> list[int]: ...  # None = pad (delay)

    def embed(self, rows: torch.Tensor) -> torch.Tensor: ...  # [B, Q, S] ids -> [B, Q, d]

    def backbone(
        self, x: torch.Tensor, attn: AttnFn, positions: torch.Tensor, cond: Any = None
    ) -> torch.Tensor: ...

    def heads(self, h: torch.Tensor) -> HeadLogits: ...  # [N, d] -> primary + [N, S, K] streams


@dataclass(frozen=True)
class SpeechLMConfig:
    """Shape of a speech LM. Defaults: the benchmark's tiny model (a real transformer, d=256)."""

    n_streams: int = 8  #: S codebook streams (Bagpiper-like 8; OpusLM uses 9)
    codebook_size: int = 256  #: K codes per stream
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    max_positions: int = 2048  #: context window in rows
    rope_theta: float = 10000.0
    seed: int = 0  #: random initialisation seed

    @classmethod
    def preset(cls, name: str) -> SpeechLMConfig:
        """``tiny`` (tests), ``bench`` (the default), ``bagpiper``/``opuslm`` (paper-like stream layout,
        d=1024 x 8 layers, still random)."""
        presets = {
            "tiny": cls(n_streams=4, codebook_size=32, d_model=64, n_layers=2, n_heads=2, max_positions=512),
            "bench": cls(),
            "bagpiper": cls(n_streams=8, codebook_size=1024, d_model=1024, n_layers=8, n_heads=16),
            "opuslm": cls(n_streams=9, codebook_size=1024, d_model=1024, n_layers=8, n_heads=16),
        }
        if name not in presets:
            raise ValueError(f"unknown speech LM preset {name!r}; known: {', '.join(presets)}")
        return presets[name]


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


@functools.lru_cache(maxsize=8)
def _freqs(half: int, theta: float) -> torch.Tensor:
    return theta ** (-torch.arange(half, dtype=torch.float32) / half)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of ``x[B, Q, H, D]`` at ``positions[B, Q]`` (half-split convention)."""
    half = x.shape[-1] // 2
    freq = _freqs(half, theta)
    ang = positions[..., None].float() * freq  # [B, Q, half]
    cos, sin = ang.cos()[:, :, None], ang.sin()[:, :, None]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


class Block(nn.Module):
    def __init__(self, cfg: SpeechLMConfig, idx: int) -> None:
        super().__init__()
        self.idx, self.cfg = idx, cfg
        d = cfg.d_model
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, cfg.mlp_ratio * d, bias=False)
        self.down = nn.Linear(cfg.mlp_ratio * d, d, bias=False)

    def forward(self, x: torch.Tensor, attn: AttnFn, positions: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.cfg.n_heads
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, h, d // h).unbind(2)
        q, k = rotate(q, positions, self.cfg.rope_theta), rotate(k, positions, self.cfg.rope_theta)
        x = x + self.out(attn(self.idx, q, k, v).reshape(b, n, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class SpeechLM(nn.Module):
    """Delay-pattern speech LM: summed row embeddings -> transformer -> S codebook heads."""

    has_text = True

    def __init__(self, cfg: SpeechLMConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or SpeechLMConfig()
        if cfg.d_model % cfg.n_heads:
            raise ValueError("d_model must be a multiple of n_heads")
        self.cfg = cfg
        self.layout = VocabLayout(cfg.n_streams, cfg.codebook_size)
        gen = torch.Generator().manual_seed(cfg.seed)
        self.embedding = nn.Embedding(self.layout.size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.head = CodebookHeads(cfg.d_model, self.layout)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() >= 2:
                    p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            self.embedding.weight.mul_(0.5)
            self.head.stream_emb.copy_(torch.randn(self.head.stream_emb.shape, generator=gen))
        self.eval()

    # ---- the surface the engine uses
    @property
    def n_streams(self) -> int:
        return self.cfg.n_streams

    @property
    def codebook_size(self) -> int:
        return self.cfg.codebook_size

    @property
    def kv_shape(self) -> tuple[int, int, int]:
        """(layers, heads, head_dim) of the KV cache."""
        return self.cfg.n_layers, self.cfg.n_heads, self.cfg.d_model // self.cfg.n_heads

    @property
    def max_positions(self) -> int:
        return self.cfg.max_positions

    bos, eos, bridge = BOS, EOS, BRIDGE

    def null_prompt(self) -> list[list[int]]:
        """The CFG companion's prompt: BOS + NULL, no condition."""
        return self.text_rows([BOS, NULL])

    def text_rows(self, tokens: list[int]) -> list[list[int]]:
        pad = [-1] * (self.n_streams - 1)
        return [[t, *pad] for t in tokens]

    def audio_row(self, codes: list[int | None]) -> list[int]:
        """Input row of one audio step; ``None`` = that stream is padded (delay)."""
        lay = self.layout
        return [lay.pad_id(i) if c is None else lay.audio_id(i, c) for i, c in enumerate(codes)]

    def embed(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows[B, Q, S]`` of ids (-1 empty) -> summed embeddings ``[B, Q, d]``."""
        present = (rows >= 0).unsqueeze(-1)
        return (self.embedding(rows.clamp_min(0)) * present).sum(-2)

    def backbone(
        self, x: torch.Tensor, attn: AttnFn, positions: torch.Tensor, cond: torch.Tensor | None = None
    ) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x, attn, positions)
        return self.norm(x)

    def heads(self, h: torch.Tensor) -> HeadLogits:
        return self.head(h)
