"""Benchmark reporting: machine header, JSON/Markdown writers and matplotlib plots.

Everything here is presentation: the measurements come from ``speclive.bench.suites``. The
Markdown tables carry the header (machine, models, settings) and the exact command that
reproduces them, so a results file is self-describing.
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

# a divergence from AR at a reference top-2 logit gap below NEAR_TIE_GAP is a near-tie flip
from speclive.backends.base import NEAR_TIE_GAP
from speclive.sysinfo import cpu_model


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


def _git_commit() -> str | None:
    # a copy of the tree without .git (e.g. on a lent GPU machine) can name its commit
    if os.environ.get("SPECLIVE_GIT_COMMIT"):
        return os.environ["SPECLIVE_GIT_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}{'+dirty' if dirty else ''}" if sha else None


def machine_info() -> dict[str, Any]:
    """Where a benchmark ran: CPU, cores, memory, load, library versions, git commit, time."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu": cpu_model(),
        "gpu": gpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": affinity,
        "mem_gb": _mem_total_gb(),
        "loadavg_at_start": load,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {
            d: _version(d) for d in ("speclive", "torch", "transformers", "llama-cpp-python", "numpy")
        },
        "git": _git_commit(),
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
    }


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
        f"machine: {m.get('cpu')} | {m.get('cores')} cores ({m.get('cores_usable')} usable) | "
        f"{m.get('mem_gb')} GB | load avg at start {m.get('loadavg_at_start')}"
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


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_jsonable(data), indent=1) + "\n")
    os.replace(tmp, path)
    return path


def markdown_preamble(title: str, header: Mapping[str, Any]) -> list[str]:
    """Title, the run header as a list and the command that reproduces the run."""
    lines = [f"# {title}", ""] + [f"- {x}" for x in header_lines(header)]
    return lines + ["", "Reproduce with:", "", "```", header.get("command", ""), "```", ""]


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


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "–"
        return f"{v:.{digits}f}"
    return str(v)


def md_table(columns: Sequence[tuple[str, str, int]], rows: Iterable[Mapping[str, Any]]) -> str:
    """A Markdown table; ``columns`` are (key, title, digits)."""
    out = ["| " + " | ".join(t for _, t, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join(_fmt(r.get(k), d) for k, _, d in columns) + " |")
    return "\n".join(out)


# ------------------------------------------------------------------------------------ decode
SUMMARY_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("method", "method", 0),
    ("backend", "backend", 0),
    ("prompts", "prompts", 0),
    ("new_tokens", "tokens", 0),
    ("e2e_tps", "e2e tok/s", 1),
    ("speedup", "speedup vs ar", 2),
    ("decode_speedup", "decode speedup", 2),
    ("tau", "τ", 2),
    ("acceptance_rate", "accept", 2),
    ("alpha", "α̂", 2),
    ("bound_trace", "free-draft bound", 2),
    ("efficiency", "of bound", 2),
    ("bound_alpha", "α-bound", 2),
    ("bound_alpha_k", "k*", 0),
    ("identical", "identical", 0),
    ("near_tie", "near-tie flips", 0),
    ("bugs", "BUGS", 0),
)

CURVE_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("k", "k", 0),
    ("ms", "t(k) ms", 2),
    ("ratio", "t(k)/t(1)", 2),
    ("per_token_ms", "ms/token", 2),
)


STOCK_CURVE_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("stock_ms", "stock nn.Linear t(k) ms", 2),
    ("stock_ratio", "stock t(k)/t(1)", 2),
    ("linear_speedup", "dual-layout speedup", 2),
)


def curve_columns(rows: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, str, int], ...]:
    """The cost-curve table's columns; the stock-linear comparison when it was measured."""
    return CURVE_COLUMNS + (STOCK_CURVE_COLUMNS if rows and "stock_ms" in rows[0] else ())


def _identical_cell(row: Mapping[str, Any]) -> str:
    if row.get("identical") is None:
        return "–"
    return f"{row['identical']}/{row['compared']}"


def peer_comparison(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line: our fastest method's e2e tok/s over each peer's, within one set of one run.

    Peers of every backend count (llama-cpp-python, transformers, vLLM): the rows of one run saw
    the same prompts, so single-stream throughputs compare directly across engines.
    """
    from speclive.bench.suites import OUR_METHODS, TALON_METHODS

    ours_names = set(OUR_METHODS) | set(TALON_METHODS)
    rows = [r for r in rows if "/cold" not in r["backend"]]  # cold runs have their own table
    ours = [r for r in rows if r["method"] in ours_names and r.get("e2e_tps")]
    peers = [r for r in rows if r["method"] not in ours_names and r.get("e2e_tps")]
    if not ours or not peers:
        return ""
    best = max(ours, key=lambda r: r["e2e_tps"])

    def name(r: Mapping[str, Any]) -> str:
        return f"`{r['method']}` [{r['backend']}]"

    parts = []
    for r in sorted(peers, key=lambda r: -r["e2e_tps"]):
        note = f", {r['prompts']} of {best['prompts']} prompts" if r["prompts"] != best["prompts"] else ""
        parts.append(f"{name(r)} {r['e2e_tps']:.2f} ({best['e2e_tps'] / r['e2e_tps']:.2f}×{note})")
    return (
        f"Single-stream e2e tok/s, our fastest {name(best)} {best['e2e_tps']:.2f} over each peer: "
        + "; ".join(parts)
        + "."
    )


def decode_markdown(result: Mapping[str, Any]) -> str:
    """The Markdown report of a decode benchmark (header, command, one table per set)."""
    header = result["header"]
    lines = [f"# speclive decode benchmark: {header.get('tag')}", ""]
    lines += [f"- {h}" for h in header_lines(header)]
    lines += ["", "Reproduce with:", "", "```", header.get("command", ""), "```", ""]
    lines += [
        "Columns: *e2e tok/s* = new tokens / wall time of the whole call (prefill included, same for "
        "every method and peer); *speedup* = e2e throughput over `ar` of the same backend on the same "
        "prompts (the ratio of summed times when the outputs have equal length); *decode speedup* "
        "excludes prefill (our loop only); *τ* = tokens per target forward; *α̂* = per-token "
        "acceptance estimate; *free-draft bound* = speedup the same draft/accept trace would give if "
        "drafting were free and verification cost followed the measured cost curve; *of bound* = "
        "decode speedup / that bound; *α-bound* = best speedup of a free chain drafter with "
        "acceptance α̂ at the optimal fixed length k*; *identical* = prompts whose output is "
        f"token-identical to `ar`; a divergence at a reference top-2 logit gap < {NEAR_TIE_GAP} is a "
        "near-tie flip, larger gaps are BUGS.",
        "",
    ]
    bounds = result.get("ceilings", {})
    if bounds:
        lines.append(
            "Ceiling (perfect acceptance, free drafting, measured cost curve): "
            + ", ".join(f"{b}: {c['speedup']:.2f}× at k={c['k']}" for b, c in bounds.items())
        )
        lines.append("")
    by_set: dict[str, list[dict]] = {}
    for row in result["summary"]:
        by_set.setdefault(row["set"], []).append(dict(row))
    for name, rows in by_set.items():
        for r in rows:
            r["identical"] = _identical_cell(r)
        lines += [f"## {name}", "", md_table(SUMMARY_COLUMNS, rows), ""]
        versus = peer_comparison(rows)
        if versus:
            lines += [versus, ""]
    cvw = result.get("cold_vs_warm")
    if cvw:
        lines += [
            "## cold vs warm",
            "",
            "*warm*: one drafter per method across the prompt set (the tables above); *cold*: a fresh "
            "process and drafter per prompt, its speedup over `ar` run the same way; *+knowledge*: "
            "cold, loading what earlier cold processes saved (`speclive knowledge`); *cold/warm*: "
            "ratio of the speedups; *gain kept*: (cold − 1) / (warm − 1). Decode speedups where "
            "measured, end-to-end ones for peers.",
            "",
            md_table(
                [
                    ("set", "set", 0),
                    ("method", "method", 0),
                    ("knowledge", "saved knowledge", 0),
                    ("measure", "measure", 0),
                    ("warm", "warm", 2),
                    ("cold", "cold", 2),
                    ("cold_of_warm", "cold/warm", 2),
                    ("cold_gain_of_warm_gain", "gain kept", 2),
                ],
                [{**r, "knowledge": "yes" if r["knowledge"] else "no"} for r in cvw],
            ),
            "",
        ]
    bugs = result.get("bugs", [])
    if bugs:
        lines += ["## BUGS: divergences from AR at a clear logit gap", ""]
        for b in bugs:
            lines.append(
                f"- {b['set']}/{b['prompt_id']} {b['method']}[{b['backend']}]: first divergence at token "
                f"{b['position']}, reference gap {b['gap_top2']:.3f} (ar token {b['ref_token']}, "
                f"method token {b['method_token']})"
            )
        lines.append("")
    curves = result.get("cost_curves", {})
    for backend, curve in curves.items():
        rows = curve.get("rows", [])
        if rows:
            lines += [
                f"## cost curve: {curve.get('model')} on {backend} (prefix {curve.get('prefix')})",
                "",
                md_table(CURVE_COLUMNS, rows),
                "",
            ]
    if result.get("notes"):
        lines += ["## notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(lines)


def costcurve_markdown(result: Mapping[str, Any]) -> str:
    header = result["header"]
    lines = [f"# verification cost curve: {result['model']} on {result['backend']}", ""]
    lines += [f"- {h}" for h in header_lines(header)]
    lines += [
        "",
        "Reproduce with:",
        "",
        "```",
        header.get("command", ""),
        "```",
        "",
        f"One `extend` of k new tokens (logits for all of them) after a fixed {result['prefix']}-token "
        f"prefix, truncated back after each; median of {result['repeats']} repeats.",
        "",
        md_table(curve_columns(result["rows"]), result["rows"]),
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ plots
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_costcurve(path: Path, rows: Sequence[Mapping[str, Any]], title: str) -> Path:
    plt = _pyplot()
    ks = [r["k"] for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.plot(ks, [r["ms"] for r in rows], "o-")
    a1.set_xlabel("k (tokens in one extend)")
    a1.set_ylabel("t(k) [ms]")
    a1.set_xscale("log", base=2)
    a1.grid(True, alpha=0.3)
    a2.plot(ks, [r["ratio"] for r in rows], "o-", label="measured t(k)/t(1)")
    a2.plot(ks, ks, "--", color="grey", label="linear (k)")
    a2.plot(ks, [1.0] * len(ks), ":", color="grey", label="flat (GPU ideal)")
    a2.set_xlabel("k")
    a2.set_ylabel("t(k)/t(1)")
    a2.set_xscale("log", base=2)
    a2.set_yscale("log", base=2)
    a2.legend()
    a2.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
