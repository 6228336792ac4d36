"""``speclive bench fuzz``: the reliability figures of the server under fuzzing.

One in-process server (real models, the limits of ``ServerConfig``), then:

1. the REST API fuzzed from its own OpenAPI schema (``bench.fuzz``): ``--requests`` generated
   requests per operation, valid and invalid; operations without inputs get the same request
   that many times;
2. ``WS /v1/realtime`` fuzzed (``bench.fuzz_realtime``): ``--events`` generated client events,
   then the hostile clients;
3. with ``--responses N``, fuzzing that generates (``bench.fuzz_generate``): chat completions
   with real budgets (up to 256 tokens) and spoken realtime turns, interrupted at random, until
   N responses were generated (or ``--generate-seconds`` passed), with the server's RSS before,
   during and after. The server's ``max_tokens`` cap is then 256 (8 otherwise, so schema
   fuzzing reaches its limits fast).

``--requests 0`` / ``--events 0`` leave the REST / realtime fuzzing out.

The server's own ``ERROR`` log records are counted (a crashed session or an unhandled request
logs one). Results: ``benchmarks/results/fuzz-<tag>.{json,md}``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclive.asr.transcribe import TranscribeConfig, Transcriber
from speclive.common_options import asr_model_option, model_option, threads_option
from speclive.loader import load_backend
from speclive.options import OptionSet, option
from speclive.server.app import create_app
from speclive.server.audio import resample
from speclive.server.config import ServerConfig
from speclive.server.inproc import serve_in_thread
from speclive.server.memory import set_malloc
from speclive.tts.piper import PiperTTS
from speclive_bench import mappings, report
from speclive_bench.fuzz import fuzz_rest
from speclive_bench.fuzz_generate import fuzz_generate
from speclive_bench.fuzz_realtime import fuzz_realtime


class ErrorLog(logging.Handler):
    """Collects the ``ERROR`` records of the loggers it is added to."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record)[:2000])


@dataclass
class FuzzOptions:
    """Settings of ``bench fuzz``; each field with a flag is its command-line option."""

    model: str = model_option("smollm2-135m-instruct", help="chat model of the fuzzed server", always=True)
    asr_model: str = asr_model_option("whisper-tiny.en", always=True)
    requests: int = option(
        10_000, "--requests", parse=int, help="generated requests per REST operation", always=True
    )
    events: int = option(10_000, "--events", parse=int, help="generated realtime client events", always=True)
    responses: int = option(
        0, "--responses", parse=int, help="generated responses of the generating phase (0: none)", always=True
    )
    generate_seconds: float = option(
        3600.0,
        "--generate-seconds",
        parse=float,
        help="the longest the generating phase goes on",
        always=True,
    )
    rest_clients: int = option(
        3, "--rest-clients", parse=int, help="chat clients at once in the generating phase", always=True
    )
    realtime_clients: int = option(
        1,
        "--realtime-clients",
        parse=int,
        help="realtime clients at once in the generating phase",
        always=True,
    )
    seed: int = option(0, "--seed", parse=int, always=True)
    #: llama.cpp threads of the fuzzed server: its threads wait for each other whenever one is
    #: not scheduled, and the fuzzing clients and Piper (its own thread pool) run in this process
    threads: int = threads_option(1, help="llama.cpp threads of the fuzzed server", always=True)
    out: Path = report.out_option()
    #: results stem fuzz-<tag> (the command sets the default: the model)
    tag: str | None = option(None, "--tag", help="results name: fuzz-<tag>.*", always=True)
    command: str = ""


OPTIONS = OptionSet(FuzzOptions)


def add_fuzz_parser(sub: Any) -> None:
    p = sub.add_parser("fuzz", help="fuzz the server: REST from its OpenAPI schema, the realtime WebSocket")
    OPTIONS.add_to(p)
    p.set_defaults(func=cmd_fuzz)


def _server(opts: FuzzOptions, key: str):

    # limits small enough that the fuzzer reaches each of them in seconds
    config = ServerConfig(
        model=opts.model,
        asr_model=opts.asr_model,
        api_key=key,
        max_sessions=4,
        max_tokens=256 if opts.responses else 8,
        max_speech_chars=64,
        max_body_bytes=1_000_000,
        max_audio_s=10.0,
        max_turn_s=4.0,
        realtime_idle_s=5.0,
        realtime_events_per_s=2000.0,
        realtime_send_timeout_s=5.0,
    )
    # malloc's settings and the reserved model buffers of `speclive serve`, so that the memory
    # measured is the one a server has (the clients run in this process too)
    set_malloc(config.malloc_arenas, config.malloc_mmap_threshold_mib)
    tts = PiperTTS(config.tts_voice)
    tts.reserve()
    stt = Transcriber(TranscribeConfig(model=opts.asr_model, method="specasr", draft="self:1"))
    live = Transcriber(
        TranscribeConfig(model=opts.asr_model, method="specasr", draft="self:1", target_audio_margin_s=1.0)
    )
    backend = load_backend(opts.model, "llamacpp", n_ctx=2048, threads=opts.threads)
    backend.reserve_memory()
    app = create_app(config, backend=backend, transcriber=stt, live_transcriber=live, tts=tts)
    return app, config, tts


#: the server limits a fuzz result records
LIMITS = (
    "max_sessions",
    "max_tokens",
    "max_speech_chars",
    "max_body_bytes",
    "max_audio_s",
    "max_turn_s",
    "realtime_idle_s",
    "realtime_events_per_s",
    "realtime_send_timeout_s",
)


def cmd_fuzz(args: argparse.Namespace) -> int:
    opts = OPTIONS.build(args)
    key = "fuzz-bench-key"
    opts.tag = opts.tag or opts.model
    opts.command = OPTIONS.command(["speclive", "bench", "fuzz"], opts)
    header = {"machine": report.machine_info(), "command": opts.command}
    app, config, tts = _server(opts, key)
    spoken = tts.synthesize("What is the capital of France?")
    speech = resample(spoken.samples, spoken.sample_rate, 16_000)
    errors = ErrorLog()
    loggers = [logging.getLogger(n) for n in ("speclive", "uvicorn.error")]
    for lg in loggers:
        lg.addHandler(errors)
    last = [0.0]

    def progress(label: str, n: int) -> None:
        if time.time() - last[0] > 10:
            last[0] = time.time()
            print(f"  {label}: {n}", file=sys.stderr, flush=True)

    rest, ws, gen = [], None, None
    try:
        with serve_in_thread(app) as url:
            if opts.requests > 0:
                print(f"fuzzing REST: {opts.requests} requests per operation", file=sys.stderr)
                # half valid, half invalid requests per operation
                rest = fuzz_rest(
                    app,
                    url,
                    examples=max(1, opts.requests // 2),
                    api_key=key,
                    seed=opts.seed,
                    progress=progress,
                )
            if opts.events > 0:
                print(f"fuzzing the realtime WebSocket: {opts.events} events", file=sys.stderr)
                ws = fuzz_realtime(
                    url,
                    config,
                    events=opts.events,
                    api_key=key,
                    speech=speech,
                    seed=opts.seed,
                    progress=lambda n: progress("realtime events", n),
                )
            if opts.responses > 0:
                print(f"fuzzing that generates: {opts.responses} responses", file=sys.stderr)
                gen = fuzz_generate(
                    url,
                    opts.responses,
                    opts.model,
                    speech,
                    api_key=key,
                    seed=opts.seed,
                    max_seconds=opts.generate_seconds,
                    rest_clients=opts.rest_clients,
                    realtime_clients=opts.realtime_clients,
                    progress=lambda n: progress("generated responses", n),
                )
    finally:
        for lg in loggers:
            lg.removeHandler(errors)
    result = {
        "header": _fuzz_header(header, opts, config),
        "rest": [r.to_dict() for r in rest],
        "realtime": ws.to_dict() if ws is not None else None,
        "generate": gen.to_dict() if gen is not None else None,
        "server_errors_logged": errors.records,
    }
    for p in report.write_result_files(result, opts.out, f"fuzz-{opts.tag}", fuzz_markdown, None):
        print(f"wrote {p}", file=sys.stderr)
    print(fuzz_markdown(result))
    return 1 if _problems(result) else 0


def _fuzz_header(header: dict[str, Any], opts: FuzzOptions, config: ServerConfig) -> dict[str, Any]:
    """A fuzz result's header: the machine and command, the models, the fuzzed server's limits
    and its memory settings (those of `speclive serve`, ``_server``)."""
    return {
        **header,
        "models": f"{opts.model} (llama.cpp), {opts.asr_model}, Piper",
        "limits": {k: getattr(config, k) for k in LIMITS},
        "memory": {
            "malloc_arenas": config.malloc_arenas,
            "malloc_mmap_threshold_mib": config.malloc_mmap_threshold_mib,
            "reserved": "llama.cpp buffers, Piper's arena",
        },
    }


def _problems(result: dict[str, Any]) -> int:
    """Violations of every phase of a fuzz result, and the server's ERROR log records."""
    bad = sum(len(r["violations"]) for r in result["rest"]) + len(result["server_errors_logged"])
    for phase in ("realtime", "generate"):
        bad += len(result[phase]["violations"]) if result[phase] is not None else 0
    return bad


def fuzz_markdown(result: dict[str, Any]) -> str:
    lines = report.markdown_preamble("Server fuzzing: REST and the realtime WebSocket", result["header"])
    lines += [f"Limits of the fuzzed server: `{result['header']['limits']}`", ""]
    if result["header"].get("memory"):
        lines += [f"Memory settings of the fuzzed server: `{result['header']['memory']}`", ""]
    if result["rest"]:
        lines += _rest_markdown(result["rest"])
    if result.get("realtime"):
        lines += _realtime_markdown(result["realtime"])
    if result.get("generate"):
        lines += generate_markdown(result["generate"])
    lines += ["", f"Server `ERROR` log records: {len(result['server_errors_logged'])}"]
    return "\n".join(lines)


def _rest_markdown(rest: list[dict[str, Any]]) -> list[str]:
    rows = []
    for r in rest:
        five = sum(v for k, v in r["statuses"].items() if k.startswith("5"))
        rows.append(
            {
                "operation": r["operation"],
                "requests": r["requests"],
                "statuses": ", ".join(f"{k}: {v}" for k, v in r["statuses"].items()),
                "5xx": five,
                "violations": len(r["violations"]),
                "healthy after": "yes" if r["healthy_after"] else "NO",
                "seconds": r["seconds"],
            }
        )
    cols = [(k, k, 0) for k in ("operation", "requests", "statuses", "5xx", "violations", "healthy after")]
    return ["## REST (OpenAPI schema)", "", report.md_table(cols + [("seconds", "seconds", 1)], rows), ""]


def _realtime_markdown(ws: dict[str, Any]) -> list[str]:
    lines = [
        "## Realtime WebSocket",
        "",
        f"- {ws['generated_events']} generated client events in {ws['scripts']} scripts, "
        f"{ws['events'] - ws['generated_events']} more from the hostile clients, "
        f"{ws['aborted_connections']} connections dropped without a close frame, "
        f"{ws['refused_full']} connections refused while the server was full (1013) and retried",
        f"- error events by code: {ws['error_codes']}",
        f"- close codes seen by clients: {ws['close_codes']}",
        f"- server events: {ws['server_events']}",
        f"- violations: {len(ws['violations'])}" + (f" — {ws['violations'][:5]}" if ws["violations"] else ""),
        f"- before / after (sessions, tasks, RSS, open fds): {ws['before']} / {ws['after']}",
        "",
        "| hostile client | result | seconds |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {v} | {ws['scenario_seconds'].get(k, '')} |" for k, v in ws["scenarios"].items()]
    return lines + [""]


def generate_markdown(g: dict[str, Any]) -> list[str]:
    """The generating phase: responses, refusals, violations, RSS before / during / after."""
    rest, rt, rss = g["rest"], g["realtime"], g["rss"]
    gb = 1e9
    series = ", ".join(
        f"{t:g} s: {b / gb:.3f}"
        for t, b in rss["series_s_bytes"][:: max(1, len(rss["series_s_bytes"]) // 24)]
    )
    lines = [
        "## Fuzzing that generates",
        "",
        f"- **{g['generated_responses']} responses generated** in {g['seconds']:g} s"
        + (" (stopped by --generate-seconds)" if g["stopped_by_time"] else ""),
        f"- REST chat: {rest['requests']} requests, statuses {rest['statuses']}; {rest['generated']} "
        f"generated (content, or a stream left after its first chunk), {rest['left_mid_answer']} left "
        f"mid-answer by the client, {rest['completion_tokens']} completion tokens; "
        f"5xx other than clean refusals: {rest['5xx_not_refusals']}, clean refusals (503 + Retry-After): "
        f"{rest['refused_503']}",
        f"- budgets drawn (max_tokens, realtime max_output_tokens): {g['budgets']}",
        f"- realtime: {rt['sessions']} sessions ({rt.get('sessions_refused', 0)} more refused 1013 "
        f"for all of the client's retries), {rt['turns']} spoken turns, {rt['responses_created']} "
        f"responses created, response.done by status {rt['responses_done']}, {rt['generated']} generated "
        f"(done after output, or cancelled), {rt['turns_without_answer']} turns without an answer",
        f"- mid-answer actions: {rt['mid_answer_actions']}",
        f"- realtime error events by code: {rt['error_codes']}; close codes: {rt['close_codes']}",
        f"- violations: {len(g['violations'])}" + (f" — {g['violations'][:5]}" if g["violations"] else ""),
        "- RSS of the process that serves (its fuzzing clients run in it too): "
        f"before {rss['before_bytes'] / gb:.3f} GB, during max "
        f"{rss['during_max_bytes'] / gb:.3f} GB, after (settled) {rss['after_bytes'] / gb:.3f} GB "
        f"({rss['growth_after_pct']:+.2f} %)",
        f"- RSS during (s: GB): {series}",
        *_steps_lines(rss.get("steps")),
        "",
    ]
    return lines


#: the mappings' steps the Markdown lists (the JSON has them all)
STEPS_LISTED = 12


def _steps_lines(steps: list[dict[str, Any]] | None) -> list[str]:
    """One line per mapping that stepped up during the run (``mappings.StepWatch``)."""
    if steps is None:
        return []
    least = f"{mappings.STEP_BYTES / 2**20:.0f} MiB"
    if not steps:
        return [f"- no mapping's resident memory grew by {least} or more between two readings"]
    lines = [f"- mappings whose resident memory grew by {least} or more between two readings:"] + [
        f"  - {x['t']:.0f} s: {x['kind']} at {x['start']} ({x['mapped_mib']:.1f} MiB mapped"
        f"{', new' if x['new'] else ''}), resident {x['resident_before_mib']:.1f} → "
        f"{x['resident_after_mib']:.1f} MiB"
        for x in steps[:STEPS_LISTED]
    ]
    if len(steps) > STEPS_LISTED:
        lines.append(f"  - and {len(steps) - STEPS_LISTED} more (the JSON's `generate.rss.steps`)")
    return lines
