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

    def forward(self, h: torch.Tensor) -> HeadLogits:
        lay = self.layout
        primary = self.proj(h + self.stream_emb[0])
        s, k = lay.n_streams, lay.codebook_size
        w_audio = self.proj.weight[lay.text_size :].view(s, k + 1, -1)[:, :k]  # [S, K, d] view
        aux = torch.einsum("nsd,skd->nsk", h[:, None, :] + self.stream_emb[1:], w_audio[1:])
        streams = torch.cat([lay.audio_view(primary)[:, :1], aux], 1)
        return HeadLogits(primary, streams)
