"""``speclive serve``: run the OpenAI-compatible server with uvicorn (models loaded at startup)."""

from __future__ import annotations

import argparse
import logging
import sys

from speclive.server.config import SERVE_OPTIONS, ServerConfig

#: how long a shutdown waits for responses in flight
GRACEFUL_S = 30


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server: chat, transcription, speech")
    SERVE_OPTIONS.add_to(p)  # one flag per field of ServerConfig that the command sets
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=cmd_serve)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return SERVE_OPTIONS.build(args)


def cmd_serve(args: argparse.Namespace) -> int:
    try:  # lazy: the serve extra (fastapi, uvicorn) is optional; other commands run without it
        import uvicorn

        from speclive.server.app import create_app
        from speclive.server.memory import set_malloc
    except ImportError as e:  # pragma: no cover - depends on the install
        print(f"speclive serve needs the 'serve' extra ({e}): pip install -e '.[serve]'", file=sys.stderr)
        return 2

    config = config_from_args(args)
    set_malloc(config.malloc_arenas, config.malloc_mmap_threshold_mib)  # before any model loads
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
