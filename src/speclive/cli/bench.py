"""``speclive bench``: cost curves and side-by-side decode benchmarks.

Sub-commands:

- ``costcurve``: time one ``extend`` of k tokens after a fixed prefix; writes
  ``costcurve-<model>-<backend>.{json,md,png}``.
- ``decode``: every method (our loop with each drafter, llama-cpp-python, transformers
  generate / assisted / prompt lookup, vLLM when installed) on the same prompts in one process;
  writes ``decode-<tag>.{json,md,png}``.
- ``scale``: speclive's sessions on vLLM vs plain vLLM at 1 and N concurrent sessions
  (``speclive.bench.scale``); writes ``scale-<tag>.{json,md,png}``.
- ``all-small``: a quick preset of ``decode`` (SmolLM2 on llama.cpp, 2 prompts per set,
  32 tokens) to check that everything runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from speclive.bench.report import NEAR_TIE_GAP, command_line

DEFAULT_OUT = Path("benchmarks/results")


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in _csv(text)]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e


def add_bench_parser(subparsers: Any) -> None:
    """Register ``speclive bench`` and its sub-commands on the top-level sub-parsers."""
    from speclive.bench.costcurve import DEFAULT_CURVE_KS
    from speclive.bench.methods import ALL_METHODS
    from speclive.bench.prompts import SETS
    from speclive.loader import BACKENDS, DEFAULT_MODEL

    p = subparsers.add_parser("bench", help="benchmarks: cost curves, decode speed vs peers")
    sub = p.add_subparsers(dest="bench_command", required=True)

    c = sub.add_parser("costcurve", help="verification cost t(k) of one extend of k tokens")
    c.add_argument("--model", default=DEFAULT_MODEL)
    c.add_argument("--backend", default="llamacpp", choices=BACKENDS)
    c.add_argument("--device", default="cpu", help="torch device of the hf backend (cpu, cuda, ...)")
    c.add_argument("--ks", type=_ints, default=[1, 2, 4, 8, 16, 32], help="comma-separated k values")
    c.add_argument("--repeats", type=int, default=5, help="timed repeats per k (median reported)")
    c.add_argument("--prefix", type=int, default=256, help="tokens in the cache before each extend")
    c.add_argument("--out", type=Path, default=DEFAULT_OUT)
    c.add_argument("--no-plot", action="store_true")
    c.add_argument(
        "--compare-stock-linear",
        action="store_true",
        help="hf: also time the curve on transformers' stock nn.Linear modules (same process)",
    )
    c.set_defaults(func=cmd_costcurve)

    d = sub.add_parser("decode", help="all methods side by side on prompt sets")
    d.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="target model")
    d.add_argument("--backend", default="llamacpp", choices=[*BACKENDS, "both"])
    d.add_argument("--device", default="cpu", help="torch device of the hf backend (cpu, cuda, ...)")
    d.add_argument("--sets", type=_csv, default=list(SETS), help=f"comma-separated: {','.join(SETS)}")
    d.add_argument("--limit", type=int, default=None, help="prompts per set (spread over the set)")
    d.add_argument("--max-tokens", type=int, default=128)
    d.add_argument(
        "--methods",
        type=_csv,
        default=list(ALL_METHODS),
        help=f"comma-separated subset of: {','.join(ALL_METHODS)} (inapplicable ones are skipped; "
        "ar is always run)",
    )
    d.add_argument("--max-draft", type=int, default=None, help="longest draft of our drafters")
    d.add_argument("--out", type=Path, default=DEFAULT_OUT)
    d.add_argument("--tag", default=None, help="results name: decode-<tag>.* (default: target-backend)")
    d.add_argument(
        "--curve-ks",
        type=_ints,
        default=list(DEFAULT_CURVE_KS),
        help="k values of the cost curve measured after the runs (for the bounds)",
    )
    d.add_argument("--curve-repeats", type=int, default=3)
    d.add_argument("--no-curve", action="store_true", help="use the online cost estimate, measure nothing")
    d.add_argument(
        "--near-tie",
        type=float,
        default=NEAR_TIE_GAP,
        help="top-2 gap below which a divergence is a near tie",
    )
    d.add_argument("--no-gap-check", action="store_true", help="do not re-run AR to analyse divergences")
    d.add_argument("--no-warmup", action="store_true")
    d.add_argument("--no-plot", action="store_true")
    d.add_argument("--no-progress", action="store_true")
    d.add_argument(
        "--cold",
        action="store_true",
        help="also run every local method cold: a fresh process and drafter per prompt, without and "
        "(our drafters) with saved knowledge, side by side with the warm run",
    )
    d.add_argument("--vllm-k", type=int, default=None, help="num_speculative_tokens of the vLLM methods")
    d.add_argument(
        "--vllm-eager",
        action="store_true",
        help="vLLM without torch.compile (quick checks; the default runs vLLM as shipped)",
    )
    d.set_defaults(func=cmd_decode)

    a = sub.add_parser("all-small", help="quick preset: SmolLM2 on llama.cpp, 2 prompts per set, 32 tokens")
    a.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a.add_argument("--tag", default="all-small")
    a.set_defaults(func=cmd_all_small)

    t = sub.add_parser("talon", help="Talon Table 1: suffix / hybrid / async drafting vs AR and peers")
    t.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    t.add_argument("--backend", default="llamacpp", choices=BACKENDS)
    t.add_argument("--device", default="cpu", help="torch device of the hf backend (cpu, cuda, ...)")
    t.add_argument("--sets", type=_csv, default=["mtbench", "humaneval", "chat-heldout"])
    t.add_argument("--limit", type=int, default=4, help="prompts per set (spread over the set)")
    t.add_argument("--max-tokens", type=int, default=128)
    t.add_argument("--methods", type=_csv, default=None, help="default: ar,model,ngram,suffix,hybrid,...")
    t.add_argument("--datastore", default=None, help="global suffix datastore (speclive datastore build)")
    t.add_argument("--hf-peers", action="store_true", help="also transformers generate/assisted (slow)")
    t.add_argument("--out", type=Path, default=DEFAULT_OUT)
    t.add_argument("--tag", default=None, help="results name: talon-<tag>.* (default: target-backend)")
    t.add_argument("--no-curve", action="store_true")
    t.add_argument("--no-plot", action="store_true")
    t.add_argument("--no-progress", action="store_true")
    t.set_defaults(func=cmd_talon)

    r = sub.add_parser("retranslate", help="SSBD re-translation: AR vs bias β vs mask-k (Tables 2-4)")
    r.add_argument("--model", default=DEFAULT_MODEL)
    r.add_argument("--backend", default="llamacpp", choices=BACKENDS)
    r.add_argument("--device", default="cpu", help="torch device of the hf backend (cpu, cuda, ...)")
    r.add_argument("--langs", type=_csv, default=["de", "zh", "ja"])
    r.add_argument("--betas", type=_floats, default=[0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    r.add_argument("--mask-ks", type=_ints, default=[3, 5])
    r.add_argument("--beta", type=float, default=0.2, help="β of the mask-k rows")
    r.add_argument("--limit", type=int, default=12, help="source sentences per language")
    r.add_argument("--lag-k", type=int, default=3)
    r.add_argument("--max-tokens", type=int, default=160)
    r.add_argument("--out", type=Path, default=DEFAULT_OUT)
    r.add_argument("--tag", default=None, help="results name: retranslate-<tag>.* (default: model-backend)")
    r.add_argument("--no-plot", action="store_true")
    r.set_defaults(func=cmd_retranslate)

    gr = sub.add_parser("graphs", help="hf step: eager transformers vs static cache + CUDA graphs")
    gr.add_argument("--model", default=DEFAULT_MODEL)
    gr.add_argument("--device", default="cuda", help="torch device (graphs need cuda)")
    gr.add_argument("--limit", type=int, default=8, help="prompts (half MT-Bench, half code edits)")
    gr.add_argument("--max-tokens", type=int, default=128)
    gr.add_argument("--repeats", type=int, default=7, help="timed repeats per pass length")
    gr.add_argument("--out", type=Path, default=DEFAULT_OUT)
    gr.add_argument("--tag", default=None, help="results name: graphs-<tag>.* (default: model-device)")
    gr.add_argument("--no-plot", action="store_true")
    gr.set_defaults(func=cmd_graphs)

    g = sub.add_parser("predgen", help="PredGen voice chat on MT-Bench: cascade vs verifiers (Table 1)")
    g.add_argument("--model", default=DEFAULT_MODEL)
    g.add_argument("--backend", default="llamacpp", choices=BACKENDS)
    g.add_argument("--device", default="cpu", help="torch device of the hf backend (cpu, cuda, ...)")
    g.add_argument(
        "--methods",
        type=_csv,
        default=["baseline", "greedy", "topk:3", "reflection"],
        help="baseline and verifiers (greedy, topk:K, reflection), each optionally with options "
        "@sentence|@chunks (how the first sentence is verified), @fits (pre-synthesize only what "
        "fits before the next word) and @eager (every new first sentence at once)",
    )
    g.add_argument("--turns", type=_ints, default=[1, 2])
    g.add_argument("--limit", type=int, default=20, help="MT-Bench questions (spread over the 80)")
    g.add_argument("--cpm", type=float, default=600.0, help="user speaking rate, characters per minute")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--no-tts", action="store_true")
    g.add_argument(
        "--judge", default=None, help="judge model for MT-Bench scores (e.g. qwen2.5-coder-1.5b-instruct)"
    )
    g.add_argument("--out", type=Path, default=DEFAULT_OUT)
    g.add_argument("--tag", default=None, help="results name: predgen-<tag>.* (default: model-backend)")
    g.add_argument("--no-plot", action="store_true")
    g.set_defaults(func=cmd_predgen)

    lv = sub.add_parser(
        "live",
        help="live pipelines on spoken questions: voice-to-voice latency vs cascade/prefill/preemptive",
    )
    lv.add_argument("--pipeline", default="chat", choices=("chat", "translate"))
    lv.add_argument("--model", default=DEFAULT_MODEL)
    lv.add_argument("--backend", default="llamacpp", choices=BACKENDS)
    lv.add_argument(
        "--methods",
        type=_csv,
        default=None,
        help="chat: predgen, predgen:topk:K, cascade, prefill, preemptive (default: predgen and the three "
        "baselines); translate: ssbd, ar, cascade",
    )
    lv.add_argument("--voices", type=_csv, default=["piper", "espeak"], help="piper, espeak")
    lv.add_argument("--limit", type=int, default=12, help="questions (chat) or utterances (translate)")
    lv.add_argument("--max-tokens", type=int, default=64)
    lv.add_argument("--target-lang", default="de")
    lv.add_argument("--beta", type=float, default=0.2)
    lv.add_argument("--end-silence", type=float, default=0.5, help="silence (s) that ends a turn")
    lv.add_argument("--pause", type=float, default=0.2, help="silence (s) that starts speculative final work")
    lv.add_argument(
        "--first-clause",
        type=int,
        default=4,
        help="chat: the first spoken unit may be a clause of at least this many words (0: a sentence)",
    )
    lv.add_argument("--out", type=Path, default=DEFAULT_OUT)
    lv.add_argument("--tag", default=None, help="results name: live-<pipeline>-<tag>.*")
    lv.add_argument("--no-plot", action="store_true")
    lv.set_defaults(func=cmd_live)

    from speclive.bench.speechlm import add_speechlm_bench_parser

    add_speechlm_bench_parser(sub)

    from speclive.cli.bench_asr import add_asr_bench_parser

    add_asr_bench_parser(sub)

    from speclive.bench.serve import add_serve_bench_parser

    add_serve_bench_parser(sub)

    from speclive.bench.reliability import add_fuzz_parser

    add_fuzz_parser(sub)

    from speclive.bench.soak import add_soak_parser

    add_soak_parser(sub)

    from speclive.bench.scale import add_scale_bench_parser

    add_scale_bench_parser(sub)


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in _csv(text)]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from e


def _device_args(device: str) -> list[str]:
    """``--device D`` for a reproducing command line; nothing for the default CPU."""
    return [] if device == "cpu" else ["--device", device]


def cmd_costcurve(args: argparse.Namespace) -> int:
    from speclive.bench import report
    from speclive.bench.costcurve import curve_columns, measure_cost_curve, write_costcurve_outputs
    from speclive.loader import load_backend

    backend = load_backend(args.model, args.backend, device=args.device)
    cmd = command_line(
        [
            "speclive",
            "bench",
            "costcurve",
            "--model",
            args.model,
            "--backend",
            args.backend,
            *_device_args(args.device),
            "--ks",
            ",".join(map(str, args.ks)),
            "--repeats",
            str(args.repeats),
            "--prefix",
            str(args.prefix),
            *(["--compare-stock-linear"] if args.compare_stock_linear else []),
        ]
    )
    settings: dict[str, object] = {
        "ks": args.ks,
        "repeats": args.repeats,
        "prefix": args.prefix,
        "device": args.device,
    }
    linear_info = getattr(backend, "linear_info", None)
    if linear_info is not None:
        settings["linear"] = linear_info
    header = {
        "machine": report.machine_info(),
        "models": {args.backend: backend.name},
        "settings": settings,
        "command": cmd,
    }
    for line in report.header_lines(header):
        print(line, file=sys.stderr)
    res = measure_cost_curve(backend, args.ks, args.repeats, args.prefix, progress=True)
    if args.compare_stock_linear:
        if not (linear_info or {}).get("installed"):
            raise SystemExit(
                f"--compare-stock-linear: no dual-layout linears on this backend ({linear_info})"
            )
        from speclive.backends.cpu_linear import stock_linears

        with stock_linears(backend.model):  # type: ignore[attr-defined]
            stock = measure_cost_curve(backend, args.ks, args.repeats, args.prefix, progress=True)
        for row, srow in zip(res["rows"], stock["rows"], strict=True):
            row["stock_ms"], row["stock_ratio"] = srow["ms"], srow["ratio"]
            row["linear_speedup"] = srow["ms"] / row["ms"]
    res["header"] = header
    paths = write_costcurve_outputs(res, args.out, plot=not args.no_plot)
    print(report.md_table(curve_columns(res["rows"]), res["rows"]))
    for p in paths.values():
        print(f"wrote {p}", file=sys.stderr)
    return 0


def decode_command(args: argparse.Namespace) -> str:
    """The canonical command line reproducing a decode run (written into the results)."""
    parts = [
        "speclive",
        "bench",
        "decode",
        "--target",
        args.target,
        "--backend",
        args.backend,
        "--sets",
        ",".join(args.sets),
        "--max-tokens",
        str(args.max_tokens),
        "--methods",
        ",".join(args.methods),
    ]
    if args.limit is not None:
        parts += ["--limit", str(args.limit)]
    parts += _device_args(getattr(args, "device", "cpu"))
    if args.max_draft is not None:
        parts += ["--max-draft", str(args.max_draft)]
    if args.tag:
        parts += ["--tag", args.tag]
    if args.no_curve:
        parts.append("--no-curve")
    else:
        parts += ["--curve-ks", ",".join(map(str, args.curve_ks)), "--curve-repeats", str(args.curve_repeats)]
    if args.near_tie != NEAR_TIE_GAP:
        parts += ["--near-tie", str(args.near_tie)]
    if getattr(args, "cold", False):
        parts.append("--cold")
    if args.vllm_k is not None:
        parts += ["--vllm-k", str(args.vllm_k)]
    for flag in ("no_gap_check", "no_warmup", "vllm_eager"):
        if getattr(args, flag, False):
            parts.append("--" + flag.replace("_", "-"))
    return command_line(parts)


def cmd_decode(args: argparse.Namespace) -> int:
    from speclive.bench.decode import DecodeOptions, decode_markdown, run_decode_bench, write_decode_outputs
    from speclive.bench.prompts import SETS
    from speclive.errors import ConfigError

    bad = [s for s in args.sets if s not in SETS]
    if bad:
        raise ConfigError(f"unknown prompt sets {bad}; known: {', '.join(SETS)}")
    backends = ["llamacpp", "hf"] if args.backend == "both" else [args.backend]
    tag = args.tag or f"{args.target}-{args.backend}"
    opts = DecodeOptions(
        target=args.target,
        backends=backends,
        sets=args.sets,
        limit=args.limit,
        max_tokens=args.max_tokens,
        methods=args.methods,
        out=args.out,
        tag=tag,
        max_draft=args.max_draft,
        curve_ks=args.curve_ks,
        curve_repeats=args.curve_repeats,
        measure_curve=not args.no_curve,
        near_tie=args.near_tie,
        warmup=not args.no_warmup,
        gap_check=not args.no_gap_check,
        progress=not args.no_progress,
        plot=not args.no_plot,
        vllm_k=args.vllm_k,
        vllm_eager=getattr(args, "vllm_eager", False),
        cold=getattr(args, "cold", False),
        device=getattr(args, "device", "cpu"),
        command=decode_command(args),
    )
    try:
        result = run_decode_bench(opts)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    paths = write_decode_outputs(result, args.out, tag, plot=not args.no_plot)
    print(decode_markdown(result))
    for p in paths.values():
        print(f"wrote {p}", file=sys.stderr)
    return 1 if result["bugs"] else 0


def cmd_all_small(args: argparse.Namespace) -> int:
    from speclive.bench.costcurve import DEFAULT_CURVE_KS
    from speclive.bench.methods import LLAMACPP_PEERS, OUR_METHODS
    from speclive.bench.prompts import SETS

    ns = argparse.Namespace(
        target="smollm2-135m-instruct",
        backend="llamacpp",
        sets=list(SETS),
        limit=2,
        max_tokens=32,
        methods=[*OUR_METHODS, *LLAMACPP_PEERS],
        max_draft=None,
        out=args.out,
        tag=args.tag,
        curve_ks=list(DEFAULT_CURVE_KS),
        curve_repeats=3,
        no_curve=False,
        near_tie=NEAR_TIE_GAP,
        no_gap_check=False,
        no_warmup=False,
        no_plot=False,
        no_progress=False,
        vllm_k=None,
        vllm_eager=False,
    )
    return cmd_decode(ns)


def cmd_retranslate(args: argparse.Namespace) -> int:
    from speclive.bench.ssbd import RetranslateBenchOptions, run_retranslate_bench, write_outputs

    tag = args.tag or f"{args.model}-{args.backend}"
    parts = [
        "speclive",
        "bench",
        "retranslate",
        "--model",
        args.model,
        "--backend",
        args.backend,
        *_device_args(args.device),
        "--langs",
        ",".join(args.langs),
        "--betas",
        ",".join(f"{b:g}" for b in args.betas),
        "--mask-ks",
        ",".join(map(str, args.mask_ks)),
        "--beta",
        f"{args.beta:g}",
        "--limit",
        str(args.limit),
        "--lag-k",
        str(args.lag_k),
        "--max-tokens",
        str(args.max_tokens),
        "--tag",
        tag,
    ]
    opts = RetranslateBenchOptions(
        model=args.model,
        backend=args.backend,
        device=args.device,
        langs=args.langs,
        betas=args.betas,
        mask_ks=args.mask_ks,
        beta=args.beta,
        limit=args.limit,
        lag_k=args.lag_k,
        max_tokens=args.max_tokens,
        out=args.out,
        tag=tag,
        plot=not args.no_plot,
        command=command_line(parts),
    )
    result = run_retranslate_bench(opts, log=lambda m: print(m, file=sys.stderr))
    for p in write_outputs(result, args.out, tag, plot_it=opts.plot):
        print(f"wrote {p}", file=sys.stderr)
    from speclive.bench.ssbd import markdown

    print(markdown(result))
    return 0


def cmd_graphs(args: argparse.Namespace) -> int:
    from speclive.bench.graphs import markdown, plot, run_graphs_bench
    from speclive.bench.report import machine_info, write_result_files

    tag = args.tag or f"{args.model}-{args.device.replace(':', '')}"
    result = run_graphs_bench(
        args.model,
        args.device,
        limit=args.limit,
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        log=lambda m: print(m, file=sys.stderr),
    )
    result["header"] = {
        "machine": machine_info(),
        "target": args.model,
        "backends": "hf (eager) vs hf static cache + CUDA graphs, one copy of the weights",
        "settings": {"precision": "fp32", "device": args.device, **result["settings"]},
        "command": command_line(
            [
                "speclive",
                "bench",
                "graphs",
                "--model",
                args.model,
                "--device",
                args.device,
                "--limit",
                str(args.limit),
                "--max-tokens",
                str(args.max_tokens),
                "--repeats",
                str(args.repeats),
                "--tag",
                tag,
            ]
        ),
    }
    for p in write_result_files(result, args.out, f"graphs-{tag}", markdown, None if args.no_plot else plot):
        print(f"wrote {p}", file=sys.stderr)
    print(markdown(result))
    return 0


def cmd_predgen(args: argparse.Namespace) -> int:
    from speclive.bench.predgen import PredGenBenchOptions, markdown, run_predgen_bench, write_outputs
    from speclive.errors import ConfigError
    from speclive.sessions.predictive import parse_method

    if "baseline" not in args.methods:
        raise ConfigError("--methods must include baseline (speedups and turn-2 history come from it)")
    for m in args.methods:
        if m != "baseline":
            parse_method(m)
    tag = f"predgen-{args.tag}" if args.tag else f"predgen-{args.model}-{args.backend}"
    parts = [
        "speclive",
        "bench",
        "predgen",
        "--model",
        args.model,
        "--backend",
        args.backend,
        "--methods",
        ",".join(args.methods),
        "--turns",
        ",".join(map(str, args.turns)),
        "--limit",
        str(args.limit),
        "--cpm",
        f"{args.cpm:g}",
        "--max-tokens",
        str(args.max_tokens),
        "--tag",
        tag.removeprefix("predgen-"),
        *_device_args(args.device),
    ]
    if args.no_tts:
        parts.append("--no-tts")
    if args.judge:
        parts += ["--judge", args.judge]
    opts = PredGenBenchOptions(
        model=args.model,
        backend=args.backend,
        device=args.device,
        methods=args.methods,
        turns=args.turns,
        limit=args.limit,
        cpm=args.cpm,
        max_tokens=args.max_tokens,
        tts=not args.no_tts,
        judge=args.judge,
        out=args.out,
        tag=tag,
        plot=not args.no_plot,
        command=command_line(parts),
    )
    result = run_predgen_bench(opts, log=lambda m: print(m, file=sys.stderr))
    for p in write_outputs(result, args.out, tag, plot_it=opts.plot):
        print(f"wrote {p}", file=sys.stderr)
    print(markdown(result))
    return 0


def cmd_live(args: argparse.Namespace) -> int:
    from speclive.bench.live import (
        CHAT_METHODS,
        TRANSLATE_METHODS,
        VOICES,
        LiveBenchOptions,
        chat_markdown,
        run_live_chat_bench,
        run_live_translate_bench,
        translate_markdown,
        write_outputs,
    )
    from speclive.errors import ConfigError

    chat = args.pipeline == "chat"
    methods = args.methods or list(CHAT_METHODS if chat else TRANSLATE_METHODS)
    allowed = ("predgen", "cascade", "prefill", "preemptive") if chat else TRANSLATE_METHODS
    for m in methods:
        if m.split(":")[0] not in allowed:
            raise ConfigError(
                f"invalid method {m!r} for --pipeline {args.pipeline}; allowed: {', '.join(allowed)}"
            )
    if chat and "cascade" not in methods:
        raise ConfigError(
            "--methods must include cascade: ratios and answer identity are measured against it"
        )
    bad = [v for v in args.voices if v not in VOICES]
    if bad:
        raise ConfigError(f"unknown voices {bad}; known: {', '.join(VOICES)}")
    tag = (
        f"live-{args.pipeline}-{args.tag}"
        if args.tag
        else f"live-{args.pipeline}-{args.model}-{args.backend}"
    )
    parts = ["speclive", "bench", "live", "--pipeline", args.pipeline, "--model", args.model]
    parts += ["--backend", args.backend, "--methods", ",".join(methods), "--voices", ",".join(args.voices)]
    parts += ["--limit", str(args.limit), "--max-tokens", str(args.max_tokens)]
    parts += ["--end-silence", f"{args.end_silence:g}", "--pause", f"{args.pause:g}"]
    if not chat:
        parts += ["--target-lang", args.target_lang, "--beta", f"{args.beta:g}"]
    else:
        parts += ["--first-clause", str(args.first_clause)]
    parts += ["--tag", tag.removeprefix(f"live-{args.pipeline}-")]
    opts = LiveBenchOptions(
        pipeline=args.pipeline,
        model=args.model,
        backend=args.backend,
        methods=methods,
        voices=args.voices,
        limit=args.limit,
        max_tokens=args.max_tokens,
        target_lang=args.target_lang,
        beta=args.beta,
        end_s=args.end_silence,
        pause_s=args.pause,
        first_clause_words=args.first_clause,
        out=args.out,
        tag=tag,
        plot=not args.no_plot,
        command=command_line(parts),
    )
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    result = run_live_chat_bench(opts, log) if chat else run_live_translate_bench(opts, log)
    for p in write_outputs(result, args.out, tag, plot_it=opts.plot):
        print(f"wrote {p}", file=sys.stderr)
    print(chat_markdown(result) if chat else translate_markdown(result))
    return 0


def cmd_talon(args: argparse.Namespace) -> int:
    from speclive.bench import report
    from speclive.bench.decode import DecodeOptions
    from speclive.bench.prompts import SETS, TALON_SETS
    from speclive.bench.talon import TALON_DEFAULT_METHODS, plot_talon, run_talon, talon_markdown
    from speclive.errors import ConfigError

    bad = [s for s in args.sets if s not in (*SETS, *TALON_SETS)]
    if bad:
        known = ", ".join(dict.fromkeys((*SETS, *TALON_SETS)))
        raise ConfigError(f"unknown prompt sets {bad}; known: {known}")
    methods = args.methods or list(TALON_DEFAULT_METHODS)
    tag = args.tag or f"{args.target}-{args.backend}"
    parts = ["speclive", "bench", "talon", "--target", args.target, "--backend", args.backend]
    parts += ["--sets", ",".join(args.sets), "--limit", str(args.limit), "--max-tokens", str(args.max_tokens)]
    parts += ["--methods", ",".join(methods), "--tag", tag, *_device_args(args.device)]
    if args.datastore:
        parts += ["--datastore", args.datastore]
    for flag in ("hf_peers", "no_curve"):
        if getattr(args, flag):
            parts.append("--" + flag.replace("_", "-"))
    opts = DecodeOptions(
        target=args.target,
        backends=[args.backend],
        sets=args.sets,
        limit=args.limit,
        max_tokens=args.max_tokens,
        methods=methods,
        out=args.out,
        tag=tag,
        measure_curve=not args.no_curve,
        progress=not args.no_progress,
        plot=not args.no_plot,
        datastore=args.datastore,
        device=args.device,
        command=command_line(parts),
    )
    try:
        result = run_talon(opts, hf_peers=args.hf_peers)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    paths = report.write_result_files(
        result, args.out, f"talon-{tag}", talon_markdown, None if args.no_plot else plot_talon
    )
    print(talon_markdown(result))
    for p in paths:
        print(f"wrote {p}", file=sys.stderr)
    return 0
