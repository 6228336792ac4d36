"""Replay n-gram drafter configurations on the answers of a ``bench serve`` result.

No model runs. speclive's answers on one prompt set (``--set``; greedy, so they are the
target's own) are decoded again with each drafter below, a drafted token accepted where it
equals the answer's token at its place, each pass costing t(n)/t(1) single steps on the cost
curve of a ``bench decode`` result (``--curve``, the same model and host class). Beside them,
the copy oracle of ``copy_bound.py`` on the same answers: every copy of the prompt or the
answer so far drafted whole and accepted.

- ``product``: what ``--drafter ngram`` builds now (``loader.make_drafter``);
- ``geometric-16``: the controller the loader handed the drafter before 2026-12-02 (a plain
  geometric ``AdaptiveConfig(max_len=16)``: no learned survival, no calibrated copy priors);
- ``survival-16``: the drafter's defaults, at most 16 tokens.

Each is replayed *warm* (one drafter kept across the prompts, in order) and *cold* (a fresh
drafter per prompt, as ``speclive generate`` starts). The figure is decode speed over plain
decoding of the same answers: sum of tokens over sum of pass costs. The first token is decoded
like the others (in the server it comes with the prefill), so the figure is the decode's, not
the request's.

    PYTHONPATH=src:benchmarks python benchmarks/replay_serve_drafters.py \\
        benchmarks/results/serve-qwen1.5b-llamaserver-codeedit-1client-avx512-calibrated.json \\
        --set code-edit \\
        --curve benchmarks/results/decode-coldstart-short-edits-qwen1.5b-avx512-calibrated.json

Writes ``replay-serve-<result>-<set>.{json,md}`` with ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from copy_bound import copy_oracle_cost, copy_runs, curve, serve_inputs, stamp
from replay_drafters import CurveTarget, replay

from speclive.drafting.base import AdaptiveConfig, AdaptiveLength, Drafter
from speclive.drafting.ngram import NgramDrafter
from speclive.loader import make_drafter
from speclive_bench import report

DRAFTERS: dict[str, Callable[[], Drafter]] = {
    "product": lambda: make_drafter("ngram", None),  # type: ignore[arg-type,return-value]
    "geometric-16": lambda: NgramDrafter(adaptive=AdaptiveLength(AdaptiveConfig(max_len=16))),
    "survival-16": lambda: NgramDrafter(max_len=16),
}


def answers(result: dict, prompt_set: str, tok) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of speclive's first answer to each prompt of the set, in order."""
    seen: dict[str, str] = {}
    for r in result["single"]:
        if r["server"] == "speclive" and r["prompt_set"] == prompt_set and not r["error"]:
            seen.setdefault(r["prompt"], r["text"])
    return [(tok.chat([{"role": "user", "content": p}]), tok.encode(t)) for p, t in seen.items()]


def replay_all(pairs, rows: list[dict], tok) -> dict:
    target = CurveTarget(rows, tok)
    t1 = target.seconds(1)
    plain = sum(len(ref) for _, ref in pairs) * t1
    out: dict = {}
    for name, make in DRAFTERS.items():
        warm = make()
        for mode in ("warm", "cold"):
            secs, passes = 0.0, []
            for prompt, ref in pairs:
                if mode == "warm":
                    steps, s = replay(warm, target, prompt, ref)
                else:
                    steps, s = replay(make(), CurveTarget(rows, tok), prompt, ref)
                secs += s
                passes.append(len(steps))
            out[f"{name} {mode}"] = {"speedup": plain / secs, "passes": passes}
    t = curve(rows)
    oracle = sum(copy_oracle_cost(copy_runs(p, ref), t, 1) for p, ref in pairs)
    out["copy oracle"] = {"speedup": sum(len(ref) for _, ref in pairs) / oracle, "passes": []}
    return out


def markdown(res: dict) -> str:
    h = res["header"]
    lines = report.markdown_preamble(f"n-gram drafters replayed on `{h['set']}` answers of {h['source']}", h)
    lines += [
        f"{h['answers']} answers of speclive in `{h['source']}`, replayed at the cost curve of "
        f"`{h['curve_source']}` (no model runs; greedy acceptance against the answers).",
        "",
        "| drafter | decode speed over plain decoding | passes per answer |",
        "|---|---|---|",
        *(
            f"| {k} | {v['speedup']:.3f}× | {' '.join(map(str, v['passes']))} |"
            for k, v in res["replay"].items()
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", type=Path, help="a bench serve result (JSON)")
    ap.add_argument("--set", required=True, help="the prompt set")
    ap.add_argument("--curve", type=Path, required=True, help="a bench decode result with the cost curve")
    ap.add_argument("--out", type=Path, default=None, help="write replay-serve-<result>-<set>.{json,md} here")
    args = ap.parse_args(argv)
    source, rows, tok = serve_inputs(args.result, args.curve, args.out)
    pairs = answers(source, args.set, tok)
    res: dict = {"replay": replay_all(pairs, rows, tok)}
    stamp(res, "replay_serve_drafters.py", argv, args.result, source)
    res["header"] |= {"curve_source": args.curve.name, "set": args.set, "answers": len(pairs)}
    print(markdown(res))
    if args.out is not None:
        name = f"replay-serve-{args.result.stem}-{args.set}"
        for p in report.write_result_files(res, args.out, name, markdown, None):
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
