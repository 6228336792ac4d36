"""Paired statistics of the benchmarks: percentiles, one bootstrap and the ratios built on it.

Every benchmark runs each sample through every method, so its comparisons are paired: a
bootstrap resamples the samples (rows), keeping each sample's values of all methods together.
The resampling is seeded (``SEED``), so a result file's intervals are reproducible.

- ``paired_ratio``: the house definition of a paired ratio, the median of per-sample ratios
  new / base with its 95 % bootstrap interval and the geometric mean beside it;
- ``percentile_ratio``: base / new of the q-th percentiles, paired bootstrap interval;
- ``ratio_of_sums``: (Σa_num / Σa_den) / (Σb_num / Σb_den), e.g. throughput over throughput on
  the same prompts, paired bootstrap interval;
- ``percentile_ci``: one sample's q-th percentile with its bootstrap interval;
- ``percentile``: q in 0..100, None for no data;
- ``ratio_text``: a ``paired_ratio`` as table text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

#: resamples of a bootstrap
BOOT_N = 2000
#: the bootstrap's seed: the same data give the same interval
SEED = 0
#: the interval's percentiles (95 %)
INTERVAL = (2.5, 97.5)

Method = Literal["linear", "lower", "nearest", "nearest-up"]


def percentile(values: Sequence[float | None], q: float, method: Method = "linear") -> float | None:
    """The q-th percentile (q in 0..100) of ``values`` without their None entries; None when
    nothing is left.

    ``linear`` interpolates between the two nearest ranks (numpy's default); the others return
    an observed value at rank q/100·(n−1): ``lower`` rounds the rank down, ``nearest`` to the
    nearest (a tie to the even rank), ``nearest-up`` to the nearest (a tie upwards).
    """
    v = [x for x in values if x is not None]
    if not v:
        return None
    if method == "linear":
        return float(np.percentile(v, q))
    s = sorted(v)
    at = q / 100 * (len(s) - 1)
    if method == "lower":
        k = int(at)
    elif method == "nearest":
        k = int(round(at))
    elif method == "nearest-up":
        k = int(at + 0.5)
    else:
        raise ValueError(f"unknown percentile method {method!r}")
    return float(s[min(len(s) - 1, max(0, k))])


def bootstrap(
    stat: Callable[..., Any], *samples: Sequence[float] | np.ndarray, n: int = BOOT_N, seed: int = SEED
) -> np.ndarray:
    """``stat`` on ``n`` resamples of the rows of ``samples`` (all of one length; a row's values
    stay together: a paired bootstrap). ``stat`` gets each sample resampled as an (n, rows)
    array and returns the n statistics."""
    arrays = [np.asarray(s, float) for s in samples]
    rows = arrays[0].size
    idx = np.random.default_rng(seed).integers(0, rows, size=(n, rows))
    return np.asarray(stat(*(a[idx] for a in arrays)))


def interval(sims: np.ndarray) -> tuple[float, float]:
    """The 95 % percentile interval of bootstrap statistics."""
    lo, hi = np.percentile(sims, INTERVAL)
    return float(lo), float(hi)


def paired_ratio(
    base: Sequence[float], new: Sequence[float], n: int = BOOT_N, seed: int = SEED, p90: bool = False
) -> dict[str, Any]:
    """Median and geometric mean of per-sample ratios new/base (samples with a positive base),
    the median's 95 % bootstrap interval; with ``p90`` also the ratios' 90th percentile."""
    b, m = np.asarray(base, float), np.asarray(new, float)
    ok = b > 0
    r = m[ok] / b[ok]
    if r.size == 0:
        out: dict[str, Any] = {"median": None, "lo": None, "hi": None, "geomean": None, "n": 0}
        return {**out, "p90": None} if p90 else out
    lo, hi = interval(bootstrap(lambda x: np.median(x, axis=1), r, n=n, seed=seed))
    out = {
        "median": float(np.median(r)),
        "lo": lo,
        "hi": hi,
        "geomean": float(np.exp(np.mean(np.log(np.maximum(r, 1e-9))))),
        "n": int(r.size),
    }
    if p90:
        out["p90"] = float(np.percentile(r, 90))
    return out


def ratio_text(d: dict | None) -> str:
    """A ``paired_ratio`` as "median [lo, hi] (gm geomean)"; "–" for none."""
    if not d or d.get("median") is None:
        return "–"
    return f"{d['median']:.2f} [{d['lo']:.2f}, {d['hi']:.2f}] (gm {d['geomean']:.2f})"


def percentile_ci(
    values: Sequence[float], q: float, n: int = BOOT_N, seed: int = SEED
) -> tuple[float | None, float | None, float | None]:
    """The q-th percentile of ``values`` with its 95 % bootstrap interval: (point, lo, hi)."""
    v = np.asarray(values, float)
    if v.size == 0:
        return None, None, None
    lo, hi = interval(bootstrap(lambda x: np.percentile(x, q, axis=1), v, n=n, seed=seed))
    return float(np.percentile(v, q)), lo, hi


def percentile_ratio(
    base: Sequence[float], new: Sequence[float], q: float = 50, n: int = BOOT_N, seed: int = SEED
) -> tuple[float | None, float | None, float | None]:
    """base / new of the q-th percentiles (above 1: ``new`` is lower) with a paired bootstrap
    interval over samples: (ratio, lo, hi)."""
    b, m = np.asarray(base, float), np.asarray(new, float)
    if b.size == 0:
        return None, None, None

    def ratio(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.percentile(x, q, axis=1) / np.percentile(y, q, axis=1)

    lo, hi = interval(bootstrap(ratio, b, m, n=n, seed=seed))
    return float(np.percentile(b, q) / np.percentile(m, q)), lo, hi


def ratio_of_sums(
    a_num: Sequence[float],
    a_den: Sequence[float],
    b_num: Sequence[float],
    b_den: Sequence[float],
    n: int = BOOT_N,
    seed: int = SEED,
) -> tuple[float, float, float]:
    """(Σa_num/Σa_den) / (Σb_num/Σb_den) over paired samples (e.g. tokens and seconds of two
    methods on the same prompts) with a paired bootstrap interval: (ratio, lo, hi)."""
    an, ad, bn, bd = (np.asarray(x, float) for x in (a_num, a_den, b_num, b_den))
    point = (an.sum() / ad.sum()) / (bn.sum() / bd.sum())

    def ratio(w: np.ndarray, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        return (w.sum(1) / x.sum(1)) / (y.sum(1) / z.sum(1))

    lo, hi = interval(bootstrap(ratio, an, ad, bn, bd, n=n, seed=seed))
    return float(point), lo, hi
