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

Losslessness is the engine's: the target verifies every node with the greedy rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from speclive.backends.base import Backend
from speclive.drafting.base import AdaptiveConfig, Drafter
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


def _top2(logits: np.ndarray) -> tuple[int, float, int, float]:
    """Best and second-best token with their normalized probabilities."""
    z = logits.astype(np.float64)
    m = z.max()
    e = np.exp(z - m)
    s = e.sum()
    i1 = int(np.argmax(z))
    z2 = z.copy()
    z2[i1] = -np.inf
    i2 = int(np.argmax(z2))
    return i1, float(e[i1] / s), i2, float(e[i2] / s)


class SpecASRDrafter(Drafter):
    name = "specasr"

    def __init__(self, draft: Backend, config: SpecASRConfig | None = None):
        cfg = config or SpecASRConfig()
        if not 0.0 <= cfg.threshold < 1.0:
            raise ConfigError(f"confidence threshold must be in [0, 1), got {cfg.threshold}")
        if cfg.max_len < 1:
            raise ConfigError(f"max_len must be >= 1, got {cfg.max_len}")
        super().__init__(AdaptiveConfig(max_len=cfg.max_len, fixed=True))
        self.cfg = cfg
        self.draft = draft
        self.state = draft.new_state()
        self.detail = f"draft={draft.name}"
        #: rest of the last draft after the rejected position (for recycling)
        self._old: list[int] = []
        self._old_probs: list[float] = []
        #: stats: draft forward passes and tokens reused without decoding
        self.draft_steps = 0
        self.recycled = 0

    def bind(self, target: Backend) -> None:
        super().bind(target)
        if self.draft.vocab_size != target.vocab_size:
            raise ConfigError(
                f"draft {self.draft.name} (vocab {self.draft.vocab_size}) and target {target.name} "
                f"(vocab {target.vocab_size}) do not share a vocabulary"
            )

    def begin(self, context: Sequence[int]) -> None:
        self._old, self._old_probs = [], []

    # ---- helpers --------------------------------------------------------------------
    def _step(self, token: int) -> np.ndarray:
        self.draft_steps += 1
        return self.draft.extend(self.state, [token])[-1]

    def _match(self, token: int, i: int, seq: Sequence[int]) -> int:
        """Index ``j`` of ``seq`` with ``seq[j] == token`` and ``|j - i| <= window`` (aligned first)."""
        w = self.cfg.match_window
        for j in sorted(range(i - w, i + w + 1), key=lambda j: abs(j - i)):
            if 0 <= j < len(seq) and seq[j] == token:
                return j
        return -1

    # ---- pass 1: the trunk ----------------------------------------------------------
    def _trunk(self, context: Sequence[int], budget: int) -> tuple[list[int], list[float], list[tuple]]:
        cfg = self.cfg
        logits = self.draft.sync(self.state, context)[-1]
        self.draft_steps += 1
        tokens: list[int] = []
        probs: list[float] = []
        marks: list[tuple[int, int, float]] = []  # (position, 2nd-best token, its margin)
        old = self._old if cfg.recycle else []
        old_probs = self._old_probs
        limit = min(cfg.max_len, budget)
        eos = self.target.tokenizer.eos_ids if self.target is not None else set()
        while len(tokens) < limit:
            t1, p1, t2, p2 = _top2(logits)
            uncertain = p1 < cfg.threshold
            if uncertain:
                if not cfg.sparse_tree and cfg.adaptive:
                    break
                if cfg.sparse_tree:
                    if p1 < cfg.trunk_floor and cfg.adaptive:
                        break
                    marks.append((len(tokens), t2, p1 - p2))
            tokens.append(t1)
            probs.append(p1)
            if t1 in eos:
                break
            i = len(tokens) - 1
            j = self._match(t1, i, old) if old else -1
            if j >= 0:
                # recycling: the old draft re-aligns here; reuse its continuation undecoded
                rest = old[j + 1 : j + 1 + limit - len(tokens)]
                tokens.extend(rest)
                probs.extend(old_probs[j + 1 : j + 1 + len(rest)])
                self.recycled += len(rest)
                break
            if len(tokens) < limit:
                logits = self._step(t1)
        return tokens, probs, marks

    # ---- pass 2: sparse branches ----------------------------------------------------
    def _branches(
        self, context: Sequence[int], tree: DraftTree, trunk: list[int], marks: list[tuple], budget: int
    ) -> None:
        cfg = self.cfg
        for pos, alt, _margin in sorted(marks, key=lambda m: m[2])[: cfg.max_branches]:
            if len(tree) >= budget:
                break
            # decode the branch after context + trunk[:pos] + alt until it re-joins the trunk
            branch = [alt]
            logits = self.draft.sync(self.state, list(context) + trunk[:pos] + [alt])[-1]
            self.draft_steps += 1
            joined: list[int] = []
            for _ in range(cfg.branch_len):
                t1, p1, _t2, _p2 = _top2(logits)
                rel = trunk[pos + 1 :]  # trunk positions after the replaced one
                j = self._match(t1, len(branch) - 1, rel)
                if j >= 0:
                    joined = rel[j:]
                    self.recycled += len(joined)
                    break
                if p1 < cfg.threshold:
                    break
                branch.append(t1)
                logits = self._step(t1)
            parent = pos - 1  # trunk node index == position
            for tok in branch + joined:
                if len(tree) >= budget:
                    return
                parent = tree.add(tok, parent, prob=0.0, source="branch")

    # ---- protocol -------------------------------------------------------------------
    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        if budget <= 0:
            return DraftTree()
        trunk, probs, marks = self._trunk(context, budget)
        tree = DraftTree.chain(trunk, probs=probs, source=self.name)
        if self.cfg.sparse_tree and self.cfg.tree_verify and marks and len(tree) < budget:
            self._branches(context, tree, trunk, marks, budget)
        return tree

    def feedback(self, tree: DraftTree, accepted_nodes: Sequence[int], bonus: int) -> None:
        super().feedback(tree, accepted_nodes, bonus)
        # the rejected continuation: from the last accepted node follow first children
        last = accepted_nodes[-1] if accepted_nodes else -1
        rest: list[int] = []
        rest_probs: list[float] = []
        kids = tree.children(last)
        node = kids[0] if kids else -1
        while node >= 0:
            rest.append(tree.tokens[node])
            rest_probs.append(tree.probs[node] if tree.probs else 1.0)
            kids = tree.children(node)
            node = kids[0] if kids else -1
        # rest[0] was replaced by the bonus token; what follows is aligned after it
        self._old, self._old_probs = rest[1:], rest_probs[1:]

    def close(self) -> None:
        self.draft.release(self.state)
