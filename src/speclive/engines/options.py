"""The ``--engine local|vllm`` and ``--vllm-url`` options shared by the session commands
(``retranslate``, ``predgen``, ``live``, ``serve``) and the one function that loads what they
name: an in-process backend (``speclive.loader.load_backend``) or vLLM replicas
(``speclive.engines.vllm.connect``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from speclive.errors import ConfigError

ENGINES = ("local", "vllm")


def add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        default="local",
        choices=ENGINES,
        help="local: the model in this process (--backend); vllm: `vllm serve` replicas (--vllm-url)",
    )
    p.add_argument(
        "--vllm-url",
        action="append",
        default=[],
        metavar="URL",
        help="base URL of a `vllm serve` replica, e.g. http://127.0.0.1:8100 (repeat, or "
        "comma-separate, for several replicas)",
    )
    p.add_argument("--vllm-top-k", type=int, default=20, help="log-probs per position of a vLLM verification")


def vllm_urls(values: Sequence[str]) -> list[str]:
    return [u.strip() for v in values for u in v.split(",") if u.strip()]


def check_engine_args(args: argparse.Namespace) -> None:
    """Fail before anything loads when the options do not fit together."""
    urls = vllm_urls(getattr(args, "vllm_url", []) or [])
    if args.engine == "vllm" and not urls:
        raise ConfigError("--engine vllm needs --vllm-url URL (a `vllm serve` replica)")
    if args.engine != "vllm" and urls:
        raise ConfigError("--vllm-url needs --engine vllm")


def load_llm(args: argparse.Namespace) -> Any:
    """The LLM the options name: a ``Backend`` or a ``VLLMEngine`` (both drive the sessions)."""
    check_engine_args(args)
    if args.engine == "vllm":
        from speclive.engines.vllm import connect

        return connect(vllm_urls(args.vllm_url), model=args.model, top_k=args.vllm_top_k)
    from speclive.loader import load_backend

    return load_backend(args.model, args.backend, threads=args.threads, device=args.device)
