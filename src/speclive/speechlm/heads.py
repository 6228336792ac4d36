"""Codebook heads with a shared projection: ``l(i) = W_H (h_t + e_i)``.

One language-model head ``W_H`` over the unified vocabulary plus S learnable stream embeddings
``e_i``. Stream 0 is the *primary* stream: its full-vocabulary logits drive text sampling and the
modality decision. The S-1 *auxiliary* streams only need their own sub-vocabulary, so they are
projected in one batched product against the matching slices of ``W_H``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from speclive.speechlm.vocab import VocabLayout


@dataclass
class HeadLogits:
    primary: torch.Tensor | None  #: [N, V] unmasked stream-0 logits over the whole vocabulary
    streams: torch.Tensor  #: [N, S, K] real-code logits of every stream


class CodebookHeads(nn.Module):
    def __init__(self, d_model: int, layout: VocabLayout) -> None:
        super().__init__()
        self.layout = layout
        self.proj = nn.Linear(d_model, layout.size, bias=False)  # W_H, shared
        self.stream_emb = nn.Parameter(torch.randn(layout.n_streams, d_model) * 0.02)  # e_i
        self._aux_cache: tuple[int, torch.Tensor] | None = None

    def _aux_weight(self) -> torch.Tensor:
        """``W_H`` rows of the auxiliary streams' codes as one ``[S-1, d, K]`` operand (cached per
        weight version: it is a copy)."""
        w = self.proj.weight
        if self._aux_cache is None or self._aux_cache[0] != w._version:
            lay = self.layout
            s, k = lay.n_streams, lay.codebook_size
            with torch.inference_mode(False), torch.no_grad():  # a plain tensor, usable anywhere
                aux = w[lay.text_size :].view(s, k + 1, -1)[1:, :k].transpose(1, 2).contiguous()
            self._aux_cache = (w._version, aux)
        return self._aux_cache[1]

    def forward(self, h: torch.Tensor) -> HeadLogits:
        lay = self.layout
        primary = self.proj(h + self.stream_emb[0])
        aux = torch.bmm((h[None, :, :] + self.stream_emb[1:, None, :]), self._aux_weight()).transpose(0, 1)
        streams = torch.cat([lay.audio_view(primary)[:, :1], aux], 1)
        return HeadLogits(primary, streams)
