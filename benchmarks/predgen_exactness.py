"""Classify the greedy answers of a PredGen result file that differ from the baseline's.

The same check ``speclive bench predgen`` now runs at the end of every run
(``bench.predgen.check_greedy_exactness``): at the first differing token, plain AR's top-2
logit gap decides near-tie (allowed on llama.cpp) or BUG. For result files written before the
bench did this, it adds the verdicts and rewrites the JSON, Markdown and plot in place.

    PYTHONPATH=src python benchmarks/predgen_exactness.py benchmarks/results/predgen-X.json [--near-tie 0.5]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from speclive.loader import load_backend
    from speclive_bench.predgen import _mark_agreement, check_greedy_exactness, summarize, write_outputs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path, help="predgen-*.json")
    ap.add_argument("--near-tie", type=float, default=0.5)
    args = ap.parse_args(argv)
    result = json.loads(args.result.read_text())
    h = result["header"]
    backend = load_backend(h["target"], h["backends"])
    records = result["records"]
    _mark_agreement(records)
    found = check_greedy_exactness(records, backend, args.near_tie)
    h["settings"]["near_tie_gap"] = args.near_tie
    h["settings"]["near_tie_check"] = "added afterwards by benchmarks/predgen_exactness.py"
    result["summary"] = summarize(records, h["methods"], h["settings"]["turns"])
    write_outputs(result, args.result.parent, args.result.stem)
    bugs = [d for d in found if d["verdict"] == "bug"]
    for d in found:
        where = f"q{d['id']} t{d['turn']} {d['method']}: token {d['position']}"
        print(f"{where} gap {d['gap_top2']:.3f} {d['verdict']}")
    print(f"{len(found)} divergences, {len(bugs)} BUGS", file=sys.stderr)
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
