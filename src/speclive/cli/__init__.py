"""The ``speclive`` command line: generate, models, knowledge, bench, demo, transcribe.

One module per command group (``speclive.cli.<group>``), each adding its parser to the top-level
one; the commands are thin shells over the library:

- ``generate``: ``speclive generate`` and the engine options other one-model commands share;
- ``models``: ``speclive models list|install|verify``;
- ``knowledge``: ``speclive knowledge show|reset|path``;
- ``bench``: ``speclive bench ...``, from the ``speclive_bench`` package;
- ``datastore``: ``speclive datastore build|info|outputs``;
- ``demo``: ``speclive demo``;
- ``sessions``: ``speclive retranslate`` and ``speclive predgen``;
- ``speechlm``: ``speclive speechlm demo``;
- ``asr``: ``speclive transcribe``;
- ``live``: ``speclive live chat|translate|transcribe``;
- ``serve``: ``speclive serve``.

(The first line above is the top-level ``--help`` description.)
"""

from __future__ import annotations

import argparse
import sys

from speclive.cli.asr import add_transcribe_parser
from speclive.cli.datastore import add_datastore_parser
from speclive.cli.demo import add_demo_parser
from speclive.cli.generate import add_generate_parser
from speclive.cli.knowledge import add_knowledge_parser
from speclive.cli.live import add_live_parser
from speclive.cli.models import add_models_parser
from speclive.cli.serve import add_serve_parser
from speclive.cli.sessions import add_predgen_parser, add_retranslate_parser
from speclive.cli.speechlm import add_speechlm_parser
from speclive.errors import SpecliveError


def _add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """``speclive bench``, from the ``speclive_bench`` package when its dependencies are there."""
    try:  # lazy: the benchmarks need the 'bench' and 'serve' extras; the product commands do not
        from speclive_bench.cli import add_bench_parser
    except ImportError as e:
        missing = str(e)

        def unavailable(args: argparse.Namespace) -> int:
            raise SpecliveError(f"speclive bench needs the 'bench' and 'serve' extras ({missing})")

        p = sub.add_parser("bench", help="benchmarks (needs the 'bench' and 'serve' extras)")
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=unavailable)
        return
    add_bench_parser(sub)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speclive", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate_parser(sub)
    add_models_parser(sub)
    add_knowledge_parser(sub)
    _add_bench_parser(sub)
    add_datastore_parser(sub)
    add_demo_parser(sub)
    add_retranslate_parser(sub)
    add_predgen_parser(sub)
    add_speechlm_parser(sub)
    add_transcribe_parser(sub)
    add_live_parser(sub)
    add_serve_parser(sub)

    args = parser.parse_args(argv)
    try:
        prepare = getattr(args, "prepare", None)
        if prepare is not None:  # a command's checks before anything loads
            prepare(args)
        return int(args.func(args) or 0)
    except SpecliveError as e:
        print(f"speclive: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


__all__ = ["main"]
