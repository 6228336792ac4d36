"""Iteration-level scheduler: which sequences run this step and how many tokens each computes.

A *request* is the scheduling unit: its main sequence plus, with CFG, its hidden companion. Each
step the running requests go first (in admission order), then waiting ones are admitted while the
step's token budget, the sequence cap and the KV pool allow. A request's share of the budget is
split equally between its members; a member computes ``min(pending, share)`` tokens (a decode step
is 1 token, a long prompt is prefilled in chunks). When the pool runs dry the newest running request
is preempted as a whole (both members' blocks freed; its rows are recomputed when re-admitted).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from speclive.speechlm.guidance import SamplingParams
from speclive.speechlm.kvcache import PagedKVCache, SeqCache
from speclive.speechlm.step import Slot


@dataclass(frozen=True)
class SchedulerConfig:
    """Capacity knobs of the engine (defaults in brackets)."""

    max_num_seqs: int = 64  #: running sequences at most, companions included [64]
    token_budget: int = 1024  #: tokens computed per step, all sequences together [1024]
    block_size: int = 16  #: tokens per KV block [16]
    n_blocks: int = 1024  #: KV blocks in the pool (blocks x block_size x layers x 2 x d floats) [1024]

    def validate(self) -> None:
        if self.max_num_seqs < 2 or self.token_budget < 2 or self.block_size < 1 or self.n_blocks < 1:
            raise ValueError("max_num_seqs >= 2, token_budget >= 2, block_size >= 1, n_blocks >= 1 required")


@dataclass
class Sequence:
    """One KV-cached token stream: its input rows and how many of them are in the cache."""

    rows: list[list[int]]
    n_prompt: int
    cond: torch.Tensor | None = None  #: per-sequence conditioning (e.g. MusicGen text states)
    cache: SeqCache = field(default_factory=SeqCache)
    last_hidden: torch.Tensor | None = None  #: hidden state of the newest cached row

    @property
    def pending(self) -> int:
        return len(self.rows) - self.cache.length


@dataclass
class Request:
    request_id: str
    params: SamplingParams
    slot: Slot
    main: Sequence
    companion: Sequence | None = None
    text: list[int] = field(default_factory=list)
    audio_rows: list[list[int | None]] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  #: sampled-from logits (record_logits)
    n_preempted: int = 0

    @property
    def members(self) -> list[Sequence]:
        return [self.main] if self.companion is None else [self.main, self.companion]


@dataclass
class Work:
    """One request's part of a step."""

    request: Request
    chunks: list[tuple[Sequence, int]]  #: (sequence, tokens to compute), n > 0
    samples: bool  #: every member is fully cached after this step -> sample


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, cache: PagedKVCache) -> None:
        cfg.validate()
        self.cfg, self.cache = cfg, cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def n_running_seqs(self) -> int:
        return sum(len(r.members) for r in self.running)

    def _chunks(self, req: Request, budget: int) -> list[tuple[Sequence, int]] | None:
        share = budget // len(req.members)
        if share < 1:
            return None
        return [(s, min(s.pending, share)) for s in req.members if s.pending > 0]

    def _reserve(self, chunks: list[tuple[Sequence, int]]) -> bool:
        need = sum(self.cache.blocks_needed(s.cache, s.cache.length + n) for s, n in chunks)
        if need > self.cache.allocator.n_free:
            return False
        for s, n in chunks:
            self.cache.reserve(s.cache, s.cache.length + n)
        return True

    def free(self, req: Request) -> None:
        """Release every member's blocks (finish, cancel, preempt: always the pair together)."""
        for s in req.members:
            self.cache.release(s.cache)

    def preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.free(req)
        req.n_preempted += 1
        self.waiting.appendleft(req)

    def remove(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.free(req)

    def _work(self, req: Request, chunks: list[tuple[Sequence, int]]) -> Work:
        counts = {id(s): n for s, n in chunks}
        samples = all(s.pending == counts.get(id(s), 0) for s in req.members)
        return Work(req, chunks, samples)

    def schedule(self) -> list[Work]:
        budget = self.cfg.token_budget
        work: list[Work] = []
        i = 0
        while i < len(self.running):
            req = self.running[i]
            chunks = self._chunks(req, budget)
            if not chunks:
                i += 1
                continue
            if not self._reserve(chunks):
                victim = self.running[-1]
                self.preempt(victim)
                continue  # retry req (or, if it was the victim, the loop moves on)
            work.append(self._work(req, chunks))
            budget -= sum(n for _, n in chunks)
            i += 1
        while self.waiting and budget >= len(self.waiting[0].members):
            req = self.waiting[0]
            if self.n_running_seqs() + len(req.members) > self.cfg.max_num_seqs:
                break
            chunks = self._chunks(req, budget)
            if not chunks or not self._reserve(chunks):
                break
            self.waiting.popleft()
            self.running.append(req)
            work.append(self._work(req, chunks))
            budget -= sum(n for _, n in chunks)
        return work
