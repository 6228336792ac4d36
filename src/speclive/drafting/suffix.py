"""Suffix drafter: Talon's retrieval drafter M_r over a per-request and a global datastore.

Each step (Algorithm 1, twice):

1. the per-request store (prompt + output so far, ``RequestIndex``) and the global corpus store
   (``SuffixDatastore``, optional) each return the continuations of the longest suffix of the
   context they contain, with occurrence counts;
2. each is counted into a trie and pruned to the ``max_nodes`` most frequent nodes (the
   retrieval tree T_r with frequency-based pruning);
3. the trees are fused by longest-prefix matching and scored: a node's score is its empirical
   path probability (count / matches, with ``prior`` pseudo-counts) times a calibration factor
   learned online per (store, match-length bucket);
   the continuation of the *latest* longest request match (what the n-gram drafter copies) is
   fused in as a chain of its own, its node at depth d scored S_b(d), the survival curve learned
   per match-length bucket b (as the n-gram drafter learns it: a copy is taken whole or breaks
   at an edit): a long exact copy that keeps being accepted stays long, where path-probability
   scores decay with depth;
4. the verified tree is the prefix of nodes, by decreasing score, that maximises expected tokens
   per unit of time under the target's measured verification-cost curve; when no tree beats
   plain AR by ``min_gain`` nothing is drafted (with a periodic probe so calibration recovers).

**Free probes.** A probe (a few nodes verified although they are not expected to pay, so that a
switched-off chain or store can be switched back on) costs a verification pass: on a CPU a
1-node probe costs most of a step, and a drafter that is off on chat probes every 8-256
steps. But whether a probe would be accepted is already decided by the tokens the target
commits without it: under greedy acceptance a node is accepted exactly when it equals the
target's next token, which the plain AR step commits anyway. So probes are not sent; they are
kept and scored against the committed tokens at the next ``propose`` (``_resolve_free_probe``),
through the same learning as a verified probe (same calibration, same back-off). When
nothing pays, the drafter therefore verifies nothing at all and runs at AR speed, minus a
lookup.

Lookups are far cheaper than a target step; ``lookup_stats`` records their time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from speclive.backends.base import Backend
from speclive.drafting.base import AdaptiveLength, Drafter, DraftTarget, ProbeBackoff, StepFeedback
from speclive.drafting.datastore import DEFAULT_MAX_BYTES, SuffixDatastore
from speclive.drafting.ngram import (
    BUCKET_PRIOR,
    COPY_ADAPTIVE,
    bucket_controllers,
    controllers_state,
    load_controllers,
)
from speclive.drafting.retrieval import (
    Calibrator,
    Candidates,
    RequestIndex,
    bucket,
    count_tree,
    top_nodes,
)
from speclive.drafting.tree import DraftTree
from speclive.errors import ConfigError


@dataclass
class SuffixConfig:
    #: deepest draft (tokens of continuation considered per match)
    depth: int = 16
    #: retrieval tree size after frequency-based pruning (Talon's m), per store
    max_nodes: int = 32
    #: longest suffix matched (ℓ of Algorithm 1 starts here)
    max_match: int = 32
    #: per-request store: shortest suffix that counts as a match (its n-gram index key)
    request_min_n: int = 2
    #: largest learned factor between accepted and predicted draft nodes (per store and bucket)
    calib_ceil: float = 2.5
    #: global store: shortest suffix that counts as a match
    global_min_match: int = 3
    #: continuations counted per lookup (spread evenly over the matches)
    max_samples: int = 256
    #: pseudo-counts of "something else" when turning counts into probabilities
    prior: float = 1.0
    #: a tree must beat AR by this factor in expectation, else nothing is drafted
    min_gain: float = 1.03
    #: steps without drafting before a probe (doubles after each probe, up to 256)
    probe_after: int = 8
    #: nodes verified by a probe
    probe_nodes: int = 1
    #: fuse the latest longest request match's continuation in as a chain (module docstring)
    copy_chain: bool = True
    #: longest copied chain: a longer one gains little when a copy is taken whole (the cost
    #: curve grows almost linearly there) and costs much when a bucket's acceptance learned on
    #: code sends it on chat, where copies fail after a few tokens (docs/talon.md)
    chain_depth: int = 16
    #: probes are not verified but compared with the tokens the target commits anyway (a
    #: "free probe", module docstring): same calibration and back-off, no verification cost
    free_probes: bool = True

    def validate(self) -> None:
        if self.depth < 1 or self.max_nodes < 1 or self.max_match < 1 or self.chain_depth < 1:
            raise ConfigError("suffix drafter: depth, chain_depth, max_nodes and max_match must be >= 1")
        if self.request_min_n < 1 or self.global_min_match < 1:
            raise ConfigError("suffix drafter: minimum match lengths must be >= 1")
        if self.calib_ceil < 1.0:
            raise ConfigError(f"suffix drafter: calib_ceil must be >= 1, got {self.calib_ceil}")
        if self.prior < 0 or self.min_gain <= 0:
            raise ConfigError("suffix drafter: prior must be >= 0 and min_gain > 0")


@dataclass
class LookupStats:
    calls: int = 0
    seconds: float = 0.0
    max_seconds: float = 0.0

    def add(self, s: float) -> None:
        self.calls += 1
        self.seconds += s
        self.max_seconds = max(self.max_seconds, s)

    @property
    def mean_ms(self) -> float:
        return 1000 * self.seconds / self.calls if self.calls else 0.0


class SuffixDrafter(Drafter):
    name = "suffix"

    def __init__(
        self,
        datastore: SuffixDatastore | None = None,
        config: SuffixConfig | None = None,
        adaptive: AdaptiveLength | None = None,
    ):
        # the tree is selected by expected gain (``choose``), with its own probe back-off;
        # ``adaptive`` is the length controller of a subclass's model chain
        super().__init__(adaptive)
        self.cfg = config or SuffixConfig()
        self.cfg.validate()
        self.store = datastore
        self.request = RequestIndex(self.cfg.request_min_n, self.cfg.max_match)
        # the ceiling lets a store whose drafts are nearly always accepted lift a single
        # occurrence's raw score (1 / (1 + prior) = 0.5) to ~1, as the n-gram drafter learns
        self.calib = Calibrator(ceil=self.cfg.calib_ceil)
        self.lookup_stats = LookupStats()
        self._lookup_ema: float | None = None
        self.backoff = ProbeBackoff(self.cfg.probe_after)
        self._probing = False
        # per proposed node: (calibration key, raw score) of the last proposal
        self._last: list[tuple[str, float]] = []
        # the copied chain's length controllers: the n-gram drafter's buckets, priors and
        # learned survival (a copy is taken whole or breaks at an edit)
        # (apart for copies from the prompt and from the output so far, as the n-gram drafter)
        chain_cfg = replace(COPY_ADAPTIVE, max_len=self.cfg.chain_depth)
        self.chain_ctl = bucket_controllers(chain_cfg, BUCKET_PRIOR, "prompt")
        self.chain_ctl_output = bucket_controllers(chain_cfg, BUCKET_PRIOR, "output")
        # per tracked chain of the last proposal: its node indices in the proposed tree
        self._chains: dict[str, list[int]] = {}
        # a free probe not resolved yet: (context length when proposed, its tree, the
        # calibration keys/raw scores and tracked chains ``_learn`` needs, was it a probe of
        # the whole drafter)
        self._free: tuple[int, DraftTree, list[tuple[str, float]], dict[str, list[int]], bool] | None
        self._free = None
        self._ctx_len = 0
        #: free probes resolved / with an accepted token, and the verifications they saved
        self.free_probe_stats = {"probes": 0, "hits": 0, "nodes": 0}
        self.detail = f"datastore={self.store.n if self.store else 0} tokens"

    # ---- lifecycle ------------------------------------------------------------------
    def start(self, target: DraftTarget, context: Sequence[int]) -> None:
        super().start(target, context)
        if self.store is not None:
            v = self.store.meta.get("tokenizer", {}).get("vocab_size")
            if v is not None and int(v) != int(target.tokenizer.vocab_size):
                raise ConfigError(
                    f"the datastore was built for a tokenizer of {v} tokens, {target.name} has "
                    f"{target.tokenizer.vocab_size}: rebuild it for this model"
                )
        self.request.reset(context)
        self._free = None

    # ---- retrieval ------------------------------------------------------------------
    def retrieve(self, context: Sequence[int]) -> Candidates:
        """Both stores' pruned retrieval trees, calibrated and fused (no selection yet)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        self._resolve_free_probe(context)
        self._ctx_len = len(context)
        self.request.sync(context)
        cand = Candidates()
        chain_depth = cfg.chain_depth if cfg.copy_chain else 0
        length, conts = self.request.lookup(max(cfg.depth, chain_depth))
        if length >= cfg.request_min_n and len(conts):
            tree = count_tree(conts[:, : cfg.depth])
            key = f"request:{bucket(length)}"
            cand.add_counts(
                tree, top_nodes(tree, cfg.max_nodes), cfg.prior, self.calib.scale(key), key, "request"
            )
            if cfg.copy_chain:
                # row 0: the latest; copied from the prompt when its continuation starts there
                starts = self.request.last_starts
                from_prompt = bool(starts) and starts[0] < self.request.prompt_len
                self._add_copy_chain(cand, length, conts[0, :chain_depth], from_prompt)
        if self.store is not None:
            m = self.store.match(context[-cfg.max_match :], cfg.max_match)
            if m.length >= cfg.global_min_match:
                tree = count_tree(self.store.continuations(m, cfg.depth, cfg.max_samples))
                key = f"global:{bucket(m.length)}"
                cand.add_counts(
                    tree, top_nodes(tree, cfg.max_nodes), cfg.prior, self.calib.scale(key), key, "global"
                )
        dt = time.perf_counter() - t0
        self.lookup_stats.add(dt)
        self._lookup_ema = dt if self._lookup_ema is None else 0.8 * self._lookup_ema + 0.2 * dt
        return cand

    def _add_copy_chain(
        self, cand: Candidates, length: int, row: np.ndarray, from_prompt: bool = True
    ) -> None:
        """The continuation ``row`` of a ``length``-token match as a chain scored S_b(d)."""
        ends = np.flatnonzero(row < 0)
        n = int(ends[0]) if len(ends) else len(row)
        if n == 0:
            return
        ctls = self.chain_ctl if from_prompt else self.chain_ctl_output
        b = max((x for x in ctls if x <= length), default=min(ctls))
        ctl = ctls[b]
        key = f"chain:{b}" if from_prompt else f"chain:out{b}"
        # node d scored S_b(d), the bucket's learned probability that depth d is accepted
        surv = ctl.survival_curve()[:n]
        cond = [surv[0]] + [y / x if x > 0 else 0.0 for x, y in zip(surv, surv[1:], strict=False)]
        idx = cand.add_chain([int(t) for t in row[:n]], cond, 1.0, key, "chain")
        cand.chains[key] = idx
        # the bucket's controller, as the n-gram drafter's: while its chains do not pay it is
        # off and asks for a short probe now and then (backing off exponentially)
        k = ctl.length()
        if ctl.off and k > 0:
            cand.probe = idx[:k]

    def _cost(self, k: int) -> float:
        return self.target.cost.ratio(k) if self.target is not None else 1.0 + 0.5 * (k - 1)

    def _step_seconds(self) -> float | None:
        return self.target.cost.step_seconds() if self.target is not None else None

    def lookup_cost(self) -> float:
        """Lookup time in units of one target step (0 until both are measured)."""
        t1 = self._step_seconds()
        return (self._lookup_ema or 0.0) / t1 if t1 else 0.0

    def _max_leaves(self) -> int | None:
        return self.target.max_tree_branches if self.target is not None else None

    def choose(self, cand: Candidates, budget: int, draft_cost: float, keep: Sequence[int] = ()) -> DraftTree:
        """Select the nodes to verify (with probing when drafting is off) and remember them.

        ``keep``: candidate nodes already paid for (a drafted model chain); if the selection is
        empty, the first of them is verified anyway (else the copied chain's probe, if it asks).
        """
        force = 0
        if self.backoff.due():
            force = self.cfg.probe_nodes
        nodes, gain = cand.select(
            budget, self._cost, draft_cost, self._max_leaves(), self.cfg.min_gain, force=force
        )
        probe = bool(nodes) and gain < self.cfg.min_gain  # forced: no expected gain
        if keep and not nodes:
            nodes = [keep[0]]  # already paid for: verified
        elif cand.probe and not nodes:
            nodes, gain = list(cand.probe), self.cfg.min_gain  # the chain's probe: its own back-off
            probe = True
        # a probe of the drafter (nodes without expected gain) doubles the back-off unless
        # something of it is accepted (``_learn``); drafts expected to pay leave it alone
        self._probing = bool(nodes) and gain < self.cfg.min_gain
        if nodes:
            self.backoff.off_steps = 0
        else:
            self.backoff.off_steps += 1
        self._last = [(cand.key[i], cand.raw[i]) for i in nodes]
        pos = {c: j for j, c in enumerate(nodes)}
        chains = {name: [pos[c] for c in idx if c in pos] for name, idx in cand.chains.items()}
        self._chains = {name: idx for name, idx in chains.items() if idx}
        tree = cand.tree(nodes)
        if probe and self.cfg.free_probes and not keep:
            # the probe's outcome is fixed by the tokens the target commits without it:
            # learn from those (``_resolve_free_probe``) instead of paying for a verification
            # (not when a draft model's chain was paid for this step: that one is verified)
            self._free = (self._ctx_len, tree, self._last, self._chains, self._probing)
            self._last, self._chains, self._probing = [], {}, False
            return DraftTree()
        return tree

    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        cand = self.retrieve(context)
        return self.choose(cand, budget, self.lookup_cost())

    def _resolve_free_probe(self, context: Sequence[int]) -> None:
        """Feed a free probe's outcome back once the tokens it covers are committed.

        Under greedy acceptance a probe node would have been accepted exactly when it equals
        the token the target committed there (the target's argmax, whatever was drafted since);
        under sampling the committed token is a draw from the target, so it matches with the
        probability that a deterministic draft of it is accepted.
        """
        if self._free is None:
            return
        n, tree, last, chains, probing = self._free
        if len(context) <= n:
            if len(context) < n:
                self._free = None  # the context was rewritten
            return  # nothing committed yet
        seen = [int(t) for t in context[n : n + tree.max_depth()]]
        path = tree.follow(seen)
        if len(path) == len(seen) and len(seen) < tree.max_depth() and tree.children(path[-1]):
            return  # every token so far matched and the probe goes deeper: wait for more
        self._free = None
        saved = self._last, self._chains, self._probing
        self._last, self._chains, self._probing = last, chains, probing
        self._learn(tree, path)
        self._last, self._chains, self._probing = saved
        self.free_probe_stats["probes"] += 1
        self.free_probe_stats["hits"] += int(bool(path))
        self.free_probe_stats["nodes"] += len(tree)

    def feedback(self, step: StepFeedback) -> None:
        # selection reads the target's measured cost curve directly: only acceptance is learned
        self._learn(step.tree, step.accepted)

    def _learn(self, tree: DraftTree, accepted_nodes: Sequence[int]) -> None:
        """Back-off, chain controllers and calibration after ``accepted_nodes`` of ``tree``
        (the last proposal, or a free probe) were accepted."""
        chains, self._chains = self._chains, {}
        if self._probing:
            if accepted_nodes:
                self.backoff.reset()
            else:
                self.backoff.grow()
        self._probing = False
        if not self._last or len(self._last) != len(tree):
            return
        acc = set(accepted_nodes)
        for name, nodes in chains.items():
            kept = 0
            for j in nodes:  # root-anchored chains: count the accepted prefix
                if j not in acc:
                    break
                kept += 1
            self.chain_feedback(name, len(nodes), kept)
        predicted: dict[str, float] = {}
        accepted: dict[str, float] = {}
        for key, raw in self._last:
            if not key.startswith("chain:"):  # copied chains learn α_b, not a calibration
                predicted[key] = predicted.get(key, 0.0) + raw
        for i in accepted_nodes:
            key = self._last[i][0]
            if key in predicted:
                accepted[key] = accepted.get(key, 0.0) + 1.0
        self.calib.update(predicted, accepted)
        self._last = []

    def chain_feedback(self, name: str, drafted: int, kept: int) -> None:
        """``kept`` of the ``drafted`` verified nodes of a tracked chain were accepted."""
        if name.startswith("chain:out"):
            self.chain_ctl_output[int(name[len("chain:out") :])].update(drafted, kept)
        elif name.startswith("chain:"):
            self.chain_ctl[int(name.split(":", 1)[1])].update(drafted, kept)

    def knowledge(self) -> dict:
        return {
            "chain": controllers_state(self.chain_ctl),
            "chain_output": controllers_state(self.chain_ctl_output),
            "calib": self.calib.state(),
            "off": self.backoff.off_steps,
            "backoff": self.backoff.wait,
            "lookup_ema": self._lookup_ema,
        }

    def load_knowledge(self, data: dict) -> None:
        calib = data.get("calib")
        backoff = int(data.get("backoff", self.cfg.probe_after))
        off = int(data.get("off", 0))
        lookup = data.get("lookup_ema")
        load_controllers(self.chain_ctl, data.get("chain", {}))
        load_controllers(self.chain_ctl_output, data.get("chain_output", {}))
        if calib is not None:
            self.calib.load_state(calib)
        self.backoff.load(backoff, off)
        self._lookup_ema = float(lookup) if lookup else None


def load_datastore(path: str | None, target: Backend, max_mb: float | None = None) -> SuffixDatastore | None:
    """Load a datastore for ``target`` (None stays None); refuses other tokenizers."""
    if not path:
        return None
    budget = DEFAULT_MAX_BYTES if max_mb is None else int(max_mb * 2**20)
    return SuffixDatastore.load(path, target.tokenizer, max_bytes=budget)


def continuation_matrix(rows: Sequence[Sequence[int]], depth: int) -> np.ndarray:
    """Rows padded with ``SEP`` to ``depth`` columns (test and tooling helper)."""
    out = np.full((len(rows), depth), -1, dtype=np.int32)
    for r, row in enumerate(rows):
        row = list(row)[:depth]
        out[r, : len(row)] = row
    return out
