"""How fast could any copying drafter decode the AR outputs of a ``bench decode`` result?

A copying drafter (n-gram, prompt lookup, the suffix drafter without a datastore) drafts
tokens that already occur in the context: the prompt and the output so far. This script gives
such drafters an oracle: at every position it knows the longest run of the coming AR tokens
that occurs verbatim anywhere in the context, and it may draft any prefix of that run, which
is then accepted whole. Dynamic programming picks the draft lengths that minimise the decode's
cost on the cost curve measured in the same file (a pass verifying n tokens costs t(n)/t(1)
single steps), so the result bounds every copying drafter on those outputs and that machine:
no drafting time, no rejected token, and the right occurrence of every copy.

Beside it, the same for a draft model that would cost ``c`` target steps per drafted token and
draft every coming token right (acceptance 1), and at the acceptance ``alpha`` (each token
accepted independently): how fast a draft model of that relative cost could go at best.

    PYTHONPATH=src python benchmarks/copy_bound.py \\
        benchmarks/results/decode-coldstart-short-edits-qwen1.5b.json --model-cost 0.27 --alpha 0.75

Writes ``copy-bound-<result>.{json,md}`` beside the result with ``--out``; prints the table.
No model runs (the tokenizer reads the prompts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from speclive.loader import tokenizer_for
from speclive.models.resolve import resolve
from speclive_bench import report
from speclive_bench.costcurve import CostCurve
from speclive_bench.prompts import load_prompts


def curve(rows: list[dict]) -> list[float]:
    """t(n)/t(1) for n = 0 up to the longest measured pass, linear between the measured rows
    (``CostCurve``; t(0) = 0). Nothing past the last row: a draft is at most one token shorter
    than the longest pass measured, so no bound rests on an extrapolated cost."""
    pts = {r["k"]: r["ms"] for r in rows if r.get("ms")}
    r = CostCurve({k: ms / pts[1] for k, ms in pts.items()})
    return [0.0] + [r(n) for n in range(1, max(pts) + 1)]


def copy_runs(context: list[int], ref: list[int]) -> list[int]:
    """For each position i of ``ref``: the longest prefix of ``ref[i:]`` that occurs verbatim
    in ``context + ref[:i]`` (0 when its first token occurs nowhere)."""
    runs = []
    for i in range(len(ref)):
        ctx = context + ref[:i]
        best = 0
        for j in range(len(ctx)):
            n = 0
            while i + n < len(ref) and j + n < len(ctx) and ctx[j + n] == ref[i + n]:
                n += 1
            best = max(best, n)
        runs.append(best)
    return runs


def copy_oracle_cost(runs: list[int], t: list[float], min_run: int = 1) -> float:
    """The least decode cost (in single steps) of ``len(runs)`` tokens when each pass at
    position i may draft up to ``runs[i]`` tokens, all accepted, plus the pass's own token;
    copies shorter than ``min_run`` tokens are not drafted (a drafter that needs that much
    evidence before it trusts a copy)."""
    n = len(runs)
    cost = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        longest = min(runs[i], n - i - 1, len(t) - 2) if runs[i] >= min_run else 0
        cost[i] = min(t[k + 1] + cost[i + k + 1] for k in range(longest + 1))
    return cost[0]


#: the oracle is also run drafting only copies of at least these many tokens
MIN_RUNS = (1, 2, 4, 8)


def model_draft_bound(t: list[float], c: float, alpha: float) -> tuple[float, int]:
    """The best speed over plain decoding of a draft model costing ``c`` target steps per
    drafted token, drafting k tokens per pass, each accepted with probability ``alpha``
    (a rejection ends the run): max over k of E[tokens] / (t(k+1)/t(1) + k c), and its k."""
    best = (1.0, 0)
    for k in range(1, len(t) - 1):
        tokens = sum(alpha**i for i in range(k + 1))
        best = max(best, (tokens / (t[k + 1] + k * c), k))
    return best


def bound(result: dict, model_cost: float, alpha: float) -> dict:
    """Per prompt and per set: the copy oracle's speed over plain decoding and the share of
    positions where a copy of at least 1 / 4 tokens was there to take."""
    tok = tokenizer_for(resolve(result["header"]["target"]))
    t = curve(result["cost_curves"]["llamacpp"]["rows"])
    limit = result["header"]["settings"]["limit"]
    ar = [r for r in result["records"] if r["method"] == "ar" and r.get("backend") == "llamacpp"]
    sets = list(dict.fromkeys(r["set"] for r in ar))
    texts = {p["id"]: p["text"] for s in sets for p in load_prompts(s, limit)}
    prompts = []
    for r in ar:
        context = tok.chat([{"role": "user", "content": texts[r["prompt_id"]]}])
        ref = r["token_ids"]
        runs = copy_runs(context, ref)
        prompts.append(
            {
                "set": r["set"],
                "prompt_id": r["prompt_id"],
                "tokens": len(ref),
                **{f"copy_oracle_speedup_min{m}": len(ref) / copy_oracle_cost(runs, t, m) for m in MIN_RUNS},
                "copy_at_least_1": sum(x >= 1 for x in runs) / len(runs),
                "copy_at_least_4": sum(x >= 4 for x in runs) / len(runs),
            }
        )
    per_set = []
    for s in sets:
        ps = [p for p in prompts if p["set"] == s]
        row: dict = {"set": s, "prompts": len(ps)}
        for m in MIN_RUNS:
            row[f"copy_oracle_speedup_min{m}"] = statistics.median(
                p[f"copy_oracle_speedup_min{m}"] for p in ps
            )
        row["copy_at_least_1"] = statistics.mean(p["copy_at_least_1"] for p in ps)
        row["copy_at_least_4"] = statistics.mean(p["copy_at_least_4"] for p in ps)
        per_set.append(row)
    perfect, k_perfect = model_draft_bound(t, model_cost, 1.0)
    at_alpha, k_alpha = model_draft_bound(t, model_cost, alpha)
    return {
        "curve": {str(n): t[n] for n in (2, 3, 4, 8, 16, 32)},
        "model_draft": {
            "cost_per_token": model_cost,
            "alpha": alpha,
            "perfect_speedup": perfect,
            "perfect_k": k_perfect,
            "speedup_at_alpha": at_alpha,
            "k_at_alpha": k_alpha,
        },
        "sets": per_set,
        "prompts": prompts,
    }


def markdown(res: dict) -> str:
    lines = report.markdown_preamble("Copy oracle: the bound of every copying drafter", res["header"])
    lines += [
        "Cost curve t(n)/t(1) from the result file: "
        + ", ".join(f"t({n}) {v:.2f}" for n, v in res["curve"].items()),
        "",
        report.md_table(
            [
                ("set", "set", 0),
                ("prompts", "prompts", 0),
                *[
                    (f"copy_oracle_speedup_min{m}", f"copy oracle, copies ≥ {m} drafted: median over AR", 2)
                    for m in MIN_RUNS
                ],
                ("copy_at_least_1", "positions with a copy of ≥ 1 token", 2),
                ("copy_at_least_4", "≥ 4 tokens", 2),
            ],
            res["sets"],
        ),
        "",
    ]
    m = res["model_draft"]
    lines.append(
        f"A draft model costing {m['cost_per_token']:.2f} target steps per drafted token: at best "
        f"{m['perfect_speedup']:.2f}× (every token right, k = {m['perfect_k']}); at acceptance "
        f"{m['alpha']:.2f}, {m['speedup_at_alpha']:.2f}× (k = {m['k_at_alpha']})."
    )
    return "\n".join(lines)


def serve_inputs(result: Path, curve_result: Path, out: Path | None) -> tuple[dict, list[dict], Any]:
    """What the scripts over a ``bench serve`` result read: that result, the llama.cpp cost
    curve rows of a ``bench decode`` result and the target's tokenizer (after refusing to write
    into ``out`` from a dirty tree)."""
    if out is not None:
        report.refuse_dirty_results(out)
    source = json.loads(result.read_text())
    rows = json.loads(curve_result.read_text())["cost_curves"]["llamacpp"]["rows"]
    return source, rows, tokenizer_for(resolve(source["header"]["target"]))


def stamp(res: dict, script: str, argv: list[str] | None, path: Path, source: dict) -> None:
    """A derived result's provenance and header: the command that made it, this machine, and
    the result file it was computed from (with that file's machine)."""
    command = " ".join(["python", f"benchmarks/{script}", *(argv or sys.argv[1:])])
    res["provenance"] = report.provenance(command)
    res["header"] = {
        "machine": report.machine_info(None),
        "command": command,
        "source": path.name,
        "source_machine": source["header"].get("machine"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", type=Path)
    ap.add_argument("--model-cost", type=float, required=True, help="a draft token's cost in target steps")
    ap.add_argument("--alpha", type=float, required=True, help="the draft model's acceptance per token")
    ap.add_argument("--out", type=Path, default=None, help="write copy-bound-<result>.{json,md} here")
    args = ap.parse_args(argv)
    if args.out is not None:
        report.refuse_dirty_results(args.out)
    source = json.loads(args.result.read_text())
    res = bound(source, args.model_cost, args.alpha)
    stamp(res, "copy_bound.py", argv, args.result, source)
    print(markdown(res))
    if args.out is not None:
        for p in report.write_result_files(res, args.out, f"copy-bound-{args.result.stem}", markdown, None):
            print(f"wrote {p}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
