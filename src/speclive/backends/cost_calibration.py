"""This machine's verification-cost curve t(k)/t(1), measured once and kept.

A drafter picks its draft length from t(k)/t(1), the cost of a pass over k new tokens in
single steps. A backend learns that curve as it runs (``CostModel``), but only at the lengths it
runs; a length it has not run reads the prior curve. The committed prior was measured on one
host class, and hosts differ by far more than noise: Qwen2.5-Coder 1.5B on llama.cpp costs
t(8)/t(1) ≈ 6.0 on the 2-core AVX2 host and ≈ 2.9 on the 2-core AVX-512 one. A new process
on the flatter host then thinks long drafts cost twice what they do and drafts short, and it
never runs the long lengths that would correct it.

``calibrate`` times chains of ``KS`` tokens on a scratch state behind a prompt-sized prefix (the
fastest of ``REPEATS`` passes each, so a load spike is not kept) and keeps the ratios in
``$SPECLIVE_HOME/cost-curves.json``, keyed by the model file, the backend's settings that change
its kernels (threads, flash attention, repacked weights, batch size) and the CPU. The curve
becomes the backend's prior: online measurements still replace it where they exist. A later
process on the same machine reads it back for nothing; the first one pays a few seconds
(about 11 s for the 1.5B model on two cores). ``SPECLIVE_COST_CALIBRATION=0`` turns it off.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from speclive import kept_measurements
from speclive.backends.base import Backend, CostModel
from speclive.kept_measurements import keep_entry, read_entries
from speclive.sysinfo import cpu_detail, cpu_model

log = logging.getLogger(__name__)

#: the pass lengths timed (drafters interpolate between them). llama.cpp's CPU kernels step up
#: just past multiples of 16 rows (docs/engine.md, learned survival), so both sides of the steps are
#: timed: interpolating from 16 to 32 would price 17 to 20 tokens far too low
KS = (1, 2, 4, 8, 16, 17, 32, 33, 64)
#: passes per length; the fastest counts
REPEATS = 2
#: tokens in the cache before the timed passes: a verification pass follows a prompt, and long
#: passes cost more behind a longer one
PREFIX = 256
ENV = "SPECLIVE_COST_CALIBRATION"


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def measure(backend: Backend, ks: tuple[int, ...] = KS, repeats: int = REPEATS) -> dict[int, float]:
    """t(k)/t(1) of ``backend`` at ``ks`` (k = 1 must be among them), timed on a scratch state.
    The backend's own cost model and pass count are left as they were."""
    if 1 not in ks:
        raise ValueError("the curve is relative to k = 1: ks must hold 1")
    vocab = int(backend.vocab_size)

    def ids(n: int, salt: int) -> list[int]:
        return [(1000 + 7919 * (i + salt)) % vocab for i in range(n)]

    cost, calls = backend.cost, backend.forward_calls
    backend.cost = CostModel()  # the timed passes are not samples of the live model
    state = backend.new_state()
    best = dict.fromkeys(ks, math.inf)
    try:
        backend.extend(state, ids(PREFIX, 0), last_only=True)
        for r in range(repeats):
            for k in ks:
                t0 = time.perf_counter()
                backend.extend(state, ids(k, 1 + r * 64 + k))
                best[k] = min(best[k], time.perf_counter() - t0)
                backend.truncate(state, PREFIX)
    finally:
        backend.release(state)
        backend.cost, backend.forward_calls = cost, calls
    return {k: max(1.0, best[k] / best[1]) for k in ks}


def _key(model: Path, settings: dict[str, Any]) -> str:
    st = model.stat()
    parts = [f"{model.resolve()}:{st.st_size}:{st.st_mtime_ns}", cpu_model(), cpu_detail() or ""]
    parts.append(f"ks={KS} prefix={PREFIX} repeats={REPEATS}")  # a curve measured otherwise is not this one
    return kept_measurements.key(parts + [f"{k}={settings[k]}" for k in sorted(settings)])


def calibrate(
    backend: Backend, model: Path, settings: dict[str, Any], cache: Path
) -> dict[int, float] | None:
    """This machine's curve for ``backend`` (loaded from ``model`` with ``settings``): read from
    ``cache``, else measured and kept there. It becomes the backend's prior cost curve (module
    docstring). None (nothing changed) where the model file is not there."""
    if not model.is_file():
        return None
    entry_key = _key(model, settings)
    curve: dict[int, float] | None = None
    entry = read_entries(cache).get(entry_key)
    if isinstance(entry, dict) and isinstance(entry.get("curve"), dict):
        try:
            curve = {int(k): float(v) for k, v in entry["curve"].items()}
        except (TypeError, ValueError):
            curve = None
        if curve is not None and (curve.get(1) != 1.0 or any(v < 1.0 for v in curve.values())):
            curve = None
    if curve is None:
        t0 = time.perf_counter()
        log.info("measuring %s's verification cost on this machine (once; kept in %s)", model.name, cache)
        curve = measure(backend)
        entry = {
            "model": model.name,
            "settings": settings,
            "cpu": f"{cpu_model()} ({cpu_detail()})",
            "seconds": round(time.perf_counter() - t0, 2),
            "curve": {str(k): round(v, 4) for k, v in sorted(curve.items())},
        }
        keep_entry(cache, entry_key, entry)  # a read-only home: measured again next time
    backend.use_cost_prior(curve)
    return curve
