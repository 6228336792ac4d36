"""How far could `speclive serve` get ahead of its best peer, one client at a time, on the
requests of a ``bench serve`` result? A bound from the peer's own measurements.

Each 1-client request of the peer (``--peer``) is paired with what the fastest possible
speclive would take for the same request:

- its time to the first token equal to the peer's (both servers run llama.cpp's kernels on
  the same GGUF; speclive does not prefill faster);
- its decode the copy oracle of ``copy_bound.py`` over the greedy answer (the plain server's
  text, ``--reference``): every copy of the prompt or the answer so far drafted whole and
  accepted, at the pass costs t(n)/t(1) of the cost curve in ``--curve`` (a ``bench decode``
  result on the same model and machine class), each single step as long as the plain server's
  own step on that request.

The bound is the peer's time over that time, per request; its median with a 95 % bootstrap
interval and its 90th percentile. A ratio over the bound cannot be reached by any drafter that
copies, with the same prefill; beside it the bound with an infinitely fast decode (the
peer's total over its time to the first token).

    PYTHONPATH=src python benchmarks/serve_copy_bound.py \\
        benchmarks/results/serve-qwen1.5b-llamaserver.json --set code-edit \\
        --peer llama-server-ngram --reference llama-server \\
        --curve benchmarks/results/decode-coldstart-short-edits-qwen1.5b.json --target 1.3

Writes ``serve-copy-bound-<result>.{json,md}`` with ``--out``; no model runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from copy_bound import copy_oracle_cost, copy_runs, curve, serve_inputs, stamp

from speclive_bench import report
from speclive_bench.stats import paired_ratio


def bound(result: dict, curve_rows: list[dict], prompt_set: str, peer: str, reference: str, tok: Any) -> dict:
    """Per request of ``peer`` on ``prompt_set``: the copy oracle's total time and the bound
    (``tok``: the target's tokenizer, ``encode`` and ``chat``)."""
    t = curve(curve_rows)
    rows = [r for r in result["single"] if r["prompt_set"] == prompt_set and not r["error"]]
    plain = {(r["prompt"], r["pass_index"]): r for r in rows if r["server"] == reference}
    cost: dict[str, tuple[int, float]] = {}  # per prompt: answer tokens, oracle decode cost
    requests = []
    for r in (r for r in rows if r["server"] == peer):
        ref = plain.get((r["prompt"], r["pass_index"]))
        if ref is None or ref["tokens"] < 2:
            continue
        if r["prompt"] not in cost:
            ids = tok.encode(ref["text"])
            runs = copy_runs(tok.chat([{"role": "user", "content": r["prompt"]}]), ids)
            # the first token comes with the prefill; the oracle decodes the rest
            cost[r["prompt"]] = (len(ids), copy_oracle_cost(runs[1:], t, 1))
        n, steps = cost[r["prompt"]]
        step_s = (ref["total_s"] - ref["ttft_s"]) / (ref["tokens"] - 1)
        best_s = r["ttft_s"] + steps * step_s
        requests.append(
            {
                "prompt": r["prompt"][:60],
                "pass_index": r["pass_index"],
                "answer_tokens": n,
                "oracle_steps": steps,
                "plain_step_ms": 1000 * step_s,
                "peer_ttft_s": r["ttft_s"],
                "peer_total_s": r["total_s"],
                "oracle_total_s": best_s,
            }
        )
    peer_total = [q["peer_total_s"] for q in requests]
    return {
        "curve": {str(n): t[n] for n in (2, 4, 8, 16, 32, len(t) - 1) if n < len(t)},
        # tok/s ratios of equal token counts: the peer's time over speclive's
        "bound": paired_ratio([q["oracle_total_s"] for q in requests], peer_total, p90=True),
        "bound_infinite_decode": paired_ratio([q["peer_ttft_s"] for q in requests], peer_total, p90=True),
        "requests": requests,
    }


def markdown(res: dict) -> str:
    h = res["header"]
    lines = report.markdown_preamble(f"Copy-oracle bound of speclive serve against {h['peer']}", h)
    b, inf = res["bound"], res["bound_infinite_decode"]
    verdict = "out of reach" if b["hi"] < h["target"] else "not excluded"
    lines += [
        f"{b['n']} requests of `{h['peer']}` on `{h['set']}` in `{h['source']}`, paired with a "
        f"speclive that prefills as fast as the peer and decodes `{h['reference']}`'s greedy answer "
        "with every copy drafted whole and accepted (the copy oracle of `copy_bound.py`), at the pass "
        f"costs of `{h['curve_source']}` and the plain server's own step time on each request.",
        "",
        "Cost curve t(n)/t(1): " + ", ".join(f"t({n}) {v:.2f}" for n, v in res["curve"].items()),
        "",
        "| bound on tok/s speclive / peer | median [95 % CI] | geometric mean | p90 |",
        "|---|---|---|---|",
        *(
            f"| {name} | {x['median']:.2f} [{x['lo']:.2f}, {x['hi']:.2f}] | {x['geomean']:.2f} | "
            f"{x['p90']:.2f} |"
            for name, x in (("copy oracle", b), ("infinitely fast decode", inf))
        ),
        "",
        f"Target {h['target']:.2f}×: **{verdict}** for any copying drafter at this prefill and these "
        f"answer lengths (at most {h['max_tokens']} tokens, the run's `--max-tokens`: with longer "
        "answers the decode weighs more and the bound rises).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", type=Path, help="a bench serve result (JSON)")
    ap.add_argument("--set", required=True, help="the prompt set")
    ap.add_argument("--peer", required=True, help="the peer to bound the ratio against")
    ap.add_argument("--reference", required=True, help="the plain (greedy, undrafted) server")
    ap.add_argument("--curve", type=Path, required=True, help="a bench decode result with the cost curve")
    ap.add_argument("--target", type=float, default=1.3, help="the ratio the target asks for")
    ap.add_argument("--out", type=Path, default=None, help="write serve-copy-bound-<result>.{json,md} here")
    args = ap.parse_args(argv)
    source, rows, tok = serve_inputs(args.result, args.curve, args.out)
    res = bound(source, rows, args.set, args.peer, args.reference, tok)
    stamp(res, "serve_copy_bound.py", argv, args.result, source)
    res["header"] |= {
        "curve_source": args.curve.name,
        "set": args.set,
        "peer": args.peer,
        "reference": args.reference,
        "target": args.target,
        "max_tokens": source["header"]["settings"]["max_tokens"],
    }
    print(markdown(res))
    if args.out is not None:
        stem = f"serve-copy-bound-{args.result.stem}-{args.set}"
        for p in report.write_result_files(res, args.out, stem, markdown, None):
            print(f"wrote {p}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
