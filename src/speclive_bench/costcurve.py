"""Verification cost curves: t(k), the time of one ``extend`` of k new tokens, and the bounds
they put on speculative decoding.

``measure_cost_curve`` times one ``extend`` of k new tokens after a fixed prefix (the shape of a
verification pass), truncating back after each, and reports the median t(k) and t(k)/t(1).

Bounds (decode only, prefill excluded), with r(k) = t(k)/t(1) the measured cost curve:

- *free-draft bound* of a run: the same draft/accept trace with drafting free,
  ``Σ(accepted_i + 1) / Σ r(drafted_i + 1)`` over its verification steps;
- *α-bound*: the best speedup of a free chain drafter whose tokens are accepted independently
  with probability α̂ (estimated from the trace), ``max_k (1 - α^(k+1)) / (1 - α) / r(k + 1)``;
- *ceiling*: the α-bound at α = 1 (every draft accepted).

``speclive bench costcurve`` writes ``costcurve-<model>-<backend>[-<device>].{json,md,png}``
(``write_costcurve_outputs``).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from speclive.backends.base import Backend
from speclive.common_options import backend_option, model_option
from speclive.options import option
from speclive_bench import report

DEFAULT_CURVE_KS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)


# ------------------------------------------------------------------------------------ cost curve
def curve_tokens(backend: Backend, n: int) -> list[int]:
    """``n`` deterministic token ids of ordinary code text for timing (content barely matters)."""
    lines = [f"def f{i}(x, y):\n    return x * {i} + y - {i * i}  # step {i}\n" for i in range(4 * n)]
    ids = backend.tokenizer.encode("".join(lines))
    if len(ids) < n:
        raise ValueError(f"could not build {n} timing tokens")
    return ids[:n]


@dataclass
class CostCurveOptions:
    """Settings of ``bench costcurve``; each field with a flag is its command-line option."""

    model: str = model_option(always=True)
    backend: str = backend_option(always=True)
    device: str = report.hf_device_option()
    ks: Sequence[int] = option(
        (1, 2, 4, 8, 16, 32), "--ks", parse=int, help="comma-separated k values", always=True
    )
    repeats: int = option(
        5, "--repeats", parse=int, help="timed repeats per k (median reported)", always=True
    )
    prefix: int = option(
        256, "--prefix", parse=int, help="tokens in the cache before each extend", always=True
    )
    out: Path = report.out_option()
    plot: bool = report.plot_option()
    compare_stock_linear: bool = option(
        False,
        "--compare-stock-linear",
        help="hf: also time the curve on transformers' stock nn.Linear modules (same process)",
    )


def measure_cost_curve(
    backend: Backend,
    ks: Sequence[int] = DEFAULT_CURVE_KS,
    repeats: int = 5,
    prefix: int = 256,
    warmup: int = 1,
    progress: bool = False,
) -> dict[str, Any]:
    """Median time of one ``extend`` of k tokens after ``prefix`` tokens, for every k in ``ks``.

    Repeats are interleaved over k (k loop inside the repeat loop) so slow drift of the machine
    spreads over all k. Returns ``{"rows": [{"k", "ms", "ratio", "per_token_ms", "samples_ms"}],
    "ratios": {k: t(k)/t(1)}, ...}``.
    """
    ks = sorted({int(k) for k in ks} | {1})
    if ks[0] < 1:
        raise ValueError("k must be >= 1")
    if prefix + ks[-1] > backend.n_ctx:
        raise ValueError(f"prefix {prefix} + k {ks[-1]} exceeds the context of {backend.n_ctx} tokens")
    tokens = curve_tokens(backend, prefix + ks[-1])
    state = backend.new_state()
    samples: dict[int, list[float]] = {k: [] for k in ks}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=(warmup + repeats) * len(ks), desc=f"cost curve {backend.name}", file=sys.stderr)
    try:
        if prefix:
            backend.extend(state, tokens[:prefix], last_only=True)
        for r in range(warmup + repeats):
            for k in ks:
                t0 = time.perf_counter()
                backend.extend(state, tokens[prefix : prefix + k])
                dt = time.perf_counter() - t0
                backend.truncate(state, prefix)
                if r >= warmup:
                    samples[k].append(dt)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        backend.release(state)
    med = {k: statistics.median(v) for k, v in samples.items()}
    rows = [
        {
            "k": k,
            "ms": 1000 * med[k],
            "ratio": med[k] / med[1],
            "per_token_ms": 1000 * med[k] / k,
            "samples_ms": [1000 * s for s in samples[k]],
        }
        for k in ks
    ]
    return {
        "model": backend.name,
        "backend": backend.kind,
        "prefix": prefix,
        "repeats": repeats,
        "rows": rows,
        "ratios": {k: med[k] / med[1] for k in ks},
        "t1_ms": 1000 * med[1],
    }


class CostCurve:
    """r(k) = t(k)/t(1) from measured points: linear interpolation, linear extrapolation beyond."""

    def __init__(self, ratios: Mapping[int, float]):
        pts = sorted((int(k), float(v)) for k, v in ratios.items())
        if not pts:
            raise ValueError("an empty cost curve")
        self.ks = [k for k, _ in pts]
        self.rs = [v for _, v in pts]

    def __call__(self, k: float) -> float:
        ks, rs = self.ks, self.rs
        if k <= ks[0]:
            return rs[0]
        if k >= ks[-1]:
            if len(ks) == 1:
                return rs[0] * k / ks[0]
            slope = (rs[-1] - rs[-2]) / (ks[-1] - ks[-2])
            return rs[-1] + max(slope, 0.0) * (k - ks[-1])
        return float(np.interp(k, ks, rs))


def alpha_bound(alpha: float, r: Callable[[float], float], max_k: int) -> tuple[float, int]:
    """Best (speedup, k) of a free chain drafter with i.i.d. per-token acceptance ``alpha``."""
    best, best_k = 1.0 / r(1), 0
    a = min(max(alpha, 0.0), 1.0)
    for k in range(1, max_k + 1):
        tokens = (k + 1) if a >= 1.0 else (1 - a ** (k + 1)) / (1 - a)
        s = tokens / r(k + 1)
        if s > best:
            best, best_k = s, k
    return best, best_k


def trace_bound(steps: Sequence[Sequence[int]], r: Callable[[float], float]) -> float | None:
    """Speedup of a draft/accept trace ``[(drafted, accepted), ...]`` if drafting were free."""
    if not steps:
        return None
    cost = sum(r(d + 1) for d, _ in steps)
    return sum(a + 1 for _, a in steps) / cost if cost > 0 else None


def alpha_hat(steps: Sequence[Sequence[int]]) -> float | None:
    """Per-token acceptance estimate: accepted / (accepted + steps that rejected a draft)."""
    hits = sum(a for d, a in steps if d > 0)
    misses = sum(1 for d, a in steps if d > 0 and a < d)
    return hits / (hits + misses) if hits + misses else None


# ------------------------------------------------------------------------------------ report
CURVE_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("k", "k", 0),
    ("ms", "t(k) ms", 2),
    ("ratio", "t(k)/t(1)", 2),
    ("per_token_ms", "ms/token", 2),
)

STOCK_CURVE_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("stock_ms", "stock nn.Linear t(k) ms", 2),
    ("stock_ratio", "stock t(k)/t(1)", 2),
    ("linear_speedup", "dual-layout speedup", 2),
)


def curve_columns(rows: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, str, int], ...]:
    """The cost-curve table's columns; the stock-linear comparison when it was measured."""
    return CURVE_COLUMNS + (STOCK_CURVE_COLUMNS if rows and "stock_ms" in rows[0] else ())


def costcurve_markdown(result: Mapping[str, Any]) -> str:
    title = f"verification cost curve: {result['model']} on {result['backend']}"
    lines = report.markdown_preamble(title, result["header"])
    lines += [
        f"One `extend` of k new tokens (logits for all of them) after a fixed {result['prefix']}-token "
        f"prefix, truncated back after each; median of {result['repeats']} repeats.",
        "",
        report.md_table(curve_columns(result["rows"]), result["rows"]),
        "",
    ]
    return "\n".join(lines)


def plot_costcurve(path: Path, rows: Sequence[Mapping[str, Any]], title: str) -> Path:
    plt = report._pyplot()
    ks = [r["k"] for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.plot(ks, [r["ms"] for r in rows], "o-")
    a1.set_xlabel("k (tokens in one extend)")
    a1.set_ylabel("t(k) [ms]")
    a1.set_xscale("log", base=2)
    a1.grid(True, alpha=0.3)
    a2.plot(ks, [r["ratio"] for r in rows], "o-", label="measured t(k)/t(1)")
    a2.plot(ks, ks, "--", color="grey", label="linear (k)")
    a2.plot(ks, [1.0] * len(ks), ":", color="grey", label="flat (GPU ideal)")
    a2.set_xlabel("k")
    a2.set_ylabel("t(k)/t(1)")
    a2.set_xscale("log", base=2)
    a2.set_yscale("log", base=2)
    a2.legend()
    a2.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_costcurve_outputs(result: Mapping[str, Any], out: Path, plot: bool = True) -> dict[str, Path]:
    """Write ``costcurve-<model>-<backend>[-<device>].{json,md,png}`` into ``out`` (the device
    is named when it is not the CPU)."""
    out = Path(out)
    device = result.get("header", {}).get("settings", {}).get("device", "cpu")
    stem = f"costcurve-{result['model']}-{result['backend']}" + ("" if device == "cpu" else f"-{device}")
    paths = {"json": report.write_json(out / f"{stem}.json", result)}
    md = out / f"{stem}.md"
    md.write_text(costcurve_markdown(result))
    paths["md"] = md
    if plot:
        paths["png"] = plot_costcurve(
            out / f"{stem}.png", result["rows"], f"verification cost: {result['model']} ({result['backend']})"
        )
    return paths
