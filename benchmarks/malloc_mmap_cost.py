"""What a fixed mmap threshold costs: a copy of a verification's logits rows, with glibc's
moving threshold against a fixed one (``speclive serve --malloc-mmap-threshold``).

With a fixed threshold of T bytes, every block of T or more gets a mapping of its own and is
unmapped when freed, so each new one is faulted in page by page again. The serving path copies
logits rows (rows x vocabulary x 4 bytes: 1.5 MB for 8 rows of SmolLM2's 49,152 ids, 1.2 MB for
2 rows of Qwen's 151,936) at every step. Each setting runs in a fresh process, the settings
interleaved, and the median of the repeats is reported.

    python benchmarks/malloc_mmap_cost.py [--out benchmarks/results/malloc-mmap-cost.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, sys, time
import numpy as np
from speclive.server.memory import fix_mmap_threshold
threshold, rows, vocab, n = (int(x) for x in sys.argv[1:5])
if threshold:
    assert fix_mmap_threshold(threshold)
src = np.ones((rows, vocab), np.float32)
big = np.empty(8 << 20, np.uint8)
del big  # one large block freed: glibc's moving threshold rises past the copies' size
t0 = time.perf_counter()
for _ in range(n):
    a = src.copy()
    a[0, 0] += 1.0
    del a
print(json.dumps((time.perf_counter() - t0) / n))
"""

SHAPES = {"SmolLM2, 8 rows": (8, 49_152), "Qwen2.5, 2 rows": (2, 151_936)}
SETTINGS = {"glibc's moving threshold": 0, "fixed 1 MiB": 1 << 20}


def _one(threshold: int, rows: int, vocab: int, n: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(threshold), str(rows), str(vocab), str(n)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout))


def main() -> int:
    from speclive_bench.report import provenance, provenance_line

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/malloc-mmap-cost.md"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--copies", type=int, default=2000)
    args = ap.parse_args()
    prov = provenance(" ".join(["python", "benchmarks/malloc_mmap_cost.py", *sys.argv[1:]]))
    times: dict[tuple[str, str], list[float]] = {(s, t): [] for s in SHAPES for t in SETTINGS}
    for _ in range(args.repeats):
        for shape, (rows, vocab) in SHAPES.items():
            for setting, threshold in SETTINGS.items():
                times[shape, setting].append(_one(threshold, rows, vocab, args.copies))
    lines = [
        "# A copy of a verification's logits rows under glibc's moving and a fixed mmap threshold",
        "",
        provenance_line(prov),
        f"- command: `{prov['command']}`",
        f"- {args.copies} copies per process, {args.repeats} processes per cell, interleaved; median",
        "",
        "| logits | " + " | ".join(SETTINGS) + " | fixed / moving |",
        "|---|" + "---|" * (len(SETTINGS) + 1),
    ]
    result = {"provenance": prov, "cells": {}}
    for shape, (rows, vocab) in SHAPES.items():
        med = [statistics.median(times[shape, s]) for s in SETTINGS]
        mb = rows * vocab * 4 / 1e6
        lines.append(
            f"| {shape} ({mb:.1f} MB) | "
            + " | ".join(f"{1e6 * m:.0f} µs" for m in med)
            + f" | {med[1] / med[0]:.0f}× |"
        )
        result["cells"][shape] = {s: times[shape, s] for s in SETTINGS}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
