"""Delay-pattern interleaving of an S x T codebook grid (MusicGen-style, stream i offset by i steps).

Frame ``f`` of stream ``i`` is emitted at step ``f + i``, so ``T`` frames take ``T + S - 1`` steps; the
positions a stream has nothing to say (before its first frame, after its last) hold that stream's
pad code. ``interleave`` builds the step rows, ``deinterleave`` recovers the grid and checks the pads.
"""

from __future__ import annotations

import torch


def n_steps(n_frames: int, n_streams: int) -> int:
    """Rows a grid of ``n_frames`` frames occupies once delayed."""
    return n_frames + n_streams - 1 if n_frames > 0 else 0


def stream_active(step: int, stream: int, n_frames: int | None) -> bool:
    """Does ``stream`` carry a real code at ``step``? ``n_frames=None``: the end is not known yet."""
    frame = step - stream
    return frame >= 0 and (n_frames is None or frame < n_frames)


def interleave(codes: torch.Tensor, pad: int | torch.Tensor) -> torch.Tensor:
    """``codes[S, T]`` -> delayed rows ``[T + S - 1, S]``; ``pad`` is one id or one id per stream."""
    n_streams, n_frames = codes.shape
    pads = torch.as_tensor(pad, dtype=codes.dtype).expand(n_streams)
    rows = pads.repeat(n_steps(n_frames, n_streams), 1)
    for i in range(n_streams):
        rows[i : i + n_frames, i] = codes[i]
    return rows


def deinterleave(rows: torch.Tensor, pad: int | torch.Tensor | None = None) -> torch.Tensor:
    """Delayed rows ``[T + S - 1, S]`` -> ``codes[S, T]``.

    With ``pad`` given, every position outside the delay window must hold the pad code; a grid that
    was not drained (too few rows) or has codes where pads belong raises ``ValueError``.
    """
    n_rows, n_streams = rows.shape
    n_frames = n_rows - n_streams + 1
    if n_rows == 0:
        return rows.new_zeros((n_streams, 0))
    if n_frames < 1:
        raise ValueError(f"{n_rows} delayed rows cannot hold a grid of {n_streams} streams (drain missing?)")
    codes = torch.stack([rows[i : i + n_frames, i] for i in range(n_streams)])
    if pad is not None:
        pads = torch.as_tensor(pad, dtype=rows.dtype).expand(n_streams)
        expect = interleave(codes, pads)
        if not torch.equal(expect, rows):
            bad = (expect != rows).nonzero()[0].tolist()
            raise ValueError(f"delay pattern broken at step {bad[0]}, stream {bad[1]}: expected a pad code")
    return codes
