"""Replay the n-gram drafter, cold, on short code edits (``code-edit-short``), with and without
resumed copies (``NgramDrafter(resume_gap=...)``).

No model runs, and no model output is used: the answer of each edit is *constructed* by applying
the edit to the code (renamed function, parameter or local variable; a ``# result`` line above
each ``return``), fenced as the prompt asks, and cut to 96 tokens. The other edit kinds are
skipped. A drafted token is accepted when it equals the constructed answer's, and a step costs
t(n+1)/t(1) from the cost curve of a committed decode result, as in ``replay_drafters.py --cold``
(a fresh drafter per prompt, a cost model that starts from the prior). This shows how the
drafter's decisions change on short copies; it is not a measurement of the model, whose
answers may add prose or differ from the constructed ones:

    PYTHONPATH=src python benchmarks/replay_short_edits.py \\
        benchmarks/results/archive/decode-coldstart-qwen1.5b-llamacpp-code-edit-quiet.json [--steps]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_drafters import CurveTarget, replay  # noqa: E402

from speclive.backends.base import CostModel  # noqa: E402
from speclive.drafting.ngram import NgramDrafter  # noqa: E402
from speclive.drafting.priors import cost_curve  # noqa: E402
from speclive.loader import tokenizer_for  # noqa: E402
from speclive.models.resolve import resolve  # noqa: E402
from speclive_bench.datasets import code_edit_short_prompts  # noqa: E402

#: new tokens of each constructed answer (as the issue's cold short-edit check)
MAX_TOKENS = 96


def constructed_answer(item: dict) -> str | None:
    """The edit applied to the code, fenced; None for edit kinds not constructed here."""
    code, edit = item["code"], item["edit"]
    change = item["prompt"].split("Change: ", 1)[1].split("\n", 1)[0]
    names = re.findall(r"`([A-Za-z_]\w*)`", change)
    if edit == "rename_function":
        code = re.sub(rf"\b{names[0]}\b", names[0] + "_v2", code)
    elif edit in ("rename_param", "rename_local"):  # "Rename ... `old` of/in `f` to `new` ..."
        code = re.sub(rf"\b{names[0]}\b", names[2], code)
    elif edit == "comment_returns":
        code = re.sub(r"^(\s*)return\b", r"\1# result\n\1return", code, flags=re.M)
    else:
        return None
    return f"```python\n{code}```"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", help="a decode result with a llama.cpp cost curve and its target")
    ap.add_argument("--prompts", type=int, default=30, help="short edits to build (before skipping)")
    ap.add_argument("--steps", action="store_true", help="print (drafted, accepted) per step")
    args = ap.parse_args(argv)
    res = json.load(open(args.result))
    tok = tokenizer_for(resolve(res["header"]["target"]))
    rows = res["cost_curves"]["llamacpp"]["rows"]
    timing = CurveTarget(rows, tok)
    t1 = timing.seconds(1)
    totals = {gap: [0.0, 0.0] for gap in (0, 8)}
    for item in code_edit_short_prompts(args.prompts):
        answer = constructed_answer(item)
        if answer is None:
            continue
        prompt = tok.chat([{"role": "user", "content": item["prompt"]}])
        ref = tok.encode(answer)[:MAX_TOKENS]
        line = [item["id"], item["edit"], f"{len(ref)} tokens"]
        for gap, tot in totals.items():
            cold = CurveTarget(rows, tok)
            cold.cost = CostModel(cost_curve())
            steps, secs = replay(NgramDrafter(resume_gap=gap), cold, prompt, ref, timing=timing)
            tot[0] += len(ref) * t1
            tot[1] += secs
            line.append(f"resume_gap={gap}: {len(ref) * t1 / secs:.2f}x ({len(steps)} passes)")
            if args.steps:
                print(gap, [s for s in steps if s[0]])
        print(*line)
    print("all:", *(f"resume_gap={g}: {b / t:.3f}x" for g, (b, t) in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
