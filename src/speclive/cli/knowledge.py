"""``speclive knowledge show|reset|path``: the saved cold-start knowledge files.

The store itself (where the files live, what they hold, how they are read and deleted) is
``speclive.knowledge``; this module only parses the command and prints.
"""

from __future__ import annotations

import argparse
from typing import Any

from speclive.knowledge import entries, knowledge_dir, reset, summary


def add_knowledge_parser(subparsers: Any) -> None:
    """``speclive knowledge show|reset|path``."""
    p = subparsers.add_parser("knowledge", help="saved cold-start knowledge: show or reset it")
    p.add_argument("action", choices=["show", "reset", "path"])
    p.set_defaults(func=cmd_knowledge)


def cmd_knowledge(args: argparse.Namespace) -> int:
    if args.action == "path":
        print(knowledge_dir())
        return 0
    if args.action == "reset":
        print(f"deleted {reset()} knowledge file(s) in {knowledge_dir()}")
        return 0
    items = entries()
    if not items:
        print(f"no saved knowledge in {knowledge_dir()}")
    for path, data in items:
        print(f"{path.name}: {summary(data) if data else 'unreadable (ignored)'}")
    return 0
