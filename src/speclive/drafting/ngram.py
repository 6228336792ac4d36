"""Prompt-lookup drafter: copy what followed the longest earlier match of the context's suffix.

Free to run (a dictionary lookup), so it pays whenever the output repeats the input or itself:
code edits, quoting, re-translation. Two choices make it pay on a CPU, where verifying k
tokens costs far more than one step:

- **Longest match, not the latest short n-gram.** Every ``min_n``-gram indexes all its
  occurrences; a lookup extends each candidate backwards (up to ``max_match`` tokens) and
  takes the longest, latest match. A 2-gram that occurs ten times in a code file says
  little; a 20-token match says "we are copying this passage".
- **Acceptance per match-length bucket.** How much of a draft survives depends mostly on how
  long the match is, so each bucket (``buckets``: lower bounds of match length) has its own
  ``AdaptiveLength`` controller: long matches get long drafts, short ones short drafts or
  none, each chosen from the target's measured verification-cost curve.
- **Learned survival, not geometric acceptance.** A copy is taken whole or breaks at an edit,
  so each bucket's controller learns P(depth j accepted) directly (``AdaptiveConfig.survival``)
  instead of assuming an independent per-token rate, which kept drafts too short.

- **Prompt copies apart from self-repetition, calibrated cold start.** A continuation copied
  from the prompt (a code edit quoting its input) survives far longer than one copied from the
  output so far (a phrase the answer repeats), so each has its own bucket controllers
  (``by_bucket`` and ``output_buckets``). Each starts from the copy-survival curve measured on
  the committed benchmarks (``speclive.drafting.priors``): after a 16+ token match against the
  prompt a copy survives to depth 16 about 92 % of the time, so the very first draft after a
  long verbatim match is a long one (the whole copy at once, as prompt-lookup decoding does),
  not a few tokens grown step by step as a geometric prior would.

Replaying the greedy outputs of Qwen2.5-Coder-1.5B on the code-edit set against the measured
llama.cpp cost curve, this raised the achievable decode speedup from 1.39x (latest 4-gram, one
global acceptance estimate) to about 1.56x, and learned survival to about 1.61x (8 prompts,
greedy AR outputs of the committed run ``archive/decode-qwen1.5b-llamacpp``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from speclive.drafting.base import AdaptiveConfig, AdaptiveLength, Drafter, DraftTarget, StepFeedback
from speclive.drafting.priors import copy_survival
from speclive.drafting.tree import DraftTree
from speclive.errors import ConfigError

#: the match-length buckets, with the prior per-token acceptance of a copy after a match of at
#: least this many tokens where no survival curve is calibrated (``speclive.drafting.priors``)
BUCKET_PRIOR = {2: 0.45, 4: 0.6, 8: 0.8, 16: 0.9}

#: the copying drafters' length controller: learned survival (module docstring), a memory of
#: roughly 10 drafts; shared by this drafter and the suffix drafter's copied chain
COPY_ADAPTIVE = AdaptiveConfig(max_len=16, survival=True, survival_decay=0.1)

#: the n-gram drafter's longest draft by default. A whole copy in one pass pays where long passes
#: cost less per token than short ones (a CPU with wide vector units, a GPU); the controllers
#: choose the length from the target's cost curve, so where long passes are dear they stay short
NGRAM_MAX_DRAFT = 64


def bucket_controllers(
    base: AdaptiveConfig, buckets: Sequence[int], source: str = "prompt"
) -> dict[int, AdaptiveLength]:
    """One controller per match-length bucket, each starting from its bucket's priors: the
    calibrated survival curve of copies from ``source`` (survival mode) and a prior per-token
    acceptance."""
    out = {}
    for b in buckets:
        cfg = replace(base, prior_alpha=BUCKET_PRIOR.get(b, base.prior_alpha))
        curve = copy_survival(b, cfg.max_len, source) if cfg.survival and cfg.prior_survival is None else None
        if curve is not None:
            # the per-token acceptance of a geometric curve as likely to reach max_len
            alpha = max(curve[-1], 1e-3) ** (1.0 / len(curve))
            cfg = replace(cfg, prior_survival=curve, prior_alpha=min(max(alpha, 0.05), 0.99))
        out[b] = AdaptiveLength(cfg)
    return out


def controllers_state(ctls: dict[int, AdaptiveLength]) -> dict[str, dict]:
    return {str(b): c.state() for b, c in ctls.items()}


def load_controllers(ctls: dict[int, AdaptiveLength], data: dict) -> None:
    """Restore ``controllers_state`` output into the buckets both know (all or nothing)."""
    states = {int(b): st for b, st in data.items() if int(b) in ctls}
    backup = {b: ctls[b].state() for b in states}
    try:
        for b, st in states.items():
            ctls[b].load_state(st)
    except (ValueError, KeyError, TypeError):
        for b, st in backup.items():
            ctls[b].load_state(st)
        raise


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(
        self,
        min_n: int = 2,
        max_match: int = 32,
        max_candidates: int = 64,
        buckets: Sequence[int] = (2, 4, 8, 16),
        adaptive: AdaptiveLength | None = None,
        max_len: int = NGRAM_MAX_DRAFT,
    ):
        if min_n < 1 or max_match < min_n:
            raise ConfigError(f"ngram drafter needs 1 <= min_n <= max_match, got {min_n}, {max_match}")
        if not buckets or sorted(buckets) != list(buckets) or buckets[0] < min_n:
            raise ConfigError(f"buckets must be increasing match lengths >= min_n, got {list(buckets)}")
        # the controller handed in records every draft; its config is the base of the
        # bucket controllers, which choose the lengths
        super().__init__(adaptive or AdaptiveLength(replace(COPY_ADAPTIVE, max_len=max_len)))
        base = self.adaptive.cfg
        self.min_n, self.max_match, self.max_candidates = min_n, max_match, max_candidates
        self.buckets = tuple(int(b) for b in buckets)
        #: controllers of copies from the prompt / from the output so far, per bucket
        self.by_bucket = bucket_controllers(base, self.buckets, "prompt")
        self.output_buckets = bucket_controllers(base, self.buckets, "output")
        self._prompt_len = 0
        self._ctx: list[int] = []
        # min_n-gram -> start indices of the tokens that followed each occurrence (increasing)
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._last_ctl: AdaptiveLength | None = None
        #: match length of the last lookup (0 = none)
        self.last_match = 0

    def start(self, target: DraftTarget, context: Sequence[int]) -> None:
        super().start(target, context)
        for a in [*self.by_bucket.values(), *self.output_buckets.values()]:
            a.target_cost = target.cost
        self._reset(context)

    def _reset(self, context: Sequence[int]) -> None:
        """Index ``context`` from scratch; its tokens count as the prompt."""
        self._prompt_len = len(context)
        self._ctx = []
        self._index = {}
        self._sync(context)

    def _sync(self, context: Sequence[int]) -> None:
        ctx = self._ctx
        if len(context) < len(ctx) or (ctx and context[len(ctx) - 1] != ctx[-1]):
            self._reset(context)  # context was rewritten: rebuild
            return
        n = self.min_n
        for j in range(len(ctx), len(context)):
            ctx.append(int(context[j]))
            # index the n-gram ending at j-1: token j followed it
            if j - n >= 0:
                self._index.setdefault(tuple(ctx[j - n : j]), []).append(j)

    def match(self) -> tuple[int, int]:
        """(length, start of the continuation) of the longest earlier match of the suffix."""
        ctx, n = self._ctx, self.min_n
        if len(ctx) < n + 1:
            return 0, -1
        starts = self._index.get(tuple(ctx[-n:]))
        if not starts:
            return 0, -1
        end = len(ctx)
        best_len, best_start = 0, -1
        for start in reversed(starts[-self.max_candidates :]):  # latest first: ties keep the latest
            if start >= end:
                continue
            m = n
            while m < self.max_match and start - m - 1 >= 0 and ctx[start - m - 1] == ctx[end - m - 1]:
                m += 1
            if m > best_len:
                best_len, best_start = m, start
                if m >= self.max_match:
                    break
        return best_len, best_start

    def lookup(self, k: int) -> list[int]:
        """Up to ``k`` tokens following the longest match (no adaptivity)."""
        m, start = self.match()
        return self._ctx[start : start + k] if m else []

    def _bucket(self, m: int) -> int:
        return max(b for b in self.buckets if b <= m)

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        self._sync(context)
        m, start = self.match()
        self.last_match = m
        self._last_ctl = None
        if m < self.buckets[0]:
            return DraftTree()
        ctls = self.by_bucket if start < self._prompt_len else self.output_buckets
        ctl = ctls[self._bucket(m)]
        k = min(budget, ctl.length())
        if k <= 0:
            return DraftTree()
        self._last_ctl = ctl
        return DraftTree.chain(self._ctx[start : start + k], source=self.name)

    def knowledge(self) -> dict:
        return {
            **super().knowledge(),
            "buckets": controllers_state(self.by_bucket),
            "output_buckets": controllers_state(self.output_buckets),
        }

    def load_knowledge(self, data: dict) -> None:
        super().load_knowledge(data)
        load_controllers(self.by_bucket, data.get("buckets", {}))
        load_controllers(self.output_buckets, data.get("output_buckets", {}))

    def feedback(self, step: StepFeedback) -> None:
        # every draft updates the acceptance of the controller handed in; the bucket that
        # chose the draft also learns acceptance and step cost
        depth, kept = step.tree.max_depth(), len(step.accepted)
        self.adaptive.update(depth, kept)
        ctl = self._last_ctl
        if ctl is not None:
            ctl.update(depth, kept)
            if step.seconds is not None:
                ctl.observe_step(depth, step.seconds, step.committed)
