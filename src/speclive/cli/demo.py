"""``speclive demo`` (`make demo`): plain and speculative decoding of one prompt, side by side.

Answers one prompt twice on the same backend: first plain greedy decoding (the reference),
then with a speculative drafter, streaming the second answer live with the tokens that came
from accepted drafts highlighted. Ends with the side-by-side numbers: tokens/s of both runs,
the speedup, τ (tokens per target pass), acceptance, and whether the two outputs are
token-identical (they must be on the fp32 backend; on llama.cpp a near-tie flip is possible).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from speclive.common_options import EngineOptions
from speclive.decoder import GenerationConfig, GenerationStats, SpeculativeDecoder
from speclive.errors import SpecliveError
from speclive.loader import load_backend, make_drafter
from speclive.options import OptionSet

DEMO = OptionSet(
    EngineOptions,
    only=("model", "backend", "drafter", "draft_model", "threads", "max_tokens"),
    defaults={"max_tokens": 200},
)

#: A code-editing request: the answer copies most of the prompt, the case prompt lookup wins on.
DEFAULT_PROMPT = (
    "Add type hints and a docstring to this function, keep everything else unchanged:\n\n"
    "def moving_average(values, window):\n"
    "    if window <= 0:\n"
    "        raise ValueError('window must be positive')\n"
    "    result = []\n"
    "    total = 0.0\n"
    "    for i, v in enumerate(values):\n"
    "        total += v\n"
    "        if i >= window:\n"
    "            total -= values[i - window]\n"
    "        if i >= window - 1:\n"
    "            result.append(total / window)\n"
    "    return result\n"
)

GREEN = "\033[32m"
DIM = "\033[2m"
BOLD = "\033[1m"
RESET = "\033[0m"


def add_demo_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("demo", help="live demo: plain vs speculative decoding of one prompt")
    DEMO.add_to(p)
    p.add_argument("--no-color", action="store_true", help="plain text (default when not a terminal)")
    p.add_argument("prompt", nargs="?", default=DEFAULT_PROMPT)
    p.set_defaults(func=cmd_demo)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_demo(args: argparse.Namespace) -> int:
    if not args.prompt.strip():
        raise SpecliveError("empty prompt: give the text to answer as the last argument")
    if args.drafter == "none":
        raise SpecliveError("the demo compares plain decoding with a drafter: pick one other than none")
    color = not args.no_color and sys.stdout.isatty() and os.environ.get("NO_COLOR") is None
    c = (lambda code: code) if color else (lambda code: "")

    _say(f"loading {args.model} on {args.backend} ...")
    target = load_backend(args.model, args.backend, threads=args.threads)
    drafter = make_drafter(args.drafter, target, args.draft_model)
    ids = target.tokenizer.chat([{"role": "user", "content": args.prompt}])
    cfg = GenerationConfig(max_tokens=args.max_tokens)

    print(f"{c(BOLD)}Prompt{c(RESET)}\n{args.prompt.rstrip()}\n")

    # 1) reference: plain greedy decoding, one target pass per token
    _say("plain greedy decoding (reference) ...")
    plain = SpeculativeDecoder(target)
    plain.run(ids[:2], GenerationConfig(max_tokens=2))  # warm-up: first-call allocations
    ref = plain.run(ids, cfg)
    plain.close()

    # 2) the same prompt with speculation, streamed live
    print(
        f"{c(BOLD)}Answer with speculative decoding ({args.drafter}){c(RESET)}  "
        f"{c(GREEN)}green{c(RESET)}{'' if color else ' (colour off)'} = text from accepted drafts, "
        "several tokens per target pass\n"
    )
    spec = SpeculativeDecoder(target, drafter)
    s = GenerationStats()
    out_ids: list[int] = []
    for ev in spec.generate(ids, cfg):
        s = ev.stats
        out_ids += ev.tokens
        if ev.accepted and color:
            sys.stdout.write(f"{GREEN}{ev.text}{RESET}")
        else:
            sys.stdout.write(ev.text)
        sys.stdout.flush()
    spec.close()

    r = ref.stats
    speedup = r.total_s / s.total_s if s.total_s > 0 else 0.0
    same = out_ids == ref.token_ids
    print("\n")
    print(f"{c(BOLD)}Side by side{c(RESET)} ({target.name}, {target.kind} backend)")
    for label, st in (("plain greedy", r), ("speculative ", s)):
        print(
            f"  {label} : {st.new_tokens:4d} tokens in {st.total_s:6.2f}s "
            f"{st.e2e_tokens_per_second:6.1f} tok/s  {st.target_forwards} target passes"
        )
    print(
        f"  drafted {s.drafted}, accepted {s.accepted} ({100 * s.acceptance_rate:.0f}%), "
        f"tau {s.mean_accepted:.2f} tokens per target pass"
    )
    print(
        f"  {c(BOLD)}speedup {speedup:.2f}x{c(RESET)}, output "
        + (
            "token-identical to plain greedy"
            if same
            else "DIFFERS from plain greedy (see docs/engine.md on llama.cpp near-ties)"
        )
    )
    return 0
