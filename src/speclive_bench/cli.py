"""``speclive bench``: cost curves and side-by-side decode benchmarks.

Sub-commands:

- ``costcurve``: time one ``extend`` of k tokens after a fixed prefix; writes
  ``costcurve-<model>-<backend>.{json,md,png}``.
- ``decode``: every method (our loop with each drafter, llama-cpp-python, transformers
  generate / assisted / prompt lookup, vLLM when installed) on the same prompts in one process;
  writes ``decode-<tag>.{json,md,png}``.
- ``scale``: speclive's sessions on vLLM vs plain vLLM at 1 and N concurrent sessions
  (``speclive_bench.scale``); writes ``scale-<tag>.{json,md,png}``.
- ``all-small``: a quick preset of ``decode`` (SmolLM2 on llama.cpp, 2 prompts per set,
  32 tokens) to check that everything runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from speclive.options import OptionSet


def add_bench_parser(subparsers: Any) -> None:
    """Register ``speclive bench`` and its sub-commands on the top-level sub-parsers."""
    from speclive_bench.report import RESULTS_DIR

    p = subparsers.add_parser("bench", help="benchmarks: cost curves, decode speed vs peers")
    sub = p.add_subparsers(dest="bench_command", required=True)

    c = sub.add_parser("costcurve", help="verification cost t(k) of one extend of k tokens")
    _options("costcurve").add_to(c)
    c.set_defaults(func=cmd_costcurve)

    d = sub.add_parser("decode", help="all methods side by side on prompt sets")
    decode_options().add_to(d)
    d.set_defaults(func=cmd_decode)

    a = sub.add_parser("all-small", help="quick preset: SmolLM2 on llama.cpp, 2 prompts per set, 32 tokens")
    a.add_argument("--out", type=Path, default=RESULTS_DIR)
    a.add_argument("--tag", default="all-small")
    a.set_defaults(func=cmd_all_small)

    t = sub.add_parser("talon", help="Talon Table 1: suffix / hybrid / async drafting vs AR and peers")
    talon_options().add_to(t)
    t.set_defaults(func=cmd_talon)

    r = sub.add_parser("retranslate", help="SSBD re-translation: AR vs bias β vs mask-k (Tables 2-4)")
    _options("retranslate").add_to(r)
    r.set_defaults(func=cmd_retranslate)

    gr = sub.add_parser("graphs", help="hf step: eager transformers vs static cache + CUDA graphs")
    _options("graphs").add_to(gr)
    gr.set_defaults(func=cmd_graphs)

    g = sub.add_parser("predgen", help="PredGen voice chat on MT-Bench: cascade vs verifiers (Table 1)")
    _options("predgen").add_to(g)
    g.set_defaults(func=cmd_predgen)

    lv = sub.add_parser(
        "live",
        help="live pipelines on spoken questions: voice-to-voice latency vs cascade/prefill/preemptive",
    )
    _options("live").add_to(lv)
    lv.set_defaults(func=cmd_live)

    from speclive_bench.speechlm import add_speechlm_bench_parser

    add_speechlm_bench_parser(sub)

    from speclive_bench.cli_asr import add_asr_bench_parser

    add_asr_bench_parser(sub)

    from speclive_bench.serve import add_serve_bench_parser

    add_serve_bench_parser(sub)

    from speclive_bench.reliability import add_fuzz_parser

    add_fuzz_parser(sub)

    from speclive_bench.soak import add_soak_parser

    add_soak_parser(sub)

    from speclive_bench.scale import add_scale_bench_parser

    add_scale_bench_parser(sub)

    from speclive_bench.turns import add_turns_bench_parser

    add_turns_bench_parser(sub)


def _options(command: str) -> OptionSet:
    """The option set of a ``bench`` sub-command whose options class is its own."""
    if command == "costcurve":
        from speclive_bench.costcurve import CostCurveOptions as cls
    elif command == "retranslate":
        from speclive_bench.ssbd import RetranslateBenchOptions as cls
    elif command == "graphs":
        from speclive_bench.graphs import GraphsOptions as cls
    elif command == "predgen":
        from speclive_bench.predgen import PredGenBenchOptions as cls
    elif command == "live":
        from speclive_bench.live import LiveBenchOptions as cls

        return OptionSet(cls, defaults={"methods": None})
    else:
        raise KeyError(command)
    return OptionSet(cls)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr)


def cmd_costcurve(args: argparse.Namespace) -> int:
    from speclive.loader import load_backend
    from speclive_bench import report
    from speclive_bench.costcurve import curve_columns, measure_cost_curve, write_costcurve_outputs

    options = _options("costcurve")
    opts = options.build(args)
    backend = load_backend(opts.model, opts.backend, device=opts.device)
    settings: dict[str, object] = {
        "ks": list(opts.ks),
        "repeats": opts.repeats,
        "prefix": opts.prefix,
        "device": opts.device,
    }
    linear_info = backend.linear_info
    if linear_info is not None:
        settings["linear"] = linear_info
    header = {
        "machine": report.machine_info(),
        "models": {opts.backend: backend.name},
        "settings": settings,
        "command": options.command(["speclive", "bench", "costcurve"], opts),
    }
    for line in report.header_lines(header):
        _log(line)
    res = measure_cost_curve(backend, opts.ks, opts.repeats, opts.prefix, progress=True)
    if opts.compare_stock_linear:
        if not (linear_info or {}).get("installed"):
            raise SystemExit(
                f"--compare-stock-linear: no dual-layout linears on this backend ({linear_info})"
            )
        from speclive.backends.cpu_linear import stock_linears

        with stock_linears(backend.model):  # type: ignore[attr-defined]
            stock = measure_cost_curve(backend, opts.ks, opts.repeats, opts.prefix, progress=True)
        for row, srow in zip(res["rows"], stock["rows"], strict=True):
            row["stock_ms"], row["stock_ratio"] = srow["ms"], srow["ratio"]
            row["linear_speedup"] = srow["ms"] / row["ms"]
    res["header"] = header
    paths = write_costcurve_outputs(res, opts.out, plot=opts.plot)
    print(report.md_table(curve_columns(res["rows"]), res["rows"]))
    for p in paths.values():
        _log(f"wrote {p}")
    return 0


def decode_options() -> OptionSet:
    """``bench decode``'s options: every declared ``DecodeOptions`` field but Talon's."""
    from speclive_bench.decode import DecodeOptions

    return OptionSet(DecodeOptions, skip=("datastore", "hf_peers"))


def talon_options() -> OptionSet:
    """``bench talon``'s options: ``DecodeOptions`` with the Talon sets and methods."""
    from speclive_bench.decode import DecodeOptions
    from speclive_bench.prompts import TALON_SETS

    fields = ("target", "backends", "device", "sets", "limit", "max_tokens", "methods", "datastore")
    fields += ("hf_peers", "out", "tag", "measure_curve", "plot", "progress")
    return OptionSet(DecodeOptions, only=fields, defaults={"sets": TALON_SETS, "limit": 4, "methods": None})


def _decode(options: OptionSet, opts: Any, words: list[str], run: Any) -> Any:
    """Resolve the default tag, write the reproducing command, run (bad settings: ConfigError)."""
    from speclive.errors import ConfigError

    opts.tag = opts.resolved_tag()
    opts.command = options.command(words, opts)
    try:
        return run(opts)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _check_sets(sets: list[str], known: tuple[str, ...]) -> None:
    from speclive.errors import ConfigError

    bad = [s for s in sets if s not in known]
    if bad:
        raise ConfigError(f"unknown prompt sets {bad}; known: {', '.join(dict.fromkeys(known))}")


def run_decode_command(opts: Any) -> int:
    """``bench decode`` on ``opts`` (``DecodeOptions``): run, write the results, print the table."""
    from speclive_bench.decode import decode_markdown, run_decode_bench, write_decode_outputs
    from speclive_bench.prompts import SETS

    _check_sets(list(opts.sets), SETS)
    options = decode_options()
    result = _decode(options, opts, ["speclive", "bench", "decode"], run_decode_bench)
    paths = write_decode_outputs(result, opts.out, opts.tag, plot=opts.plot)
    print(decode_markdown(result))
    for p in paths.values():
        _log(f"wrote {p}")
    return 1 if result["bugs"] else 0


def cmd_decode(args: argparse.Namespace) -> int:
    return run_decode_command(decode_options().build(args))


def cmd_all_small(args: argparse.Namespace) -> int:
    from speclive_bench.methods import LLAMACPP_PEERS, OUR_METHODS

    opts = decode_options().preset(
        target="smollm2-135m-instruct",
        backends=["llamacpp"],
        limit=2,
        max_tokens=32,
        methods=[*OUR_METHODS, *LLAMACPP_PEERS],
        out=args.out,
        tag=args.tag,
    )
    return run_decode_command(opts)


def cmd_retranslate(args: argparse.Namespace) -> int:
    from speclive_bench.ssbd import markdown, run_retranslate_bench, write_outputs

    options = _options("retranslate")
    opts = options.build(args)
    opts.tag = opts.tag or f"{opts.model}-{opts.backend}"
    opts.command = options.command(["speclive", "bench", "retranslate"], opts)
    result = run_retranslate_bench(opts, log=_log)
    for p in write_outputs(result, opts.out, opts.tag, plot_it=opts.plot):
        _log(f"wrote {p}")
    print(markdown(result))
    return 0


def cmd_graphs(args: argparse.Namespace) -> int:
    from speclive_bench.graphs import markdown, plot, run_graphs_bench
    from speclive_bench.report import machine_info, write_result_files

    options = _options("graphs")
    opts = options.build(args)
    opts.tag = opts.tag or f"{opts.model}-{opts.device.replace(':', '')}"
    result = run_graphs_bench(
        opts.model,
        opts.device,
        limit=opts.limit,
        max_tokens=opts.max_tokens,
        repeats=opts.repeats,
        log=_log,
    )
    result["header"] = {
        "machine": machine_info(),
        "target": opts.model,
        "backends": "hf (eager) vs hf static cache + CUDA graphs, one copy of the weights",
        "settings": {"precision": "fp32", "device": opts.device, **result["settings"]},
        "command": options.command(["speclive", "bench", "graphs"], opts),
    }
    for p in write_result_files(
        result, opts.out, f"graphs-{opts.tag}", markdown, plot if opts.plot else None
    ):
        _log(f"wrote {p}")
    print(markdown(result))
    return 0


def cmd_predgen(args: argparse.Namespace) -> int:
    from speclive.errors import ConfigError
    from speclive.sessions.predictive import parse_method
    from speclive_bench.predgen import markdown, run_predgen_bench, write_outputs

    options = _options("predgen")
    opts = options.build(args)
    if "baseline" not in opts.methods:
        raise ConfigError("--methods must include baseline (speedups and turn-2 history come from it)")
    for m in opts.methods:
        if m != "baseline":
            parse_method(m)
    opts.tag = opts.tag or f"{opts.model}-{opts.backend}"
    opts.command = options.command(["speclive", "bench", "predgen"], opts)
    result = run_predgen_bench(opts, log=_log)
    for p in write_outputs(result, opts.out, f"predgen-{opts.tag}", plot_it=opts.plot):
        _log(f"wrote {p}")
    print(markdown(result))
    return 0


def cmd_live(args: argparse.Namespace) -> int:
    from speclive.errors import ConfigError
    from speclive_bench.live import (
        CHAT_METHODS,
        TRANSLATE_METHODS,
        VOICES,
        _asr_variant,
        chat_markdown,
        run_live_chat_bench,
        run_live_translate_bench,
        translate_markdown,
        write_outputs,
    )

    options = _options("live")
    opts = options.build(args)
    chat = opts.pipeline == "chat"
    opts.methods = opts.methods or list(CHAT_METHODS if chat else TRANSLATE_METHODS)
    allowed = ("predgen", "cascade", "prefill", "preemptive") if chat else TRANSLATE_METHODS
    for m in opts.methods:
        try:
            base = _asr_variant(m)[0] if chat else m
        except ValueError as e:
            raise ConfigError(str(e)) from e
        if base.split(":")[0] not in allowed:
            raise ConfigError(
                f"invalid method {m!r} for --pipeline {opts.pipeline}; allowed: {', '.join(allowed)}"
            )
    if chat and "cascade" not in opts.methods:
        raise ConfigError(
            "--methods must include cascade: ratios and answer identity are measured against it"
        )
    bad = [v for v in opts.voices if v not in VOICES]
    if bad:
        raise ConfigError(f"unknown voices {bad}; known: {', '.join(VOICES)}")
    opts.tag = opts.tag or f"{opts.model}-{opts.backend}"
    opts.command = options.command(["speclive", "bench", "live"], opts)
    result = run_live_chat_bench(opts, _log) if chat else run_live_translate_bench(opts, _log)
    for p in write_outputs(result, opts.out, f"live-{opts.pipeline}-{opts.tag}", plot_it=opts.plot):
        _log(f"wrote {p}")
    print(chat_markdown(result) if chat else translate_markdown(result))
    return 0


def cmd_talon(args: argparse.Namespace) -> int:
    from speclive_bench import report
    from speclive_bench.prompts import SETS, TALON_SETS
    from speclive_bench.talon import TALON_DEFAULT_METHODS, plot_talon, run_talon, talon_markdown

    _check_sets(args.sets, (*SETS, *TALON_SETS))
    options = talon_options()
    opts = options.build(args)
    opts.methods = opts.methods or list(TALON_DEFAULT_METHODS)
    result = _decode(options, opts, ["speclive", "bench", "talon"], run_talon)
    paths = report.write_result_files(
        result, opts.out, f"talon-{opts.tag}", talon_markdown, None if not opts.plot else plot_talon
    )
    print(talon_markdown(result))
    for p in paths:
        print(f"wrote {p}", file=sys.stderr)
    return 0
