"""SpecASR drafter (Wei et al. 2025): long adaptive drafts, draft recycling, a two-pass sparse tree.

Works with any draft ``Backend`` sharing the target's vocabulary (a shallow self-draft of
Whisper base, or tiny.en -> medium.en). Each technique is switchable for an ablation:

- **adaptive single-sequence prediction** (``adaptive``): draft greedily up to ``max_len`` (24)
  tokens and stop at the first position whose normalized top probability is below
  ``threshold`` (0.4). Off: always draft ``max_len`` tokens.
- **draft sequence recycling** (``recycle``): the unaccepted rest of the previous draft is kept;
  while regenerating after a rejection, each new token is compared with the old sequence at the
  same or an adjacent position (a substitution, insertion or deletion), and on a match the old
  continuation is reused instead of being decoded again.
- **two-pass sparse token tree** (``sparse_tree``): pass 1 does not stop at uncertain positions
  but marks them with their second-best token and keeps drafting the trunk; pass 2 grows a
  branch from each marked position (most uncertain first), decoding a branch only until it
  re-joins the trunk at the same or an adjacent position, after which the trunk's rest is
  copied under it (recycling, no draft work).
- **tree-attention verification** (``tree_verify``): the target verifies trunk and branches in
  one pass with a tree mask. Off: only the trunk is verified (branches are not used).

Drafting happens in the *draft's* token space; a ``VocabBridge`` maps the committed context
into it and every drafted path (trunk, trunk prefix + branch) back to target ids, and the paths
are merged into one ``DraftTree`` by longest common prefix. ``IdentityBridge`` serves a draft
with the target's vocabulary; ``asr.whisper_bridge.WhisperBridge`` maps tiny.en <-> base through
text, so all techniques work across vocabularies too. Recycling aligns the previous draft with
the new context in draft space (longest common prefix; the token after it was rejected).

Losslessness is the engine's: the target verifies every node with the greedy rule.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from speclive.backends.base import Backend, common_prefix_len
from speclive.drafting.base import AdaptiveConfig, AdaptiveLength, Drafter, DraftTarget
from speclive.drafting.tree import DraftTree
from speclive.errors import ConfigError


@dataclass
class SpecASRConfig:
    #: longest trunk drafted in one step (paper: 24)
    max_len: int = 24
    #: normalized top probability below which a position is uncertain (paper: 0.4)
    threshold: float = 0.4
    #: stop the trunk at the first uncertain position (off: always ``max_len``, no truncation)
    adaptive: bool = True
    #: reuse unaccepted draft tokens of the previous step
    recycle: bool = False
    #: mark uncertain positions and expand branches there (two-pass sparse tree)
    sparse_tree: bool = False
    #: verify branches with tree attention in the same target pass (off: trunk only)
    tree_verify: bool = True
    #: most branches grown in pass 2
    max_branches: int = 3
    #: most tokens decoded for one branch before it must have re-joined the trunk
    branch_len: int = 3
    #: in tree mode the trunk still stops where the top probability falls below this
    trunk_floor: float = 0.1
    #: positions compared around the aligned one when matching (1 = same or adjacent)
    match_window: int = 1
    #: also stop the trunk once one more token no longer pays for itself on the measured costs:
    #: its probability of being accepted (the product of the draft's top probabilities so
    #: far) times one target step must exceed the extra verification row it costs (t(k+1) -
    #: t(k) on the target's cost curve) plus, for a token still to be decoded, one draft step
    cost_stop: bool = False


def _top2(logits: np.ndarray) -> tuple[int, float, int, float]:
    """Best and second-best token with their normalized probabilities (one exp pass, float32)."""
    z = np.asarray(logits, dtype=np.float32)
    i1 = int(np.argmax(z))
    e = np.exp(z - z[i1])  # -inf -> 0; the best token's term is exactly 1
    s = float(e.sum(dtype=np.float64))
    e[i1] = -1.0
    i2 = int(np.argmax(e))
    return i1, 1.0 / s, i2, float(e[i2]) / s


class VocabBridge(ABC):
    """Maps committed target context into draft ids and drafted paths back to target ids."""

    @abstractmethod
    def to_draft(self, context: Sequence[int]) -> list[int]: ...

    @abstractmethod
    def to_target(self, context: Sequence[int], path: Sequence[int]) -> list[int]:
        """Target ids continuing ``context`` for the draft ids ``path`` (may be shorter)."""

    def draft_eos(self) -> set[int]:
        return set()


class IdentityBridge(VocabBridge):
    """Draft and target share one vocabulary."""

    def __init__(self, eos: set[int]):
        self._eos = set(eos)

    def to_draft(self, context: Sequence[int]) -> list[int]:
        return list(context)

    def to_target(self, context: Sequence[int], path: Sequence[int]) -> list[int]:
        return list(path)

    def draft_eos(self) -> set[int]:
        return self._eos


class SpecASRDrafter(Drafter):
    name = "specasr"

    def __init__(
        self, draft: Backend, config: SpecASRConfig | None = None, bridge: VocabBridge | None = None
    ):
        cfg = config or SpecASRConfig()
        if not 0.0 <= cfg.threshold < 1.0:
            raise ConfigError(f"confidence threshold must be in [0, 1), got {cfg.threshold}")
        if cfg.max_len < 1:
            raise ConfigError(f"max_len must be >= 1, got {cfg.max_len}")
        # lengths come from the draft's confidence: the controller only records acceptance
        super().__init__(AdaptiveLength(AdaptiveConfig(max_len=cfg.max_len, fixed=True)))
        self.cfg = cfg
        self.draft = draft
        self.bridge = bridge
        self.state = draft.new_state()
        self.detail = f"draft={draft.name}"
        #: the last draft context + trunk, in draft ids (for recycling)
        self._last: list[int] = []
        self._last_probs: list[float] = []
        #: stats: draft tokens reused without decoding
        self.recycled = 0

    def start(self, target: DraftTarget, context: Sequence[int]) -> None:
        super().start(target, context)
        if self.bridge is None:
            if self.draft.vocab_size != target.vocab_size:
                raise ConfigError(
                    f"draft {self.draft.name} (vocab {self.draft.vocab_size}) and target {target.name} "
                    f"(vocab {target.vocab_size}) do not share a vocabulary: pass a VocabBridge"
                )
            self.bridge = IdentityBridge(target.tokenizer.eos_ids)
        self._last, self._last_probs = [], []

    # ---- helpers --------------------------------------------------------------------
    def _match(self, token: int, i: int, seq: Sequence[int]) -> int:
        """Index ``j`` of ``seq`` with ``seq[j] == token`` and ``|j - i| <= window`` (aligned first)."""
        w = self.cfg.match_window
        for j in sorted(range(i - w, i + w + 1), key=lambda j: abs(j - i)):
            if 0 <= j < len(seq) and seq[j] == token:
                return j
        return -1

    def _old_rest(self, dctx: list[int]) -> tuple[list[int], list[float]]:
        """The previous draft's continuation aligned after ``dctx`` (recycling candidates)."""
        if not self.cfg.recycle or not self._last:
            return [], []
        p = common_prefix_len(self._last, dctx)
        if p < len(dctx) - 1 or p >= len(self._last):
            return [], []  # the context moved past the old draft or elsewhere: nothing to reuse
        # dctx[:p] agrees; dctx[p] (if any) replaced the old token at p
        start = p + 1 if p < len(dctx) else p
        n_ctx_old = len(self._last) - len(self._last_probs)
        probs = self._last_probs[max(0, start - n_ctx_old) :]
        return self._last[start:], probs

    # ---- cost model -----------------------------------------------------------------
    def _costs(self) -> tuple[Any, float]:
        """The target's cost curve and one draft step in units of one target step."""
        tc = self.target.cost
        t1, d1 = tc.unit_seconds(), self.draft.cost.unit_seconds()
        return tc, (d1 / t1 if t1 and d1 else 0.3)

    @staticmethod
    def _row_cost(tc: Any, n: int) -> float:
        """Extra target cost (in target steps) of verifying ``n + 1`` draft tokens instead of ``n``."""
        return max(0.0, tc.optimistic_ratio(n + 2) - tc.optimistic_ratio(n + 1))

    # ---- pass 1: the trunk ----------------------------------------------------------
    def _trunk(self, dctx: list[int], budget: int) -> tuple[list[int], list[float], list[tuple]]:
        cfg = self.cfg
        assert self.bridge is not None
        logits = self.draft.sync(self.state, dctx)[-1]
        tokens: list[int] = []
        probs: list[float] = []
        marks: list[tuple[int, int, float]] = []  # (position, 2nd-best token, top1 - top2)
        old, old_probs = self._old_rest(dctx)
        limit = min(cfg.max_len, budget)
        eos = self.bridge.draft_eos()
        tc, draft_cost = self._costs() if cfg.cost_stop else (None, 0.0)
        cum = 1.0  # probability that every token so far is accepted (draft's estimate)
        while len(tokens) < limit:
            t1, p1, t2, p2 = _top2(logits)
            cum *= p1
            if tc is not None and cum < self._row_cost(tc, len(tokens)):
                break
            if p1 < cfg.threshold:
                if cfg.sparse_tree:
                    if cfg.adaptive and p1 < cfg.trunk_floor:
                        break
                    marks.append((len(tokens), t2, p1 - p2))
                elif cfg.adaptive:
                    break
            tokens.append(t1)
            probs.append(p1)
            if t1 in eos:
                break
            j = self._match(t1, len(tokens) - 1, old) if old else -1
            if j >= 0:
                # recycling: the old draft re-aligns here; reuse its continuation undecoded
                rest = old[j + 1 : j + 1 + limit - len(tokens)]
                rest_p = (old_probs[j + 1 : j + 1 + len(rest)] + [1.0] * len(rest))[: len(rest)]
                if tc is not None:  # recycled tokens cost no drafting, only verification rows
                    n = 0
                    while n < len(rest) and cum * rest_p[n] >= self._row_cost(tc, len(tokens) + n):
                        cum *= rest_p[n]
                        n += 1
                    rest, rest_p = rest[:n], rest_p[:n]
                tokens.extend(rest)
                probs.extend(rest_p)
                self.recycled += len(rest)
                break
            if (
                len(tokens) >= 2
                and tc is not None
                and cum * p1 < self._row_cost(tc, len(tokens)) + draft_cost
            ):
                break  # the next token (guessed as likely as this one) would not pay its draft step
            # (the second token is always decoded: the draft's step time stays measured)
            if len(tokens) < limit:
                logits = self.draft.extend(self.state, [t1])[-1]
        return tokens, probs, marks

    # ---- pass 2: sparse branches ----------------------------------------------------
    def _branches(self, dctx: list[int], trunk: list[int], marks: list[tuple]) -> list[list[int]]:
        """Draft-id paths (from the context) through each branch, re-joined to the trunk."""
        cfg = self.cfg
        paths = []
        eos = self.bridge.draft_eos() if self.bridge else set()
        chosen = sorted(marks, key=lambda m: m[2])[: cfg.max_branches]  # most uncertain first
        # decode the chosen branches last position first: the draft cache then only ever moves
        # back along the trunk (a truncation, free) instead of re-decoding trunk tokens
        for pos, alt, _margin in sorted(chosen, key=lambda m: -m[0]):
            branch = [alt]
            joined: list[int] = []
            if alt not in eos:
                logits = self.draft.sync(self.state, dctx + trunk[:pos] + [alt])[-1]
                rel = trunk[pos + 1 :]  # trunk positions after the replaced one
                for _ in range(cfg.branch_len):
                    t1, p1, _t2, _p2 = _top2(logits)
                    j = self._match(t1, len(branch) - 1, rel)
                    if j >= 0:
                        joined = rel[j:]  # recycling: the trunk's rest, not decoded again
                        self.recycled += len(joined)
                        break
                    if p1 < cfg.threshold or t1 in eos:
                        break
                    branch.append(t1)
                    logits = self.draft.extend(self.state, [t1])[-1]
            paths.append(trunk[:pos] + branch + joined)
        return paths

    # ---- protocol -------------------------------------------------------------------
    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        if budget <= 0:
            return DraftTree()
        assert self.bridge is not None, "start() the drafter on a target first"
        dctx = self.bridge.to_draft(context)
        trunk, probs, marks = self._trunk(dctx, budget)
        self._last, self._last_probs = dctx + trunk, probs
        ids = self.bridge.to_target(context, trunk)
        tree = DraftTree.chain(
            ids, probs=probs[: len(ids)] if len(probs) >= len(ids) else None, source=self.name
        )
        if self.cfg.sparse_tree and self.cfg.tree_verify and marks:
            for path in self._branches(dctx, trunk, marks):
                extra = self.bridge.to_target(context, path)
                if extra:
                    tree = tree.merge(DraftTree.chain(extra, source="branch"))
        return tree.truncated(budget)

    def close(self) -> None:
        self.draft.release(self.state)
