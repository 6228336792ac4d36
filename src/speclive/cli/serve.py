"""``speclive serve``: run the OpenAI-compatible server with uvicorn (models loaded at startup)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from speclive.server.config import ServerConfig


#: how long a shutdown waits for responses in flight
GRACEFUL_S = 30


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    from speclive.cli.generate import add_engine_args
    from speclive.engines.options import add_engine_options
    from speclive.options import add_stream_draft_flag

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server: chat, transcription, speech")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    # --model --backend --drafter --draft-model --max-draft --threshold --threads --device --n-ctx
    # --datastore, as `generate` has them (the drafter is checked against SERVE_DRAFTERS)
    add_engine_args(p)
    add_engine_options(p)
    p.add_argument("--asr-model", default="whisper-base", help="Whisper model of /v1/audio/transcriptions")
    p.add_argument("--asr-draft", default="whisper-tiny.en", help="SpecASR draft (a Whisper model or self:N)")
    p.add_argument("--asr-method", default="specasr", help="ar | sd | specasr | faster-whisper")
    p.add_argument("--voice", default="piper-joe-medium", help="Piper voice of /v1/audio/speech")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (all but /health)")
    p.add_argument(
        "--max-sessions", type=int, default=4, help="requests computing at once; more wait in line"
    )
    p.add_argument(
        "--queue-wait",
        type=float,
        default=30.0,
        help="seconds a request waits for a slot before a 503 (0: none)",
    )
    p.add_argument("--max-tokens", type=int, default=2048, help="most tokens one completion may generate")
    p.add_argument(
        "--max-audio",
        type=float,
        default=120.0,
        help="longest audio to transcribe (seconds)",
    )
    p.add_argument(
        "--max-turn", type=float, default=30.0, help="longest realtime turn (seconds): it ends there"
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        help="close a realtime session that sends nothing for this many seconds (0: never)",
    )
    p.add_argument(
        "--max-events-per-s",
        type=float,
        default=200.0,
        help="realtime client events per second per session (bursts of twice as many pass)",
    )
    p.add_argument(
        "--memory-trim",
        type=float,
        default=60.0,
        help="seconds between returns of freed heap memory to the OS (0: never)",
    )
    p.add_argument("--lazy", action="store_true", help="load each model on first use, not at startup")
    add_stream_draft_flag(p)
    p.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin (https://app.example) whose pages may open /v1/realtime besides the "
        "server's own page; repeat for more, '*' for any (other origins are refused with 403)",
    )
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=cmd_serve)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    from speclive.engines.options import check_engine_args, vllm_urls
    from speclive.server.config import ServerConfig

    check_engine_args(args)
    return ServerConfig(
        host=args.host,
        port=args.port,
        model=args.model,
        backend=args.backend,
        drafter=args.drafter,
        draft_model=args.draft_model,
        max_draft=args.max_draft,
        threshold=args.threshold,
        datastore=args.datastore,
        knowledge=not args.no_knowledge,
        n_ctx=args.n_ctx,
        threads=args.threads,
        device=args.device,
        engine=args.engine,
        vllm_urls=tuple(vllm_urls(args.vllm_url)),
        vllm_top_k=args.vllm_top_k,
        asr_model=args.asr_model,
        asr_draft=args.asr_draft,
        asr_method=args.asr_method,
        stream_draft=args.stream_draft,
        stream_partials=args.stream_partials,
        allow_origins=tuple(args.allow_origin),
        tts_voice=args.voice,
        api_key=args.api_key,
        max_sessions=args.max_sessions,
        queue_wait_s=args.queue_wait,
        max_tokens=args.max_tokens,
        max_audio_s=args.max_audio,
        max_turn_s=args.max_turn,
        realtime_idle_s=args.idle_timeout,
        realtime_events_per_s=args.max_events_per_s,
        preload=not args.lazy,
        memory_trim_s=args.memory_trim,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from speclive.server.app import create_app
    except ImportError as e:  # pragma: no cover - depends on the install
        print(f"speclive serve needs the 'serve' extra ({e}): pip install -e '.[serve]'", file=sys.stderr)
        return 2
    import logging

    config = config_from_args(args)
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=args.log_level.upper(), format=fmt)
    app = create_app(config)
    if config.host not in ("127.0.0.1", "localhost", "::1") and not config.api_key:
        print(
            f"warning: listening on {config.host} without --api-key: anyone who can reach it may use it",
            file=sys.stderr,
        )
    print(
        f"speclive serve: loading models, then listening on {config.url} (OpenAI base_url: {config.url}/v1)",
        file=sys.stderr,
        flush=True,
    )
    # SIGTERM / Ctrl-C: no new connections; responses in flight finish (realtime sessions get a
    # 1012 close), for at most GRACEFUL_S seconds
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=GRACEFUL_S,
    )
    return 0
