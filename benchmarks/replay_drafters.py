"""Replay drafters against the AR outputs of a ``bench talon`` / ``bench decode`` result file.

No model runs: the AR record's tokens are the target's greedy output, so a drafted node is
"accepted" when it equals the AR token at its position (oracle greedy acceptance; near-ties
ignored) and a step costs t(n+1)/t(1) from the cost curve measured in the same file. The
drafters (one instance each, kept across prompts and sets like the benchmark's) see exactly
the same contexts, so their per-step decisions can be compared without timing noise:

    PYTHONPATH=src python benchmarks/replay_drafters.py benchmarks/results/talon-X.json \\
        --datastore /tmp/talon/ds-qwen1.5b.npz [--steps] [--no-free-probes]

Prints per prompt and per set the decode speedup each drafter would reach on that curve
(drafting time ignored: the suffix drafter's lookups are ~0.3% of a step).

``--cold`` replays what one process per prompt does: a fresh drafter for every prompt, and a
target whose cost model starts from the prior curve and learns from the replayed steps only.
"""

from __future__ import annotations

import argparse
import json
import sys

from speclive.backends.base import CostModel
from speclive.drafting.base import StepFeedback
from speclive.drafting.ngram import NgramDrafter
from speclive.drafting.priors import cost_curve
from speclive.drafting.suffix import SuffixConfig, SuffixDrafter, load_datastore
from speclive.loader import tokenizer_for
from speclive.models.resolve import resolve
from speclive_bench.prompts import load_prompts


class CurveTarget:
    """What a drafter's ``start`` reads: the measured cost curve (interpolated between rows)."""

    kind = "llamacpp"
    max_tree_branches = 16

    def __init__(self, rows: list[dict], tokenizer) -> None:
        self.tokenizer = tokenizer
        self.cost = CostModel()
        pts = {r["k"]: r["ms"] / 1000 for r in rows if r.get("ms")}
        ks = sorted(pts)
        for k in range(1, 65):
            lo = max((x for x in ks if x <= k), default=ks[0])
            hi = min((x for x in ks if x >= k), default=None)
            if hi is None:
                s = pts[lo] * k / lo
            elif hi == lo:
                s = pts[lo]
            else:
                s = pts[lo] + (pts[hi] - pts[lo]) * (k - lo) / (hi - lo)
            self.cost.observe(k, s)

    def seconds(self, n: int) -> float:
        return self.cost._seconds[min(n, 64)]


def replay(d, target: CurveTarget, prompt: list[int], ref: list[int], timing: CurveTarget | None = None):
    """Oracle decoding of ``ref``; step times from ``timing`` (default ``target``). When they
    differ, ``target``'s cost model learns each step's time as a backend's would."""
    timing = timing or target
    ctx = list(prompt)
    d.start(target, ctx)
    out: list[int] = []
    steps, secs = [], 0.0
    while len(out) < len(ref):
        budget = min(64, len(ref) - len(out) - 1)
        tree = d.propose(ctx, budget).truncated(budget) if budget > 0 else None
        n = len(tree) if tree is not None else 0
        acc = tree.follow(ref[len(out) :]) if n else []
        new = ref[len(out) : len(out) + len(acc) + 1]
        dt = timing.seconds(n + 1)
        secs += dt
        if timing is not target:
            target.cost.observe(n + 1, dt)
        if n:
            d.feedback(StepFeedback(tree, acc, new[-1], dt, len(new)))
        steps.append((n, len(acc)))
        out += new
        ctx += new
    return steps, secs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result")
    ap.add_argument("--datastore", default=None)
    ap.add_argument("--no-free-probes", action="store_true")
    ap.add_argument("--steps", action="store_true", help="print the (drafted, accepted) steps")
    ap.add_argument("--cold", action="store_true", help="a fresh drafter and cost model per prompt")
    args = ap.parse_args(argv)
    res = json.load(open(args.result))
    tok = tokenizer_for(resolve(res["header"]["target"]))
    rows = res["cost_curves"]["llamacpp"]["rows"]
    target = CurveTarget(rows, tok)
    t1 = target.seconds(1)
    sets = list(dict.fromkeys(r["set"] for r in res["records"]))
    limit = res["header"]["settings"]["limit"]
    texts = {p["id"]: p["text"] for s in sets for p in load_prompts(s, limit)}
    store = load_datastore(args.datastore, target) if args.datastore else None  # type: ignore[arg-type]
    makers = {
        "ngram": NgramDrafter,  # the default: survival-mode buckets
        "suffix": lambda: SuffixDrafter(store, SuffixConfig(free_probes=not args.no_free_probes)),
    }
    drafters = {m: f() for m, f in makers.items()}
    ar = [r for r in res["records"] if r["method"] == "ar" and r.get("backend") == "llamacpp"]
    for s in sets:
        tot = {m: [0.0, 0.0] for m in drafters}
        for r in (r for r in ar if r["set"] == s):
            prompt = tok.chat([{"role": "user", "content": texts[r["prompt_id"]]}])
            ref = r["token_ids"]
            line = [s, r["prompt_id"]]
            for m, d in drafters.items():
                if args.cold:
                    cold = CurveTarget(rows, tok)
                    cold.cost = CostModel(cost_curve())
                    steps, secs = replay(makers[m](), cold, prompt, ref, timing=target)
                else:
                    steps, secs = replay(d, target, prompt, ref)
                tot[m][0] += len(ref) * t1
                tot[m][1] += secs
                line.append(f"{m} {len(ref) * t1 / secs:.3f}x ({len(steps)} passes)")
                if args.steps:
                    print(m, [(i, st) for i, st in enumerate(steps) if st[0]])
            print(*line)
        print(s, *(f"{m} {b / t:.3f}x" for m, (b, t) in tot.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
