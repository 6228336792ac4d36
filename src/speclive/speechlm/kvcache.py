"""Paged KV cache in plain torch tensors: a block allocator, per-sequence block tables, and the
attention call that writes new keys/values into their slots and gathers each sequence's context.

Storage per layer is ``[n_blocks * block_size, 2 (k, v), heads, head_dim]``; a sequence owns a list of blocks
(its block table) and its token ``j`` lives in slot ``table[j // B] * B + j % B``. One batched
attention call serves every sequence of a step: queries are padded to the longest chunk, contexts
to the longest sequence, and a boolean mask keeps each query to its own causal prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


class OutOfBlocksError(RuntimeError):
    """The pool has fewer free blocks than a sequence needs (the scheduler preempts or waits)."""


class BlockAllocator:
    """Free-list allocator of fixed-size KV blocks."""

    def __init__(self, n_blocks: int) -> None:
        self.n_blocks = n_blocks
        self._free = list(range(n_blocks - 1, -1, -1))

    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def n_used(self) -> int:
        return self.n_blocks - len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfBlocksError(f"need {n} KV blocks, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


@dataclass
class SeqCache:
    """The KV state of one sequence: its block table and how many tokens are stored."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0


class PagedKVCache:
    """Block pool for all layers plus the allocator that hands blocks to sequences."""

    def __init__(
        self, n_layers: int, n_heads: int, head_dim: int, n_blocks: int, block_size: int = 16
    ) -> None:
        self.block_size = block_size
        self.allocator = BlockAllocator(n_blocks)
        # keys and values side by side, so one index op writes (and one gathers) both
        self.kv = torch.zeros((n_layers, n_blocks * block_size, 2, n_heads, head_dim))

    def blocks_needed(self, seq: SeqCache, new_length: int) -> int:
        return max(0, -(-new_length // self.block_size) - len(seq.blocks))

    def reserve(self, seq: SeqCache, new_length: int) -> None:
        """Give ``seq`` enough blocks to hold ``new_length`` tokens."""
        need = self.blocks_needed(seq, new_length)
        if need:
            seq.blocks.extend(self.allocator.allocate(need))

    def release(self, seq: SeqCache) -> None:
        self.allocator.free(seq.blocks)
        seq.blocks = []
        seq.length = 0

    def slots(self, seq: SeqCache, start: int, stop: int) -> torch.Tensor:
        pos = torch.arange(start, stop)
        table = torch.tensor(seq.blocks, dtype=torch.long)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def batch(self, seqs: list[SeqCache], n_new: list[int]) -> PagedAttention:
        """Attention for one step in which ``seqs[b]`` appends ``n_new[b]`` tokens (blocks reserved)."""
        bs = self.block_size
        new = torch.tensor(n_new)
        past = torch.tensor([s.length for s in seqs])
        total = past + new
        q_max, l_max = int(new.max()), int(total.max())
        n_tab = max(len(s.blocks) for s in seqs)
        table = torch.tensor([s.blocks + [0] * (n_tab - len(s.blocks)) for s in seqs], dtype=torch.long)
        key_pos = torch.arange(l_max)
        gather = table[:, key_pos // bs] * bs + key_pos % bs  # [B, L]; past the end: masked
        q_pos = past[:, None] + torch.arange(q_max)[None, :]  # absolute position of each query
        q_valid = torch.arange(q_max)[None, :] < new[:, None]
        write_slots = gather.gather(1, q_pos.clamp_max(l_max - 1))[q_valid]
        write_rows = torch.arange(len(seqs) * q_max).view(len(seqs), q_max)[q_valid]
        mask = (key_pos[None, None, :] <= q_pos[:, :, None]) & (key_pos[None, None, :] < total[:, None, None])
        for s, n in zip(seqs, n_new, strict=True):
            s.length += n
        return PagedAttention(self, gather, write_slots, write_rows, mask[:, None], q_pos)


@dataclass
class PagedAttention:
    """The per-step attention context; ``__call__(layer, q, k, v)`` with ``[B, Q, H, D]`` tensors."""

    cache: PagedKVCache
    gather: torch.Tensor  #: [B, L] slot of every context token (0 past the end, masked)
    write_slots: torch.Tensor  #: [N] slots of the new tokens
    write_rows: torch.Tensor  #: [N] their rows in the flattened [B * Q] query batch
    mask: torch.Tensor  #: [B, 1, Q, L] True = may attend
    positions: torch.Tensor  #: [B, Q] absolute positions of the queries

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, n_q, h, d = k.shape
        pool = self.cache.kv[layer]
        new = torch.stack([k, v], 2).reshape(b * n_q, 2, h, d).index_select(0, self.write_rows)
        pool.index_copy_(0, self.write_slots, new)
        ctx = pool.index_select(0, self.gather.view(-1)).view(*self.gather.shape, 2, h, d)  # [B, L, 2, H, D]
        keys, vals = ctx[:, :, 0].transpose(1, 2), ctx[:, :, 1].transpose(1, 2)  # [B, H, L, D]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=self.mask)
        return out.transpose(1, 2)


class ContiguousAttention:
    """A plain growing K/V per layer for one sequence: the sequential reference's cache."""

    def __init__(self, n_layers: int) -> None:
        self.k: list[torch.Tensor | None] = [None] * n_layers
        self.v: list[torch.Tensor | None] = [None] * n_layers
        self.length = 0
        self.positions = torch.zeros((1, 0), dtype=torch.long)

    def advance(self, n: int) -> ContiguousAttention:
        """Prepare for ``n`` new tokens of the single sequence (batch 1)."""
        self.positions = torch.arange(self.length, self.length + n)[None, :]
        self.length += n
        return self

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        prev_k, prev_v = self.k[layer], self.v[layer]
        self.k[layer] = k if prev_k is None else torch.cat([prev_k, k], 1)
        self.v[layer] = v if prev_v is None else torch.cat([prev_v, v], 1)
        keys, vals = self.k[layer].transpose(1, 2), self.v[layer].transpose(1, 2)
        n_new, total = q.shape[1], keys.shape[2]
        mask = torch.ones((n_new, total), dtype=torch.bool).tril(total - n_new)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=mask)
        return out.transpose(1, 2)
