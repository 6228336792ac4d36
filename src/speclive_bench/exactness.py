"""Exactness against plain AR: where two outputs part, and how close a call AR made there.

A lossless method must reproduce greedy AR token for token. On a quantized backend the logits
of a k-token verification pass differ slightly from those of a one-token step, so an output may
flip where AR's top-2 logit gap is tiny (below ``report.NEAR_TIE_GAP``: a near-tie); a flip at a
clear gap is a bug (a wrong mask, position or cache reuse). ``ar_logit_gap`` reads that gap by
re-running the reference AR of ``speclive_bench.reference.greedy_steps`` along the reference output.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from speclive.backends.base import Backend, common_prefix_len
from speclive_bench.reference import greedy_steps


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (a length difference counts), None if identical."""
    n = common_prefix_len(a, b)
    return None if n == len(a) == len(b) else n


def ar_logit_gap(
    backend: Backend, prompt: Sequence[int], ref: Sequence[int], position: int, other: int | None
) -> dict[str, Any]:
    """Re-run AR exactly as our loop does and read the logits that chose ``ref[position]``.

    AR runs along ``ref`` (teacher-forced, so the context is the reference's even where the re-run
    would pick otherwise), with the prompt fed as the loop feeds it (``split_prompt``).
    Returns the top-2 gap there, the gap between the reference token (or the argmax when the
    reference ended) and ``other`` (the divergent token, if any), and whether the re-run still
    picks the reference token (AR reproducibility).
    """
    steps = greedy_steps(backend, prompt, position + 1, follow=ref[:position], split_prompt=True)
    ((row, _),) = deque(steps, maxlen=1)  # the last row: position's (a followed token never ends a run)
    order = np.argsort(row)[::-1]
    top1, top2 = int(order[0]), int(order[1])
    ref_tok = int(ref[position]) if position < len(ref) else None
    chosen = ref_tok if ref_tok is not None else top1
    out: dict[str, Any] = {
        "gap_top2": float(row[top1] - row[top2]),
        "argmax": top1,
        "second": top2,
        "ref_token": ref_tok,
        "method_token": other,
        "rerun_matches_ref": ref_tok is None or ref_tok == top1,
    }
    if other is not None and 0 <= other < len(row):
        out["gap_pair"] = float(row[chosen] - row[other])
    return out


class CallRecorder:
    """Records a backend's ``extend`` and ``truncate`` calls per state, and each state's last
    logits row, while in use (``with CallRecorder(backend) as rec:``); ``replay`` makes a
    state's calls again on a new state. The same calls on the same backend must give the same
    rows: a difference is a cache that does not hold what its calls put in it."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.calls: dict[int, list[tuple]] = {}
        self.last: dict[int, np.ndarray] = {}
        self.extend, self.truncate = backend.extend, backend.truncate

    def __enter__(self) -> CallRecorder:
        self.backend.extend, self.backend.truncate = self._extend, self._truncate  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.backend.extend, self.backend.truncate  # the class's methods again

    def _extend(
        self, state: Any, tokens: Any, parents: Any = None, last_only: bool = False, skip: int = 0
    ) -> np.ndarray:
        out = self.extend(state, tokens, parents, last_only=last_only, skip=skip)
        self.calls.setdefault(id(state), []).append(("extend", list(tokens), parents, last_only, skip))
        self.last[id(state)] = out[-1].copy()
        return out

    def _truncate(self, state: Any, n: int) -> None:
        self.calls.setdefault(id(state), []).append(("truncate", n))
        self.truncate(state, n)

    def replay(self, state: Any) -> np.ndarray | None:
        """The last logits row of ``state``'s recorded calls made again on a new state."""
        s, row = self.backend.new_state(), None
        for call in self.calls.get(id(state), []):
            if call[0] == "extend":
                row = self.extend(s, call[1], call[2], last_only=call[3], skip=call[4])[-1]
            else:
                self.truncate(s, call[1])
        self.backend.release(s)
        return row
