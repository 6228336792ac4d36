"""Judge the answers of a PredGen result file: MT-Bench single-answer scores, paired by question.

``speclive bench predgen --judge MODEL`` grades every answer inside the run; on this 2-core CPU
the 1.5B judge needs ~20-30 s per answer, more than the run itself. This script grades the
answers of a finished result file afterwards, for chosen methods and an evenly spread subset of
its questions, with the same judge (``bench.predgen.Judge``: the ``single-v1`` prompt, greedy),
and reports each method's mean score, its exact agreement with the baseline and its score
difference from the baseline paired by question (95 % bootstrap interval over questions).

    flock /tmp/speclive-cpu.lock env PYTHONPATH=src python benchmarks/predgen_judge.py \\
        benchmarks/results/predgen-X.json --methods baseline,topk:3 --limit 24 \\
        --judge qwen2.5-coder-1.5b-instruct --backend llamacpp

writes ``benchmarks/results/predgen-judge-<stem>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def paired_difference(a: list[float], b: list[float], n_boot: int = 4000, seed: int = 0) -> dict[str, float]:
    """Mean of ``a - b`` over pairs with a 95 % bootstrap interval (pairs resampled)."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    return {
        "mean": float(d.mean()),
        "lo": float(np.quantile(means, 0.025)),
        "hi": float(np.quantile(means, 0.975)),
    }


def summarize(records: list[dict[str, Any]], methods: list[str]) -> list[dict[str, Any]]:
    by = {(r["method"], r["id"]): r for r in records}
    rows = []
    for m in methods:
        mine = {i: r for (meth, i), r in sorted(by.items()) if meth == m}
        scored = [r for r in mine.values() if r.get("score") is not None]
        row: dict[str, Any] = {
            "method": m,
            "answers": len(mine),
            "scored": len(scored),
            "mean_score": float(np.mean([r["score"] for r in scored])) if scored else None,
            "identical_to_baseline": sum(bool(r.get("identical")) for r in mine.values()),
            "forced": sum(bool(r.get("forced")) for r in mine.values()),
        }
        pairs = [
            (r["score"], base["score"])
            for i, r in mine.items()
            if (base := by.get(("baseline", i))) is not None
            and r.get("score") is not None
            and base.get("score") is not None
        ]
        if m != "baseline" and pairs:
            row["vs_baseline"] = paired_difference([p[0] for p in pairs], [p[1] for p in pairs])
        rows.append(row)
    return rows


def markdown(result: dict[str, Any]) -> str:
    h = result["header"]
    lines = [
        "# PredGen answers judged (MT-Bench single-answer, 1-10)",
        "",
        f"- answers from: `{h['source']}` ({h['source_command']})",
        f"- judge: {h['judge']} on {h['backend']}, greedy, `single-v1` prompt, max 256 tokens "
        "(a rating asked for after 128 when the reply has none)",
        f"- questions: {h['questions']} of the file's, evenly spread: {', '.join(map(str, h['ids']))}",
        f"- machine: {h['machine'].get('cpu', '?')}, {h['machine'].get('cores_usable')} cores, "
        f"git {h['machine'].get('git')}, date (UTC) {h['machine'].get('date_utc')}",
        "",
        "Reproduce with:",
        "",
        "```",
        h["command"],
        "```",
        "",
        "*identical* = answers token-identical to the baseline's; *vs baseline* = mean score "
        "difference paired by question, with a 95 % bootstrap interval over questions; "
        "*forced* = the judge wrote no `[[rating]]` in its reply, so its first 128 tokens were "
        "followed by `Rating: [[` for it to complete (`bench.predgen.Judge`); *unscored* = "
        "no number even then.",
        "",
        "| method | answers | mean score | vs baseline | identical to baseline | forced | unscored |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["summary"]:
        vs = r.get("vs_baseline")
        vs_s = f"{vs['mean']:+.2f} [{vs['lo']:+.2f}, {vs['hi']:+.2f}]" if vs else "–"
        mean = f"{r['mean_score']:.2f}" if r["mean_score"] is not None else "–"
        lines.append(
            f"| {r['method']} | {r['answers']} | {mean} | {vs_s} | {r['identical_to_baseline']} | "
            f"{r.get('forced', 0)} | {r['answers'] - r['scored']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    from speclive_bench.predgen import Judge, _spread
    from speclive_bench.report import machine_info

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path, help="predgen-*.json")
    ap.add_argument("--methods", default="baseline,topk:3", help="methods to grade (baseline first)")
    ap.add_argument("--limit", type=int, default=24, help="questions, evenly spread over the file's")
    ap.add_argument("--turn", type=int, default=1)
    ap.add_argument("--judge", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--backend", default="llamacpp")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if "baseline" not in methods:
        methods.insert(0, "baseline")
    src = json.loads(args.result.read_text())
    records = [r for r in src["records"] if r["turn"] == args.turn and r["method"] in methods]
    missing = sorted(set(methods) - {r["method"] for r in records})
    if missing:
        print(
            f"error: {args.result} has no turn-{args.turn} answers for {', '.join(missing)}", file=sys.stderr
        )
        return 2
    all_ids = sorted({r["id"] for r in records})
    ids = [all_ids[i] for i in _spread(len(all_ids), min(args.limit, len(all_ids)))]
    chosen = [r for r in records if r["id"] in ids]
    chosen.sort(key=lambda r: (r["id"], methods.index(r["method"])))  # one question's answers in a row
    judge = Judge(args.judge, args.backend)
    graded = []
    for r in tqdm(chosen, desc="judge", unit="answer", file=sys.stderr):
        graded.append(
            {k: r[k] for k in ("id", "turn", "method", "question", "response")}
            | {"identical": r.get("identical")}
            | judge.judge(r["question"], r["response"])
        )
    command = (
        f"flock /tmp/speclive-cpu.lock env PYTHONPATH=src python benchmarks/predgen_judge.py {args.result} "
        f"--methods {','.join(methods)} --limit {args.limit} --turn {args.turn} --judge {args.judge} "
        f"--backend {args.backend}"
    )
    result = {
        "header": {
            "source": str(args.result),
            "source_command": src["header"].get("command", "?"),
            "judge": args.judge,
            "backend": args.backend,
            "questions": len(ids),
            "ids": ids,
            "machine": machine_info(),
            "command": command,
        },
        "summary": summarize(graded, methods),
        "records": graded,
    }
    stem = f"predgen-judge-{args.result.stem.removeprefix('predgen-')}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    md = markdown(result)
    (args.out / f"{stem}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
