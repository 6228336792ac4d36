"""Codec decoders: audio codes ``[S, T]`` -> waveform.

``Codec`` is the protocol the engine calls at completion. ``RandomRVQDecoder`` is a small
randomly-initialised residual-VQ decoder (sum of per-codebook embeddings, then transposed
convolutions up to the sample rate) for tests and demos; ``HFCodec`` wraps transformers'
EnCodec or DAC when real weights are available (a local folder or a cached hub id).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from speclive.errors import BackendUnavailableError


@runtime_checkable
class Codec(Protocol):
    sample_rate: int
    n_codebooks: int

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes[S, T]`` (long) -> mono waveform ``[n_samples]`` in [-1, 1]."""
        ...


class RandomRVQDecoder(nn.Module):
    """Random RVQ decoder: frame rate ``sample_rate / prod(strides)``; deterministic from ``seed``."""

    def __init__(
        self,
        n_codebooks: int = 8,
        codebook_size: int = 256,
        dim: int = 64,
        strides: tuple[int, ...] = (8, 5, 4, 2),
        sample_rate: int = 16000,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.n_codebooks, self.codebook_size, self.sample_rate = n_codebooks, codebook_size, sample_rate
        self.hop = math.prod(strides)
        gen = torch.Generator().manual_seed(seed)
        self.codebooks = nn.Parameter(
            torch.randn(n_codebooks, codebook_size, dim, generator=gen)
            / (1 + torch.arange(n_codebooks))[:, None, None]
        )
        ups, ch = [], dim
        for st in strides:
            conv = nn.ConvTranspose1d(ch, max(ch // 2, 8), kernel_size=2 * st, stride=st, padding=st // 2)
            ups += [conv, nn.ELU()]
            ch = max(ch // 2, 8)
        ups.append(nn.Conv1d(ch, 1, kernel_size=7, padding=3))
        self.net = nn.Sequential(*ups)
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (0.5 / math.sqrt(max(1, p[0].numel()))))
        self.eval()

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.dim() != 2 or codes.shape[0] != self.n_codebooks:
            raise ValueError(f"expected codes [{self.n_codebooks}, T], got {list(codes.shape)}")
        idx = codes.long().clamp(0, self.codebook_size - 1)
        latent = sum(self.codebooks[i][idx[i]] for i in range(self.n_codebooks))  # [T, dim]
        wave = self.net(latent.T[None])[0, 0]
        wave = wave[: codes.shape[1] * self.hop]
        return torch.tanh(wave / (wave.abs().max() + 1e-6) * 2) * 0.9


class HFCodec:
    """EnCodec / DAC from transformers; ``decode`` takes the ``[S, T]`` grid of one request."""

    def __init__(self, model) -> None:
        self.model = model.eval()
        cfg = model.config
        self.sample_rate = int(cfg.sampling_rate)
        self.n_codebooks = int(getattr(cfg, "n_codebooks", 0) or getattr(cfg, "num_quantizers", 0) or 0)
        self.codebook_size = int(cfg.codebook_size)
        self.kind = cfg.model_type

    @classmethod
    def load(cls, name_or_path: str | Path) -> HFCodec:
        """Load ``facebook/encodec_24khz``-style or ``descript/dac_16khz``-style weights (local or cached)."""
        try:
            from transformers import AutoConfig, DacModel, EncodecModel
        except ImportError as e:  # pragma: no cover
            raise BackendUnavailableError("transformers is needed for HF codecs") from e
        cfg = AutoConfig.from_pretrained(name_or_path)
        klass = {"encodec": EncodecModel, "dac": DacModel}.get(cfg.model_type)
        if klass is None:
            raise ValueError(f"{name_or_path}: unsupported codec type {cfg.model_type!r} (encodec, dac)")
        return cls(klass.from_pretrained(name_or_path))

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        codes = codes.long()
        if self.kind == "encodec":
            out = self.model.decode(codes[None, None], [None]).audio_values
        else:
            out = self.model.decode(audio_codes=codes[None]).audio_values
        return out.reshape(-1)


def write_wav(path: str | Path, wave: torch.Tensor, sample_rate: int) -> Path:
    """16-bit PCM mono WAV with the standard library."""
    import wave as wavmod

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pcm = (wave.detach().float().clamp(-1, 1) * 32767).round().to(torch.int16).numpy().tobytes()
    with wavmod.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes(pcm)
    return path
