"""Small-model drafter: a cheaper LM with the target's tokenizer drafts a chain.

Keeps its own KV cache in sync with the committed context (trim to the common prefix, extend
only what is new), so accepted draft tokens are never recomputed. SpecASR-style confidence
truncation stops a draft as soon as the draft model's top probability falls below
``threshold`` (default 0.4); the adaptive controller caps the length from the measured
verification-cost curve and switches drafting off when it does not pay.

**A draft model that cannot pay costs nothing.** Before its first draft of a generation the
drafter compares its step cost with the target's, both as measured in this process (saved
timings may come from another machine load): the draft model's single-step time (three
one-token steps on its empty cache, unless it has drafted in this process), the target's, the
target's cost curve t(k)/t(1) and the acceptance estimate α (learned, saved, or the calibrated
prior of ``speclive.drafting.priors``). When no draft length k beats plain AR by
``min_gain``, drafting stays off for the generation: the draft model is never prefilled nor
caught up, and one stderr line says so with the numbers. Until the target's step time is known
(the first one-token step of a process) nothing is drafted. A later probe of a switched-off drafter
catches the draft cache up in one batched ``extend`` (``Backend.sync``), and is skipped when even
α = ``CEILING_ALPHA`` could not pay for that catch-up.

The draft model reads only the last ``window`` tokens of the prompt (default 96). Where a
draft step costs a sizeable fraction of a target step (a CPU), prefilling a long prompt into
the draft model can cost more than its drafts win back over a typical answer; local context
is what a draft needs anyway. The window start is fixed per generation so the draft cache
keeps growing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from speclive.acceptance import softmax
from speclive.backends.base import Backend, BackendState, common_prefix_len
from speclive.drafting.base import AdaptiveConfig, AdaptiveLength, Drafter, DraftTarget
from speclive.drafting.priors import draft_alpha
from speclive.drafting.tree import DraftTree
from speclive.errors import ConfigError

#: a sync that extends more tokens than this is catch-up (new prompt, pause), not drafting
ONEOFF_TOKENS = 4
DEFAULT_WINDOW = 96
#: a switched-off draft model is not probed when even this acceptance rate would not pay
CEILING_ALPHA = 0.95
#: one-token steps timed to measure a draft model's step cost (the fastest counts)
GATE_STEPS = 3
#: target steps over which the gate lets a generation's drafting pay back the prefill of the
#: draft cache up to the new prompt (half the usual 128-token answer, counted in AR steps)
GATE_HORIZON = 64


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def catch_up_cost(draft: Backend, state: BackendState, tokens: Sequence[int], draft_ratio: float) -> float:
    """Cost (target single steps) of bringing ``state`` up to ``tokens``, if it is catch-up.

    A draft cache left behind while drafting was off must prefill what it missed before it can
    draft: that is what made probes of an off draft model expensive.
    """
    behind = len(tokens) - common_prefix_len(state.tokens, tokens)
    if behind <= ONEOFF_TOKENS or draft_ratio <= 0:
        return 0.0
    return draft_ratio * draft.cost.ratio(behind)


def probe_cannot_pay(
    ctl: AdaptiveLength, draft: Backend, state: BackendState, tokens: Sequence[int], alpha: float
) -> bool:
    """True when the controller ``ctl`` is switched off (this draft would be a back-off probe)
    and even acceptance ``alpha`` could not pay for the drafts plus the catch-up prefill of the
    draft cache ``state`` up to ``tokens``: the probe is skipped (the back-off still grows)."""
    if not ctl.off or ctl.cfg.fixed:
        return False
    extra = catch_up_cost(draft, state, tokens, ctl.draft_ratio)
    return ctl.ceiling(alpha, extra) < ctl.cfg.min_gain


def window_start(context: Sequence[int], window: int | None) -> int:
    """Index where a draft model's view of ``context`` begins (0 = whole context)."""
    return 0 if window is None else max(0, len(context) - window)


def timed_sync(backend: Backend, state: BackendState, tokens: Sequence[int]) -> tuple[np.ndarray, float]:
    """``backend.sync`` and its seconds if it was a long catch-up (one-off work), else 0."""
    behind = len(tokens) - common_prefix_len(state.tokens, tokens)
    t0 = time.perf_counter()
    logits = backend.sync(state, tokens)
    return logits, (time.perf_counter() - t0 if behind > ONEOFF_TOKENS else 0.0)


@dataclass
class ChainDraft:
    tokens: list[int]
    probs: list[float]
    dists: list[np.ndarray] | None


def draft_chain(
    backend: Backend,
    state: BackendState,
    logits: np.ndarray,
    k: int,
    threshold: float,
    temperature: float = 0.0,
    rng: np.random.Generator | None = None,
    stop: object = None,
    min_before_stop: int = 0,
) -> ChainDraft:
    """Draft up to ``k`` tokens after ``logits`` (the draft's last-row logits).

    ``stop`` (an object with ``is_set()``, e.g. a ``threading.Event``) is checked between draft
    steps once ``min_before_stop`` tokens are drafted: an asynchronous drafter cuts its chain
    short when the target needs it.
    """
    out = ChainDraft([], [], [] if temperature > 0 else None)
    row = logits
    for i in range(k):
        p = softmax(row, temperature if temperature > 0 else 1.0)
        if temperature > 0:
            tok = int((rng or np.random.default_rng()).choice(p.shape[0], p=p))
        else:
            tok = int(np.argmax(p))
        conf = float(p.max())
        if conf < threshold:
            break
        out.tokens.append(tok)
        out.probs.append(float(p[tok]))
        if out.dists is not None:
            out.dists.append(p)
        if i + 1 >= k or (
            stop is not None and i + 1 >= min_before_stop and stop.is_set()  # type: ignore[attr-defined]
        ):
            break
        row = backend.extend(state, [tok])[-1]
    return out


class ModelDrafter(Drafter):
    name = "model"

    def __init__(
        self,
        draft: Backend,
        max_len: int = 24,
        threshold: float = 0.4,
        fixed_len: int | None = None,
        temperature: float = 0.0,
        adaptive: AdaptiveLength | None = None,
        window: int | None = DEFAULT_WINDOW,
    ):
        if not 0.0 <= threshold < 1.0:
            raise ConfigError(f"confidence threshold must be in [0, 1), got {threshold}")
        if window is not None and window < 1:
            raise ConfigError(f"draft context window must be >= 1 token (or None), got {window}")
        if fixed_len is not None and fixed_len < 1:
            raise ConfigError(f"fixed draft length must be >= 1, got {fixed_len}")
        if fixed_len is not None:
            adaptive = AdaptiveLength(AdaptiveConfig(max_len=fixed_len, fixed=True))
            threshold = 0.0
        super().__init__(
            adaptive or AdaptiveLength(AdaptiveConfig(max_len=max_len, prior_alpha=draft_alpha() or 0.7))
        )
        self.draft = draft
        self.threshold = threshold
        self.temperature = temperature
        self.rng = np.random.default_rng(0)
        self.state = draft.new_state()
        self.window = window
        self._start = 0
        self.detail = f"draft={draft.name}"
        #: the cost gate's verdict for this generation: None = not decided yet, True = may draft
        self.gate_open: bool | None = None
        #: why the gate closed (the stderr line), once it did
        self.gate_reason = ""
        self._said = False
        self.log: Callable[[str], None] = _stderr

    def start(self, target: DraftTarget, context: Sequence[int]) -> None:
        super().start(target, context)
        if (
            self.draft.vocab_size > target.vocab_size + 1024
            or self.draft.tokenizer.vocab_size != target.tokenizer.vocab_size
        ):
            # same tokenizer is the contract of this drafter; CrossVocabDrafter handles the rest
            if self.draft.tokenizer.encode("Hello world") != target.tokenizer.encode("Hello world"):
                raise ConfigError(
                    f"draft model {self.draft.name} does not share the tokenizer of {target.name}; "
                    "use the crossvocab drafter"
                )
        # the next sync() trims the draft cache to its common prefix with the new view, so an
        # unchanged view (no window, shared system prompt) is not recomputed
        self._start = window_start(context, self.window)
        self.gate_open = None

    def _update_costs(self) -> None:
        t_d = self.draft.cost.step_seconds()
        t_t = self.target.cost.step_seconds() if self.target else None
        if t_d and t_t:
            self.adaptive.draft_ratio = t_d / t_t

    def _measure_draft_step(self, token: int) -> None:
        """Time ``GATE_STEPS`` one-token steps of the draft model on its (empty) cache."""
        times = []
        for _ in range(GATE_STEPS):
            t0 = time.perf_counter()
            self.draft.extend(self.state, [token])
            times.append(time.perf_counter() - t0)
            self.draft.truncate(self.state, 0)
        self.draft.cost.set_seconds(1, min(times))

    def _gate(self, context: Sequence[int]) -> bool | None:
        """Can any draft length pay on this machine? None while the target's step is unmeasured."""
        ctl = self.adaptive
        if ctl.cfg.fixed or self.target is None:
            return True
        # both step times as measured in this process (saved ones may come from another load)
        if not self.target.cost.observed.get(1):
            return None
        t_t = self.target.cost.step_seconds()
        if not self.draft.cost.observed.get(1):
            if self.state.tokens:  # a cache in use: its next sync would pay for a reset
                return True
            self._measure_draft_step(int(context[-1]))
        self._update_costs()
        k, best = ctl._best()
        # the draft cache must first be brought up to this prompt (one prefill): a gain per step
        # that cannot pay that back over the horizon is a loss for this generation
        catch_up = catch_up_cost(self.draft, self.state, context[self._start :], ctl.draft_ratio)
        overall = GATE_HORIZON / (GATE_HORIZON / best + catch_up)
        if overall >= ctl.cfg.min_gain:
            return True
        ctl.off = True
        t_d = self.draft.cost.step_seconds() or 0.0
        self.gate_reason = (
            f"speclive: {self.name} drafter off: a step of {self.draft.name} takes {1000 * t_d:.1f} ms = "
            f"{ctl.draft_ratio:.2f} target steps ({1000 * t_t:.1f} ms); at acceptance {ctl.alpha:.2f} "
            f"the best draft length ({k}) would give {best:.2f}x of plain decoding, "
            f"{overall:.2f}x after the draft cache's catch-up ({catch_up:.1f} target steps) over "
            f"{GATE_HORIZON} steps (< {ctl.cfg.min_gain:.2f}x needed): the draft model is not prefilled"
        )
        if not self._said:
            self._said = True
            self.log(self.gate_reason)
        return False

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        if self.gate_open is None:
            self.gate_open = self._gate(context)
            if self.gate_open is None:
                return DraftTree()  # decided once the target's step is measured
        self._update_costs()
        k = min(budget, self.adaptive.length())
        if k <= 0:
            return DraftTree()
        view = context[self._start :]
        if probe_cannot_pay(self.adaptive, self.draft, self.state, view, CEILING_ALPHA):
            return DraftTree()
        logits, oneoff = timed_sync(self.draft, self.state, view)
        self._oneoff_s += oneoff
        logits = logits[-1]
        d = draft_chain(self.draft, self.state, logits, k, self.threshold, self.temperature, self.rng)
        return DraftTree.chain(d.tokens, probs=d.probs, dists=d.dists, source=self.name)

    def close(self) -> None:
        self.draft.release(self.state)
