"""The unified vocabulary: one id space split into a text region and S audio sub-vocabularies.

Layout (``V = text_size + S * (K + 1)``)::

    [0, text_size)                          text: 256 byte tokens + specials (BOS, EOS, bridges, NULL)
    text_size + i*(K+1) + c, c in [0, K)    code c of audio stream i
    text_size + i*(K+1) + K                 the pad code of stream i (delay positions; never sampled)

The regions are disjoint, so the active modality is read off the argmax of the unmasked primary
distribution: which region holds the largest logit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from speclive.speechlm.phases import Region

N_BYTES = 256
BOS, EOS, AUDIO_START, SPEAKER, NULL = range(N_BYTES, N_BYTES + 5)
#: deterministic bridging tokens of the transition phase
BRIDGE = (AUDIO_START, SPEAKER)
TEXT_SIZE = N_BYTES + 8  # specials, rounded up


@dataclass(frozen=True)
class VocabLayout:
    n_streams: int  #: S
    codebook_size: int  #: K real codes per stream (the pad is code K)
    text_size: int = TEXT_SIZE

    @property
    def size(self) -> int:
        return self.text_size + self.n_streams * (self.codebook_size + 1)

    def audio_id(self, stream: int | torch.Tensor, code: int | torch.Tensor):
        return self.text_size + stream * (self.codebook_size + 1) + code

    def pad_id(self, stream: int | torch.Tensor):
        return self.audio_id(stream, self.codebook_size)

    def pad_ids(self) -> torch.Tensor:
        return self.pad_id(torch.arange(self.n_streams))

    def region_of(self, token: int) -> Region:
        return Region.TEXT if token < self.text_size else Region.AUDIO

    def audio_view(self, logits: torch.Tensor) -> torch.Tensor:
        """``[N, V]`` -> ``[N, S, K]``: the real-code logits of every stream (a view, pads dropped)."""
        n = logits.shape[0]
        return logits[:, self.text_size :].view(n, self.n_streams, self.codebook_size + 1)[..., :-1]

    def argmax_regions(self, logits: torch.Tensor) -> list[Region]:
        """Per row: the region holding the largest logit (text vs any real audio code)."""
        text_max = logits[:, : self.text_size].amax(-1)
        audio_max = self.audio_view(logits).amax((-1, -2))
        pairs = zip(text_max.tolist(), audio_max.tolist(), strict=True)
        return [Region.AUDIO if a > t else Region.TEXT for t, a in pairs]

    def text_mask(self) -> torch.Tensor:
        """Ids the text phase may sample: bytes and EOS (bridges are forced, never sampled)."""
        return _text_mask(self.size)


@functools.lru_cache(maxsize=8)
def _text_mask(size: int) -> torch.Tensor:
    m = torch.zeros(size, dtype=torch.bool)
    m[:N_BYTES] = True
    m[EOS] = True
    return m


def encode_text(text: str) -> list[int]:
    """Byte tokenizer of the tiny models: BOS + UTF-8 bytes."""
    return [BOS, *text.encode("utf-8")]


def decode_text(tokens: list[int]) -> str:
    return bytes(t for t in tokens if t < N_BYTES).decode("utf-8", errors="replace")
