"""The generated tables (``speclive bench tables``): the committed blocks in README.md and
benchmarks/README.md are what the result files give, every result file a doc cites exists, the
status column holds one of three words, and only a clean provenance makes a result current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speclive_bench import tables
from speclive_bench.tables import STATUSES, TableError, block, check, check_links, extract, figure

ROOT = Path(__file__).resolve().parents[1]


def test_committed_tables_come_from_the_result_files() -> None:
    """``speclive bench tables --check`` on the checkout: no stale block, no missing file."""
    assert check(ROOT) == []
    assert tables.main(["--check", "--root", str(ROOT)]) == 0


def test_status_column_and_the_files_it_cites() -> None:
    status = block((ROOT / "README.md").read_text(), "status").strip().splitlines()
    assert status[0].startswith("| feature | target | status |")
    rows = [line.split(" | ") for line in status[2:]]
    assert rows and all(r[2] in STATUSES for r in rows)
    for r in rows:
        cited = [p for p in r[3].split("`") if p.startswith("benchmarks/results/")]
        assert cited, r
        assert all((ROOT / p).is_file() for p in cited)
        # a current figure cites a current file, "no current figure" only archived ones
        assert all(("/archive/" in p) == (r[2] == STATUSES[2]) for p in cited if "history" not in r[3])


def test_only_a_clean_provenance_is_current() -> None:
    assert tables.unprovenanced(ROOT) == []
    archived = tables.results(ROOT / tables.RESULTS / "archive")
    assert archived and not any(r.current for r in archived.values())


def test_figure_paths() -> None:
    doc = {"summary": [{"set": "a", "m": "x b=0.2", "v": 1}, {"set": "b", "m": "x b=0.2", "v": [5, 6]}]}
    assert extract(doc, "summary[set=a,m=x b=0.2].v") == 1
    assert extract(doc, "summary[set=b].v.1") == 6
    with pytest.raises(TableError):
        extract(doc, "summary[set=c].v")


def test_a_figure_writes_its_interval_from_the_same_file() -> None:
    doc = {"summary": [{"m": "a", "r": 0.44, "lo": 0.4, "hi": 0.57}]}
    spec = {
        "figure": "summary[m=a].r",
        "format": "{:.2f}×",
        "also": [
            {"figure": "summary[m=a].lo", "format": " (95 % CI {:.2f}"},
            {"figure": "summary[m=a].hi", "format": "–{:.2f})"},
        ],
    }
    assert figure(doc, spec) == (0.44, "0.44× (95 % CI 0.40–0.57)")
    with pytest.raises(TableError):  # a figure the file lacks is an error
        figure(doc, {**spec, "also": [{"figure": "summary[m=a].p90"}]})


def test_a_lossy_figure_shows_its_quality_beside_it() -> None:
    doc = {"summary": [{"m": "topk", "speedup": 2.5, "identical": 8, "n": 80}]}
    spec = {
        "figure": "summary[m=topk].speedup",
        "format": "{:.1f}×",
        "quality": [{"figure": "summary[m=topk].identical", "format": "{} identical"}],
    }
    assert figure(doc, spec) == (2.5, "2.5× (quality: 8 identical)")
    with pytest.raises(TableError):  # a quality the file lacks is an error, as any figure
        figure(doc, {**spec, "quality": [{"figure": "summary[m=topk].chrf"}]})


def _tree(tmp_path: Path, clean: bool) -> Path:
    """A small checkout: one result, one archived result, a spec and the two READMEs."""
    res = tmp_path / "benchmarks" / "results"
    (res / "archive").mkdir(parents=True)
    prov = {"commit": "a" * 40, "clean": clean, "cpu": {"name": "CPU", "detail": "avx2"}}
    prov |= {"kernel": "6.1", "command": "speclive bench soak", "created": "now"}
    (res / "soak-x.json").write_text(json.dumps({"provenance": prov, "summary": {"errors": 2}}))
    (res / "archive" / "soak-old.json").write_text(json.dumps({"summary": {"errors": 0}}))
    (res / "archive" / "README.md").write_text("# archived\n")
    (tmp_path / "benchmarks" / "tables.toml").write_text(
        '[[status]]\nfeature = "f"\ntarget = "t"\nfile = "soak-x.json"\nfigure = "summary.errors"\n'
        'format = "{} errors"\nat_most = 0\n[[status.history]]\nfile = "archive/soak-old.json"\n'
        'figure = "summary.errors"\n'
    )
    (tmp_path / "README.md").write_text("<!-- tables:begin status -->\n<!-- tables:end status -->\n")
    (tmp_path / "benchmarks" / "README.md").write_text(
        "`soak-x.json` `results/archive/soak-old.json` `soak-gone.md` archive/nothing.json\n"
        "<!-- tables:begin current -->\n<!-- tables:end current -->\n"
        "<!-- tables:begin archived -->\n<!-- tables:end archived -->\n"
    )
    return tmp_path


def test_generate_then_check(tmp_path: Path) -> None:
    root = _tree(tmp_path, clean=True)
    assert tables.unprovenanced(root) == []
    assert any("differs" in p for p in check(root))
    assert tables.main(["--root", str(root)]) == 0
    status = block((root / "README.md").read_text(), "status")
    assert "| f | t | target missed | 2 errors (`benchmarks/results/soak-x.json`); history: 0 " in status
    assert "archive/soak-old.json" in block((root / "benchmarks/README.md").read_text(), "archived")
    assert sorted(check_links(root)) == [
        "benchmarks/README.md:1: archive/nothing.json",
        "benchmarks/README.md:1: soak-gone.md",
    ]


def test_a_two_part_target_is_met_only_when_both_parts_are(tmp_path: Path) -> None:
    """Throughput met but p99 worse: "target missed"."""
    root = _tree(tmp_path, clean=True)
    res = root / "benchmarks" / "results" / "soak-x.json"
    doc = json.loads(res.read_text())
    res.write_text(json.dumps(doc | {"summary": {"errors": 0, "ratio": 1.04, "p99_ratio": 0.64}}))
    spec = root / "benchmarks" / "tables.toml"
    row = (
        '[[status]]\nfeature = "f"\ntarget = "t"\nfile = "soak-x.json"\nfigure = "summary.ratio"\n'
        'at_least = 1.0\nrequire = [{{ figure = "summary.p99_ratio", at_least = {} }}]\n'
    )
    for bound, word in ((1.0, "target missed"), (0.6, "target met")):
        spec.write_text(row.format(bound))
        assert tables.main(["--root", str(root)]) == 0
        assert f"| f | t | {word} | 1.04 (" in block((root / "README.md").read_text(), "status")


def test_a_dirty_result_is_no_current_figure(tmp_path: Path) -> None:
    root = _tree(tmp_path, clean=False)
    assert tables.unprovenanced(root) == [
        "benchmarks/results/soak-x.json: not from a clean tree "
        "(re-run it from a clean tree, or move it to archive/)"
    ]
    (root / "benchmarks/results/notes.md").write_text("# a report without provenance\n")
    assert "benchmarks/results/notes.md: no commit, clean, kernel, command, created, cpu or gpu" in " ".join(
        tables.unprovenanced(root)
    )
    with pytest.raises(TableError, match="not a current result"):
        tables.blocks(root)
    assert tables.main(["--root", str(root)]) == 2


def test_a_scripts_provenance_line_is_what_the_tables_read() -> None:
    """Standalone benchmark scripts write ``report.provenance_line``; a report without a JSON
    beside it is current only if ``bench tables`` parses that line back."""
    from speclive_bench.report import provenance_line

    prov = {
        "commit": "a" * 40,
        "clean": True,
        "cpu": {"name": "AMD EPYC", "detail": "family 25 model 1, avx2"},
        "kernel": "6.1.0",
        "created": "2026-11-27T10:00:00+00:00",
    }
    m = tables._MD_PROVENANCE.search(provenance_line(prov))
    assert m is not None
    assert (m["commit"], m["clean"], m["kernel"]) == ("a" * 40, "True", "6.1.0")
    assert m["cpu"] == "AMD EPYC (family 25 model 1, avx2)"
    assert provenance_line(prov, "; load 0.1").endswith("+00:00; load 0.1")


def test_the_host_class_comes_from_the_provenance() -> None:
    amd = {"cpu": {"name": "AMD EPYC", "detail": "family 25 model 1, avx2"}, "gpu": None}
    xeon = {"cpu": {"name": "Intel(R) Xeon(R) Processor", "detail": "family 6 model 167, avx512f"}}
    assert tables.host_class(amd) == "AVX2 (AMD EPYC)"
    assert tables.host_class(xeon) == "AVX-512 (Intel Xeon)"
    assert tables.host_class({"gpu": "NVIDIA H200", "cpu": amd["cpu"]}) == "NVIDIA H200"
    assert tables.host_class({"cpu": {"name": "Some CPU", "detail": ""}}) == "Some"
