"""The backend protocol every decoder, drafter and session talks to.

A backend is one loaded causal LM. Its KV cache lives in a ``BackendState``; the backend
offers exactly five cache operations:

- ``extend(state, tokens, parents=None)``: append new tokens and return their logits
  ``float32[n, vocab]``, row ``i`` predicting the token after node ``i``.  With ``parents``
  the new tokens form a *tree*: ``parents[i] == -1`` hangs node ``i`` under the last cached
  token, otherwise under the earlier new node ``parents[i] < i``.  Every node sees the cached
  prefix plus its own ancestors, at position ``len(prefix) + depth(i)``.  A tree extension
  is *pending* until ``keep`` chooses one root-anchored path of it.
- ``keep(state, path)``: after an extension, keep only nodes ``path`` (indices of the last
  extension, a chain starting at a root node) and drop the rest: the cache is compacted so
  the state is exactly as if prefix + path had been appended as a chain.
- ``truncate(state, n)``: keep only the first ``n`` cached tokens (rollback).
- ``fork(state)``: an independent state sharing the same prefix.
- ``release(state)``: free what the state holds.

Optional features are declared on the class, not probed: ``max_tree_branches`` (a limit on
the leaves of one tree extension, None for none), ``settable_threads`` (``set_threads``
changes the CPU threads it computes with, ``n_threads``), ``max_states`` (states that hold a
cache at once before one is evicted, None for no limit; ``restore_evicted`` prefills an
evicted state again on its next use; ``offload_parked`` keeps a parked state's cache in host
memory instead of the model's cache) and ``reserve_memory`` (take the cache's and buffers'
memory now).
``in_process`` tells a backend from a remote engine that sessions take in its place
(``speclive.engines.vllm.VLLMEngine`` declares it False and brings its own decode loop,
``make_decoder``).

``state.tokens`` always lists the committed cache content (a pending tree is not in it).
A conformance suite (``tests/test_backend_conformance.py``) checks every backend against
fresh full forwards.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from speclive.errors import ContextOverflowError
from speclive.tokenizer import Tokenizer

#: A lossless output may depart from plain greedy decoding only where the reference's top-2 logit
#: gap is below this: quantized kernels (llama.cpp) give a k-token batch logits up to ~0.8 away
#: from one-token steps, so a near tie can flip. A divergence at a larger gap is a bug. Tests and
#: benchmarks judge divergences with this one bar.
NEAR_TIE_GAP = 0.5


@dataclass
class BackendState:
    """Cache bookkeeping shared by all backends; backends subclass it for their handles."""

    tokens: list[int] = field(default_factory=list)
    #: nodes of the last tree extension waiting for ``keep`` (None when nothing is pending)
    pending: list[int] | None = None
    pending_parents: list[int] | None = None
    #: the cost curve this state's verification passes are timed into (None: the backend's
    #: ``cost``): a decoder that runs the target on other threads while it drafts keeps the
    #: curve of that thread count apart without touching the shared backend
    cost: CostModel | None = None
    #: seconds of this state's last ``extend``, or None when its last pass shared one decode
    #: with other states' passes (llama.cpp's ``extend_many``): such a decode's time is not
    #: this state's to learn its own step cost from
    pass_s: float | None = None

    def __len__(self) -> int:
        return len(self.tokens)


class CostCurve(Protocol):
    """What a drafter reads of a verification-cost curve (``CostModel`` is one; a server's
    ``speclive.server.shared_pass_cost.SharedPassCost`` is another)."""

    @property
    def observed(self) -> dict[int, int]:
        """Timings observed in this process per k."""
        ...

    def ratio(self, k: int) -> float: ...
    def optimistic_ratio(self, k: int) -> float: ...
    def step_seconds(self) -> float | None: ...
    def unit_seconds(self) -> float | None: ...


class CostModel:
    """Online estimate of how long one ``extend`` of ``k`` tokens takes, relative to ``k=1``.

    Every backend records its own extension times here (an exponential moving average per
    ``k``; a state with a ``cost`` of its own records there), so drafters read the *measured*
    verification-cost curve t(k)/t(1) of the machine they run on; a prior curve fills the gaps
    until a length has been seen. The decoder hands a drafter the curve it is to read
    (``speclive.drafting.base.DraftTarget``).
    """

    def __init__(self, prior: dict[int, float] | None = None, alpha: float = 0.2, max_k: int = 64):
        self.max_k = max_k
        self.alpha = alpha
        self._prior = dict(prior or {1: 1.0, 2: 1.7, 4: 2.5, 8: 4.5, 16: 7.5, 32: 13.0, 64: 26.0})
        self._seconds: dict[int, float] = {}
        #: timings observed in this process per k (restored measurements are not counted)
        self.observed: dict[int, int] = {}

    def observe(self, k: int, seconds: float) -> None:
        if k < 1 or k > self.max_k:
            return
        # a restored measurement (another process, another load) only stands in until this
        # process has timed k once
        n = self.observed.get(k, 0)
        old = self._seconds.get(k) if n else None
        self._seconds[k] = seconds if old is None else (1 - self.alpha) * old + self.alpha * seconds
        self.observed[k] = n + 1

    def set_prior(self, prior: dict[int, float]) -> None:
        """Replace the prior curve (measurements stay where they are)."""
        self._prior = dict(prior)

    def set_seconds(self, k: int, seconds: float) -> None:
        """Replace the estimate of t(k) (a deliberate measurement, not one more sample)."""
        if 1 <= k <= self.max_k and seconds > 0:
            self._seconds[k] = float(seconds)
            self.observed[k] = max(1, self.observed.get(k, 0))

    def state(self) -> dict[str, float]:
        """The measured t(k) in seconds, keyed by k (JSON-able; ``load_state`` restores it)."""
        return {str(k): v for k, v in sorted(self._seconds.items())}

    def load_state(self, data: dict[str, float]) -> None:
        """Restore ``state()`` output; raises ``ValueError`` on a malformed entry (nothing changed)."""
        seconds = {int(k): float(v) for k, v in data.items()}
        if any(not 1 <= k <= self.max_k or not v > 0 for k, v in seconds.items()):
            raise ValueError(f"bad cost measurements: {data}")
        self._seconds = seconds

    def step_seconds(self) -> float | None:
        """Measured seconds of one single-token step, if seen."""
        return self._seconds.get(1)

    def unit_seconds(self) -> float | None:
        """Seconds of a single-token step: measured, else inferred from the shortest measured
        length through the prior curve (a verifier may never run a one-token pass)."""
        if 1 in self._seconds:
            return self._seconds[1]
        if not self._seconds:
            return None
        k = min(self._seconds)
        return self._seconds[k] / self._prior_ratio(k)

    def optimistic_ratio(self, k: int) -> float:
        """The lower of the measured and the prior t(k)/t(1). For decisions that stop using a
        length when it looks expensive: a measurement inflated by a load spike would otherwise
        never be corrected, since that length is no longer run."""
        return min(self.ratio(k), self._prior_ratio(k))

    def _prior_ratio(self, k: int) -> float:
        keys = sorted(self._prior)
        if k <= keys[0]:
            return self._prior[keys[0]]
        for lo, hi in zip(keys, keys[1:], strict=False):
            if lo <= k <= hi:
                w = (k - lo) / (hi - lo)
                return (1 - w) * self._prior[lo] + w * self._prior[hi]
        return self._prior[keys[-1]] * k / keys[-1]

    def ratio(self, k: int) -> float:
        """t(k)/t(1): measured where both are known, else the prior curve."""
        t1 = self._seconds.get(1)
        tk = self._seconds.get(k)
        if t1 and tk:
            return max(tk / t1, 1.0 if k >= 1 else 0.0)
        return self._prior_ratio(k)

    def curve(self, ks: Sequence[int]) -> dict[int, float]:
        return {k: self.ratio(k) for k in ks}


class Backend(ABC):
    """One causal LM plus the operations on its KV cache (module docstring)."""

    #: short backend kind, e.g. "hf" or "llamacpp"
    kind: str = "base"
    name: str
    tokenizer: Tokenizer
    vocab_size: int
    n_ctx: int

    #: the model runs in this process (the cache operations below); a remote engine says False
    in_process: bool = True
    #: where the model computes: "cpu", or the torch device of a backend placed on one
    device: Any = "cpu"

    # ---- optional features (module docstring): the defaults say "not supported" ------
    #: most leaves (root-to-leaf branches) one tree ``extend`` may hold (None: no limit)
    max_tree_branches: int | None = None
    #: ``set_threads`` can change the CPU threads this backend computes with
    settable_threads: bool = False
    #: CPU threads it computes with (None: not a setting of this backend)
    n_threads: int | None = None
    #: states that can hold a cache at once; more evict each other (None: no limit)
    max_states: int | None = None
    #: an evicted state is prefilled again on its next use instead of failing it (where
    #: ``max_states`` is set)
    restore_evicted: bool = False
    #: ``park`` copies the state's cache to host memory and frees its place in the model's cache
    #: (its cells, its home); its next use copies it back (where ``max_states`` is set)
    offload_parked: bool = False
    #: facts about replaced linear kernels, for benchmark headers (None: none replaced)
    linear_info: dict[str, Any] | None = None

    def __init__(self) -> None:
        self.cost = CostModel(self.default_cost_prior())
        self.forward_calls = 0

    # ---- protocol -------------------------------------------------------------------
    @abstractmethod
    def new_state(self) -> BackendState: ...

    @abstractmethod
    def _extend(
        self, state: BackendState, tokens: list[int], parents: list[int] | None, last_only: bool = False
    ) -> np.ndarray:
        """Evaluate new tokens (``parents`` None = chain); ``last_only``: chains only, last row."""

    @abstractmethod
    def _compact(self, state: BackendState, keep_idx: list[int]) -> None:
        """Keep cache rows ``keep_idx`` (absolute, increasing) of the committed+pending cache."""

    @abstractmethod
    def _truncate(self, state: BackendState, n: int) -> None: ...

    @abstractmethod
    def fork(self, state: BackendState) -> BackendState: ...

    def release(self, state: BackendState) -> None:
        self.truncate(state, 0)

    def park(self, state: BackendState) -> None:
        """Keep ``state``'s cache only while nothing else needs its room: where states evict
        each other (``max_states``), a parked state is evicted before any other (or, with
        ``offload_parked``, moved to host memory at once); ``unpark`` or any use of the state
        ends it. Nothing to do where states never evict."""

    def unpark(self, state: BackendState) -> None:
        """``state`` is in use again: evicted only in its turn (least recently used)."""

    def use_cost_prior(self, prior: dict[int, float]) -> None:
        """From now on ``prior`` (t(k)/t(1) measured on this machine: ``cost_calibration``) is
        the curve of this backend's cost model where nothing has been measured yet."""
        self.cost.set_prior(prior)

    def default_cost_prior(self) -> dict[int, float] | None:
        return None

    def set_threads(self, n_threads: int) -> None:
        """Compute with ``n_threads`` CPU threads (only where ``settable_threads``)."""
        raise NotImplementedError(f"the {self.kind} backend has no thread setting")

    def reserve_memory(self) -> None:
        """Make the cache's and compute buffers' memory resident now, where a backend would
        otherwise take it as states fill and batches widen (a server's memory use is then known
        at start-up); nothing to do by default."""

    # ---- shared checks around the backend-specific parts ----------------------------
    def extend(
        self,
        state: BackendState,
        tokens: Sequence[int],
        parents: Sequence[int] | None = None,
        last_only: bool = False,
        skip: int = 0,
    ) -> np.ndarray:
        """Append ``tokens`` (a chain, or a tree via ``parents``) and return their logits.

        ``last_only`` (chains only) returns just the last row, ``[1, vocab]``: a prefill needs
        nothing else, and skipping the LM head over the prompt saves real time on big vocabularies.
        ``skip`` leaves out the first ``skip`` rows (chain or tree): a prompt's tail that rides
        in front of a verification pass needs its cache entries, not its logits.
        """
        toks, plist = self._checked(state, tokens, parents, last_only, skip)
        if not toks:
            return np.zeros((0, self.vocab_size), dtype=np.float32)
        t0 = time.perf_counter()
        if skip and not last_only:
            logits = self._extend_skipping(state, toks, plist, skip)
        else:
            logits = self._extend(state, toks, plist, last_only)
        state.pass_s = time.perf_counter() - t0
        if not (last_only or skip):  # the cost curve describes verification passes (all rows)
            (state.cost or self.cost).observe(len(toks), state.pass_s)
        self.forward_calls += 1
        self._extended(state, toks, plist)
        return logits

    def extend_many(
        self,
        passes: Sequence[tuple[BackendState, Sequence[int], Sequence[int] | None]],
        skip: Sequence[int] | None = None,
    ) -> list[np.ndarray | Exception]:
        """``extend`` for several different states, ``(state, tokens, parents)`` each, with
        ``skip`` per pass (default: none; a prompt chunk skips all rows but its last): their
        logits in order, or in the place of a pass that failed, its exception (the other passes
        are unaffected). Backends that evaluate several sequences in one forward pass
        (llama.cpp) do so; the result is that of one ``extend`` per pass."""
        skips = list(skip) if skip is not None else [0] * len(passes)
        return [self._try_extend(st, toks, par, k) for (st, toks, par), k in zip(passes, skips, strict=True)]

    def _try_extend(
        self,
        state: BackendState,
        tokens: Sequence[int],
        parents: Sequence[int] | None,
        skip: int = 0,
    ) -> np.ndarray | Exception:
        try:
            return self.extend(state, tokens, parents, skip=skip)
        except Exception as e:  # noqa: BLE001 - handed to the pass's owner
            return e

    def _extend_skipping(
        self, state: BackendState, tokens: list[int], parents: list[int] | None, skip: int
    ) -> np.ndarray:
        """``_extend`` without the first ``skip`` rows; backends that can leave those rows'
        LM head out (llama.cpp) do so."""
        return self._extend(state, tokens, parents)[skip:]

    def _checked(
        self,
        state: BackendState,
        tokens: Sequence[int],
        parents: Sequence[int] | None,
        last_only: bool,
        skip: int = 0,
    ) -> tuple[list[int], list[int] | None]:
        """``extend``'s argument checks: the tokens as ints and the parents (None for a chain)."""
        if state.pending is not None:
            raise RuntimeError("extend() called while a tree extension is pending: call keep() first")
        toks = [int(t) for t in tokens]
        if not toks:
            return toks, None
        if len(state.tokens) + len(toks) > self.n_ctx:
            raise ContextOverflowError(
                f"{len(state.tokens)} cached + {len(toks)} new tokens exceed the context window "
                f"of {self.n_ctx} tokens of model {self.name}"
            )
        if not 0 <= skip < len(toks):
            raise ValueError(f"skip={skip} must leave at least one of the {len(toks)} rows")
        bad = [t for t in toks if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        chain = parents is None or _is_chain(parents)
        plist = None if chain else [int(p) for p in parents]  # type: ignore[union-attr]
        if plist is not None:
            if len(plist) != len(toks):
                raise ValueError("parents must have one entry per token")
            for i, p in enumerate(plist):
                if not -1 <= p < i:
                    raise ValueError(f"parents[{i}]={p}: a parent must be -1 or an earlier node")
            if last_only:
                raise ValueError("last_only applies to chain extensions only")
        return toks, plist

    @staticmethod
    def _extended(state: BackendState, tokens: list[int], parents: list[int] | None) -> None:
        """After an evaluation: a chain is committed, a tree waits for ``keep``."""
        if parents is None:
            state.tokens.extend(tokens)
        else:
            state.pending, state.pending_parents = tokens, parents

    def keep(self, state: BackendState, path: Sequence[int]) -> None:
        path = [int(i) for i in path]
        if state.pending is None:
            # after a chain extension keep(path) is a truncation to a prefix of it
            raise RuntimeError("keep() needs a pending tree extension; use truncate() after a chain")
        nodes, parents = state.pending, state.pending_parents
        assert parents is not None
        prev = -1
        for i in path:
            if not 0 <= i < len(nodes) or parents[i] != prev:
                raise ValueError(f"path {path} is not a root-anchored chain of the pending tree")
            prev = i
        base = len(state.tokens)
        if path != list(range(len(path))) or len(path) != len(nodes):
            keep_idx = list(range(base)) + [base + i for i in path]
            self._compact(state, keep_idx)
        state.tokens.extend(nodes[i] for i in path)
        state.pending = state.pending_parents = None

    def truncate(self, state: BackendState, n: int) -> None:
        if state.pending is not None:
            self.keep(state, [])
        n = max(0, min(n, len(state.tokens)))
        if n < len(state.tokens):
            self._truncate(state, n)
            del state.tokens[n:]

    def sync(self, state: BackendState, tokens: Sequence[int]) -> np.ndarray:
        """Make the cache hold ``tokens`` with minimal work; return the logits after the last one.

        Trims the cache to its common prefix with ``tokens`` and extends the rest. At least the
        last token is re-evaluated so the caller always gets the logits after ``tokens``.
        """
        tokens = list(tokens)
        if not tokens:
            raise ValueError("sync() needs at least one token")
        common = common_prefix_len(state.tokens, tokens)
        common = min(common, len(tokens) - 1)
        self.truncate(state, common)
        return self.extend(state, tokens[common:], last_only=True)


def rows_to_move(keep_idx: Sequence[int]) -> tuple[int, list[int]]:
    """For a ``_compact`` over preallocated cache rows: ``(base, rows)``, where the kept rows
    stop being rows ``0, 1, ...`` in place, and the rows to copy down to ``base`` onward."""
    base = 0
    while base < len(keep_idx) and keep_idx[base] == base:
        base += 1
    return base, list(keep_idx[base:])


def _is_chain(parents: Sequence[int]) -> bool:
    return all(int(p) == i - 1 for i, p in enumerate(parents))


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
