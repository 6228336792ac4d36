"""The benchmark harness: the import graph of ``speclive_bench``, the interleaved loop, the run
header (git state, load average), the Talon verdict rule and the reference AR the exactness
checks re-run."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
from context_lm import ASSISTANT, EOS, USER, ContextLM, reference_greedy

from speclive_bench import report
from speclive_bench.exactness import ar_logit_gap
from speclive_bench.harness import interleaved, rotated, run_interleaved
from speclive_bench.reference import greedy_reference, greedy_steps
from speclive_bench.talon import verdict

BENCH = Path(report.__file__).resolve().parent
#: shared by every benchmark; they import no benchmark module
HARNESS = {
    "report",
    "prompts",
    "costcurve",
    "exactness",
    "datasets",
    "peers",
    "vllm_peer",
    "reference",
    "launch",
    "stats",
    "harness",
}


# ------------------------------------------------------------------------------------ imports
def _bench_imports(tree: ast.AST) -> set[str]:
    """``speclive_bench`` modules a syntax tree imports."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "speclive_bench":
                out |= {a.name for a in node.names}
            elif node.module.startswith("speclive_bench."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("speclive_bench.")}
    return out


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """The import statements a module runs when it is imported (not those in functions)."""
    out: list[ast.stmt] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            todo += ast.iter_child_nodes(node)
    return out


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Per module of ``speclive_bench``: the bench modules imported at module level, and those
    imported inside functions."""
    top: dict[str, set[str]] = {}
    local: dict[str, set[str]] = {}
    for path in sorted(BENCH.glob("*.py")):
        tree = ast.parse(path.read_text())
        name = path.stem
        top[name] = set()
        for stmt in _module_level(tree):
            top[name] |= _bench_imports(stmt)
        local[name] = _bench_imports(tree) - top[name]
    return top, local


def test_bench_imports_flow_one_way() -> None:
    top, local = _graph()
    assert "suites" not in top
    for name in HARNESS:
        assert top[name] <= HARNESS, f"harness module {name} imports {top[name] - HARNESS}"
    for name, mods in local.items():
        assert not mods, f"{name} imports {mods} inside functions"
    # no cycle among module-level imports (depth-first search)
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        if state.get(m) == 1:
            raise AssertionError(f"import cycle: {' -> '.join([*path, m])}")
        if state.get(m) == 2:
            return
        state[m] = 1
        for d in sorted(top.get(m, ())):
            visit(d, [*path, m])
        state[m] = 2

    for m in top:
        visit(m, [])


def test_no_bench_function_is_longer_than_a_screen() -> None:
    long = []
    for path in sorted(BENCH.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > 80:
                    long.append(f"{path.stem}.{node.name}: {n} lines")
    assert not long, "\n".join(long)


# ------------------------------------------------------------------------------------ the loop
def test_rotation_per_sample() -> None:
    assert rotated("abc", 0) == ["a", "b", "c"]
    assert rotated("abc", 4) == ["b", "c", "a"]
    assert rotated([], 3) == []
    assert interleaved(1, "abc", "xy") == ["b", "c", "a", "y", "x"]


def test_run_interleaved_order_errors_and_repeats() -> None:
    calls: list[tuple[str, int]] = []
    errors: list[tuple[str, int, str]] = []
    seen: list[tuple[int, list[str]]] = []

    def run_one(m: str, s: int) -> dict:
        calls.append((m, s))
        if (m, s) == ("b", 1):
            raise ValueError("broken")
        return {"m": m, "s": s}

    records = run_interleaved(
        [0, 1, 2],
        ["a", "b"],
        run_one,
        then=["c"],
        progress=False,
        on_error=lambda m, s, e: errors.append((m, s, e)),
        after_sample=lambda s, done: seen.append((s, [m for m, _ in done])),
    )
    order = [("a", 0), ("b", 0), ("c", 0), ("b", 1), ("a", 1), ("c", 1), ("a", 2), ("b", 2), ("c", 2)]
    assert calls == order
    assert records[3] == {"error": "ValueError: broken"} and errors == [("b", 1, "ValueError: broken")]
    assert records[4] == {"m": "a", "s": 1}
    assert seen == [(0, ["a", "b", "c"]), (1, ["b", "a", "c"]), (2, ["a", "b", "c"])]
    # repeats continue the rotation and mark the records
    again = run_interleaved([0], ["a", "b"], lambda m, s: {"m": m}, repeats=2, progress=False)
    assert again == [
        {"m": "a", "repeat": 0},
        {"m": "b", "repeat": 0},
        {"m": "b", "repeat": 1},
        {"m": "a", "repeat": 1},
    ]
    with pytest.raises(ValueError):
        run_interleaved([1], ["b"], run_one, catch=False, progress=False)


# ------------------------------------------------------------------------------------ header
def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def test_git_state_flags_uncommitted_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECLIVE_GIT_COMMIT", raising=False)
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "first")
    commit, dirty = report.git_state(tmp_path)
    assert commit and not commit.endswith("+dirty") and dirty is False
    (tmp_path / "new.txt").write_text("untracked files do not count\n")
    assert report.git_state(tmp_path) == (commit, False)
    (tmp_path / "a.txt").write_text("two\n")
    assert report.git_state(tmp_path) == (commit + "+dirty", True)
    full, _ = report.git_state(tmp_path, full=True)
    assert full and len(full) == 40 + len("+dirty") and full.startswith(commit)
    monkeypatch.setenv("SPECLIVE_GIT_COMMIT", "abc1234+dirty")
    assert report.git_state(tmp_path) == ("abc1234+dirty", True)
    monkeypatch.setenv("SPECLIVE_GIT_COMMIT", "abc1234")
    assert report.git_state(tmp_path) == ("abc1234", None)


def test_header_records_dirty_tree_and_start_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "git_state", lambda where=None: ("abc1234+dirty", True))
    info = report.machine_info([0.5, 0.25, 0.125])
    assert info["git"] == "abc1234+dirty" and info["git_dirty"] is True
    assert info["load_avg_start"] == [0.5, 0.25, 0.125]
    header = {"machine": info, "command": "speclive bench decode"}
    assert "load avg before loading models [0.5, 0.25, 0.125]" in report.header_lines(header)[0]
    md = report.markdown_preamble("t", header)
    warning = [x for x in md if "Warning: uncommitted changes" in x]
    assert len(warning) == 1 and "abc1234" in warning[0]
    assert md.index(warning[0]) < md.index("Reproduce with:")
    # without a reading of its own, the one from when the harness was imported
    assert report.machine_info()["load_avg_start"] == report._LOAD_AVG_AT_IMPORT

    monkeypatch.setattr(report, "git_state", lambda where=None: ("abc1234", False))
    clean = {"machine": report.machine_info(), "command": "x"}
    assert clean["machine"]["git_dirty"] is False
    assert not any("Warning" in x for x in report.markdown_preamble("t", clean))
    assert not any("Warning" in x for x in report.markdown_preamble("t", {"command": "x"}))


# ------------------------------------------------------------------------------------ talon
@pytest.mark.parametrize(
    ("ratio", "lo", "hi", "expected"),
    [
        (1.001, 0.990, 1.011, "within noise"),  # above 1, interval reaches below: not "faster"
        (0.995, 0.985, 1.004, "within noise"),
        (1.05, 1.02, 1.08, "faster"),
        (0.95, 0.92, 0.98, "slower"),
    ],
)
def test_talon_verdict_is_symmetric(ratio: float, lo: float, hi: float, expected: str) -> None:
    assert verdict({"ratio": ratio, "lo": lo, "hi": hi}) == expected


# ------------------------------------------------------------------------------------ reference AR
PROMPTS = [[5, 9, 11, 4], [7], [30, 31, 32, 33, 34, 35], [USER, 12, 40, 17, ASSISTANT]]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_reference_is_plain_greedy(prompt: list[int]) -> None:
    lm = ContextLM()
    ref = reference_greedy(prompt, 12)
    out, gaps = greedy_reference(lm, prompt, 12)
    assert out == ref
    ended = len(ref) < 12  # stopped at EOS: that step's gap is there, its token is not
    assert len(gaps) == len(out) + ended and all(g > 0 for g in gaps)
    # the decoder's prompt shapes and teacher forcing along the output read the same rows
    for split in (False, True):
        steps = list(greedy_steps(lm, prompt, 12, follow=out[:5], split_prompt=split))
        assert [t for _, t in steps][: len(out)] == out


def test_greedy_reference_stops_at_eos() -> None:
    lm = ContextLM()
    prompt = [USER, 12, 40, ASSISTANT]  # a "translation": two words, then EOS
    out, gaps = greedy_reference(lm, prompt, 10)
    assert len(out) == 2 and len(gaps) == 3
    # a followed token never ends the run, an argmax EOS does
    steps = list(greedy_steps(lm, prompt, 10, follow=[*out, EOS, 4]))
    assert [t for _, t in steps] == [*out, EOS, 4, EOS]


def test_ar_logit_gap_reads_the_reference_row() -> None:
    lm = ContextLM()
    prompt = [5, 9, 11, 4]
    ref, gaps = greedy_reference(lm, prompt, 10)
    for pos in (0, 3, len(ref) - 1):
        other = (ref[pos] + 1) % 64
        g = ar_logit_gap(lm, prompt, ref, pos, other)
        assert g["argmax"] == ref[pos] and g["rerun_matches_ref"] and g["ref_token"] == ref[pos]
        assert g["gap_top2"] == pytest.approx(gaps[pos]) and g["gap_pair"] >= g["gap_top2"]
        assert g["method_token"] == other and g["second"] != g["argmax"]
    # teacher forcing: along another output the row is that output's
    wrong = [*ref[:2], (ref[2] + 1) % 64, *ref[3:]]
    g = ar_logit_gap(lm, prompt, wrong, 3, None)
    assert g["argmax"] == reference_greedy([*prompt, *wrong[:3]], 1)[0]
    assert "gap_pair" not in g
