"""The benchmark loop: every sample through every method, interleaved.

A benchmark states its samples, its methods and how one method runs on one sample
(``run_one(method, sample) -> record``); ``run_interleaved`` runs them sample-major, the
methods in an order rotated per sample (``rotated``), so a slow spell of a shared machine lands
on every method alike instead of on whichever one ran during it. A method that raises becomes
an ``{"error": "Type: message"}`` record and the loop goes on; a tqdm bar on stderr shows the
progress. With ``repeats`` the samples run again (the rotation continues), each record marked
with its ``repeat``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tqdm import tqdm

M = TypeVar("M")
S = TypeVar("S")
Record = dict[str, Any]


def rotated(items: Sequence[M], i: int) -> list[M]:
    """``items`` rotated left by ``i`` (modulo their number): the order of sample ``i``."""
    if not items:
        return []
    k = i % len(items)
    return list(items[k:]) + list(items[:k])


def interleaved(i: int, *groups: Sequence[M]) -> list[M]:
    """Sample ``i``'s order: each group rotated by ``i``, the groups one after the other."""
    return [m for g in groups for m in rotated(g, i)]


def error_record(e: BaseException) -> Record:
    """The record of a run that raised ``e``."""
    return {"error": f"{type(e).__name__}: {e}"}


def run_interleaved(
    samples: Sequence[S],
    methods: Sequence[M],
    run_one: Callable[[M, S], Record],
    *,
    then: Sequence[M] = (),
    repeats: int = 1,
    desc: str = "bench",
    unit: str = "run",
    progress: bool = True,
    postfix: Callable[[M, S], str] | None = None,
    catch: bool = True,
    on_error: Callable[[M, S, str], None] | None = None,
    after_sample: Callable[[S, list[tuple[M, Record]]], None] | None = None,
) -> list[Record]:
    """Run ``run_one(method, sample)`` for every sample (``repeats`` times over) and method, in
    the order ``interleaved(i, methods, then)`` for the i-th sample run; returns the records in
    the order they ran.

    ``then``: methods run after ``methods`` on each sample, rotated on their own (e.g. one
    process per run). ``postfix(method, sample)``: the bar's note while a run is on. A run that
    raises gives ``error_record`` (passed to ``on_error``) unless ``catch`` is off.
    ``after_sample(sample, [(method, record), ...])``: called once a sample has run with every
    method (e.g. to compare their outputs).
    """
    records: list[Record] = []
    total = len(samples) * (len(methods) + len(then)) * repeats
    with tqdm(
        total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, disable=not progress
    ) as bar:
        for r in range(repeats):
            for si, sample in enumerate(samples):
                done: list[tuple[M, Record]] = []
                for m in interleaved(r * len(samples) + si, methods, then):
                    if postfix is not None:
                        bar.set_postfix_str(postfix(m, sample))
                    try:
                        rec = run_one(m, sample)
                    except Exception as e:
                        if not catch:
                            raise
                        rec = error_record(e)
                        if on_error is not None:
                            on_error(m, sample, rec["error"])
                    if repeats > 1:
                        rec["repeat"] = r
                    records.append(rec)
                    done.append((m, rec))
                    bar.update(1)
                if after_sample is not None:
                    after_sample(sample, done)
    return records
