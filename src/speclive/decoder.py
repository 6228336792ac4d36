"""The one draft -> verify -> commit loop.

Every speculative method in speclive runs through ``SpeculativeDecoder.generate``: a drafter
proposes a ``DraftTree`` after the committed context, the target evaluates the last committed
token plus the whole tree in ONE ``extend`` call, an ``AcceptanceRule`` picks the accepted
path and the bonus token, and the cache keeps exactly that path. With no drafter the loop is
plain autoregressive decoding (one token per target forward), which is the reference every
lossless mode must reproduce token for token.

Cache invariant: between steps the target cache holds every committed token except the
newest one (``pending``), whose logits are produced as row 0 of the next verification.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from speclive.acceptance import AcceptanceRule, GreedyRule, SpeculativeSamplingRule
from speclive.backends.base import Backend, BackendState, common_prefix_len
from speclive.drafting.base import Drafter
from speclive.drafting.tree import DraftTree
from speclive.errors import ConfigError, ContextOverflowError

if TYPE_CHECKING:
    from speclive.knowledge import KnowledgeStore


@dataclass
class GenerationConfig:
    #: most new tokens to commit
    max_tokens: int = 256
    #: stop as soon as the output text contains one of these (not included in the output)
    stop: tuple[str, ...] = ()
    #: 0 = greedy; > 0 samples (acceptance becomes speculative sampling unless a rule is given)
    temperature: float = 0.0
    #: seed of the sampling RNG
    seed: int = 0
    #: most draft nodes verified in one target pass
    max_draft_nodes: int = 64
    #: keep generating past end-of-sequence tokens
    ignore_eos: bool = False
    #: an uncached prompt tail up to this long is evaluated in the first verification pass
    fuse_prefill: int = 32


@dataclass
class StepEvent:
    """One verification step: what was committed and what it cost."""

    tokens: list[int]
    text: str
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    sources: dict[str, int] = field(default_factory=dict)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    target_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0
    #: 1 when the prompt tail needed a pass of its own (too long to fuse into the first step)
    prefill_forwards: int = 0
    total_s: float = 0.0
    finish_reason: str = ""
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    drafted_by_source: dict[str, int] = field(default_factory=dict)

    @property
    def mean_accepted(self) -> float:
        """τ: tokens committed per decoding forward pass of the target."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def decode_s(self) -> float:
        return self.total_s - self.prefill_s

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput (prefill excluded)."""
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def e2e_tokens_per_second(self) -> float:
        """New tokens over the whole call, prefill included."""
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in (
            "mean_accepted",
            "acceptance_rate",
            "decode_s",
            "tokens_per_second",
            "e2e_tokens_per_second",
        ):
            d[k] = getattr(self, k)
        return d


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    stats: GenerationStats


def checked_request(
    prompt_ids: Sequence[int], config: GenerationConfig | None
) -> tuple[GenerationConfig, list[int]]:
    """The request's config (the default when None) and prompt as ints; ``ConfigError`` for an
    empty prompt or ``max_tokens`` < 1. Shared by every engine's ``generate``."""
    cfg = config or GenerationConfig()
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ConfigError("empty prompt: nothing to continue")
    if cfg.max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, got {cfg.max_tokens}")
    return cfg, prompt


class SpeculativeDecoder:
    def __init__(
        self,
        target: Backend,
        drafter: Drafter | None = None,
        rule: AcceptanceRule | None = None,
        knowledge: KnowledgeStore | None = None,
    ):
        self.target = target
        self.drafter = drafter
        self.rule = rule
        #: saved controller state: loaded before the first generation, saved after each one
        self.knowledge = knowledge if drafter is not None else None
        self._knowledge_loaded = False
        self.state: BackendState = target.new_state()
        self.last_stats = GenerationStats()

    def close(self) -> None:
        self.target.release(self.state)
        if self.drafter is not None:
            self.drafter.close()

    # ------------------------------------------------------------------------------------
    def _prefill(self, prompt: list[int], fuse_max: int) -> list[int]:
        """Make the cache hold ``prompt[:-1]``, reusing whatever prefix it already holds.

        A short uncached tail (at most ``fuse_max`` tokens) is not evaluated here but returned,
        to ride along in the first verification pass: a streaming session whose prompt grew
        by a few tokens then needs ONE target pass to extend the prompt and verify its draft.
        """
        keep = common_prefix_len(self.state.tokens, prompt[:-1])
        self.target.truncate(self.state, keep)
        tail = prompt[keep:-1]
        if len(tail) <= fuse_max:
            return tail
        self.target.extend(self.state, tail, last_only=True)
        self.last_stats.prefill_forwards = 1
        return []

    def prefill(self, prompt_ids: Sequence[int]) -> None:
        """Make the cache hold ``prompt_ids[:-1]`` now (reusing its common prefix), so a later
        ``generate`` on this prompt, or on one that extends it, starts with little to compute."""
        prompt = [int(t) for t in prompt_ids]
        if len(prompt) >= self.target.n_ctx:
            raise ContextOverflowError(
                f"prompt has {len(prompt)} tokens but the context window of {self.target.name} "
                f"holds {self.target.n_ctx}"
            )
        if len(prompt) > 1:
            self._prefill(prompt, 0)

    def generate(
        self, prompt_ids: Sequence[int], config: GenerationConfig | None = None
    ) -> Iterator[StepEvent]:
        """Yield one ``StepEvent`` per verification; ``self.last_stats`` holds the totals."""
        try:
            yield from self._generate(prompt_ids, config)
        finally:
            if self.drafter is not None:
                self.drafter.end()  # stops background drafting, restores backend settings
            if self.knowledge is not None and self.last_stats.target_forwards:
                self.knowledge.save()

    def _generate(
        self, prompt_ids: Sequence[int], config: GenerationConfig | None = None
    ) -> Iterator[StepEvent]:
        cfg, prompt = checked_request(prompt_ids, config)
        n_ctx = self.target.n_ctx
        if len(prompt) >= n_ctx:
            raise ContextOverflowError(
                f"prompt has {len(prompt)} tokens but the context window of {self.target.name} "
                f"holds {n_ctx} (and at least one must be generated)"
            )
        rule = self.rule or (
            GreedyRule() if cfg.temperature == 0 else SpeculativeSamplingRule(cfg.temperature)
        )
        # any integer is a seed (OpenAI's API allows negative ones); numpy takes non-negative
        rng = np.random.default_rng(cfg.seed if cfg.seed >= 0 else cfg.seed % 2**64)
        tok = self.target.tokenizer
        eos = set() if cfg.ignore_eos else tok.eos_ids
        stats = GenerationStats(prompt_tokens=len(prompt))
        self.last_stats = stats
        t_start = time.perf_counter()

        tail = self._prefill(prompt, cfg.fuse_prefill)
        stats.prefill_s = time.perf_counter() - t_start
        context = list(prompt)
        pending = prompt[-1]
        out: list[int] = []
        self._out, self._text = out, ""
        text = full = ""
        hold = max((len(s) for s in cfg.stop), default=1) - 1
        if self.drafter is not None:
            self.drafter.bind(self.target)
            if self.knowledge is not None and not self._knowledge_loaded:
                self._knowledge_loaded = True
                self.knowledge.load()
            self.drafter.begin(context)

        while True:
            remaining = cfg.max_tokens - len(out)
            # the root (pending) token and a fused prompt tail need slots
            room = n_ctx - len(self.state.tokens) - len(tail) - 1
            if room < 0:
                stats.finish_reason = "context"
                break
            budget = max(0, min(cfg.max_draft_nodes, remaining - 1, room))
            t0 = time.perf_counter()
            tree = DraftTree()
            if self.drafter is not None and budget > 0:
                tree = self.drafter.propose(context, budget).truncated(budget)
            t1 = time.perf_counter()
            tokens, parents = tree.rooted(pending)
            base = len(self.state.tokens)
            t = len(tail)
            if t:  # the prompt tail as a chain in front of the root, in the same pass
                ext_parents = [i - 1 for i in range(t)] + [p + t if p >= 0 else t - 1 for p in parents]
                logits = self.target.extend(self.state, tail + tokens, ext_parents)[t:]
                base += t
                tail = []
            else:
                logits = self.target.extend(self.state, tokens, parents)
            verdict = rule.accept(
                tokens,
                parents,
                logits,
                probs=None if tree.probs is None else [1.0] + tree.probs,
                dists=None if tree.dists is None else [None] + tree.dists,
                rng=rng,
                sources=None if tree.sources is None else [None, *tree.sources],
            )
            if self.state.pending is not None:
                self.target.keep(self.state, list(range(t)) + [i + t for i in verdict.path])
            else:
                self.target.truncate(self.state, base + len(verdict.path))
            t2 = time.perf_counter()

            accepted_nodes = [i - 1 for i in verdict.path[1:]]
            new = [tree.tokens[i] for i in accepted_nodes] + [verdict.bonus]
            if self.drafter is not None and len(tree):
                self.drafter.feedback(tree, accepted_nodes, verdict.bonus)
                if not t:  # a step that also carried the prompt tail is no drafting measurement
                    self.drafter.observe_step(tree.max_depth(), t2 - t0, len(new))
            stats.target_forwards += 1
            stats.drafted += len(tree)
            stats.accepted += len(accepted_nodes)
            stats.draft_s += t1 - t0
            stats.verify_s += t2 - t1
            sources: dict[str, int] = {}
            if tree.sources:
                for src in tree.sources:
                    src = src or "draft"
                    stats.drafted_by_source[src] = stats.drafted_by_source.get(src, 0) + 1
                for i in accepted_nodes:
                    src = tree.sources[i] or "draft"
                    sources[src] = sources.get(src, 0) + 1
                    stats.accepted_by_source[src] = stats.accepted_by_source.get(src, 0) + 1

            # commit, honouring EOS / max_tokens / stop strings
            committed: list[int] = []
            for t in new:
                if t in eos:
                    stats.finish_reason = "eos"
                    break
                committed.append(t)
                if len(out) + len(committed) >= cfg.max_tokens:
                    stats.finish_reason = "length"
                    break
            out.extend(committed)
            context.extend(committed)
            full = tok.decode(out)
            if cfg.stop:
                cut = min((i for i in (full.find(s) for s in cfg.stop) if i >= 0), default=-1)
                if cut >= 0:
                    full = full[:cut]
                    stats.finish_reason = "stop"
            shown = full
            if not stats.finish_reason:
                # hold back what could still turn into a stop string or half a character
                shown = full[: len(full) - hold] if hold else full
                shown = shown.rstrip("\ufffd")
            delta = shown[len(text) :] if len(shown) > len(text) else ""
            text += delta
            stats.new_tokens = len(out)
            stats.total_s = time.perf_counter() - t_start
            yield StepEvent(committed, delta, len(tree), len(accepted_nodes), t1 - t0, t2 - t1, sources)
            if stats.finish_reason:
                break
            pending = new[-1]
        stats.total_s = time.perf_counter() - t_start
        self._out, self._text = out, full

    @property
    def last_token_ids(self) -> list[int]:
        """Token ids committed by the last (or running) generation."""
        return list(getattr(self, "_out", []))

    def run(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None) -> GenerationResult:
        """Generate to completion and return ids, text and stats."""
        for _ in self.generate(prompt_ids, config):
            pass
        return GenerationResult(list(self._out), self._text, self.last_stats)


def make_decoder(
    target: Backend,
    drafter: Drafter | None = None,
    rule: AcceptanceRule | None = None,
    knowledge: KnowledgeStore | None = None,
) -> SpeculativeDecoder:
    """The decode loop for ``target``: ``SpeculativeDecoder`` for an in-process backend; a
    remote engine (``speclive.engines.vllm.VLLMEngine``) brings its own loop with the same
    interface (``generate``, ``run``, ``prefill``, ``last_stats``, ``close``)."""
    factory = getattr(target, "make_decoder", None)
    if factory is not None:
        return factory(drafter, rule, knowledge)
    return SpeculativeDecoder(target, drafter, rule, knowledge)
