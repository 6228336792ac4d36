"""Calibrate speclive's cold-start priors from committed decode benchmark results.

No model runs. Three priors come out (``src/speclive/drafting/priors.json``, read by
``speclive.drafting.priors``):

- **copy survival per source and match-length bucket**: for every position of every AR output
  of the given results, the n-gram drafter's longest earlier match of the context (prompt +
  output so far) is looked up, and its continuation is compared with the AR output that
  follows (oracle greedy acceptance). Per source (the continuation is copied from the
  ``prompt`` or from the ``output`` so far) and bucket b (lower bounds of the match length, as
  ``NgramDrafter``), S_b(j) = P(the first j copied tokens are all accepted), a Kaplan-Meier
  estimate (a copy cut short by the end of the output or of its source is censored), computed
  per prompt set (prompts deduplicated per (set, prompt id)). The prior is the pointwise
  minimum over the sets with at least ``MIN_SET_POSITIONS`` positions in that bucket: a curve
  safe on chat as well as on code (pooling would let the many long copies of code edits
  decide, and a cold drafter would then send long drafts after short prompt matches on chat);
  the controllers lift it where drafts keep being accepted. A bucket with fewer than
  ``MIN_POSITIONS`` positions in all gets no curve of its own (the drafter then uses the
  nearest calibrated bucket below it).
- **the verification cost curve t(k)/t(1)** of the llama.cpp target, the median of the cost
  curves measured in those results;
- **the draft/target step-cost ratio** of the same-vocabulary draft model, from the committed
  cost curves of the draft and of the target (t(1) of each, llama.cpp);
- **the draft model's per-token acceptance** (with ``--draft-model``, which loads it): the draft
  model reads each AR output teacher-forced after the last ``DEFAULT_WINDOW`` prompt tokens (what
  ``ModelDrafter`` sees) and α is the share of output positions where its argmax is the AR
  token; per set, and the prior is the minimum over the sets.

    PYTHONPATH=src python benchmarks/calibrate_priors.py \\
        benchmarks/results/archive/decode-qwen1.5b-llamacpp.json \\
        benchmarks/results/archive/decode-qwen1.5b-llamacpp-code-edit.json \\
        --draft-curve benchmarks/results/archive/costcurve-qwen2.5-coder-0.5b-instruct-q4_k_m-llamacpp.json \\
        --draft-model qwen2.5-coder-0.5b-instruct --out src/speclive/drafting/priors.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from speclive.drafting.ngram import NgramDrafter
from speclive.loader import tokenizer_for
from speclive.models.resolve import resolve
from speclive_bench.prompts import load_prompts

BUCKETS = (2, 4, 8, 16, 32)
DEPTH = 32
MIN_POSITIONS = 30
MIN_SET_POSITIONS = 10
SOURCES = ("prompt", "output")


def copy_runs(prompt: list[int], ref: list[int], buckets=BUCKETS, depth: int = DEPTH):
    """(source, bucket, run length, censor depth) at every output position with a match."""
    d = NgramDrafter(min_n=2, max_match=32, buckets=buckets[:-1] if buckets[-1] > 32 else buckets)
    ctx = list(prompt)
    d._reset(ctx)
    out = []
    for i in range(len(ref)):
        d._sync(ctx)
        m, start = d.match()
        if m >= buckets[0]:
            b = max(x for x in buckets if x <= m)
            cont = d._ctx[start : start + depth]
            truth = ref[i : i + depth]
            n = min(len(cont), len(truth))
            run = 0
            while run < n and cont[run] == truth[run]:
                run += 1
            out.append(("prompt" if start < len(prompt) else "output", b, run, n))
        ctx.append(ref[i])
    return out


def draft_agreement(draft, prompt: list[int], ref: list[int]) -> tuple[int, int]:
    """(positions where the draft model's greedy token is the AR token, positions)."""
    import numpy as np

    from speclive.drafting.model import DEFAULT_WINDOW

    view = prompt[-DEFAULT_WINDOW:]
    state = draft.new_state()
    try:
        if len(view) > 1:
            draft.extend(state, view[:-1], last_only=True)
        logits = draft.extend(state, [view[-1], *ref[:-1]])
    finally:
        draft.release(state)
    hits = int(np.sum(np.argmax(logits, axis=-1) == np.asarray(ref)))
    return hits, len(ref)


def survival(runs: list[tuple[int, int]], depth: int) -> tuple[list[float], list[int]]:
    """Kaplan-Meier S(1..depth) from (run, censor) pairs; also how many reached each depth."""
    s, curve, reached = 1.0, [], []
    for j in range(1, depth + 1):
        at_risk = sum(1 for run, n in runs if n >= j and run >= j - 1)
        fail = sum(1 for run, n in runs if n >= j and run == j - 1)
        if at_risk:
            s *= 1.0 - fail / at_risk
        curve.append(round(s, 4))
        reached.append(at_risk)
    return curve, reached


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+")
    ap.add_argument("--draft-curve", default=None, help="costcurve JSON of the draft model (llama.cpp)")
    ap.add_argument("--draft-model", default=None, help="measure the draft model's acceptance (loads it)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    runs: dict[tuple[str, int], dict[str, list[tuple[int, int]]]] = {
        (s, b): {} for s in SOURCES for b in BUCKETS
    }
    seen: set[tuple[str, str]] = set()
    curves, t1s, sources = [], [], []
    target = None
    draft = None
    if args.draft_model:
        from speclive.loader import load_backend

        draft = load_backend(args.draft_model, "llamacpp")
    agree: dict[str, list[int]] = {}
    for path in args.results:
        res = json.loads(Path(path).read_text())
        sources.append(Path(path).name)
        target = res["header"]["target"]
        tok = tokenizer_for(resolve(target))
        c = res["cost_curves"]["llamacpp"]
        curves.append({int(k): float(v) for k, v in c["ratios"].items()})
        if c.get("t1_ms"):
            t1s.append(float(c["t1_ms"]))
        limit = res["header"]["settings"]["limit"]
        sets = list(dict.fromkeys(r["set"] for r in res["records"]))
        texts = {p["id"]: p["text"] for s in sets for p in load_prompts(s, limit)}
        for r in res["records"]:
            if r["method"] != "ar" or r.get("backend") != "llamacpp" or (r["set"], r["prompt_id"]) in seen:
                continue
            seen.add((r["set"], r["prompt_id"]))
            prompt = tok.chat([{"role": "user", "content": texts[r["prompt_id"]]}])
            if draft is not None and r["token_ids"]:
                hits, n = draft_agreement(draft, prompt, r["token_ids"])
                a = agree.setdefault(r["set"], [0, 0])
                a[0] += hits
                a[1] += n
            for src, b, run, n in copy_runs(prompt, r["token_ids"]):
                runs[(src, b)].setdefault(r["set"], []).append((run, n))
    buckets: dict[str, dict[str, dict]] = {s: {} for s in SOURCES}
    for (src, b), by_set in runs.items():
        total = sum(len(rs) for rs in by_set.values())
        per_set = {
            name: survival(rs, DEPTH)[0] for name, rs in by_set.items() if len(rs) >= MIN_SET_POSITIONS
        }
        for name, curve in per_set.items():
            print(
                f"{src:>6} bucket {b:>2} {name:>10}: {len(by_set[name]):5d} positions  S(1)={curve[0]:.3f} "
                f"S(4)={curve[3]:.3f} S(8)={curve[7]:.3f} S(16)={curve[15]:.3f}"
            )
        if total < MIN_POSITIONS or not per_set:
            continue
        curve = [round(min(c[j] for c in per_set.values()), 4) for j in range(DEPTH)]
        buckets[src][str(b)] = {
            "positions": {name: len(rs) for name, rs in by_set.items()},
            "survival": curve,
            "min_over": sorted(per_set),
        }
    ks = sorted(set.intersection(*(set(c) for c in curves)))
    cost = {str(k): round(statistics.median(c[k] for c in curves), 3) for k in ks}
    out = {
        "about": "cold-start priors calibrated by benchmarks/calibrate_priors.py; see docs/coldstart.md",
        "target": target,
        "backend": "llamacpp",
        "sources": sources,
        "prompts": len(seen),
        "copy_survival": buckets,
        "cost_curve": cost,
        "target_t1_ms": round(statistics.median(t1s), 2) if t1s else None,
    }
    if args.draft_curve:
        dc = json.loads(Path(args.draft_curve).read_text())
        out["draft"] = {
            "model": dc["model"],
            "source": Path(args.draft_curve).name,
            "t1_ms": round(float(dc["t1_ms"]), 2),
            "ratio": round(float(dc["t1_ms"]) / out["target_t1_ms"], 3) if t1s else None,
        }
    if agree:
        per_set = {name: round(h / n, 4) for name, (h, n) in agree.items() if n}
        print("draft acceptance per set:", per_set)
        out.setdefault("draft", {})
        out["draft"].update(
            acceptance_model=args.draft_model, acceptance_per_set=per_set, alpha=min(per_set.values())
        )
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
