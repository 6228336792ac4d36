"""Cold runs of ``speclive bench decode --cold``: one fresh process per (method, prompt).

The warm decode benchmark keeps one drafter per method across the whole prompt set, so its
adaptive controllers arrive warm; a user's first ``speclive generate`` or a server's first
request arrives cold. A cold run starts a new Python process that loads the target (and draft
model), builds the method with a fresh drafter and fresh backend cost models, generates one
prompt and exits. With a knowledge directory the drafter loads what earlier cold processes
saved there and saves what it learned (``speclive.knowledge``); without, it starts from the
priors. Timing is that of the generation only (model loading is reported apart, as
``load_s``).

The parent (``run_cold``) talks to the child through JSON files: the job on stdin, the record
(the format of ``OurRunner.run`` / ``peer_record`` of ``speclive_bench.methods``) in the file
named by the only argument.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import speclive
from speclive.loader import load_backend
from speclive.models.resolve import resolve
from speclive_bench.methods import local_runner


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Load, build, generate once (in this process); returns the record."""

    t0 = time.perf_counter()
    target = load_backend(job["target"], job["backend"])
    ref = resolve(job["target"])
    kdir = job.get("knowledge_dir")
    runner = local_runner(
        job["method"],
        job["backend"],
        target,
        ref,
        job.get("max_draft"),
        job.get("datastore"),
        knowledge_dir=Path(kdir) if kdir else None,
    )
    if runner is None or isinstance(runner, str):
        raise RuntimeError(f"{job['method']} does not apply: {runner}")
    load_s = time.perf_counter() - t0
    try:
        rec = runner.run(job["prompt_ids"], int(job["max_tokens"]))
    finally:
        runner.close()
    rec["load_s"] = load_s
    return rec


def run_cold(job: dict[str, Any], timeout_s: float = 900.0) -> dict[str, Any]:
    """Run ``job`` in a fresh Python process (this checkout's speclive); returns its record.

    The child's stderr (e.g. the model drafter's "off" line) is kept as ``stderr_tail``.
    """

    env = dict(os.environ)
    src = str(Path(speclive.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="speclive-cold-") as tmp:
        out = Path(tmp) / "record.json"
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "speclive_bench.coldrun", str(out)],
            input=json.dumps(job),
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
        )
        process_s = time.perf_counter() - t0
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stderr or "").strip().splitlines()
            raise RuntimeError(f"cold run failed (rc={proc.returncode}): {' | '.join(tail[-3:])}")
        rec = json.loads(out.read_text())
    rec["process_s"] = process_s
    lines = [
        ln for ln in (proc.stderr or "").splitlines() if ln.startswith("speclive:") and "warning" not in ln
    ]
    if lines:
        rec["stderr_tail"] = lines[-3:]
    return rec


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m speclive_bench.coldrun OUT.json < job.json", file=sys.stderr)
        return 2
    rec = run_job(json.loads(sys.stdin.read()))
    Path(args[0]).write_text(json.dumps(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
