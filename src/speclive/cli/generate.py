"""``speclive generate``: answer one prompt with speculative decoding (and the engine options
the other commands that load one model share)."""

from __future__ import annotations

import argparse
import json
import sys

from speclive.acceptance import make_rule
from speclive.common_options import ENGINE
from speclive.decoder import GenerationConfig, GenerationStats, SpeculativeDecoder
from speclive.errors import SpecliveError
from speclive.knowledge import KnowledgeStore, disabled_by_env
from speclive.loader import load_backend, make_drafter


def _build_decoder(args: argparse.Namespace):
    target = load_backend(
        args.model, args.backend, n_ctx=args.n_ctx, threads=args.threads, device=args.device
    )
    drafter = make_drafter(
        args.drafter,
        target,
        args.draft_model,
        max_len=args.max_draft,
        threshold=args.threshold,
        datastore=getattr(args, "datastore", None),
    )
    rule = make_rule(getattr(args, "accept", None), getattr(args, "temperature", 0.0))
    knowledge = None
    if drafter is not None and getattr(args, "knowledge", True):
        if not disabled_by_env():
            knowledge = KnowledgeStore(target, drafter, args.drafter)
    return SpeculativeDecoder(target, drafter, rule, knowledge)


def _prompt_ids(dec, args: argparse.Namespace) -> list[int]:
    if not args.prompt.strip():
        raise SpecliveError("empty prompt: give the text to answer as the last argument")
    tok = dec.target.tokenizer
    if args.raw:
        return tok.encode(args.prompt, add_special_tokens=True)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}
    ]
    return tok.chat(messages)


def stats_line(stats, drafter_name: str) -> str:
    return (
        f"[{drafter_name}] {stats.new_tokens} tokens in {stats.total_s:.2f}s "
        f"({stats.tokens_per_second:.1f} tok/s decode) | target forwards {stats.target_forwards} | "
        f"tau {stats.mean_accepted:.2f} | accepted {stats.accepted}/{stats.drafted} drafted "
        f"({100 * stats.acceptance_rate:.0f}%) | draft {stats.draft_s:.2f}s verify {stats.verify_s:.2f}s"
    )


def cmd_generate(args: argparse.Namespace) -> int:
    dec = _build_decoder(args)
    ids = _prompt_ids(dec, args)
    cfg = GenerationConfig(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed, stop=tuple(args.stop or ())
    )
    if args.json:
        res = dec.run(ids, cfg)
        s = res.stats
        print(
            json.dumps(
                {
                    "text": res.text,
                    "token_ids": res.token_ids,
                    "stats": {
                        "target_forwards": s.target_forwards,
                        "mean_accepted": s.mean_accepted,
                        "acceptance_rate": s.acceptance_rate,
                        "tokens_per_second": s.tokens_per_second,
                        **{
                            k: v
                            for k, v in s.to_dict().items()
                            if k not in ("mean_accepted", "acceptance_rate")
                        },
                        "model": dec.target.name,
                        "backend": dec.target.kind,
                        "drafter": args.drafter,
                    },
                }
            )
        )
        return 0
    stats = GenerationStats()
    for ev in dec.generate(ids, cfg):
        stats = ev.stats
        sys.stdout.write(ev.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    print(stats_line(stats, args.drafter), file=sys.stderr)
    return 0


def add_generate_parser(sub) -> None:
    g = sub.add_parser("generate", help="answer a prompt with speculative decoding")
    ENGINE.add_to(g)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--accept", default=None, help="acceptance rule: greedy | topk:K | biased:B | ratio:T | sample"
    )
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--system", default=None, help="system message")
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    g.add_argument("prompt")
    g.set_defaults(func=cmd_generate)
