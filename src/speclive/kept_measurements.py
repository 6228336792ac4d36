"""Measurements kept per machine in small JSON files under ``$SPECLIVE_HOME``.

Each file maps a key (what the measurement depends on: the CPU, the model file, the settings)
to its entry. A process reads the file once and adds its own entries with an atomic rename, so
a reader never sees half a file; a home that cannot be written only costs measuring again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def key(parts: Iterable[str]) -> str:
    """A short key for what a measurement depends on, one string per thing."""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def read_entries(path: Path) -> dict[str, Any]:
    """The file's entries by key; none where it is missing or broken."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def keep_entry(path: Path, key: str, entry: Any) -> bool:
    """Add ``entry`` under ``key`` (re-reading the file first, so other processes' entries
    stay); False where the file cannot be written."""
    entries = read_entries(path)
    entries[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as exc:
        log.info("could not keep a measurement in %s: %s", path, exc)
        return False
    return True
