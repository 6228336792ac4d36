"""``speclive datastore``: build and inspect global suffix datastores (Talon's D).

- ``build --model M --corpus PATH... -o DS``: tokenize a corpus with M's tokenizer and index it;
- ``info DS``: sizes, sources and a lookup-time measurement;
- ``outputs --model M -o FILE.jsonl``: the target's own greedy answers to held-out prompts (the
  MT-Bench / HumanEval prompts a ``bench talon --limit N`` run does NOT evaluate), as a chat
  corpus: model outputs repeat, which is what makes retrieval pay.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from speclive.common_options import EngineOptions
from speclive.decoder import GenerationConfig, SpeculativeDecoder
from speclive.drafting.corpus import CorpusReport, corpus_documents
from speclive.drafting.datastore import DEFAULT_MAX_BYTES, SuffixDatastore, tokenizer_fingerprint
from speclive.loader import load_backend, make_drafter, tokenizer_for
from speclive.models.resolve import resolve
from speclive.options import OptionSet, csv
from speclive_bench.prompts import bench_prompt_texts, held_out_prompts

#: the model whose tokenizer a datastore uses, and the model that answers held-out prompts
TOKENIZER_MODEL = OptionSet(EngineOptions, only=("model",))
OPTIONAL_MODEL = OptionSet(EngineOptions, only=("model",), defaults={"model": None})
OUTPUTS_LLM = OptionSet(
    EngineOptions,
    only=("model", "backend", "max_tokens"),
    defaults={"model": "qwen2.5-coder-1.5b-instruct", "max_tokens": 160},
)


def add_datastore_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("datastore", help="global suffix datastores for the suffix/hybrid drafters")
    sub = p.add_subparsers(dest="datastore_command", required=True)

    b = sub.add_parser("build", help="index a corpus (files, folders, .jsonl chats) for a model's tokenizer")
    TOKENIZER_MODEL.add_to(b)
    b.add_argument("--corpus", nargs="+", required=True, help="files or folders (.jsonl: chats or text)")
    b.add_argument("-o", "--output", type=Path, required=True, help="datastore file to write (.npz)")
    b.add_argument("--max-tokens", type=int, default=4_000_000, help="cap on corpus tokens")
    b.add_argument("--max-depth", type=int, default=32, help="longest suffix a lookup matches")
    b.add_argument(
        "--exclude-bench",
        type=int,
        default=None,
        metavar="N",
        help="drop documents containing a prompt of `bench talon --limit N` (all prompts if 0)",
    )
    b.set_defaults(func=cmd_build)

    i = sub.add_parser("info", help="describe a datastore and time lookups")
    i.add_argument("path", type=Path)
    OPTIONAL_MODEL.add_to(i)  # given: the datastore is checked against its tokenizer
    i.add_argument("--max-mb", type=float, default=None, help="memory budget (MiB)")
    i.set_defaults(func=cmd_info)

    o = sub.add_parser("outputs", help="the model's greedy answers to held-out benchmark prompts (.jsonl)")
    OUTPUTS_LLM.add_to(o)
    o.add_argument("--sets", default="mtbench,humaneval", help="comma-separated prompt sets")
    o.add_argument("--per-set", type=int, default=24, help="held-out prompts answered per set")
    o.add_argument("--bench-limit", type=int, default=4, help="the --limit of the bench runs to stay out of")
    o.add_argument("-o", "--output", type=Path, required=True)
    o.set_defaults(func=cmd_outputs)


def cmd_build(args: argparse.Namespace) -> int:
    ref = resolve(args.model)
    tok = tokenizer_for(ref)
    exclude: list[str] = []
    if args.exclude_bench is not None:
        exclude = bench_prompt_texts(args.exclude_bench or None)
    rep = CorpusReport()
    t0 = time.perf_counter()
    docs = list(corpus_documents(args.corpus, tok, args.max_tokens, exclude, rep))
    t_tok = time.perf_counter() - t0
    meta = {
        "model": ref.name,
        "tokenizer": tokenizer_fingerprint(tok),
        "sources": rep.sources,
        "files": rep.files,
        "corpus_prompt_ids": rep.prompt_ids,
        "excluded_bench_prompts": len(exclude),
        "skipped": rep.skipped[:50],
    }
    t1 = time.perf_counter()
    ds = SuffixDatastore.from_documents(docs, max_depth=args.max_depth, meta=meta)
    t_idx = time.perf_counter() - t1
    path = ds.save(args.output)
    print(
        f"datastore {path}: {ds.n} tokens, {rep.documents} documents from {rep.files} files "
        f"(tokenize {t_tok:.1f}s, index {t_idx:.1f}s, {path.stat().st_size / 2**20:.1f} MiB)"
    )
    if rep.skipped:
        print(f"skipped {len(rep.skipped)} documents/files (first: {rep.skipped[0]})", file=sys.stderr)
    return 0


def lookup_timing(ds: Any, contexts: list[list[int]], depth: int = 16) -> dict[str, float]:
    """Mean/max milliseconds of match + continuations over every suffix of ``contexts``."""
    times = []
    for ctx in contexts:
        for end in range(8, len(ctx) + 1):
            t0 = time.perf_counter()
            m = ds.match(ctx[:end])
            ds.continuations(m, depth)
            times.append(time.perf_counter() - t0)
    if not times:
        return {"lookups": 0}
    times.sort()
    return {
        "lookups": len(times),
        "mean_ms": 1000 * sum(times) / len(times),
        "p99_ms": 1000 * times[int(0.99 * (len(times) - 1))],
        "max_ms": 1000 * times[-1],
    }


def cmd_info(args: argparse.Namespace) -> int:
    tok = None
    if args.model:
        tok = tokenizer_for(resolve(args.model))
    budget = DEFAULT_MAX_BYTES if args.max_mb is None else int(args.max_mb * 2**20)
    ds = SuffixDatastore.load(args.path, tok, max_bytes=budget)
    meta = {k: v for k, v in ds.meta.items() if k not in ("skipped", "corpus_prompt_ids")}
    meta["corpus_prompt_ids"] = len(ds.meta.get("corpus_prompt_ids", []))
    meta["memory_mib"] = round(ds.nbytes() / 2**20, 1)
    rng_ctx = [ds.tokens[i : i + 64].tolist() for i in range(0, max(1, ds.n - 64), max(1, ds.n // 20))]
    rng_ctx = [[t for t in c if t >= 0] for c in rng_ctx]
    meta["lookup"] = lookup_timing(ds, rng_ctx)
    print(json.dumps(meta, indent=2))
    return 0


def cmd_outputs(args: argparse.Namespace) -> int:
    target = load_backend(args.model, args.backend)
    drafter = make_drafter("ngram", target)
    dec = SpeculativeDecoder(target, drafter)
    sets = csv(args.sets)
    rows = held_out_prompts(sets, args.per_set, args.bench_limit)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(args.output, "w", encoding="utf-8") as fh:
        for n, row in enumerate(rows, 1):
            msgs = [{"role": "user", "content": row["text"]}]
            res = dec.run(target.tokenizer.chat(msgs), GenerationConfig(max_tokens=args.max_tokens))
            msgs.append({"role": "assistant", "content": res.text})
            fh.write(json.dumps({"id": row["id"], "set": row["set"], "messages": msgs}) + "\n")
            fh.flush()
            print(f"[{n}/{len(rows)}] {row['id']}: {len(res.token_ids)} tokens", file=sys.stderr)
    print(f"wrote {len(rows)} answers to {args.output} in {time.perf_counter() - t0:.0f}s")
    return 0
