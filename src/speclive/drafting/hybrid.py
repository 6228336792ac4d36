"""Hybrid drafter: a draft model's chain fused with the retrieval tree (Talon's T_combine).

Each step the retrieval candidates (``SuffixDrafter.retrieve``) are built first: they cost
next to nothing. The draft model runs only when it is expected to pay *on top of* retrieval:
its ``AdaptiveLength`` controller (per-token acceptance α of model-drafted nodes, draft/target
step-cost ratio, the target's cost curve) proposes a chain length k, and the model drafts when
its expected gain beats the best retrieval tree's by ``model_margin`` (with the controller's
periodic probes when it is off). On this CPU a 0.5B draft step costs ~45% of a 1.5B target
step, so the model mostly stays off and the hybrid degrades gracefully to retrieval drafting;
where the draft model is cheap relative to its target (a GPU, or a far smaller draft) it drafts.

The model chain carries its draft probabilities, so its nodes are scored like retrieval nodes
(path probability × learned calibration) and the fused tree is selected by the same
expected-tokens-per-time rule. Shared prefixes are verified once (longest-prefix fusion).

``ModelSource`` wraps the draft backend and keeps its KV cache in sync with a token sequence;
the asynchronous drafter reuses it from a worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from speclive.backends.base import Backend
from speclive.drafting.base import AdaptiveConfig, AdaptiveLength
from speclive.drafting.datastore import SuffixDatastore
from speclive.drafting.model import draft_chain
from speclive.drafting.retrieval import Candidates
from speclive.drafting.suffix import SuffixConfig, SuffixDrafter
from speclive.drafting.tree import DraftTree
from speclive.errors import ConfigError


@dataclass
class HybridConfig:
    #: longest model-drafted chain
    model_max_len: int = 8
    #: stop a model chain when the draft's top probability falls below this
    threshold: float = 0.4
    #: the model drafts only if its expected gain is this factor above retrieval's
    model_margin: float = 1.02
    #: prior per-token acceptance of model drafts
    model_prior_alpha: float = 0.7
    #: draft with the model every step regardless of cost (fusion always on; tests, GPUs)
    always_model: bool = False
    #: the model is not even probed when this acceptance rate would not make it pay
    ceiling_alpha: float = 0.9


class ModelSource:
    """A draft backend whose cache follows a token sequence; drafts greedy chains."""

    def __init__(self, draft: Backend, threshold: float = 0.4):
        self.draft = draft
        self.threshold = threshold
        self.state = draft.new_state()
        self.seconds = 0.0
        self.steps = 0

    def chain(self, context: Sequence[int], k: int, stop: object = None) -> tuple[list[int], list[float]]:
        """Up to ``k`` greedy draft tokens after ``context`` with their probabilities.

        ``stop`` (an object with ``is_set()``) is checked between draft steps.
        """
        t0 = time.perf_counter()
        logits = self.draft.sync(self.state, context)[-1]
        d = draft_chain(self.draft, self.state, logits, k, self.threshold, stop=stop)
        toks, probs = d.tokens, d.probs
        self.seconds += time.perf_counter() - t0
        self.steps += max(1, len(toks))
        return toks, probs

    def step_seconds(self) -> float | None:
        return self.draft.cost.step_seconds()

    def close(self) -> None:
        self.draft.release(self.state)


class HybridDrafter(SuffixDrafter):
    name = "hybrid"

    def __init__(
        self,
        draft: Backend,
        datastore: SuffixDatastore | None = None,
        config: HybridConfig | None = None,
        suffix: SuffixConfig | None = None,
    ):
        super().__init__(datastore, suffix)
        self.hcfg = config or HybridConfig()
        if not 0.0 <= self.hcfg.threshold < 1.0:
            raise ConfigError(f"confidence threshold must be in [0, 1), got {self.hcfg.threshold}")
        self.model = ModelSource(draft, self.hcfg.threshold)
        self.model_ctl = AdaptiveLength(
            AdaptiveConfig(max_len=self.hcfg.model_max_len, prior_alpha=self.hcfg.model_prior_alpha)
        )
        self.model_runs = 0
        self._model_nodes: list[int] = []  # tree node indices drafted by the model in the last step
        self.detail = f"draft={draft.name} datastore={self.store.n if self.store else 0} tokens"

    def bind(self, target: Backend) -> None:
        super().bind(target)
        if self.model.draft.tokenizer.encode("Hello world") != target.tokenizer.encode("Hello world"):
            raise ConfigError(
                f"draft model {self.model.draft.name} does not share the tokenizer of {target.name}"
            )
        self.model_ctl.target_cost = target.cost

    def _draft_ratio(self) -> float:
        t_d = self.model.step_seconds()
        t_t = self._step_seconds()
        return t_d / t_t if t_d and t_t else 0.45

    def model_length(self, retrieval_gain: float) -> int:
        """Model chain length to draft this step (0: the model does not pay over retrieval)."""
        if self.hcfg.always_model:
            return self.hcfg.model_max_len
        self.model_ctl.draft_ratio = self._draft_ratio()
        if self.model_ceiling() < max(retrieval_gain, 1.0) * self.hcfg.model_margin:
            # even near-perfect acceptance would not pay: do not even probe (a probe re-syncs
            # the draft cache over the whole context, a prefill of the draft model)
            return 0
        k = self.model_ctl.length()
        if k <= 0:
            return 0
        if self.model_ctl.off:  # a probe of the controller: always honoured
            return k
        if self.model_ctl.expected_speedup(k) < retrieval_gain * self.hcfg.model_margin:
            return 0
        return k

    def model_ceiling(self) -> float:
        """Best expected speedup of a model chain if ``ceiling_alpha`` of its tokens were accepted."""
        a = self.hcfg.ceiling_alpha
        ratio = self.model_ctl.draft_ratio
        best = 0.0
        for k in range(1, self.hcfg.model_max_len + 1):
            tokens = (1 - a ** (k + 1)) / (1 - a)
            best = max(best, tokens / (self._cost(k + 1) + k * ratio))
        return best

    def _retrieval_gain(self, cand: Candidates, budget: int) -> float:
        nodes, gain = cand.select(budget, self._cost, self.lookup_cost(), self._max_leaves(), 0.0)
        return gain if nodes else 1.0

    def add_model_chain(self, cand: Candidates, toks: Sequence[int], probs: Sequence[float]) -> list[int]:
        return cand.add_chain(toks, probs, self.calib.scale("model"), "model", "model") if toks else []

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        cand = self.retrieve(context)
        draft_cost = self.lookup_cost()
        k = min(budget, self.model_length(self._retrieval_gain(cand, budget)))
        model_idx: list[int] = []
        if k > 0:
            toks, probs = self.model.chain(context, k)
            self.model_runs += 1
            model_idx = self.add_model_chain(cand, toks, probs)
            draft_cost += len(toks) * self._draft_ratio()
        tree = self.choose_tracking(cand, budget, draft_cost, model_idx)
        return tree

    def choose_tracking(
        self, cand: Candidates, budget: int, draft_cost: float, model_idx: Sequence[int]
    ) -> DraftTree:
        """``choose`` and remember which tree nodes the model drafted (for its controller)."""
        force = 0
        if self._off >= self._backoff:
            force = self.cfg.probe_nodes
        nodes, gain = cand.select(
            budget, self._cost, draft_cost, self._max_leaves(), self.cfg.min_gain, force
        )
        if model_idx and not nodes:
            # the model already paid for its chain: verify at least its first token
            nodes = [model_idx[0]]
        if nodes:
            self._backoff = min(self._backoff * 2, 256) if gain < self.cfg.min_gain else self.cfg.probe_after
            self._off = 0
        else:
            self._off += 1
        self._last = [(cand.key[i], cand.raw[i]) for i in nodes]
        pos = {c: j for j, c in enumerate(nodes)}
        self._model_nodes = [pos[c] for c in model_idx if c in pos]
        return cand.tree(nodes)

    def feedback(self, tree: DraftTree, accepted_nodes: Sequence[int], bonus: int) -> None:
        if self._model_nodes:
            acc = set(accepted_nodes)
            kept = 0
            for j in self._model_nodes:  # the model chain is root-anchored: count its accepted prefix
                if j not in acc:
                    break
                kept += 1
            self.model_ctl.update(len(self._model_nodes), kept)
            self._model_nodes = []
        super().feedback(tree, accepted_nodes, bonus)

    def close(self) -> None:
        self.model.close()
