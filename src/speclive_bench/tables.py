"""``speclive bench tables``: the README's status table and benchmarks/README.md's result tables,
generated from the result files.

The spec is ``benchmarks/tables.toml`` (declarative, one entry per row): ``[[status]]`` rows
(feature, target, the current result file, the figure read from it, ``at_most``/``at_least``,
archived files as history) and ``[[result]]`` headlines of current result files. A result is
*current* when it lies in ``benchmarks/results/`` and its provenance (a JSON's top-level
``provenance`` object, or a lone Markdown report's ``- provenance:`` line) says a clean tree;
everything in ``benchmarks/results/archive/`` predates provenance and is history only.

The generated blocks sit between ``<!-- tables:begin NAME -->`` and ``<!-- tables:end NAME -->``
markers: ``status`` in README.md, ``current`` and ``archived`` in benchmarks/README.md. Without
options the command rewrites them; ``--check`` exits 1 when a committed block differs from what
the files give, when a doc cites a result file that does not exist (``check_links``), or when a
file in ``benchmarks/results`` lacks a full provenance from a clean tree (``unprovenanced``).

A row or history entry may add ``quality``: a list of ``{figure, format}`` read from the same
file and shown after the figure, so a lossy mode's quality stands beside its speed; and
``also``: figures of the same file written right after the figure (its confidence interval,
the peers' figures of the same run), so no number in a row is typed by hand.

A target of two parts ("≥ 1.0× the peer's throughput at no worse p99") lists the second in
``require``: ``{figure, at_most | at_least}`` entries of the same file; the status is "target
met" only when the figure and every required one meet their bounds.

A figure is a path into the JSON: dotted keys, ``name[key=value,...]`` picks the first element
of a list whose fields equal those values (compared as text), a number indexes a list, e.g.
``summary[set=code-edit,method=ngram].decode_speedup``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the three words a status cell may hold
STATUSES = ("target met", "target missed", "no current figure")
#: where the generated blocks live, relative to the repository root
BLOCKS = {"status": "README.md", "current": "benchmarks/README.md", "archived": "benchmarks/README.md"}
#: the docs whose mentions of result files must resolve
DOCS = ("README.md", "benchmarks/README.md", "docs/*.md")
RESULTS = Path("benchmarks/results")
SPEC = Path("benchmarks/tables.toml")
#: result file kinds, in the order a file is preferred as the one to cite
EXTS = (".json", ".md", ".png", ".log", ".csv", ".jsonl")
#: the file name prefixes of results (a backticked name with one of them is a result file)
PREFIXES = (
    "asr-",
    "costcurve-",
    "decode-",
    "fuzz-",
    "graphs-",
    "live-",
    "longconv-",
    "predgen-",
    "replay-",
    "retranslate-",
    "scale-",
    "serve-",
    "smart-turn-check",
    "soak-",
    "speechlm-",
    "talon-",
    "turns-",
    "voice-prompt",
)


class TableError(ValueError):
    """The spec names a file or a figure the results do not have."""


# ------------------------------------------------------------------------------------ reading
def stem(name: str) -> str:
    """A result file's name without its kind (``x.json``, ``x.md``, ``x.png`` share ``x``)."""
    for ext in EXTS:
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def extract(doc: Any, expr: str) -> Any:
    """The value at ``expr`` (see the module docstring) in a loaded JSON document."""
    cur = doc
    for seg in re.findall(r"[^.\[]+(?:\[[^\]]*\])?", expr):
        m = re.fullmatch(r"([^\[]+)(?:\[([^\]]*)\])?", seg)
        assert m is not None
        key, where = m.group(1), m.group(2)
        if isinstance(cur, list) and key.isdigit():
            cur = cur[int(key)]
        elif isinstance(cur, Mapping) and key in cur:
            cur = cur[key]
        else:
            raise TableError(f"no {key!r} in {expr!r}")
        if where is not None:
            want = dict(kv.split("=", 1) for kv in where.split(","))
            hits = [x for x in cur if all(str(x.get(k)) == v for k, v in want.items())]
            if not hits:
                raise TableError(f"no element [{where}] in {expr!r}")
            cur = hits[0]
    return cur


def figure(doc: Any, spec: Mapping[str, Any]) -> tuple[float | int | str, str]:
    """``(value, text)`` of the figure ``spec`` (``figure``, ``format``) in ``doc``, followed by
    its ``also`` figures and its ``quality`` figures (a lossy mode's quality beside its speed),
    read the same way."""
    value = extract(doc, spec["figure"])
    text = spec.get("format", "{}").format(value)
    text += "".join(a.get("format", " {}").format(extract(doc, a["figure"])) for a in spec.get("also", []))
    quality = [q.get("format", "{}").format(extract(doc, q["figure"])) for q in spec.get("quality", [])]
    if quality:
        text += f" (quality: {', '.join(quality)})"
    return value, text


@dataclass(frozen=True)
class Result:
    """One result in ``benchmarks/results`` (current) or its archive: its files and provenance."""

    stem: str
    folder: Path
    names: tuple[str, ...]
    provenance: Mapping[str, Any] | None

    @property
    def main(self) -> str:
        """The file to cite: the JSON when there is one, else the Markdown report, else any."""
        for ext in EXTS:
            if self.stem + ext in self.names:
                return self.stem + ext
        return self.names[0]

    @property
    def current(self) -> bool:
        """In ``benchmarks/results`` (not its archive), from a clean tree."""
        clean = bool(self.provenance and self.provenance.get("clean") is True)
        return self.folder.name == "results" and clean

    def load(self) -> Any:
        """The JSON document (TableError for a result without one)."""
        path = self.folder / f"{self.stem}.json"
        if not path.exists():
            raise TableError(f"{self.folder.name}/{self.stem} has no JSON to read a figure from")
        return _load(path)

    def title(self) -> str:
        """What the result is: its Markdown report's title (or the kind of file it is)."""
        md = self.folder / f"{self.stem}.md"
        if md.exists():
            for line in md.read_text().splitlines():
                if line.startswith("# "):
                    return line[2:].strip().replace("|", "/")
        return "data (JSON lines)" if self.main.endswith(".jsonl") else "(no report)"


@functools.lru_cache(maxsize=64)
def _load(path: Path) -> Any:
    return json.loads(path.read_text())


_MD_PROVENANCE = re.compile(
    r"^- provenance: commit (?P<commit>[0-9a-f]{40}) \(clean: (?P<clean>True|False)\), "
    r"(?P<cpu>.+), kernel (?P<kernel>\S+), (?P<created>\S+)$",
    re.M,
)


def _provenance(folder: Path, s: str, names: Sequence[str]) -> Mapping[str, Any] | None:
    """The provenance of result ``s``: its JSON's, else its lone Markdown report's line."""
    if f"{s}.json" in names:
        try:
            pv = json.loads((folder / f"{s}.json").read_text()).get("provenance")
        except (ValueError, AttributeError):
            return None
        return pv if isinstance(pv, Mapping) else None
    if f"{s}.md" in names:
        text = (folder / f"{s}.md").read_text()
        m = _MD_PROVENANCE.search(text)
        if m:
            cmd = re.search(r"^- command: `(.+)`$", text, re.M)
            cpu = re.fullmatch(r"(.+?) \((.+)\)", m["cpu"])
            return {
                "commit": m["commit"],
                "clean": m["clean"] == "True",
                "cpu": {"name": cpu[1], "detail": cpu[2]} if cpu else {"name": m["cpu"], "detail": ""},
                "gpu": None,
                "kernel": m["kernel"],
                "command": cmd[1] if cmd else None,
                "created": m["created"],
            }
    return None


def results(folder: Path) -> dict[str, Result]:
    """Every result in ``folder`` by stem (its README excluded)."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != "README.md")
    out = {}
    for s, group in itertools.groupby(sorted(names, key=stem), key=stem):
        files = tuple(group)
        # an archived result is never current: its provenance is not read
        pv = None if folder.name == "archive" else _provenance(folder, s, files)
        out[s] = Result(s, folder, files, pv)
    return out


# ------------------------------------------------------------------------------------ rendering
def _compare(value: Any, spec: Mapping[str, Any]) -> bool:
    """Whether ``value`` meets the row's target (``at_most`` or ``at_least``, one of them)."""
    bounds = [k for k in ("at_most", "at_least") if k in spec]
    if len(bounds) != 1 or not isinstance(value, int | float):
        raise TableError(f"{spec['feature']}: needs one of at_most / at_least and a number, got {value!r}")
    limit = spec[bounds[0]]
    return bool(value <= limit) if bounds[0] == "at_most" else bool(value >= limit)


def _history(spec: Mapping[str, Any], archived: Mapping[str, Result]) -> list[str]:
    """The row's archived files, each with its figure when the spec names one."""
    out = []
    for h in spec.get("history", []):
        name = h["file"].removeprefix("archive/")
        r = archived.get(stem(name))
        if r is None or name not in r.names:
            raise TableError(f"{spec['feature']}: no archived file {h['file']}")
        text = f"{figure(r.load(), h)[1]} " if "figure" in h else ""
        out.append(f"history: {text}(`{RESULTS}/archive/{name}`, archived before provenance)")
    return out


def status_rows(
    spec: Mapping[str, Any], current: Mapping[str, Result], archived: Mapping[str, Result]
) -> str:
    """The README's status table: feature, target, status, the figure and its file."""
    lines = ["| feature | target | status | figure and file | host |", "|---|---|---|---|---|"]
    for row in spec.get("status", []):
        cells, host = [], "–"
        if row.get("file"):
            r = current.get(stem(row["file"]))
            if r is None or not r.current or row["file"] not in r.names:
                raise TableError(f"{row['feature']}: {row['file']} is not a current result in {RESULTS}")
            doc = r.load()
            value, text = figure(doc, row)
            met = _compare(value, row) and all(
                _compare(extract(doc, req["figure"]), {"feature": row["feature"], **req})
                for req in row.get("require", [])
            )
            status = STATUSES[0] if met else STATUSES[1]
            cells.append(f"{text} (`{RESULTS}/{row['file']}`)")
            host = host_class(r.provenance or {})
        else:
            status = STATUSES[2]
        cells += _history(row, archived)
        figures = "; ".join(cells) or "–"
        lines.append(f"| {row['feature']} | {row['target']} | {status} | {figures} | {host} |")
    return "\n".join(lines)


#: the widest vector ISA a provenance names, as a host class is called
ISA_CLASSES = {"avx512f": "AVX-512", "avx2": "AVX2", "avx": "AVX", "neon": "NEON", "asimd": "ASIMD"}


def host_class(pv: Mapping[str, Any]) -> str:
    """The host class of a result: its GPU, else its CPU's widest ISA and model name
    ("AVX2 (AMD EPYC)"). Speeds differ up to 2x between classes: compare within one."""
    if pv.get("gpu"):
        return str(pv["gpu"])
    cpu = pv.get("cpu") or {}
    isa = str(cpu.get("detail") or "").rpartition(", ")[2]
    name = re.sub(r"\((R|TM)\)| Processor| CPU", "", str(cpu.get("name") or "?")).strip()
    return f"{ISA_CLASSES[isa]} ({name})" if isa in ISA_CLASSES else name


def _machine(pv: Mapping[str, Any]) -> str:
    if pv.get("gpu"):
        return str(pv["gpu"])
    cpu = pv.get("cpu") or {}
    return f"{cpu.get('name')} ({cpu.get('detail')})" if cpu.get("detail") else str(cpu.get("name"))


def current_rows(spec: Mapping[str, Any], current: Mapping[str, Result]) -> str:
    """benchmarks/README.md's table of current results, with each one's headline and provenance."""
    heads = {h["file"]: h for h in spec.get("result", [])}
    for name in heads:
        r = current.get(stem(name))
        if r is None or not r.current or name not in r.names:
            raise TableError(f"[[result]] {name} is not a current result in {RESULTS}")
    lines = [
        "| file | what | headline | commit | clean | CPU (ISA) or GPU | created |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in current.values() if r.current):
        head = heads.get(r.main)
        headline = "; ".join(figure(r.load(), f)[1] for f in head["headline"]) if head else "–"
        others = ", ".join(n.removeprefix(r.stem) for n in r.names if n != r.main)
        cite = f"`results/{r.main}`" + (f" (+ {others})" if others else "")
        pv = r.provenance or {}
        lines.append(
            f"| {cite} | {head.get('what', r.title()) if head else r.title()} | {headline} "
            f"| `{str(pv.get('commit'))[:10]}` | {pv.get('clean')} | {_machine(pv)} | {pv.get('created')} |"
        )
    return "\n".join(lines)


def archived_rows(archived: Mapping[str, Result]) -> str:
    """benchmarks/README.md's list of archived results: each file and what it was."""
    lines = [
        f"Archived before provenance ({len(archived)} results in `results/archive/`, history only, "
        "not current figures; see [its README](results/archive/README.md)):",
        "",
        "| archived file | what it was |",
        "|---|---|",
    ]
    for r in archived.values():
        exts = [n.removeprefix(r.stem).lstrip(".") for n in r.names]
        name = r.names[0] if len(exts) == 1 else f"{r.stem}.{{{','.join(exts)}}}"
        lines.append(f"| `results/archive/{name}` | {r.title()} |")
    return "\n".join(lines)


def blocks(root: Path) -> dict[str, str]:
    """Every generated block by name, from the spec and the result files under ``root``."""
    spec = tomllib.loads((root / SPEC).read_text())
    current = results(root / RESULTS)
    archived = results(root / RESULTS / "archive")
    return {
        "status": status_rows(spec, current, archived),
        "current": current_rows(spec, current),
        "archived": archived_rows(archived),
    }


def _block_re(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- tables:begin {name} -->\n)(.*?)(<!-- tables:end {name} -->)", re.S)


def render(root: Path) -> dict[str, str]:
    """Each file holding blocks (relative path) -> its text with every block regenerated."""
    out: dict[str, str] = {}
    for name, body in blocks(root).items():
        path = BLOCKS[name]
        text = out.get(path, (root / path).read_text())
        if not _block_re(name).search(text):
            raise TableError(f"{path} has no <!-- tables:begin {name} --> ... end block")
        out[path] = _block_re(name).sub(lambda m, b=body: m[1] + b + "\n" + m[3], text)
    return out


def block(text: str, name: str) -> str:
    """The body of block ``name`` in ``text`` ('' when there is none)."""
    m = _block_re(name).search(text)
    return m[2] if m else ""


# ------------------------------------------------------------------------------------ links
_NAME = r"(?:[\w.*-]|\{[^}\s]*\})+"
_PATH = re.compile(rf"(?:benchmarks/)?results/(archive/)?({_NAME})?")
_ARCHIVE = re.compile(rf"(?<![\w/])archive/({_NAME})")
_BARE = re.compile(r"`(" + "|".join(re.escape(p) for p in PREFIXES) + r")([^`\s]*)`")
#: a mention holding one of these is a pattern, not a file
_PLACEHOLDERS = ("<", "…", "...", "-X.", "NAME", "TAG")


def _expand(name: str) -> list[str]:
    """``a{b,c}d`` -> ``abd``, ``acd`` (every brace group)."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [x for alt in m[1].split(",") for x in _expand(name[: m.start()] + alt + name[m.end() :])]


def _resolves(folder: Path, name: str) -> bool:
    """Whether ``name`` (a file, a stem, a glob, with brace groups) names files in ``folder``."""
    name = name.rstrip(".")
    if not name:
        return folder.is_dir()
    for one in _expand(name):
        path = folder / one
        if "*" in one:
            ok = any(folder.glob(one))
        else:
            ok = path.is_file() or (path.suffix not in EXTS and any(folder.glob(glob_escape(one) + ".*")))
        if not ok:
            return False
    return True


def glob_escape(s: str) -> str:
    """``s`` with glob's special characters taken literally."""
    return re.sub(r"([*?\[])", r"[\1]", s)


def _mentions(line: str) -> Iterator[tuple[str, str]]:
    """``(folder, name)`` of every result file a line of a doc mentions (folder: ``""`` for
    ``benchmarks/results``, ``"archive"`` for its archive)."""
    spans = []
    for m in _PATH.finditer(line):
        spans.append(m.span())
        if not line[m.end() : m.end() + 1] == "<":  # results/<tag>...: a pattern
            yield ("archive" if m[1] else ""), (m[2] or "")
    for m in _ARCHIVE.finditer(line):
        if not any(a <= m.start() < b for a, b in spans):
            yield "archive", m[1]
    for m in _BARE.finditer(line):
        yield "", m[1] + m[2]


def check_links(root: Path) -> list[str]:
    """Every mention of a result file in the docs that names no file: ``path:line: name``."""
    bad = []
    docs = sorted({p for pattern in DOCS for p in root.glob(pattern)})
    for doc in docs:
        for i, line in enumerate(doc.read_text().splitlines(), 1):
            for folder, name in _mentions(line):
                if any(p in name for p in _PLACEHOLDERS):
                    continue
                where = root / RESULTS / folder
                if not _resolves(where, name):
                    shown = f"{folder}/{name}" if folder else name
                    bad.append(f"{doc.relative_to(root)}:{i}: {shown}")
    return bad


# ------------------------------------------------------------------------------------ command
#: what a result's provenance must name (``cpu`` or ``gpu``: the machine)
PROVENANCE_KEYS = ("commit", "clean", "kernel", "command", "created")


def unprovenanced(root: Path) -> list[str]:
    """The results in ``benchmarks/results`` without a full provenance from a clean tree."""
    out = []
    for r in results(root / RESULTS).values():
        pv = r.provenance or {}
        missing = [k for k in PROVENANCE_KEYS if not pv.get(k)]
        if not (pv.get("cpu") or pv.get("gpu")):
            missing.append("cpu or gpu")
        if missing or not r.current:
            why = "not from a clean tree" if pv.get("clean") is False else f"no {', '.join(missing)}"
            out.append(f"{RESULTS}/{r.main}: {why} (re-run it from a clean tree, or move it to archive/)")
    return out


def check(root: Path) -> list[str]:
    """What ``--check`` reports: results without a full clean provenance, stale generated blocks
    and mentions of missing result files."""
    problems = unprovenanced(root) + [
        f"{path}: a generated block differs from what the result files give (run `speclive bench tables`)"
        for path, text in render(root).items()
        if (root / path).read_text() != text
    ]
    return problems + [f"missing result file: {x}" for x in check_links(root)]


def add_tables_parser(sub: Any) -> None:
    """Register ``speclive bench tables``."""
    p = sub.add_parser("tables", help="regenerate (or --check) the status and result tables from the results")
    _arguments(p)
    p.set_defaults(func=cmd_tables)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 when a table is stale or a doc cites a missing result file",
    )
    p.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: here)")


def cmd_tables(args: argparse.Namespace) -> int:
    root = args.root
    try:
        if args.check:
            problems = check(root)
            for p in problems:
                print(p, file=sys.stderr)
            return 1 if problems else 0
        for path, text in render(root).items():
            if (root / path).read_text() != text:
                (root / path).write_text(text)
                print(f"rewrote {path}", file=sys.stderr)
    except TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m speclive_bench.tables [--check] [--root DIR]``."""
    p = argparse.ArgumentParser(prog="python -m speclive_bench.tables", description=__doc__.split("\n")[0])
    _arguments(p)
    return cmd_tables(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
