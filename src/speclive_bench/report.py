"""Benchmark reporting shared by every benchmark: run header, JSON/Markdown writers, plots.

Everything here is presentation and knows no benchmark: the measurements come from the
benchmark modules (``speclive_bench.decode``, ``talon``, ...). A results file is
self-describing: its header says where and from what it ran (machine, load before the run,
library versions, git commit and whether the tree had uncommitted changes) and the Markdown
carries the exact command that reproduces it.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from speclive.backends.base import NEAR_TIE_GAP as NEAR_TIE_GAP

# a divergence from AR at a reference top-2 logit gap below NEAR_TIE_GAP is a near-tie flip
from speclive.common_options import device_option
from speclive.errors import ConfigError
from speclive.options import option
from speclive.sysinfo import cpu_detail, cpu_model


# ------------------------------------------------------------------------------------ machine
def _mem_total_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def load_avg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages now (None where the system has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


#: the load average when this module was first imported, which in a ``speclive bench`` process
#: is before any model loads: ``machine_info``'s reading for a caller that passes none
_LOAD_AVG_AT_IMPORT = load_avg()


def git_state(where: Path | None = None, full: bool = False) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the checkout holding ``where`` (default: this file): the short
    (``full``: the whole) commit hash, ``+dirty`` appended when tracked files have uncommitted
    changes, and that flag (None when unknown). ``SPECLIVE_GIT_COMMIT`` names the commit of a
    copy without ``.git`` (e.g. on a lent GPU machine); a trailing ``+dirty`` there says the
    copy was dirty."""
    env = os.environ.get("SPECLIVE_GIT_COMMIT")
    if env:
        return env, True if env.endswith("+dirty") else None
    cwd = where if where is not None else Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", *([] if full else ["--short"]), "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None, None
    if not sha:
        return None, None
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return f"{sha}{'+dirty' if dirty else ''}", dirty


def machine_info(load_avg_start: list[float] | None = None) -> dict[str, Any]:
    """Where a benchmark ran: CPU, cores, memory, load, library versions, git commit, time.

    ``load_avg_start``: the load average the benchmark read (``load_avg()``) before it loaded
    any model (loading keeps a core busy and lifts the 1-minute figure); without one, the
    reading taken when this module was imported. ``git_dirty``: tracked files had uncommitted
    changes, so ``git`` alone does not name the code that ran.
    """
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    commit, dirty = git_state()
    return {
        "cpu": cpu_model(),
        "cpu_detail": cpu_detail(),
        "gpu": gpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": affinity,
        "mem_gb": _mem_total_gb(),
        "load_avg_start": load_avg_start if load_avg_start is not None else _LOAD_AVG_AT_IMPORT,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {
            d: _version(d) for d in ("speclive", "torch", "transformers", "llama-cpp-python", "numpy")
        },
        "git": commit,
        "git_dirty": dirty,
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
    }


def provenance(command: str) -> dict[str, Any]:
    """Where a result file came from: the full commit and whether the tree was clean, the CPU
    (model name, family, model, widest vector ISA) or GPU, the kernel, the command and when."""
    commit, dirty = git_state(full=True)
    return {
        "commit": commit.removesuffix("+dirty") if commit else None,
        "clean": None if dirty is None else not dirty,
        "cpu": {"name": cpu_model(), "detail": cpu_detail()},
        "gpu": gpu_model(),
        "kernel": platform.release(),
        "command": command,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def provenance_line(prov: Mapping[str, Any], extra: str = "") -> str:
    """The ``- provenance:`` line of a standalone script's Markdown report, in the form
    ``speclive bench tables`` reads from a report without a JSON beside it (``extra`` is appended
    as it is)."""
    return (
        f"- provenance: commit {prov['commit']} (clean: {prov['clean']}), {prov['cpu']['name']} "
        f"({prov['cpu']['detail']}), kernel {prov['kernel']}, {prov['created']}{extra}"
    )


def gpu_model() -> str | None:
    """The CUDA device's name when torch is already loaded and sees one (never imports torch)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    except Exception:  # a broken CUDA set-up must not break a benchmark's header
        return None
    return None


def header_lines(header: Mapping[str, Any]) -> list[str]:
    """Human-readable lines for the run header (printed and put atop the Markdown)."""
    m = header.get("machine", {})
    v = m.get("versions", {})
    lines = [
        f"machine: {m.get('cpu')}" + (f" ({m['cpu_detail']})" if m.get("cpu_detail") else "") + " | "
        f"{m.get('cores')} cores ({m.get('cores_usable')} usable) | "
        f"{m.get('mem_gb')} GB | load avg before loading models {m.get('load_avg_start')}"
        + (f" | GPU {m['gpu']}" if m.get("gpu") else ""),
        f"software: python {m.get('python')}, torch {v.get('torch')}, transformers {v.get('transformers')}, "
        f"llama-cpp-python {v.get('llama-cpp-python')}, speclive {v.get('speclive')} (git {m.get('git')})",
        f"date (UTC): {m.get('date_utc')}",
    ]
    for key in ("target", "backends", "models", "sets", "settings", "methods", "skipped"):
        if key in header and header[key]:
            val = header[key]
            if isinstance(val, Mapping):
                val = ", ".join(f"{k}={v}" for k, v in val.items())
            elif isinstance(val, list | tuple):
                val = ", ".join(str(x) for x in val)
            lines.append(f"{key}: {val}")
    return lines


def dirty_warning(header: Mapping[str, Any]) -> str | None:
    """A warning when the run's git tree had uncommitted changes (``git_dirty``), else None."""
    m = header.get("machine", {})
    if m.get("git_dirty") is not True:
        return None
    return (
        f"**Warning: uncommitted changes.** The git tree was dirty when this ran (`git_dirty: true`): "
        f"commit {str(m.get('git')).removesuffix('+dirty')} alone does not reproduce these numbers."
    )


# ------------------------------------------------------------------------------------ writers
def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def is_results_dir(path: Path | str) -> bool:
    """Whether ``path`` is a checkout's ``benchmarks/results`` (the quoted results)."""
    p = Path(path).resolve()
    return p.name == "results" and p.parent.name == "benchmarks"


def refuse_dirty_results(out: Path | str) -> None:
    """``ConfigError`` when a benchmark would write into ``benchmarks/results`` from code with
    uncommitted changes: every quoted result comes from a commit anyone can check out."""
    if not is_results_dir(out):
        return
    commit, dirty = git_state()
    if dirty:
        raise ConfigError(
            f"{out} holds the project's quoted results and the code at {commit} has uncommitted "
            "changes: commit them first, or write elsewhere with --out DIR"
        )


def write_json(path: Path, data: Any) -> Path:
    """``data`` as JSON at ``path`` (atomically). A result written into ``benchmarks/results``
    gets a top-level ``provenance`` object (``provenance()``) unless it carries one already
    (read before its run, as it should be)."""
    if is_results_dir(path.parent) and isinstance(data, dict) and "provenance" not in data:
        header = data.get("header") if isinstance(data.get("header"), dict) else {}
        data = {"provenance": provenance(str(header.get("command") or data.get("command") or "")), **data}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_jsonable(data), indent=1) + "\n")
    os.replace(tmp, path)
    return path


def markdown_preamble(title: str, header: Mapping[str, Any]) -> list[str]:
    """Title, a warning when the git tree was dirty, the run header as a list and the command
    that reproduces the run."""
    lines = [f"# {title}", ""]
    warning = dirty_warning(header)
    if warning:
        lines += [f"> {warning}", ""]
    lines += [f"- {x}" for x in header_lines(header)]
    return lines + ["", "Reproduce with:", "", "```", header.get("command", ""), "```", ""]


#: where a benchmark writes its results unless ``--out`` says otherwise
RESULTS_DIR = Path("benchmarks/results")


def out_option() -> Any:
    """The ``--out`` field of a benchmark's options: the results folder (changes no result)."""
    return option(RESULTS_DIR, "--out", parse=Path, result=False)


def plot_option() -> Any:
    """The ``plot`` field of a benchmark's options, turned off by ``--no-plot``."""
    return option(True, "--no-plot", result=False)


def hf_device_option() -> Any:
    """The ``--device`` field of a benchmark whose transformers backend may run off the CPU."""
    return device_option(help="torch device of the hf backend (cpu, cuda, ...)")


def probe_script_setup(description: str, script: str, default_out: str, n: int) -> tuple[Any, dict[str, Any]]:
    """The command line of a standalone memory-probe script (``benchmarks/<script>.py``):
    ``--out`` (its Markdown report; the JSON goes beside it) and ``--n`` (calls per case), parsed,
    the results folder refused from a dirty tree, and the run's provenance."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", type=Path, default=Path(default_out))
    ap.add_argument("--n", type=int, default=n)
    args = ap.parse_args()
    refuse_dirty_results(args.out.parent)
    return args, provenance(" ".join(["python", f"benchmarks/{script}.py", *sys.argv[1:]]))


def run_probe(code: str, *args: str) -> Any:
    """Run ``python -c code args`` in a fresh process (a memory probe starts from a clean
    heap) and return the JSON its last line of output prints."""
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_result_files(
    result: Any,
    out: Path,
    stem: str,
    markdown: Callable[[Any], str],
    plot: Callable[[Path, Any], Path] | None,
) -> list[Path]:
    """``<stem>.json`` (everything), ``<stem>.md`` (tables) and, with ``plot``, ``<stem>.png``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [write_json(out / f"{stem}.json", result)]
    md = out / f"{stem}.md"
    md.write_text(markdown(result) + "\n")
    paths.append(md)
    if plot is not None:
        paths.append(plot(out / f"{stem}.png", result))
    return paths


def word_error_rate(refs: Sequence[str], hyps: Sequence[str]) -> float:
    """Corpus word error rate (jiwer's): word-level edit distances summed over the pairs, over
    the reference words."""
    errors = words = 0
    for r, h in zip(refs, hyps, strict=True):
        rw, hw = r.split(), h.split()
        prev = list(range(len(hw) + 1))
        for i, a in enumerate(rw, 1):
            cur = [i] + [0] * len(hw)
            for j, b in enumerate(hw, 1):
                cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a != b))
            prev = cur
        errors += prev[-1]
        words += len(rw)
    return errors / words if words else 0.0


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "–"
        text = f"{v:.{digits}f}"
        # a value that rounds to zero is written 0, whatever the sign of its rounding error
        return text[1:] if text.startswith("-") and not text.strip("-0.") else text
    return str(v)


def md_table(columns: Sequence[tuple[str, str, int]], rows: Iterable[Mapping[str, Any]]) -> str:
    """A Markdown table; ``columns`` are (key, title, digits)."""
    out = ["| " + " | ".join(t for _, t, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join(_fmt(r.get(k), d) for k, _, d in columns) + " |")
    return "\n".join(out)


# ------------------------------------------------------------------------------------ plots
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_speedups(path: Path, summary: Sequence[Mapping[str, Any]], title: str) -> Path:
    """Grouped bars: speedup vs AR per method (one group per set)."""
    plt = _pyplot()
    sets = list(dict.fromkeys(r["set"] for r in summary))
    labels = list(dict.fromkeys(r["label"] for r in summary))
    val = {(r["set"], r["label"]): r.get("speedup") for r in summary}
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(sets) * max(1, len(labels)) * 0.45 + 2), 4.5))
    for j, lab in enumerate(labels):
        xs = [i + (j - (len(labels) - 1) / 2) * width for i in range(len(sets))]
        ys = [val.get((s, lab)) or 0.0 for s in sets]
        bars = ax.bar(xs, ys, width, label=lab)
        for b, y in zip(bars, ys, strict=True):
            if y:
                ax.annotate(
                    f"{y:.2f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7
                )
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(sets)), sets)
    ylabel = "speedup vs ar of the same backend (e2e)"
    if any(r.get("backend") == "vllm" for r in summary):
        ylabel += "\nvLLM methods: vs vllm-ar"
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def loud(lines: Sequence[str]) -> None:
    """Print a banner to stderr that is hard to miss."""
    bar = "!" * 100
    print("\n".join([bar, *[f"!! {x}" for x in lines], bar]), file=sys.stderr, flush=True)


def command_line(parts: list[str]) -> str:
    """The shell command (quoted) that reproduces a result, for its header."""
    return " ".join(shlex.quote(p) for p in parts)
