"""Classifier-free guidance by paired co-scheduling: the merge rule and the request parameters.

A request with guidance scale ``w > 1`` gets a hidden *companion* sequence that starts from the
model's null prompt (and null condition). The engine schedules, preempts and finishes the pair as
one unit, runs both in the same batched forward and splits the pair's token budget equally. In the
audio phase each stream's logits are merged, ``w * l_cond + (1 - w) * l_uncond``; text, bridging and
modality decisions use the conditional logits only. The sampled row is appended to both sequences
and only the main request's output is returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speclive.errors import ConfigError
from speclive.speechlm.phases import MODES


def merge(cond: torch.Tensor, uncond: torch.Tensor, w: float | torch.Tensor) -> torch.Tensor:
    """Per-stream CFG merge of logits: ``w * cond + (1 - w) * uncond``."""
    if isinstance(w, torch.Tensor):
        w = w.view(-1, *([1] * (cond.dim() - 1))).to(cond.dtype)
    return w * cond + (1 - w) * uncond


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings (defaults in brackets)."""

    mode: str = "text_audio"  #: "text" or "text_audio" ["text_audio"]
    temperature: float = 0.8  #: text temperature, 0 = greedy [0.8]
    top_k: int = 0  #: text top-k, 0 = off [0]
    audio_temperature: float = 1.0  #: audio-code temperature, 0 = greedy [1.0]
    audio_top_k: int = 50  #: audio top-k [50]
    cfg: float | None = None  #: guidance scale w; None or 1 = off, > 1 adds a companion [None]
    max_text_tokens: int = 32  #: text tokens before audio (or the end in text mode) [32]
    min_text_tokens: int = 0  #: text tokens before the model may switch to audio [0]
    max_audio_frames: int = 50  #: audio frames at most [50]
    min_audio_frames: int = 1  #: frames before the model may stop the audio [1]
    seed: int = 0  #: per-request random stream [0]

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode {self.mode!r}; use one of: {', '.join(MODES)}")
        if self.cfg is not None and self.cfg <= 0:
            raise ConfigError(f"cfg (guidance scale) must be > 0, got {self.cfg}; use 1 or omit it for none")
        if self.cfg is not None and self.cfg < 1:
            raise ConfigError(f"cfg must be >= 1 (1 = no guidance), got {self.cfg}")
        if self.temperature < 0 or self.audio_temperature < 0:
            raise ConfigError("temperatures must be >= 0")
        if self.top_k < 0 or self.audio_top_k < 0:
            raise ConfigError("top-k must be >= 0")
        if self.max_text_tokens < 0 or self.max_audio_frames < 1 or self.min_audio_frames < 0:
            raise ConfigError("max_text_tokens >= 0, max_audio_frames >= 1, min_audio_frames >= 0 required")
        if self.min_text_tokens < 0:
            raise ConfigError("min_text_tokens must be >= 0")

    @property
    def guided(self) -> bool:
        """A companion runs beside this request: ``cfg > 1`` and audio may be generated (guidance only
        touches audio logits, so a text-only request would pay for a companion it never uses)."""
        return self.cfg is not None and self.cfg > 1 and self.mode == "text_audio"
