"""``speclive bench fuzz``: the reliability figures of the server under fuzzing.

One in-process server (real models, the limits of ``ServerConfig``), then:

1. the REST API fuzzed from its own OpenAPI schema (``bench.fuzz``): ``--requests`` generated
   requests per operation, valid and invalid; operations without inputs get the same request
   that many times;
2. ``WS /v1/realtime`` fuzzed (``bench.fuzz_realtime``): ``--events`` generated client events,
   then the hostile clients.

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
from speclive.common_options import asr_model_option, model_option
from speclive.loader import load_backend
from speclive.options import OptionSet, option
from speclive.server.app import create_app
from speclive.server.audio import resample
from speclive.server.config import ServerConfig
from speclive.server.inproc import serve_in_thread
from speclive.tts.piper import PiperTTS
from speclive_bench import report
from speclive_bench.fuzz import fuzz_rest
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
    seed: int = option(0, "--seed", parse=int, always=True)
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
        max_tokens=8,
        max_speech_chars=64,
        max_body_bytes=1_000_000,
        max_audio_s=10.0,
        max_turn_s=4.0,
        realtime_idle_s=5.0,
        realtime_events_per_s=2000.0,
        realtime_send_timeout_s=5.0,
    )
    tts = PiperTTS(config.tts_voice)
    stt = Transcriber(TranscribeConfig(model=opts.asr_model, method="specasr", draft="self:1"))
    live = Transcriber(
        TranscribeConfig(model=opts.asr_model, method="specasr", draft="self:1", target_audio_margin_s=1.0)
    )
    backend = load_backend(opts.model, "llamacpp", n_ctx=2048)
    app = create_app(config, backend=backend, transcriber=stt, live_transcriber=live, tts=tts)
    return app, config, tts


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

    try:
        with serve_in_thread(app) as url:
            print(f"fuzzing REST: {opts.requests} requests per operation", file=sys.stderr)
            # half valid, half invalid requests per operation
            rest = fuzz_rest(
                app, url, examples=max(1, opts.requests // 2), api_key=key, seed=opts.seed, progress=progress
            )
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
    finally:
        for lg in loggers:
            lg.removeHandler(errors)
    limits = {
        k: getattr(config, k)
        for k in (
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
    }
    result = {
        "header": {
            **header,
            "models": f"{opts.model} (llama.cpp), {opts.asr_model}, Piper",
            "limits": limits,
        },
        "rest": [r.to_dict() for r in rest],
        "realtime": ws.to_dict(),
        "server_errors_logged": errors.records,
    }
    for p in report.write_result_files(result, opts.out, f"fuzz-{opts.tag}", fuzz_markdown, None):
        print(f"wrote {p}", file=sys.stderr)
    print(fuzz_markdown(result))
    bad = sum(len(r["violations"]) for r in result["rest"]) + len(ws.violations) + len(errors.records)
    return 1 if bad else 0


def fuzz_markdown(result: dict[str, Any]) -> str:
    lines = report.markdown_preamble("Server fuzzing: REST and the realtime WebSocket", result["header"])
    lines += [
        f"Limits of the fuzzed server: `{result['header']['limits']}`",
        "",
        "## REST (OpenAPI schema)",
        "",
    ]
    rows = []
    for r in result["rest"]:
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
    lines += [report.md_table(cols + [("seconds", "seconds", 1)], rows), ""]
    ws = result["realtime"]
    lines += [
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
    lines += ["", f"Server `ERROR` log records: {len(result['server_errors_logged'])}"]
    return "\n".join(lines)
