"""Hybrid drafter: a draft model's chain fused with the retrieval tree (Talon's T_combine).

Each step the retrieval candidates (``SuffixDrafter.retrieve``) are built first: they cost
next to nothing. The draft model runs only when it is expected to pay *on top of* retrieval:
its ``AdaptiveLength`` controller (per-token acceptance α of model-drafted nodes, draft/target
step-cost ratio, the target's cost curve) proposes a chain length k, and the model drafts when
its expected gain beats the best retrieval tree's by ``model_margin`` (with the controller's
periodic probes when it is off). Where a draft step costs a large fraction of a target step
(a small model drafting for one a few times larger, on a CPU) the model mostly stays off and
the hybrid degrades gracefully to retrieval drafting; where the draft model is cheap relative
to its target (a GPU, or a far smaller draft) it drafts.

The model chain carries its draft probabilities, so its nodes are scored like retrieval nodes
(path probability × learned calibration) and the fused tree is selected by the same
expected-tokens-per-time rule. Shared prefixes are verified once (longest-prefix fusion).

``ModelSource`` wraps the draft backend and keeps its KV cache in sync with a token sequence;
the asynchronous drafter reuses it from a worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from speclive.backends.base import Backend
from speclive.drafting.base import AdaptiveConfig, AdaptiveLength, DraftTarget
from speclive.drafting.datastore import SuffixDatastore
from speclive.drafting.model import DEFAULT_WINDOW, catch_up_cost, draft_chain, window_start
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
    #: the model is not even probed when this acceptance rate would not make it pay (drafts
    #: plus the catch-up prefill of its cache, which fell behind while it was off)
    ceiling_alpha: float = 0.9
    #: the draft model reads the last this many tokens of the prompt (None: all; see ``model``)
    window: int | None = DEFAULT_WINDOW


class ModelSource:
    """A draft backend whose cache follows a token sequence; drafts greedy chains.

    Like the model drafter it reads the context from a start fixed per generation (``begin``:
    the last ``window`` prompt tokens), so a late first draft does not prefill a long prompt.
    """

    def __init__(self, draft: Backend, threshold: float = 0.4, window: int | None = DEFAULT_WINDOW):
        self.draft = draft
        self.threshold = threshold
        self.window = window
        self.start = 0
        self.state = draft.new_state()
        self.seconds = 0.0
        self.steps = 0

    def begin(self, context: Sequence[int]) -> None:
        self.start = window_start(context, self.window)

    def catch_up(self, context: Sequence[int], draft_ratio: float) -> float:
        """Cost (target steps) of syncing the cache to ``context`` before drafting."""
        return catch_up_cost(self.draft, self.state, context[self.start :], draft_ratio)

    def chain(
        self, context: Sequence[int], k: int, stop: object = None, min_before_stop: int = 0
    ) -> tuple[list[int], list[float]]:
        """Up to ``k`` greedy draft tokens after ``context`` with their probabilities.

        ``stop`` (an object with ``is_set()``) is checked between draft steps once
        ``min_before_stop`` tokens are drafted.
        """
        t0 = time.perf_counter()
        logits = self.draft.sync(self.state, context[self.start :])[-1]
        d = draft_chain(
            self.draft, self.state, logits, k, self.threshold, stop=stop, min_before_stop=min_before_stop
        )
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
        adaptive: AdaptiveLength | None = None,
    ):
        hcfg = config or HybridConfig()
        if not 0.0 <= hcfg.threshold < 1.0:
            raise ConfigError(f"confidence threshold must be in [0, 1), got {hcfg.threshold}")
        # ``adaptive``: the length controller of the model chain
        super().__init__(
            datastore,
            suffix,
            adaptive
            or AdaptiveLength(AdaptiveConfig(max_len=hcfg.model_max_len, prior_alpha=hcfg.model_prior_alpha)),
        )
        self.hcfg = hcfg
        self.model = ModelSource(draft, self.hcfg.threshold, self.hcfg.window)
        self.model_runs = 0
        self.detail = f"draft={draft.name} datastore={self.store.n if self.store else 0} tokens"

    def start(self, target: DraftTarget, context: Sequence[int]) -> None:
        super().start(target, context)
        if self.model.draft.tokenizer.encode("Hello world") != target.tokenizer.encode("Hello world"):
            raise ConfigError(
                f"draft model {self.model.draft.name} does not share the tokenizer of {target.name}"
            )
        self.model.begin(context)

    def _draft_ratio(self) -> float:
        t_d = self.model.step_seconds()
        t_t = self._step_seconds()
        return t_d / t_t if t_d and t_t else 0.45

    def model_length(self, retrieval_gain: float | Callable[[], float], context: Sequence[int] = ()) -> int:
        """Model chain length to draft this step (0: the model does not pay over retrieval).

        ``retrieval_gain``: the best retrieval tree's expected gain, or a function computing it
        (a second tree selection, only run when the model could pay at all).
        """
        if self.hcfg.always_model:
            return self.hcfg.model_max_len
        ratio = self.adaptive.draft_ratio = self._draft_ratio()
        ceiling = self.adaptive.ceiling(self.hcfg.ceiling_alpha)
        if ceiling < self.hcfg.model_margin:
            # even near-perfect acceptance would not pay: do not even probe (a probe re-syncs
            # the draft cache, a prefill of the draft model when it has been off a while)
            return 0
        if callable(retrieval_gain):
            retrieval_gain = retrieval_gain()
        extra = self.model.catch_up(context, ratio) if context else 0.0
        bar = max(retrieval_gain, 1.0) * self.hcfg.model_margin
        if ceiling < bar or (extra and self.adaptive.ceiling(self.hcfg.ceiling_alpha, extra) < bar):
            return 0
        k = self.adaptive.length()
        if k <= 0:
            return 0
        if self.adaptive.off:  # a probe of the controller: always honoured
            return k
        if self.adaptive.expected_speedup(k) < retrieval_gain * self.hcfg.model_margin:
            return 0
        return k

    def _retrieval_gain(self, cand: Candidates, budget: int) -> float:
        nodes, gain = cand.select(budget, self._cost, self.lookup_cost(), self._max_leaves(), 0.0)
        return gain if nodes else 1.0

    def add_model_chain(self, cand: Candidates, toks: Sequence[int], probs: Sequence[float]) -> list[int]:
        if not toks:
            return []
        idx = cand.add_chain(toks, probs, self.calib.scale("model"), "model", "model")
        cand.chains["model"] = idx  # its accepted prefix feeds the model's controller
        return idx

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        cand = self.retrieve(context)
        draft_cost = self.lookup_cost()
        k = min(budget, self.model_length(lambda: self._retrieval_gain(cand, budget), context))
        model_idx: list[int] = []
        if k > 0:
            toks, probs = self.model.chain(context, k)
            self.model_runs += 1
            model_idx = self.add_model_chain(cand, toks, probs)
            draft_cost += len(toks) * self._draft_ratio()
        return self.choose(cand, budget, draft_cost, keep=model_idx)

    def chain_feedback(self, name: str, drafted: int, kept: int) -> None:
        if name == "model":
            self.adaptive.update(drafted, kept)
        else:
            super().chain_feedback(name, drafted, kept)

    def close(self) -> None:
        self.model.close()
