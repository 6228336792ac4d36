"""Drafter protocol and the adaptive draft-length controller the drafters are handed.

A drafter proposes a ``DraftTree`` continuing the committed context; the decoder verifies it
and reports back how much was accepted (``StepFeedback``). Shape borrowed from transformers'
candidate generators (``get_candidates`` / ``update_candidate_strategy``), reduced to what a
tree verifier needs, plus the start and end of a generation.

``AdaptiveLength`` makes drafting pay on a compute-bound CPU: it keeps an estimate of the
per-token acceptance rate α and reads the target's measured verification-cost curve
t(k)/t(1) plus the drafter's own cost per drafted token, then picks the length k that
maximises expected tokens per unit time,

    E[tokens | k] = (1 - α^(k+1)) / (1 - α),   cost(k) = t(k+1)/t(1) + k·c_draft,

and drafts nothing (k = 0, plain AR) when no k beats AR by a margin. While off it probes
again with exponential back-off so a drafter that starts paying is switched back on.

The geometric model fits drafters whose guesses fail independently (a draft model). Copying
drafters fail in bursts: a copied passage is either taken whole or left at an edit, so the
tokens kept per step are far from geometric and the model keeps drafts too short. With
``survival=True`` the controller also learns the survival curve S(j) = P(depth j is accepted)
itself: a Kaplan-Meier estimate from decayed counts of how many drafts reached depth j and how
many failed there (a fully accepted draft is a censored observation), shrunk towards the
geometric curve of the current α where few drafts reached that deep (or towards a calibrated
prior curve ``prior_survival``, see ``speclive.drafting.priors``). Then
E[tokens | k] = 1 + S(1) + ... + S(k).

``state()`` / ``load_state()`` export and restore what a controller has learned, so a new
process can start from it (``speclive.knowledge``).

A drafter sees its target only through a ``DraftTarget`` handed to ``start``: the name,
tokenizer and vocabulary size, the limit on tree branches and the cost curve to read. The
decoder builds it (``TargetView.of``) with the curve of the threads the target computes with
while this drafter drafts, so no drafter reads a backend's internals or depends on when a
backend's attribute changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from speclive.backends.base import Backend, CostCurve
from speclive.drafting.tree import DraftTree
from speclive.tokenizer import Tokenizer


class DraftTarget(Protocol):
    """What a drafter reads of the target it drafts for (``Drafter.start``'s argument)."""

    #: the target model's name (error messages)
    name: str
    tokenizer: Tokenizer
    vocab_size: int
    #: the verification-cost curve t(k)/t(1) the drafter plans with
    cost: CostCurve
    #: most leaves one verification tree may hold (None: no limit)
    max_tree_branches: int | None


@dataclass(frozen=True)
class TargetView:
    """A ``DraftTarget`` built from a backend, with the cost curve chosen by the decoder."""

    name: str
    tokenizer: Tokenizer
    vocab_size: int
    cost: CostCurve
    max_tree_branches: int | None = None

    @classmethod
    def of(cls, target: Backend, cost: CostCurve | None = None) -> TargetView:
        """``target`` as a drafter sees it; ``cost``: the curve to read (default: ``target.cost``)."""
        return cls(
            target.name,
            target.tokenizer,
            target.vocab_size,
            target.cost if cost is None else cost,
            target.max_tree_branches,
        )


class ProbeBackoff:
    """When a drafter that is switched off tries again: after ``wait`` steps off, a probe.

    ``wait`` starts at ``first`` and doubles (up to ``cap``) after a probe that did not pay;
    ``reset`` brings it back once drafting pays. Shared by the length controller (one chain)
    and the suffix drafter (a whole tree).
    """

    def __init__(self, first: int, cap: int = 256):
        self.first = first
        self.cap = cap
        self.wait = first
        #: steps off since the last probe or draft
        self.off_steps = 0

    def due(self) -> bool:
        return self.off_steps >= self.wait

    def tick(self) -> bool:
        """Count one step off; True when a probe is due now (the wait then doubles)."""
        self.off_steps += 1
        if not self.due():
            return False
        self.off_steps = 0
        self.grow()
        return True

    def grow(self) -> None:
        self.wait = min(self.wait * 2, self.cap)

    def reset(self) -> None:
        self.wait = self.first

    def load(self, wait: int, off_steps: int | None = None) -> None:
        """Restore a saved wait (clamped to [first, cap]) and, if given, the steps off."""
        self.wait = min(max(int(wait), self.first), self.cap)
        if off_steps is not None:
            self.off_steps = max(0, int(off_steps))


@dataclass
class AdaptiveConfig:
    #: longest draft (chain length) ever proposed
    max_len: int = 16
    #: initial guess of the per-token acceptance rate
    prior_alpha: float = 0.6
    #: weight of the newest observation in the acceptance estimate
    ema: float = 0.15
    #: drafting must beat AR by this factor in expectation, else it is switched off
    min_gain: float = 1.03
    #: steps without drafting before the first probe when off (doubles after each failed probe)
    probe_after: int = 8
    #: length of a probe draft
    probe_len: int = 2
    #: disable adaptation: always draft ``max_len``
    fixed: bool = False
    #: learn the per-depth survival curve instead of assuming geometric acceptance (see module doc)
    survival: bool = False
    #: per-update decay of the survival counts (memory of roughly 1/decay drafts)
    survival_decay: float = 0.05
    #: pseudo-drafts of the prior curve mixed into each depth's estimate
    survival_prior: float = 2.0
    #: prior S(1..max_len) the survival estimate shrinks towards (None: geometric at α); it
    #: holds at α = ``prior_alpha``, its hazards scale with 1 - α as α is learned
    prior_survival: tuple[float, ...] | None = None


class AdaptiveLength:
    def __init__(self, config: AdaptiveConfig | None = None):
        self.cfg = config or AdaptiveConfig()
        self.alpha = self.cfg.prior_alpha
        self.target_cost: CostCurve | None = None
        self.draft_ratio = 0.0  # cost of one drafted token in units of one target step
        self.backoff = ProbeBackoff(self.cfg.probe_after)
        self.off = False
        # measured vs modelled seconds of drafting steps (EMAs): the model misses overheads
        # (draft-cache sync, Python, logits copies), the measurement does not
        self._obs_s: float | None = None
        self._pred_s: float | None = None
        # survival mode: decayed counts of drafts that reached depth j / were rejected at depth j
        n = self.cfg.max_len + 1
        self._reach = [0.0] * n
        self._fail = [0.0] * n

    def _model_cost(self, k: int) -> float:
        """Modelled cost of a step drafting ``k`` tokens, in target single-step units."""
        ratio = self.target_cost.ratio(k + 1) if self.target_cost else 1.0 + 0.5 * k
        return ratio + k * self.draft_ratio

    @property
    def cost_scale(self) -> float:
        """Measured / modelled cost of drafting steps (1 until measured; clamped to [0.5, 4])."""
        if not self._obs_s or not self._pred_s:
            return 1.0
        return min(4.0, max(0.5, self._obs_s / self._pred_s))

    def expected_speedup(self, k: int, alpha: float | None = None, extra: float = 0.0) -> float:
        """Expected speedup of a ``k``-token draft at acceptance ``alpha`` (default: the
        estimate), with ``extra`` one-off cost (target-step units) charged to this step."""
        return self._expected_tokens(k, alpha)[k - 1] / (self._model_cost(k) * self.cost_scale + extra)

    def _expected_tokens(self, k_max: int, alpha: float | None = None) -> list[float]:
        """E[tokens | k] for k = 1..``k_max``: from the learned survival curve (survival mode,
        ``alpha`` None), else geometric at ``alpha`` (default: the estimate)."""
        if alpha is None and self.cfg.survival:
            out, total = [], 1.0
            for s in self.survival_curve()[:k_max]:
                total += s
                out.append(total)
            return out
        a = min(max(self.alpha if alpha is None else alpha, 0.0), 0.999)
        return [(1 - a ** (k + 1)) / (1 - a) for k in range(1, k_max + 1)]

    def _best(self, alpha: float | None = None, extra: float = 0.0) -> tuple[int, float]:
        """(k, expected speedup) of the best length in 1..max_len."""
        scale = self.cost_scale
        speedups = [
            tokens / (self._model_cost(k) * scale + extra)
            for k, tokens in enumerate(self._expected_tokens(self.cfg.max_len, alpha), start=1)
        ]
        best = max(range(len(speedups)), key=speedups.__getitem__)  # the shortest among ties
        return best + 1, speedups[best]

    def survival_curve(self) -> list[float]:
        """Estimated S(1..max_len): the probability that draft depth j is accepted."""
        a = min(max(self.alpha, 0.0), 0.999)
        w = self.cfg.survival_prior
        prior = self.cfg.prior_survival
        out, s = [], 1.0
        # a prior curve holds at the prior acceptance; as the learned α moves away from it the
        # prior hazards scale with 1 - α, so what shallow depths teach reaches the deep ones
        scale = (1.0 - a) / max(1.0 - min(self.cfg.prior_alpha, 0.999), 1e-3)
        for j in range(1, self.cfg.max_len + 1):
            h0 = 1.0 - a
            if prior is not None and j <= len(prior):
                before = prior[j - 2] if j >= 2 else 1.0
                h0 = min(1.0, (1.0 - prior[j - 1] / before if before > 0 else 1.0) * scale)
            hazard = (self._fail[j] + w * h0) / (self._reach[j] + w)
            s *= 1.0 - min(max(hazard, 0.0), 1.0)
            out.append(s)
        return out

    def ceiling(self, alpha: float, extra: float = 0.0) -> float:
        """Best expected speedup over every length if ``alpha`` of the drafts were accepted.

        Below 1 + margin nothing can pay, however well the drafter guesses: a probe (which
        for a draft model means re-syncing its cache, ``extra``) would be wasted.
        """
        return self._best(alpha, extra)[1]

    def observe_step(self, drafted: int, seconds: float, committed: int = 1) -> None:
        """Wall time of one drafting step (draft + verify) that drafted ``drafted`` tokens and
        committed ``committed`` (accepted + bonus)."""
        t1 = self.target_cost.step_seconds() if self.target_cost else None
        if drafted <= 0 or not t1 or seconds <= 0:
            return
        pred = t1 * self._model_cost(drafted)
        e = self.cfg.ema
        self._obs_s = seconds if self._obs_s is None else (1 - e) * self._obs_s + e * seconds
        self._pred_s = pred if self._pred_s is None else (1 - e) * self._pred_s + e * pred

    def best_length(self) -> int:
        if self.cfg.fixed:
            return self.cfg.max_len
        k, best = self._best()
        return k if best > 1.0 and best >= self.cfg.min_gain else 0

    def length(self) -> int:
        """Draft length to use for the next step (0 = do not draft)."""
        k = self.best_length()
        if k > 0:
            self.off = False
            self.backoff.reset()
            return k
        self.off = True
        return self.cfg.probe_len if self.backoff.tick() else 0

    def state(self) -> dict:
        """What this controller has learned, as plain JSON-able values (``load_state`` inverse)."""
        return {
            "alpha": self.alpha,
            "draft_ratio": self.draft_ratio,
            "obs_s": self._obs_s,
            "pred_s": self._pred_s,
            "reach": list(self._reach),
            "fail": list(self._fail),
            "off": self.off,
            "backoff": self.backoff.wait,
        }

    def load_state(self, st: dict) -> None:
        """Restore ``state()`` output; a malformed entry raises ``ValueError`` (nothing changed)."""
        n = self.cfg.max_len + 1
        reach = [float(x) for x in st.get("reach", [])]
        fail = [float(x) for x in st.get("fail", [])]
        if reach and (len(reach) != len(fail) or any(x < 0 for x in reach + fail)):
            raise ValueError("survival counts must be two equally long lists of counts >= 0")
        alpha = float(st["alpha"])
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"acceptance estimate {alpha} outside [0, 1]")
        obs, pred = st.get("obs_s"), st.get("pred_s")
        backoff = int(st.get("backoff", self.cfg.probe_after))
        draft_ratio = max(0.0, float(st.get("draft_ratio", 0.0)))
        self.alpha = alpha
        self.draft_ratio = draft_ratio
        self._obs_s = float(obs) if obs else None
        self._pred_s = float(pred) if pred else None
        # a controller of another max_len keeps the depths both know
        self._reach = (reach + [0.0] * n)[:n] if reach else [0.0] * n
        self._fail = (fail + [0.0] * n)[:n] if fail else [0.0] * n
        self.off = bool(st.get("off", False))
        self.backoff.load(backoff)

    def update(self, drafted: int, accepted: int) -> None:
        """Account one verification: ``accepted`` of the ``drafted`` chain tokens were kept.

        A chain of k drafts with per-token acceptance α keeps a geometric number of tokens;
        we fold every drafted position into the estimate: accepted ones as hits, the first
        rejected one as a miss (later positions are not observations: they were never reached).
        """
        if drafted <= 0:
            return
        e = self.cfg.ema
        for _ in range(accepted):
            self.alpha = (1 - e) * self.alpha + e
        if accepted < drafted:
            self.alpha = (1 - e) * self.alpha
        if self.cfg.survival:
            keep = 1.0 - self.cfg.survival_decay
            self._reach = [c * keep for c in self._reach]
            self._fail = [c * keep for c in self._fail]
            deepest = min(accepted + 1, drafted, self.cfg.max_len)
            for j in range(1, deepest + 1):
                self._reach[j] += 1.0
            if accepted < drafted and accepted + 1 <= self.cfg.max_len:
                self._fail[accepted + 1] += 1.0


@dataclass
class StepFeedback:
    """What the decoder reports to the drafter after verifying its tree."""

    tree: DraftTree
    #: accepted node indices of ``tree`` (a root-anchored chain)
    accepted: Sequence[int]
    #: the target's token after the accepted path
    bonus: int
    #: time of the step (drafting, its own target pass, accepting); None when the step is no
    #: drafting measurement (it also evaluated a prompt tail, or its pass shared a decode with
    #: other states' passes)
    seconds: float | None = None
    #: tokens the step committed (accepted + bonus)
    committed: int = 1


class Drafter(ABC):
    """Proposes draft trees; one instance serves one generation at a time.

    The protocol, in the order the decoder calls it:

    - ``start(target, context)``: a generation starts from ``context``; ``target`` (a
      ``DraftTarget``) is what the drafter may know of the target, its cost curve included;
    - ``propose(context, budget)``: a tree continuing the committed ``context``, each step;
    - ``feedback(step)``: what the target kept of that tree and what the step cost;
    - ``end()``: the generation is over (or abandoned); ``close()``: free held resources.

    ``knowledge()`` / ``load_knowledge()`` are the state ``speclive.knowledge`` persists.

    A drafter never changes the target: what it needs from it is declared (``target_threads``)
    and applied by the decoder. Its draft-length controller (``adaptive``) is built by the
    caller and handed in; the decoder's feedback is what it learns from.

    ``prepared_draft(budget)`` is for an engine that verifies one draft per request (the vLLM
    engine): a drafter that knows its whole draft before the generation starts returns it.
    """

    name = "drafter"
    #: extra text for stats lines
    detail = ""
    #: CPU threads the target should compute with while this drafter drafts (None: as it is);
    #: the decoder applies it to a target with ``settable_threads``
    target_threads: int | None = None

    def __init__(self, adaptive: AdaptiveLength | None = None):
        #: the draft-length controller (None: the drafter picks its drafts another way)
        self.adaptive = adaptive
        #: the target as ``start`` handed it (None before the first generation)
        self.target: DraftTarget | None = None
        # seconds of one-off work inside ``propose`` since the last measured step (a draft
        # cache catching up on a new prompt or after a pause); kept out of the per-step cost
        # the controller learns
        self._oneoff_s = 0.0

    def start(self, target: DraftTarget, context: Sequence[int]) -> None:
        """A generation starts from ``context``; ``target`` says what the drafter may know of
        the target (its cost curve included): reset per-request state."""
        self.target = target
        if self.adaptive is not None:
            self.adaptive.target_cost = target.cost

    @abstractmethod
    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        """A tree continuing ``context`` (committed tokens) with at most ``budget`` nodes."""

    def prepared_draft(self, budget: int) -> DraftTree | None:
        """The draft this drafter holds before the generation starts, as one tree of at most
        ``budget`` nodes (for an engine that verifies one draft per request); None when it
        drafts step by step only (the default)."""
        return None

    def feedback(self, step: StepFeedback) -> None:
        """The verification of the last proposed tree: the controller learns acceptance and,
        from a measured step, its cost."""
        if self.adaptive is None:
            return
        self.adaptive.update(step.tree.max_depth(), len(step.accepted))
        seconds = self._step_cost(step)
        if seconds is not None:
            self.adaptive.observe_step(step.tree.max_depth(), seconds, step.committed)

    def _step_cost(self, step: StepFeedback) -> float | None:
        """Seconds of a measured step without the one-off work since the last one (paid once
        per prompt or pause: folding it into the per-step cost would switch a useful drafter
        off); None when there is nothing to learn from."""
        if step.seconds is None:
            return None
        seconds, self._oneoff_s = step.seconds - self._oneoff_s, 0.0
        return seconds if seconds > 0 else None

    def knowledge(self) -> dict:
        """What this drafter has learned that is worth keeping across processes (JSON-able);
        ``speclive.knowledge`` saves it and hands it back to ``load_knowledge`` on the next start."""
        return {"adaptive": self.adaptive.state()} if self.adaptive is not None else {}

    def load_knowledge(self, data: dict) -> None:
        """Restore ``knowledge()`` output (raises ``ValueError``/``KeyError``/``TypeError`` when
        it does not fit this drafter: the caller then ignores the saved file)."""
        if "adaptive" in data and self.adaptive is not None:
            self.adaptive.load_state(data["adaptive"])

    def end(self) -> None:
        """A generation finished (or was abandoned): stop background work."""

    def close(self) -> None:
        """Free held resources (draft model states)."""
