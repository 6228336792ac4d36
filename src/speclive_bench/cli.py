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
- ``tables``: the README's status table and benchmarks/README.md's result tables, generated
  from the result files (``speclive_bench.tables``; ``--check`` only compares).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from speclive.backends.cpu_linear import stock_linears
from speclive.errors import ConfigError
from speclive.loader import load_backend
from speclive.options import OptionSet
from speclive.sessions.predictive import parse_method
from speclive_bench import (
    cli_asr,
    costcurve,
    decode,
    graphs,
    live,
    longconv,
    methods,
    predgen,
    prompts,
    reliability,
    report,
    scale,
    serve,
    soak,
    speechlm,
    ssbd,
    tables,
    talon,
    turns,
)


def add_bench_parser(subparsers: Any) -> None:
    """Register ``speclive bench`` and its sub-commands on the top-level sub-parsers."""

    p = subparsers.add_parser("bench", help="benchmarks: cost curves, decode speed vs peers")
    p.set_defaults(prepare=_refuse_dirty_results)
    sub = p.add_subparsers(dest="bench_command", required=True)

    c = sub.add_parser("costcurve", help="verification cost t(k) of one extend of k tokens")
    _options("costcurve").add_to(c)
    c.set_defaults(func=cmd_costcurve)

    d = sub.add_parser("decode", help="all methods side by side on prompt sets")
    decode_options().add_to(d)
    d.set_defaults(func=cmd_decode)

    a = sub.add_parser("all-small", help="quick preset: SmolLM2 on llama.cpp, 2 prompts per set, 32 tokens")
    a.add_argument("--out", type=Path, default=report.RESULTS_DIR)
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

    speechlm.add_speechlm_bench_parser(sub)

    cli_asr.add_asr_bench_parser(sub)

    serve.add_serve_bench_parser(sub)

    reliability.add_fuzz_parser(sub)

    soak.add_soak_parser(sub)

    longconv.add_longconv_parser(sub)

    scale.add_scale_bench_parser(sub)

    turns.add_turns_bench_parser(sub)

    tables.add_tables_parser(sub)


#: the options class of each ``bench`` sub-command whose options class is its own
_OWN_OPTIONS: dict[str, type] = {
    "costcurve": costcurve.CostCurveOptions,
    "retranslate": ssbd.RetranslateBenchOptions,
    "graphs": graphs.GraphsOptions,
    "predgen": predgen.PredGenBenchOptions,
    "live": live.LiveBenchOptions,
}


def _options(command: str) -> OptionSet:
    """The option set of a ``bench`` sub-command whose options class is its own."""
    defaults = {"methods": None} if command == "live" else None
    return OptionSet(_OWN_OPTIONS[command], defaults=defaults)


def _refuse_dirty_results(args: argparse.Namespace) -> None:
    """A run that writes into the committed results needs a clean tree (before any model loads)."""
    if getattr(args, "out", None) is not None:
        report.refuse_dirty_results(args.out)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr)


def cmd_costcurve(args: argparse.Namespace) -> int:
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
    res = costcurve.measure_cost_curve(backend, opts.ks, opts.repeats, opts.prefix, progress=True)
    if opts.compare_stock_linear:
        if not (linear_info or {}).get("installed"):
            raise SystemExit(
                f"--compare-stock-linear: no dual-layout linears on this backend ({linear_info})"
            )

        with stock_linears(backend.model):  # type: ignore[attr-defined]
            stock = costcurve.measure_cost_curve(backend, opts.ks, opts.repeats, opts.prefix, progress=True)
        for row, srow in zip(res["rows"], stock["rows"], strict=True):
            row["stock_ms"], row["stock_ratio"] = srow["ms"], srow["ratio"]
            row["linear_speedup"] = srow["ms"] / row["ms"]
    res["header"] = header
    paths = costcurve.write_costcurve_outputs(res, opts.out, plot=opts.plot)
    print(report.md_table(costcurve.curve_columns(res["rows"]), res["rows"]))
    for p in paths.values():
        _log(f"wrote {p}")
    return 0


def decode_options() -> OptionSet:
    """``bench decode``'s options: every declared ``DecodeOptions`` field but Talon's."""

    return OptionSet(decode.DecodeOptions, skip=("datastore", "hf_peers"))


def talon_options() -> OptionSet:
    """``bench talon``'s options: ``DecodeOptions`` with the Talon sets and methods."""

    fields = ("target", "backends", "device", "sets", "limit", "max_tokens", "methods", "datastore")
    fields += ("hf_peers", "out", "tag", "measure_curve", "plot", "progress")
    return OptionSet(
        decode.DecodeOptions, only=fields, defaults={"sets": prompts.TALON_SETS, "limit": 4, "methods": None}
    )


def _decode(options: OptionSet, opts: Any, words: list[str], run: Any) -> Any:
    """Resolve the default tag, write the reproducing command, run (bad settings: ConfigError)."""

    opts.tag = opts.resolved_tag()
    opts.command = options.command(words, opts)
    try:
        return run(opts)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _check_sets(sets: list[str], known: tuple[str, ...]) -> None:
    bad = [s for s in sets if s not in known]
    if bad:
        raise ConfigError(f"unknown prompt sets {bad}; known: {', '.join(dict.fromkeys(known))}")


def run_decode_command(opts: Any) -> int:
    """``bench decode`` on ``opts`` (``DecodeOptions``): run, write the results, print the table."""

    _check_sets(list(opts.sets), prompts.DECODE_SETS)
    options = decode_options()
    result = _decode(options, opts, ["speclive", "bench", "decode"], decode.run_decode_bench)
    paths = decode.write_decode_outputs(result, opts.out, opts.tag, plot=opts.plot)
    print(decode.decode_markdown(result))
    for p in paths.values():
        _log(f"wrote {p}")
    return 1 if result["bugs"] else 0


def cmd_decode(args: argparse.Namespace) -> int:
    return run_decode_command(decode_options().build(args))


def cmd_all_small(args: argparse.Namespace) -> int:
    opts = decode_options().preset(
        target="smollm2-135m-instruct",
        backends=["llamacpp"],
        limit=2,
        max_tokens=32,
        methods=[*methods.OUR_METHODS, *methods.LLAMACPP_PEERS],
        out=args.out,
        tag=args.tag,
    )
    return run_decode_command(opts)


def cmd_retranslate(args: argparse.Namespace) -> int:
    options = _options("retranslate")
    opts = options.build(args)
    opts.tag = opts.tag or f"{opts.model}-{opts.backend}"
    opts.command = options.command(["speclive", "bench", "retranslate"], opts)
    result = ssbd.run_retranslate_bench(opts, log=_log)
    for p in ssbd.write_outputs(result, opts.out, opts.tag, plot_it=opts.plot):
        _log(f"wrote {p}")
    print(ssbd.markdown(result))
    return 0


def cmd_graphs(args: argparse.Namespace) -> int:
    options = _options("graphs")
    opts = options.build(args)
    opts.tag = opts.tag or f"{opts.model}-{opts.device.replace(':', '')}"
    result = graphs.run_graphs_bench(
        opts.model,
        opts.device,
        limit=opts.limit,
        max_tokens=opts.max_tokens,
        repeats=opts.repeats,
        log=_log,
    )
    result["header"] = {
        "machine": report.machine_info(),
        "target": opts.model,
        "backends": "hf (eager) vs hf static cache + CUDA graphs, one copy of the weights",
        "settings": {"precision": "fp32", "device": opts.device, **result["settings"]},
        "command": options.command(["speclive", "bench", "graphs"], opts),
    }
    for p in report.write_result_files(
        result, opts.out, f"graphs-{opts.tag}", graphs.markdown, graphs.plot if opts.plot else None
    ):
        _log(f"wrote {p}")
    print(graphs.markdown(result))
    return 0


def cmd_predgen(args: argparse.Namespace) -> int:
    options = _options("predgen")
    opts = options.build(args)
    if "baseline" not in opts.methods:
        raise ConfigError("--methods must include baseline (speedups and turn-2 history come from it)")
    for m in opts.methods:
        if m != "baseline":
            parse_method(m)
    opts.tag = opts.tag or f"{opts.model}-{opts.backend}"
    opts.command = options.command(["speclive", "bench", "predgen"], opts)
    result = predgen.run_predgen_bench(opts, log=_log)
    for p in predgen.write_outputs(result, opts.out, f"predgen-{opts.tag}", plot_it=opts.plot):
        _log(f"wrote {p}")
    print(predgen.markdown(result))
    return 0


def cmd_live(args: argparse.Namespace) -> int:
    options = _options("live")
    opts = options.build(args)
    chat = opts.pipeline == "chat"
    opts.methods = opts.methods or list(live.CHAT_METHODS if chat else live.TRANSLATE_METHODS)
    allowed = ("predgen", "cascade", "prefill", "preemptive") if chat else live.TRANSLATE_METHODS
    for m in opts.methods:
        try:
            base = live._asr_variant(m)[0] if chat else m
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
    bad = [v for v in opts.voices if v not in live.VOICES]
    if bad:
        raise ConfigError(f"unknown voices {bad}; known: {', '.join(live.VOICES)}")
    opts.tag = opts.tag or f"{opts.model}-{opts.backend}"
    opts.command = options.command(["speclive", "bench", "live"], opts)
    result = live.run_live_chat_bench(opts, _log) if chat else live.run_live_translate_bench(opts, _log)
    for p in live.write_outputs(result, opts.out, f"live-{opts.pipeline}-{opts.tag}", plot_it=opts.plot):
        _log(f"wrote {p}")
    print(live.chat_markdown(result) if chat else live.translate_markdown(result))
    return 0


def cmd_talon(args: argparse.Namespace) -> int:
    _check_sets(args.sets, (*prompts.SETS, *prompts.TALON_SETS))
    options = talon_options()
    opts = options.build(args)
    opts.methods = opts.methods or list(talon.TALON_DEFAULT_METHODS)
    result = _decode(options, opts, ["speclive", "bench", "talon"], talon.run_talon)
    paths = report.write_result_files(
        result,
        opts.out,
        f"talon-{opts.tag}",
        talon.talon_markdown,
        None if not opts.plot else talon.plot_talon,
    )
    print(talon.talon_markdown(result))
    for p in paths:
        print(f"wrote {p}", file=sys.stderr)
    return 0
