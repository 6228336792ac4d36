"""Batched sampling with per-request randomness.

Every request owns a ``torch.Generator`` and draws a fixed number of uniforms per step, whatever
the batch looks like; sampling is then inverse-CDF on the batched probabilities. So a request's
tokens do not depend on which other requests share its steps: the batched engine and a sequential
loop with the same seed draw the same tokens from the same logits.
"""

from __future__ import annotations

import torch


def draw_uniforms(gen: torch.Generator, n: int) -> torch.Tensor:
    """The ``n`` uniforms one request consumes per step (always ``n``, used or not)."""
    return torch.rand(n, generator=gen, dtype=torch.float64)


def sample(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """One id per row of ``logits[N, V]``.

    ``temperature[N]``: 0 = greedy (argmax). ``top_k[N]``: keep the k largest (0 = all).
    ``uniforms[N]`` in [0, 1) pick the token by inverse CDF of the tempered distribution.
    """
    logits = logits.float()
    greedy = logits.argmax(-1)
    hot = temperature > 0
    if not bool(hot.any()):
        return greedy
    n_vocab = logits.shape[-1]
    x = logits / temperature.clamp_min(1e-6).unsqueeze(-1).to(logits.dtype)
    k = torch.where(top_k > 0, top_k.clamp_max(n_vocab), torch.full_like(top_k, n_vocab))
    if bool((k < n_vocab).any()):
        kmax = int(k.max())
        top = torch.topk(x, kmax, dim=-1).values
        kth = top.gather(-1, (k - 1).unsqueeze(-1))
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x.double(), dim=-1)
    cdf = probs.cumsum(-1)
    u = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)
    drawn = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_max(n_vocab - 1)
    return torch.where(hot, drawn, greedy)
