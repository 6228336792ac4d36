"""How spoken are a model's voice answers: answer length and markdown in the first spoken unit.

Asks twelve everyday voice questions through ``PredictiveResponder`` with the voice chat's
settings (``voice_predgen``: a line break ends a unit, the first unit may be a clause of four
words or more), as the cascade (the answer to the whole question, greedy), once with each
system prompt named in ``--prompts``: ``text`` (PredGen's ``SYSTEM_PROMPT``, what voice
sessions used before) and ``voice`` (``VOICE_SYSTEM_PROMPT``). Both run under the same
``--max-tokens`` cap, so the lengths compare; the count of answers that hit the cap is
reported too. A first unit "has markdown" when it contains ``*``, ``#`` or a backtick, or
starts with a list marker (``1.``, ``-``, ``•``).

    PYTHONPATH=src .venv/bin/python benchmarks/voice_prompt.py \\
        --model qwen2.5-coder-0.5b-instruct --max-tokens 256 --threads 2

prints a markdown table and every first unit; ``--json FILE`` keeps the answers.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from typing import Any

QUESTIONS = [
    "How many legs does a spider have?",
    "What's a good way to fall asleep faster?",
    "Why is the sky blue?",
    "How can I save energy at home?",
    "What's the capital of Australia?",
    "How long should I boil an egg?",
    "What should I pack for a weekend camping trip?",
    "Can you recommend a good book for a long flight?",
    "How do I get rid of hiccups?",
    "What's the difference between weather and climate?",
    "How far away is the moon?",
    "Give me some tips for a job interview.",
]

_LIST_START = re.compile(r"^\s*(\d+[.)]|[-•])\s")


def has_markdown(text: str) -> bool:
    """``*``, ``#`` or a backtick anywhere, or a list marker at the start."""
    return any(c in text for c in "*#`") or bool(_LIST_START.match(text))


def run(model: str, backend_name: str, threads: int, prompt: str, max_tokens: int) -> list[dict[str, Any]]:
    """One cascade answer per question with the voice settings and the named system prompt."""
    from speclive.live.voicechat import VOICE_SYSTEM_PROMPT, voice_predgen
    from speclive.loader import load_backend
    from speclive.sessions.predictive import SYSTEM_PROMPT, PredictiveResponder

    backend = load_backend(model, backend_name, threads=threads)
    system = {"text": SYSTEM_PROMPT, "voice": VOICE_SYSTEM_PROMPT}[prompt]
    cfg = voice_predgen(system=system, max_tokens=max_tokens, baseline=True, speak_rest=False)
    out = []
    for q in QUESTIONS:
        session = PredictiveResponder(backend, cfg)
        t0 = time.perf_counter()
        try:
            resp = session.finish(q)
        finally:
            session.close()
        out.append(
            {
                "question": q,
                "answer": resp.response,
                "first_unit": resp.first_sentence,
                "tokens": len(resp.token_ids),
                "hit_cap": len(resp.token_ids) >= max_tokens,
                "first_unit_markdown": has_markdown(resp.first_sentence),
                "answer_markdown": has_markdown(resp.response) or "\n" in resp.response.strip(),
                "seconds": time.perf_counter() - t0,
            }
        )
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean / median answer tokens and the counts of the table."""
    toks = [r["tokens"] for r in rows]
    return {
        "mean_tokens": statistics.mean(toks),
        "median_tokens": statistics.median(toks),
        "hit_cap": sum(r["hit_cap"] for r in rows),
        "first_unit_markdown": sum(r["first_unit_markdown"] for r in rows),
        "answer_markdown": sum(r["answer_markdown"] for r in rows),
        "tok_per_s": sum(toks) / sum(r["seconds"] for r in rows),
        "n": len(rows),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--backend", default="llamacpp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompts", default="text,voice", help="system prompts to compare: text, voice")
    ap.add_argument("--json", default=None, help="write every answer to this file")
    args = ap.parse_args(argv)
    results = {
        p: run(args.model, args.backend, args.threads, p, args.max_tokens) for p in args.prompts.split(",")
    }
    n = len(QUESTIONS)
    print(
        f"model {args.model} ({args.backend}, {args.threads} threads), {n} questions, cap {args.max_tokens}\n"
    )
    print(
        "| system prompt | mean tokens | median | hit the cap | first unit with markdown "
        "| answer with markdown or line breaks |\n|---|---|---|---|---|---|"
    )
    for p, rows in results.items():
        s = summary(rows)
        print(
            f"| {p} | {s['mean_tokens']:.1f} | {s['median_tokens']:.0f} | {s['hit_cap']}/{s['n']} | "
            f"{s['first_unit_markdown']}/{s['n']} | {s['answer_markdown']}/{s['n']} |"
        )
    for p, rows in results.items():
        print(f"\nfirst units, {p} prompt:")
        for r in rows:
            print(f"- {r['question']} -> {r['first_unit']!r} ({r['tokens']} tokens)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
