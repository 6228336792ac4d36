"""Saved cold-start knowledge: what the controllers learned, kept across processes.

A drafter's adaptive controllers learn the acceptance rate, the survival curve per match-length
bucket, the measured/modelled cost scale and the draft/target step-cost ratio; the backends
learn their verification-cost curve t(k). A new process (one ``speclive generate`` per prompt,
a server's first request) would start all of that from the priors again. ``KnowledgeStore``
keeps it per (target model, backend, drafter, machine) in one JSON file under
``$SPECLIVE_HOME/knowledge/`` (default ``~/.cache/speclive/knowledge``;
``$SPECLIVE_KNOWLEDGE_DIR`` names another directory): loaded before the first draft, saved
after each generation, written atomically (a temporary file, then ``os.replace``), so the
second process starts where the first stopped. Concurrent writers do not corrupt a
file; the last one to finish wins.

A file that cannot be read, is of another format version or does not fit the drafter is
ignored with one warning on stderr (the priors are used). ``speclive knowledge show`` lists the
files, ``speclive knowledge reset`` deletes them; ``--no-knowledge`` (or
``SPECLIVE_NO_KNOWLEDGE=1``) neither loads nor saves.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from speclive import sysinfo
from speclive.backends.base import Backend
from speclive.drafting.base import Drafter
from speclive.models.install import speclive_home

#: format version of the files; others are ignored
VERSION = 1
#: environment variable that turns saved knowledge off (any value but "" / "0")
ENV_OFF = "SPECLIVE_NO_KNOWLEDGE"
#: environment variable naming another directory for the knowledge files (a benchmark gives
#: each run its own, so no run starts from what earlier ones on the machine learned)
DIR_ENV = "SPECLIVE_KNOWLEDGE_DIR"


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def knowledge_dir() -> Path:
    """Where knowledge files live: ``$SPECLIVE_KNOWLEDGE_DIR`` when set, else
    ``$SPECLIVE_HOME/knowledge``."""
    named = os.environ.get(DIR_ENV, "")
    return Path(named).expanduser() if named else speclive_home() / "knowledge"


def disabled_by_env() -> bool:
    return os.environ.get(ENV_OFF, "") not in ("", "0")


def machine_id(target: Backend) -> str:
    """CPU model (with its family, model and vector ISA: one virtual CPU name covers host
    generations of different speeds), cores and the target's thread count (what the measured
    costs depend on)."""
    threads = target.n_threads
    detail = sysinfo.cpu_detail()
    cores = f"cores={os.cpu_count()}"
    parts = [sysinfo.cpu_model(), *([detail] if detail else []), cores, f"threads={threads}"]
    if str(target.device) != "cpu":
        parts.append(f"device={target.device}")
    return "|".join(parts)


class KnowledgeStore:
    """The knowledge file of one (target, backend, drafter, machine); see the module docstring."""

    def __init__(
        self,
        target: Backend,
        drafter: Drafter,
        drafter_name: str | None = None,
        directory: Path | None = None,
        log: Callable[[str], None] = _stderr,
    ):
        self.target = target
        self.drafter = drafter
        self.log = log
        draft = getattr(drafter, "draft", None)
        self.key: dict[str, Any] = {
            "target": target.name,
            "backend": target.kind,
            "drafter": drafter_name or drafter.name,
            "draft": getattr(draft, "name", None),
            "machine": machine_id(target),
        }
        digest = hashlib.sha1(json.dumps(self.key, sort_keys=True).encode()).hexdigest()[:10]
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{target.name}-{target.kind}-{self.key['drafter']}")
        self.path = Path(directory or knowledge_dir()) / f"{stem}-{digest}.json"
        #: the last load applied a saved file
        self.loaded = False
        self._warned_save = False

    def _draft_backend(self) -> Backend | None:
        d = getattr(self.drafter, "draft", None)
        return d if isinstance(d, Backend) else None

    def load(self) -> bool:
        """Apply the saved file, if any and valid; returns whether it was applied."""
        self.loaded = False
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return False
        except OSError as e:
            self.log(f"speclive: warning: cannot read saved knowledge {self.path}: {e}; using the priors")
            return False
        backup = self.drafter.knowledge()
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError(f"format version {data.get('version') if isinstance(data, dict) else '?'}")
            if data.get("key") != self.key:
                raise ValueError("it was saved for another target, drafter or machine")
            target_cost = data.get("target_cost") or {}
            draft_cost = data.get("draft_cost") or {}
            self.drafter.load_knowledge(data["drafter"])
            # a backend that has measured in this process keeps its own (fresher) measurements
            if target_cost and not self.target.cost.state():
                self.target.cost.load_state(target_cost)
            draft = self._draft_backend()
            if draft is not None and draft_cost and not draft.cost.state():
                draft.cost.load_state(draft_cost)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            self.drafter.load_knowledge(backup)
            self.log(f"speclive: warning: ignoring saved knowledge {self.path}: {e}; using the priors")
            return False
        self.loaded = True
        return True

    def snapshot(self) -> dict[str, Any]:
        draft = self._draft_backend()
        return {
            "version": VERSION,
            "key": self.key,
            "saved_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "drafter": self.drafter.knowledge(),
            "target_cost": self.target.cost.state(),
            "draft_cost": draft.cost.state() if draft is not None else {},
        }

    def save(self) -> bool:
        """Write the current state atomically; a failure is one warning, never an error."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.snapshot(), indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as e:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            if not self._warned_save:
                self._warned_save = True
                self.log(f"speclive: warning: cannot save knowledge to {self.path}: {e}")
            return False
        return True


def entries(directory: Path | None = None) -> list[tuple[Path, dict[str, Any] | None]]:
    """Every knowledge file with its content (None when unreadable)."""
    d = Path(directory or knowledge_dir())
    out: list[tuple[Path, dict[str, Any] | None]] = []
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            data = None
        out.append((p, data if isinstance(data, dict) else None))
    return out


def reset(directory: Path | None = None) -> int:
    """Delete every knowledge file; returns how many were deleted."""
    n = 0
    for p, _ in entries(directory):
        try:
            p.unlink()
            n += 1
        except FileNotFoundError:
            pass
    return n


def summary(data: dict[str, Any]) -> str:
    """One line about a knowledge file's content."""
    key = data.get("key", {})
    d = data.get("drafter", {})
    parts = [f"{key.get('target')} [{key.get('backend')}] drafter={key.get('drafter')}"]
    if key.get("draft"):
        parts.append(f"draft={key['draft']}")
    a = d.get("adaptive", {})
    if a:
        parts.append(f"alpha={a.get('alpha', 0):.2f}" + (" off" if a.get("off") else ""))
        if a.get("draft_ratio"):
            parts.append(f"draft_ratio={a['draft_ratio']:.2f}")
    t1 = data.get("target_cost", {}).get("1")
    if t1:
        parts.append(f"t1={1000 * t1:.1f}ms")
    parts.append(f"saved {data.get('saved_utc', '?')}")
    return " | ".join(parts)
