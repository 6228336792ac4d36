"""Asynchronous hybrid drafting (Talon): the draft model runs while the target verifies.

A drafter wrapper for the one decode loop, not a second loop. ``propose`` returns the tree to
verify and immediately starts a drafting job on a worker thread, so the draft model's forward
passes overlap the target's verification pass (llama.cpp releases the GIL in ``llama_decode``;
each side gets its own cores: ``threads`` per backend, default 1 + 1 on a 2-core machine). The
drafter sets its own draft backend's threads; the target's it declares (``target_threads``)
and the decoder applies.
The job drafts after a *speculated* context — the committed context plus the part of the tree
being verified that is likely to be accepted:

- **pre-verify** (speculated path empty): draft from the committed context; the target
  meanwhile verifies the retrieval tree. If what the target commits (accepted retrieval
  tokens + its bonus token) is a prefix of the model's chain, the rest of the chain is a free
  draft for the next step.
- **post-verify** (speculated path = the tree's most likely path, each node with calibrated
  acceptance probability >= ``post_verify_min_prob``): draft as if that path were accepted; if
  it is, and the bonus token equals the chain's first token, the rest of the chain is reused.

The strategy is chosen per step from the tree's scores (Talon switches to post-verify after a
step whose drafts were all accepted and back otherwise; a probability threshold generalises
that). The next ``propose`` stops the job (between draft steps), takes its chain, keeps what
is consistent with the committed tokens and fuses it with the new retrieval tree. Busy time of
both sides, reuse rates and strategy counts are in ``async_stats``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from speclive.backends.base import Backend
from speclive.drafting.base import AdaptiveLength, DraftTarget
from speclive.drafting.datastore import SuffixDatastore
from speclive.drafting.hybrid import HybridConfig, HybridDrafter
from speclive.drafting.suffix import SuffixConfig
from speclive.drafting.tree import DraftTree


@dataclass
class AsyncConfig:
    #: threads of the target backend while this drafter runs (None: leave as is)
    target_threads: int | None = 1
    #: threads of the draft backend (None: leave as is)
    draft_threads: int | None = 1
    #: post-verify when the tree's most likely path has nodes at least this likely
    post_verify_min_prob: float = 0.5
    #: most tokens one background job drafts
    max_job_len: int = 8
    #: a job ignores the stop request until it has drafted this many tokens past its
    #: speculated path (0: stop at once). Only a chain reaching past what the step commits is
    #: reusable, so when the draft is nearly as slow as the target a job stopped after its
    #: first token is wasted; 2 makes the target wait up to one draft step for a usable one.
    min_job_tokens: int = 0


@dataclass
class AsyncStats:
    steps: int = 0
    pre_verify: int = 0
    post_verify: int = 0
    jobs_reused: int = 0
    tokens_reused: int = 0
    draft_busy_s: float = 0.0
    #: main thread waiting for the draft job to stop
    wait_s: float = 0.0
    #: time between the end of one propose and the start of the next (the target's side)
    target_side_s: float = 0.0
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["draft_utilisation"] = self.draft_busy_s / self.wall_s if self.wall_s else None
        d["target_utilisation"] = self.target_side_s / self.wall_s if self.wall_s else None
        return d


@dataclass
class _Job:
    base: list[int]  # the committed context the job's speculation starts from
    spec: list[int]  # speculated accepted path (tokens) after ``base``
    future: Future
    stop: threading.Event


def _set_threads(backend: Backend, n: int | None) -> int | None:
    """Set a backend's thread count (where ``settable_threads``); returns the previous one."""
    if n is None or not backend.settable_threads:
        return None
    old = backend.n_threads
    backend.set_threads(n)
    return old


class AsyncHybridDrafter(HybridDrafter):
    name = "hybrid-async"

    def __init__(
        self,
        draft: Backend,
        datastore: SuffixDatastore | None = None,
        config: HybridConfig | None = None,
        suffix: SuffixConfig | None = None,
        async_config: AsyncConfig | None = None,
        adaptive: AdaptiveLength | None = None,
    ):
        super().__init__(draft, datastore, config, suffix, adaptive)
        self.acfg = async_config or AsyncConfig()
        self.target_threads = self.acfg.target_threads
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speclive-draft")
        self.async_stats = AsyncStats()
        self._job: _Job | None = None
        # the draft backend's thread count before ``start`` changed it
        self._saved_draft_threads: int | None = None
        self._t_return: float | None = None
        self._t_begin = 0.0

    # ---- lifecycle ------------------------------------------------------------------
    def start(self, target: DraftTarget, context: Sequence[int]) -> None:
        super().start(target, context)
        self._saved_draft_threads = _set_threads(self.model.draft, self.acfg.draft_threads)
        self._cancel()
        self.async_stats = AsyncStats()
        self._t_begin = time.perf_counter()
        self._t_return = None

    def end(self) -> None:
        self._cancel()
        st = self.async_stats
        st.wall_s = time.perf_counter() - self._t_begin
        if self._saved_draft_threads is not None:
            _set_threads(self.model.draft, self._saved_draft_threads)
        self._saved_draft_threads = None

    def close(self) -> None:
        self._cancel()
        self.pool.shutdown(wait=True)
        super().close()

    # ---- the background job ---------------------------------------------------------
    def _cancel(self) -> tuple[list[int], list[float]] | None:
        job, self._job = self._job, None
        if job is None:
            return None
        job.stop.set()
        t0 = time.perf_counter()
        try:
            toks, probs, busy = job.future.result()
        except Exception:  # noqa: BLE001 - a failed draft job only loses its draft
            return None
        self.async_stats.wait_s += time.perf_counter() - t0
        self.async_stats.draft_busy_s += busy
        return toks, probs

    def _run_job(self, ctx: list[int], k: int, stop: threading.Event) -> tuple[list[int], list[float], float]:
        t0 = time.perf_counter()
        toks, probs = self.model.chain(ctx, k, stop, min_before_stop=self.acfg.min_job_tokens)
        return toks, probs, time.perf_counter() - t0

    def _job_len(self) -> int:
        """Draft steps that fit in one verification (both measured), at least 2: a chain is
        reused only past the tokens the step commits (at least one beyond the speculated
        path, ``_reusable``), so a one-token job could never be used."""
        t_d = self.model.step_seconds()
        t_t = self._step_seconds()
        if not t_d or not t_t:
            return 2
        return max(2, min(self.acfg.max_job_len, self.hcfg.model_max_len, int(round(1.5 * t_t / t_d))))

    def _speculated_path(self, tree: DraftTree) -> list[int]:
        """Tokens of the tree's most likely root path whose nodes are likely enough."""
        probs = tree.probs or [1.0] * len(tree)
        path: list[int] = []
        node, acc = -1, 1.0
        while True:
            kids = tree.children(node)
            if not kids:
                return path
            best = max(kids, key=lambda c: probs[c])
            acc *= probs[best]
            if acc < self.acfg.post_verify_min_prob:
                return path
            path.append(tree.tokens[best])
            node = best

    def _reusable(self, context: Sequence[int], job: _Job, toks: list[int], probs: list[float]):
        """The part of a finished job's chain that continues ``context``, with probabilities."""
        n = len(job.base)
        if len(context) <= n or list(context[:n]) != job.base:
            return [], []
        committed = list(context[n:])
        if len(committed) <= len(job.spec):
            return [], []
        full = job.spec + toks
        if len(committed) >= len(full) or full[: len(committed)] != committed:
            return [], []
        off = len(committed) - len(job.spec)  # committed tokens that came out of the chain
        return full[len(committed) :], probs[off:]

    # ---- drafting -------------------------------------------------------------------
    def propose(self, context: Sequence[int], budget: int) -> DraftTree:
        st = self.async_stats
        now = time.perf_counter()
        if self._t_return is not None:
            st.target_side_s += now - self._t_return
        job = self._job
        done = self._cancel()
        cand = self.retrieve(context)
        model_idx: list[int] = []
        if job is not None and done is not None:
            toks, probs = self._reusable(context, job, *done)
            if toks:
                st.jobs_reused += 1
                st.tokens_reused += len(toks)
                model_idx = self.add_model_chain(cand, toks[:budget], probs[:budget])
        tree = self.choose(cand, budget, self.lookup_cost(), keep=model_idx)
        # start drafting the next step while the target verifies this tree
        spec = self._speculated_path(tree)
        if spec:
            st.post_verify += 1
        else:
            st.pre_verify += 1
        base = list(context)
        stop = threading.Event()
        fut = self.pool.submit(self._run_job, base + spec, self._job_len(), stop)
        self._job = _Job(base, spec, fut, stop)
        st.steps += 1
        self._t_return = time.perf_counter()
        return tree
