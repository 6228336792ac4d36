"""Faster fp32 ``nn.Linear`` on CPU for the few-row shapes speculative decoding lives on.

A decode step multiplies 1 row by each weight matrix and a verification pass 2–32 rows. A CPU
BLAS's stock ``F.linear(x, W)`` can be poor exactly there: the same product written as
``x @ Wᵀ`` with ``Wᵀ`` stored contiguous can be faster for one row, and ``W @ xᵀ`` with the rows
padded to a block costs about the same for every row count up to the block (and parallelises
over the cores, which the one-row path cannot use: it is memory-bound). Which kernel wins
depends on the machine, so it is measured there (below). ``benchmarks/README.md`` has the
whole-model effect; ``speclive bench costcurve --compare-stock-linear`` measures it on a machine.

``DualLinear`` keeps both layouts (the native ``W`` is shared with the original module,
so the extra memory is one transposed copy of each weight) and picks, per row count, the kernel
a start-up calibration found fastest: ``x @ Wᵀ`` for few rows, ``W @ xᵀ`` (rows padded up to a
block) beyond. Rows never mix, so padding changes no real row; the kernels round differently,
as the stock path already does between M=1 (gemv) and M>1 (gemm), so greedy outputs stay
token-identical in the fp32 differential tests.

The per-row-count choice is measured once per machine, thread count, torch version and weight
shape, and kept in ``$SPECLIVE_HOME/linear-plans.json`` (delete it to re-measure).

``install(model)`` swaps every ``nn.Linear`` of a model (memory permitting) and
``stock_linears(model)`` swaps them back for a block, so transformers' own ``generate`` peers
are always measured on stock modules.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from speclive.kept_measurements import keep_entry, read_entries
from speclive.models.install import speclive_home
from speclive.sysinfo import cpu_detail, cpu_model

#: rows are padded up to a multiple of this before the ``W @ xᵀ`` kernel
PAD_BLOCK = 16
#: the row counts calibrated; others use the plan of the next larger one
CALIBRATE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def _padded(m: int, block: int = PAD_BLOCK) -> int:
    """``m`` rounded up to a multiple of ``block``."""
    return -(-m // block) * block


def calibrate(weight: Any, repeats: int = 5) -> dict[int, bool]:
    """For each calibrated row count: True when ``W @ xᵀ`` (padded) beats ``x @ Wᵀ``.

    Timed on ``weight`` (the model's largest matrix: the choice is a property of the BLAS, the
    thread count and the row count far more than of the exact shape). The two kernels are timed
    alternately and the best of ``repeats`` kept, so a burst of load from another process
    hits both alike.
    """
    import torch

    wt = weight.t().contiguous()
    plan: dict[int, bool] = {}
    with torch.inference_mode():
        for m in CALIBRATE_ROWS:
            x = torch.randn(m, weight.shape[1], dtype=weight.dtype)
            xp = torch.nn.functional.pad(x, (0, 0, 0, _padded(m) - m))
            best = {"t": float("inf"), "n": float("inf")}
            for i in range(repeats + 1):
                for name in ("t", "n"):
                    t0 = time.perf_counter()
                    _ = x @ wt if name == "t" else weight @ xp.t()
                    dt = time.perf_counter() - t0
                    if i:  # the first round warms both kernels up
                        best[name] = min(best[name], dt)
            plan[m] = best["n"] < best["t"]
    return plan


def _plan_key(weight: Any) -> str:
    import torch

    cpu = f"{cpu_model()} ({cpu_detail()})"
    shape = "x".join(str(d) for d in weight.shape)
    return f"{cpu}|cores={os.cpu_count()}|threads={torch.get_num_threads()}|torch={torch.__version__}|{shape}"


def cached_plan(weight: Any) -> tuple[dict[int, bool], bool]:
    """The calibration plan for ``weight`` on this machine, from ``$SPECLIVE_HOME/linear-plans.json``
    when it was measured before (returns ``(plan, from_cache)``)."""
    path = speclive_home() / "linear-plans.json"
    key = _plan_key(weight)
    plans = read_entries(path)
    if key in plans:
        return {int(m): bool(v) for m, v in plans[key].items()}, True
    plan = calibrate(weight)
    keep_entry(path, key, {str(m): v for m, v in plan.items()})  # read-only: calibrated per load
    return plan, False


class DualLinear:
    """``y = x @ Wᵀ + b`` for a 2-D ``x``, with ``W`` kept in both layouts (module docstring).

    ``use_native(m)`` says from the plan whether ``m`` rows go through ``W @ xᵀ``; with
    ``pad_block`` those rows are padded up to a multiple of it first. Shared by the HF module
    wrapper and the Whisper decoder (``asr.whisper``).
    """

    __slots__ = ("w", "wt", "b", "bt", "plan", "pad_block", "_cache")

    def __init__(self, w: Any, b: Any, plan: dict[int, bool], pad_block: int | None = PAD_BLOCK):
        self.w = w.detach().contiguous()
        self.wt = self.w.t().contiguous()
        self.b = None if b is None else b.detach().contiguous()
        self.bt = None if self.b is None else self.b[:, None]
        self.plan = plan
        self.pad_block = pad_block
        self._cache: dict[int, bool] = {}

    def use_native(self, m: int) -> bool:
        hit = self._cache.get(m)
        if hit is None:
            key = next((r for r in CALIBRATE_ROWS if r >= m), CALIBRATE_ROWS[-1])
            hit = self._cache[m] = self.plan.get(key, m >= PAD_BLOCK)
        return hit

    def __call__(self, x: Any) -> Any:
        import torch

        m = x.shape[0]
        if not self.use_native(m):
            return x @ self.wt if self.b is None else torch.addmm(self.b, x, self.wt)
        pad = _padded(m, self.pad_block) - m if self.pad_block else 0
        xp = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
        y = self.w @ xp.t() if self.bt is None else torch.addmm(self.bt, self.w, xp.t())
        return y.t()[:m].contiguous()


def split_plan(rows: int) -> dict[int, bool]:
    """A fixed plan: ``W @ xᵀ`` from ``rows`` rows on."""
    return {m: m >= rows for m in CALIBRATE_ROWS}


def _dual_class() -> type:
    import torch

    class _Dual(torch.nn.Module):
        def __init__(self, native: torch.nn.Linear, plan: dict[int, bool]):
            super().__init__()
            self.native = [native]  # a list: not registered as a submodule (no double weights)
            self.in_features, self.out_features = native.in_features, native.out_features
            self.core = DualLinear(native.weight, native.bias, plan)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.core(x.reshape(-1, self.in_features))
            return y.reshape(*x.shape[:-1], self.out_features)

        def extra_repr(self) -> str:
            return f"in_features={self.in_features}, out_features={self.out_features}, dual layout"

    return _Dual


_DUAL: type | None = None


def make_dual(linear: Any, plan: dict[int, bool]) -> Any:
    global _DUAL
    if _DUAL is None:
        _DUAL = _dual_class()
    return _DUAL(linear, plan)


def _linears(model: Any) -> list[tuple[Any, str, Any]]:
    import torch

    out = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, torch.nn.Linear):
                out.append((parent, name, child))
    return out


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def install(model: Any, max_memory_fraction: float = 0.4) -> dict[str, Any]:
    """Swap every fp32 CPU ``nn.Linear`` of ``model`` for a calibrated dual-layout one.

    Skipped (returns ``{"installed": False, "why": ...}``) off CPU, for non-fp32 weights, when
    ``SPECLIVE_STOCK_LINEAR=1``, or when the transposed copies would take more than
    ``max_memory_fraction`` of the available memory.
    """
    import torch

    if os.environ.get("SPECLIVE_STOCK_LINEAR") == "1":
        return {"installed": False, "why": "SPECLIVE_STOCK_LINEAR=1"}
    found = _linears(model)
    if not found:
        return {"installed": False, "why": "no nn.Linear"}
    weights = [lin.weight for _, _, lin in found]
    if any(w.device.type != "cpu" or w.dtype != torch.float32 for w in weights):
        return {"installed": False, "why": "not float32 on CPU"}
    extra = sum(w.numel() * w.element_size() for w in {id(w): w for w in weights}.values())
    avail = _available_bytes()
    if avail is not None and extra > max_memory_fraction * avail:
        return {
            "installed": False,
            "why": f"transposed weights need {extra / 2**30:.1f} GiB, over "
            f"{max_memory_fraction:.0%} of the {avail / 2**30:.1f} GiB available",
        }
    largest = max(weights, key=lambda w: w.numel() if w.shape[0] < 65536 else 0)
    t0 = time.perf_counter()
    plan, cached = cached_plan(largest.detach())
    calib_s = time.perf_counter() - t0
    for parent, name, lin in found:
        setattr(parent, name, make_dual(lin, plan))
    native_from = min((m for m, v in plan.items() if v and m > 1), default=None)
    return {
        "installed": True,
        "layers": len(found),
        "extra_gib": round(extra / 2**30, 3),
        "native_from_rows": native_from,
        "plan": "cached" if cached else f"calibrated in {calib_s:.2f} s",
    }


@contextlib.contextmanager
def stock_linears(*models: Any) -> Iterator[None]:
    """Within the block, ``models`` run on their original ``nn.Linear`` modules."""
    swapped: list[tuple[Any, str, Any]] = []
    try:
        for model in models:
            if model is None:
                continue
            for parent in model.modules():
                for name, child in list(parent.named_children()):
                    if _DUAL is not None and isinstance(child, _DUAL):
                        setattr(parent, name, child.native[0])
                        swapped.append((parent, name, child))
        yield
    finally:
        for parent, name, dual in swapped:
            setattr(parent, name, dual)
