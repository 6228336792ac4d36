"""The one draft -> verify -> commit loop.

Every speculative method in speclive runs through ``SpeculativeDecoder.generate``: a drafter
proposes a ``DraftTree`` after the committed context, the target evaluates the last committed
token plus the whole tree in ONE ``extend`` call, an ``AcceptanceRule`` picks the accepted
path and the bonus token, and the cache keeps exactly that path. With no drafter the loop is
plain autoregressive decoding (one token per target forward), which is the reference every
lossless mode must reproduce token for token.

Cache invariant: between steps the target cache holds every committed token except the
newest one (``pending``), whose logits are produced as row 0 of the next verification.

A remote engine (``speclive.engines.vllm``) runs requests its own way but keeps the books the
same way: every engine's loop commits through ``Commit`` and accounts each step with
``Commit.step``. Both decoders offer the ``Decoder`` interface; ``stepwise`` hands a target
pass out to the caller (the server batches the passes of several requests) where there is one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from speclive.acceptance import AcceptanceRule, GreedyRule, SpeculativeSamplingRule
from speclive.backends.base import Backend, BackendState, CostCurve, CostModel, common_prefix_len
from speclive.drafting.base import Drafter, StepFeedback, TargetView
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
class StepEvent:
    """One verification step: what was committed and what it cost."""

    tokens: list[int]
    text: str
    drafted: int
    accepted: int
    draft_s: float
    verify_s: float
    sources: dict[str, int] = field(default_factory=dict)
    #: the generation's running totals: one object for all its events, final once the
    #: generation is over (results are carried here, not kept on the decoder)
    stats: GenerationStats = field(default_factory=GenerationStats)


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


class Commit:
    """What of a step's new tokens the output keeps, and the text a client may be shown.

    ``add(new)`` commits tokens up to an end-of-sequence token or ``max_tokens`` and cuts the
    text at the earliest stop string (each sets ``stats.finish_reason``). Until the generation
    ends, the text that could still turn into a stop string (the longest one's length minus
    one) and a trailing half UTF-8 character are held back, so a delta never has to be taken
    back. ``step`` also accounts the step in ``stats``. Shared by every engine's loop; created
    when the generation starts (``total_s`` counts from then).
    """

    def __init__(self, tokenizer: Any, cfg: GenerationConfig, stats: GenerationStats):
        self.tok, self.cfg, self.stats = tokenizer, cfg, stats
        self.t_start = time.perf_counter()
        self.eos = set() if cfg.ignore_eos else set(tokenizer.eos_ids)
        self.hold = max((len(s) for s in cfg.stop), default=1) - 1
        #: the committed token ids
        self.out: list[int] = []
        #: the output text (cut at a stop string) and the part of it handed out so far
        self.full = ""
        self.text = ""

    def add(self, new: Sequence[int]) -> tuple[list[int], str]:
        """Commit what of ``new`` may be committed; returns (committed ids, text delta)."""
        committed: list[int] = []
        for t in new:
            if t in self.eos:
                self.stats.finish_reason = "eos"
                break
            committed.append(int(t))
            if len(self.out) + len(committed) >= self.cfg.max_tokens:
                self.stats.finish_reason = "length"
                break
        self.out.extend(committed)
        full = self.tok.decode(self.out)
        if self.cfg.stop:
            cut = min((i for i in (full.find(s) for s in self.cfg.stop) if i >= 0), default=-1)
            if cut >= 0:
                full = full[:cut]
                self.stats.finish_reason = "stop"
        self.full = full
        shown = full
        if not self.stats.finish_reason:
            shown = full[: len(full) - self.hold] if self.hold else full
            shown = shown.rstrip("\ufffd")
        delta = shown[len(self.text) :] if len(shown) > len(self.text) else ""
        self.text += delta
        self.stats.new_tokens = len(self.out)
        return committed, delta

    def step(
        self,
        new: Sequence[int],
        tree: DraftTree,
        accepted: Sequence[int],
        draft_s: float,
        verify_s: float,
        forwards: int = 1,
    ) -> StepEvent:
        """One step's books: ``forwards`` target passes verified ``tree`` (per source) and kept
        its nodes ``accepted``, after ``draft_s`` seconds drafting and ``verify_s`` verifying;
        ``new`` (accepted tokens + bonus) is committed (``add``). Returns the ``StepEvent``."""
        stats = self.stats
        stats.target_forwards += forwards
        stats.drafted += len(tree)
        stats.accepted += len(accepted)
        stats.draft_s += draft_s
        stats.verify_s += verify_s
        sources: dict[str, int] = {}
        if tree.sources:
            for src in tree.sources:
                src = src or "draft"
                stats.drafted_by_source[src] = stats.drafted_by_source.get(src, 0) + 1
            for i in accepted:
                src = tree.sources[i] or "draft"
                sources[src] = sources.get(src, 0) + 1
                stats.accepted_by_source[src] = stats.accepted_by_source.get(src, 0) + 1
        committed, delta = self.add(new)
        stats.total_s = time.perf_counter() - self.t_start
        return StepEvent(committed, delta, len(tree), len(accepted), draft_s, verify_s, sources, stats=stats)


@dataclass
class VerifyPass:
    """The target pass one step needs: ``tokens`` (a chain, or a tree by ``parents``) after
    what ``state`` caches, without the logits of its first ``skip`` rows (a prompt tail in
    front of the draft needs its cache entries only). Whoever runs it hands the logits to
    ``Generation.commit``."""

    state: BackendState
    tokens: list[int]
    parents: list[int]
    skip: int = 0


class Generation:
    """One request's draft -> verify -> commit loop, one step at a time, without running the
    target itself: ``next_pass()`` drafts and returns the ``VerifyPass`` the step needs (None
    when the generation is over); ``commit(logits)`` applies the acceptance rule to that pass's
    logits, keeps the accepted path in the cache and commits the tokens. ``SpeculativeDecoder``
    runs each pass on its own; a scheduler can run the passes of several generations together.
    ``stats`` and ``commit_.out`` / ``commit_.full`` hold the result as it grows.
    """

    def __init__(
        self,
        dec: SpeculativeDecoder,
        prompt_ids: Sequence[int],
        config: GenerationConfig | None,
        probe: int | None = None,
    ):
        cfg, prompt = checked_request(prompt_ids, config)
        target = dec.target
        if len(prompt) >= target.n_ctx:
            raise ContextOverflowError(
                f"prompt has {len(prompt)} tokens but the context window of {target.name} "
                f"holds {target.n_ctx} (and at least one must be generated)"
            )
        self.dec, self.cfg, self.target, self.drafter = dec, cfg, target, dec.drafter
        self.rule = dec.rule or (
            GreedyRule() if cfg.temperature == 0 else SpeculativeSamplingRule(cfg.temperature)
        )
        # any integer is a seed (OpenAI's API allows negative ones); numpy takes non-negative
        self.rng = np.random.default_rng(cfg.seed if cfg.seed >= 0 else cfg.seed % 2**64)
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self.commit_ = Commit(target.tokenizer, cfg, self.stats)
        self.tail, self.stats.prefill_forwards, self._probe_at = dec._prefill(prompt, cfg.fuse_prefill, probe)
        self.stats.prefill_s = time.perf_counter() - self.commit_.t_start
        self.context = list(prompt)
        self.pending = prompt[-1]
        self.done = False
        self._step: tuple[DraftTree, list[int], list[int], float, float, int, int, int] | None = None
        if self.drafter is not None:
            dec._set_target_threads()
            if dec.knowledge is not None and not dec._knowledge_loaded:
                dec._knowledge_loaded = True
                dec.knowledge.load()
            # the drafter reads the cost curve of the threads the target computes with now
            curve: CostCurve = dec.state.cost or target.cost
            if dec.plan_cost is not None:
                curve = dec.plan_cost(curve)
            self.drafter.start(TargetView.of(target, curve), self.context)

    def next_pass(self) -> VerifyPass | None:
        """Draft the next step; the target pass it needs, or None when the generation is over."""
        if self.done:
            return None
        cfg, state = self.cfg, self.dec.state
        remaining = cfg.max_tokens - len(self.commit_.out)
        # the root (pending) token and a fused prompt tail need slots
        room = self.target.n_ctx - len(state.tokens) - len(self.tail) - 1
        if room < 0:
            self.stats.finish_reason = "context"
            self._finish()
            return None
        budget = max(0, min(cfg.max_draft_nodes, remaining - 1, room))
        t0 = time.perf_counter()
        tree = DraftTree()
        if self.drafter is not None and budget > 0:
            tree = self.drafter.propose(self.context, budget).truncated(budget)
        t1 = time.perf_counter()
        tokens, parents = tree.rooted(self.pending)
        t = len(self.tail)
        # the tail's rows are not wanted, but for a probe's two rows
        skip = t if self._probe_at is None else self._probe_at
        self._step = (tree, tokens, parents, t0, t1, t, skip, len(state.tokens))
        if not t:
            return VerifyPass(state, tokens, parents)
        # the prompt tail as a chain in front of the root, in the same pass
        ext_parents = [i - 1 for i in range(t)] + [p + t if p >= 0 else t - 1 for p in parents]
        return VerifyPass(state, self.tail + tokens, ext_parents, skip)

    def commit(self, logits: np.ndarray) -> StepEvent:
        """Accept from the logits of the pass ``next_pass`` returned; commit; one ``StepEvent``."""
        assert self._step is not None, "commit() needs the logits of next_pass()'s pass"
        tc = time.perf_counter()
        tree, tokens, parents, t0, t1, t, skip, base = self._step
        self._step = None
        target, state = self.target, self.dec.state
        if t:
            if self._probe_at is not None:
                self.dec.probe_prev = np.array(logits[self._probe_at - skip])
                self.dec.probe_row = np.array(logits[self._probe_at - skip + 1])
                self._probe_at = None
            logits = logits[t - skip :]
            base += t
            self.tail = []
        verdict = self.rule.accept(
            tokens,
            parents,
            logits,
            probs=None if tree.probs is None else [1.0] + tree.probs,
            dists=None if tree.dists is None else [None] + tree.dists,
            rng=self.rng,
            sources=None if tree.sources is None else [None, *tree.sources],
        )
        if state.pending is not None:
            target.keep(state, list(range(t)) + [i + t for i in verdict.path])
        else:
            target.truncate(state, base + len(verdict.path))
        t2 = time.perf_counter()

        accepted_nodes = [i - 1 for i in verdict.path[1:]]
        new = [tree.tokens[i] for i in accepted_nodes] + [verdict.bonus]
        if self.drafter is not None and len(tree):
            # the step's own time: drafting, its pass and accepting (not other work the caller
            # ran in between); a step that also carried the prompt tail, or whose pass shared a
            # decode with other states', is no drafting measurement
            own = state.pass_s
            seconds = None if t or own is None else (t1 - t0) + own + (t2 - tc)
            self.drafter.feedback(StepFeedback(tree, accepted_nodes, verdict.bonus, seconds, len(new)))
        ev = self.commit_.step(new, tree, accepted_nodes, t1 - t0, t2 - t1)
        self.context.extend(ev.tokens)
        if self.stats.finish_reason:
            self._finish()
        else:
            self.pending = new[-1]
        return ev

    def _finish(self) -> None:
        self.done = True
        self.stats.total_s = time.perf_counter() - self.commit_.t_start

    @property
    def result(self) -> GenerationResult:
        return GenerationResult(list(self.commit_.out), self.commit_.full, self.stats)


class SpeculativeDecoder:
    """A target (one KV state), an optional drafter and an acceptance rule; ``generate`` runs
    ``Generation`` steps, each with its own target pass."""

    def __init__(
        self,
        target: Backend,
        drafter: Drafter | None = None,
        rule: AcceptanceRule | None = None,
        knowledge: KnowledgeStore | None = None,
        state: BackendState | None = None,
        plan_cost: Callable[[CostCurve], CostCurve] | None = None,
    ):
        self.target = target
        self.drafter = drafter
        self.rule = rule
        #: the curve the drafter plans with, made from the one its passes are timed into
        #: (None: that one; a server whose passes share a decode prices a draft at what it adds
        #: to the shared pass, ``speclive.server.shared_pass_cost``)
        self.plan_cost = plan_cost
        #: saved controller state: loaded before the first generation, saved after each one
        self.knowledge = knowledge if drafter is not None else None
        self._knowledge_loaded = False
        #: the target's KV state: ``state`` when given (a parked cache whose prefix the next
        #: prompt may share: ``_prefill`` keeps the common part), else a new one
        self.state: BackendState = state if state is not None else target.new_state()
        # the target's cost curve at the drafter's ``target_threads`` (it differs from the usual
        # one): this decoder's passes are timed into it while the drafter drafts
        self._drafting_cost: CostModel | None = None
        #: the logits row a ``probe`` asked for and the row one position before it (None until
        #: their pass ran)
        self.probe_row: np.ndarray | None = None
        self.probe_prev: np.ndarray | None = None
        # while the drafter's threads are applied: the target's own count, restored by ``end``
        self._threads_applied = False
        self._own_threads: int | None = None

    def close(self, release_state: bool = True) -> None:
        """Close the drafter and release the state (``release_state`` False: the caller keeps
        ``state`` and its cache)."""
        if release_state:
            self.target.release(self.state)
        if self.drafter is not None:
            self.drafter.close()

    # ------------------------------------------------------------------------------------
    def _prefill(
        self, prompt: list[int], fuse_max: int, probe: int | None = None
    ) -> tuple[list[int], int, int | None]:
        """Make the cache hold ``prompt[:-1]``, reusing whatever prefix it already holds;
        returns the tail left to evaluate, the target passes spent here (0 to 3) and where the
        probe's rows start in the tail's logits (None: already in ``probe_row``, or no probe).

        A short uncached tail (at most ``fuse_max`` tokens) is not evaluated here but returned,
        to ride along in the first verification pass: a streaming session whose prompt grew
        by a few tokens then needs ONE target pass to extend the prompt and verify its draft.

        ``probe`` (``1 < probe < len(prompt) - 1``) asks for the logits after ``prompt[:probe]``
        (what the model expects at position ``probe``), kept in ``probe_row``, and the row
        before it in ``probe_prev``: positions ``probe - 2`` and ``probe - 1`` are evaluated
        again if the cache holds them, so the rows always come from this prompt's own pass.
        """
        self.probe_row = self.probe_prev = None
        keep = common_prefix_len(self.state.tokens, prompt[:-1])
        if probe is not None:
            if not 1 < probe < len(prompt) - 1:
                raise ValueError(f"probe {probe} outside the prompt's tokens 2..{len(prompt) - 2}")
            keep = min(keep, probe - 2)
        self.target.truncate(self.state, keep)
        tail = prompt[keep:-1]
        if len(tail) <= fuse_max:
            return tail, 0, None if probe is None else probe - 2 - keep
        if probe is None:
            self.target.extend(self.state, tail, last_only=True)
            return [], 1, None
        self.probe_prev = self.target.extend(self.state, prompt[keep : probe - 1], last_only=True)[-1]
        self.probe_row = self.target.extend(self.state, prompt[probe - 1 : probe], last_only=True)[-1]
        if probe < len(prompt) - 1:
            self.target.extend(self.state, prompt[probe:-1], last_only=True)
            return [], 3, None
        return [], 2, None

    def prefill(self, prompt_ids: Sequence[int], probe: int | None = None) -> None:
        """Make the cache hold ``prompt_ids[:-1]`` now (reusing its common prefix), so a later
        ``generate`` on this prompt, or on one that extends it, starts with little to compute.
        ``probe``: as in ``_prefill`` (the row lands in ``probe_row``)."""
        prompt = [int(t) for t in prompt_ids]
        if len(prompt) >= self.target.n_ctx:
            raise ContextOverflowError(
                f"prompt has {len(prompt)} tokens but the context window of {self.target.name} "
                f"holds {self.target.n_ctx}"
            )
        if len(prompt) > 1:
            self._prefill(prompt, 0, probe)

    def start(
        self, prompt_ids: Sequence[int], config: GenerationConfig | None = None, probe: int | None = None
    ) -> Generation:
        """A new generation on this decoder's state, to be stepped by the caller (see
        ``Generation``); ``end(gen)`` when it is over or abandoned. ``probe``: see ``_prefill``
        (the row is in ``probe_row`` once the first step is committed)."""
        return Generation(self, prompt_ids, config, probe)

    def _set_target_threads(self) -> None:
        """Before drafting: run the target on the threads the drafter declares
        (``Drafter.target_threads``, where the target has ``settable_threads``), and time this
        decoder's passes into the cost curve of that count (``BackendState.cost``: the shared
        backend's own curve is left alone); ``end`` restores both."""
        n = self.drafter.target_threads if self.drafter is not None else None
        t = self.target
        if n is None or not t.settable_threads or self._threads_applied:
            return
        if self._drafting_cost is None:
            self._drafting_cost = CostModel(t.default_cost_prior())
        self._threads_applied, self._own_threads = True, t.n_threads
        self.state.cost = self._drafting_cost
        t.set_threads(n)

    def end(self, gen: Generation) -> None:
        """After a generation: stop the drafter's background work, restore the target's
        threads, save what the drafter learned."""
        if self.drafter is not None:
            self.drafter.end()  # stops background drafting
        if self._threads_applied:
            self._threads_applied = False
            if self._own_threads is not None:
                self.target.set_threads(self._own_threads)
            self.state.cost = None
        if self.knowledge is not None and gen.stats.target_forwards:
            self.knowledge.save()

    def generate(
        self, prompt_ids: Sequence[int], config: GenerationConfig | None = None, probe: int | None = None
    ) -> Generator[StepEvent, None, GenerationResult]:
        """Yield one ``StepEvent`` per verification (each carries the running ``stats``);
        the generator returns the ``GenerationResult``. ``probe``: see ``_prefill``."""
        gen = self.start(prompt_ids, config, probe)
        try:
            while (p := gen.next_pass()) is not None:
                yield gen.commit(self.target.extend(p.state, p.tokens, p.parents, skip=p.skip))
        finally:
            self.end(gen)
        return gen.result

    def stepwise(
        self, prompt_ids: Sequence[int], config: GenerationConfig | None = None
    ) -> Generator[StepEvent | VerifyPass, np.ndarray | None, GenerationResult]:
        """``generate`` with the target passes handed out: each step yields its ``VerifyPass``,
        takes the pass's logits (``send``) and yields the step's ``StepEvent``; the generator
        returns the ``GenerationResult``. The caller may run the passes of several generations
        together (the server's batched verification)."""
        gen = self.start(prompt_ids, config)
        try:
            while (p := gen.next_pass()) is not None:
                logits = yield p
                assert logits is not None, "stepwise() needs the logits of each VerifyPass sent back"
                yield gen.commit(logits)
        finally:
            self.end(gen)
        return gen.result

    def run(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None) -> GenerationResult:
        """Generate to completion and return ids, text and stats."""
        return drain(self.generate(prompt_ids, config))


def drain(
    steps: Generator[StepEvent, None, GenerationResult], events: list[StepEvent] | None = None
) -> GenerationResult:
    """Run a ``generate`` generator to its end and return its ``GenerationResult`` (the
    events it yields are appended to ``events`` when given)."""
    while True:
        try:
            ev = next(steps)
        except StopIteration as done:
            return done.value
        if events is not None:
            events.append(ev)


class Decoder(Protocol):
    """The decode loop sessions and the server drive: ``SpeculativeDecoder`` in process,
    ``speclive.engines.vllm.VLLMDecoder`` on a remote engine."""

    def generate(
        self, prompt_ids: Sequence[int], config: GenerationConfig | None = None
    ) -> Generator[StepEvent, None, GenerationResult]:
        """One ``StepEvent`` per step; returns the ``GenerationResult``."""
        ...

    def stepwise(
        self, prompt_ids: Sequence[int], config: GenerationConfig | None = None
    ) -> Generator[StepEvent | VerifyPass, np.ndarray | None, GenerationResult]:
        """As ``generate``, but a step that needs a target pass in this process first yields
        its ``VerifyPass`` and takes the logits (``send``); a remote engine yields events only."""
        ...

    def run(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None) -> GenerationResult: ...

    def prefill(self, prompt_ids: Sequence[int]) -> None: ...

    def close(self, release_state: bool = True) -> None:
        """Release what the decoder holds (``release_state`` False: not its KV state)."""
        ...


def make_decoder(
    target: Backend,
    drafter: Drafter | None = None,
    rule: AcceptanceRule | None = None,
    knowledge: KnowledgeStore | None = None,
    state: BackendState | None = None,
    plan_cost: Callable[[CostCurve], CostCurve] | None = None,
) -> Decoder:
    """The decode loop for ``target``: ``SpeculativeDecoder`` for an in-process backend (on
    ``state`` when given, e.g. a parked cache to reuse; ``plan_cost``: see there); a remote
    engine (``in_process`` False: ``speclive.engines.vllm.VLLMEngine``) brings its own loop from
    its ``make_decoder``, with the same interface (``Decoder``), and keeps its cache itself
    (``state`` and ``plan_cost`` must be None)."""
    if target.in_process:
        return SpeculativeDecoder(target, drafter, rule, knowledge, state, plan_cost)
    if state is not None or plan_cost is not None:
        raise ValueError(f"{target.name} is a remote engine: it takes no KV state or cost curve")
    return target.make_decoder(drafter, rule, knowledge)
