"""``speclive bench``: bound arithmetic, report writers, and small end-to-end runs on SmolLM2.

The end-to-end tests run the real CLI entry points on SmolLM2-135M with llama.cpp (1 prompt per
set, 16 tokens, methods ar + ngram + llama-cpp-python) and check that valid JSON, Markdown and
PNG files with the expected keys are written. They are skipped when llama-cpp-python or the
SmolLM2 registry model is not installed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from speclive.cli import main
from speclive.errors import ConfigError
from speclive_bench import report
from speclive_bench.cli import add_bench_parser
from speclive_bench.costcurve import CostCurve, alpha_bound, alpha_hat, trace_bound
from speclive_bench.decode import summarize, write_decode_outputs
from speclive_bench.exactness import first_divergence
from speclive_bench.peers import strip_eos

SMOL = "smollm2-135m-instruct"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speclive")
    add_bench_parser(p.add_subparsers(dest="command", required=True))
    return p


def _run_cli(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return int(args.func(args) or 0)


def _need_smollm2() -> None:
    pytest.importorskip("llama_cpp")
    try:
        from speclive.models.resolve import resolve

        ref = resolve(SMOL, install_missing=False)
    except Exception:  # noqa: BLE001 - not installed
        pytest.skip(f"{SMOL} is not installed")
    if ref.gguf is None or not ref.gguf.is_file():
        pytest.skip(f"{SMOL} has no GGUF file")


# ------------------------------------------------------------------------------------ pure parts
def test_cost_curve_interpolates_and_extrapolates() -> None:
    c = CostCurve({1: 1.0, 2: 1.5, 4: 2.5})
    assert c(1) == 1.0
    assert c(3) == pytest.approx(2.0)
    assert c(6) == pytest.approx(3.5)  # slope of the last segment
    assert c(0.5) == 1.0


def test_bounds() -> None:
    flat = CostCurve({1: 1.0, 64: 1.0})
    s, k = alpha_bound(1.0, flat, 8)
    assert (s, k) == (pytest.approx(9.0), 8)
    s0, k0 = alpha_bound(0.0, CostCurve({1: 1.0, 2: 1.6}), 8)
    assert (s0, k0) == (pytest.approx(1.0), 0)
    linear = CostCurve({1: 1.0, 2: 2.0, 32: 32.0})
    assert alpha_bound(0.9, linear, 16)[0] == pytest.approx(1.0)  # nothing beats AR at linear cost
    # two steps drafting 3, accepting 3 and 1: 6 tokens for 2 * r(4)
    assert trace_bound([[3, 3], [3, 1]], CostCurve({1: 1.0, 4: 2.0})) == pytest.approx(6 / 4)
    assert trace_bound([], flat) is None
    assert alpha_hat([[3, 3], [3, 1], [0, 0]]) == pytest.approx(4 / 5)
    assert alpha_hat([[0, 0]]) is None


def test_first_divergence_and_strip_eos() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert strip_eos([5, 6, 2, 7], {2}, 10) == ([5, 6], "eos")
    assert strip_eos([5, 6, 7], {2}, 2) == ([5, 6], "length")


def _rec(method: str, pid: str, tokens: list[int], wall: float, **kw: object) -> dict:
    r = {
        "set": "s",
        "prompt_id": pid,
        "method": method,
        "backend": "llamacpp",
        "key": f"{method}@llamacpp",
        "label": method,
        "token_ids": tokens,
        "new_tokens": len(tokens),
        "wall_s": wall,
        "decode_s": wall / 2,
        "target_forwards": len(tokens),
    }
    r.update(kw)
    return r


def test_summarize_and_writers(tmp_path: Path) -> None:
    records = [
        _rec("ar", "p1", [1, 2, 3, 4], 2.0),
        _rec("ar", "p2", [1, 2], 1.0),
        _rec(
            "ngram",
            "p1",
            [1, 2, 3, 4],
            1.0,
            target_forwards=2,
            drafted=4,
            accepted=2,
            steps=[[2, 2], [2, 0]],
            identical=True,
        ),
        _rec(
            "ngram",
            "p2",
            [1, 3],
            1.0,
            drafted=0,
            accepted=0,
            steps=[[0, 0], [0, 0]],
            identical=False,
            first_divergence=1,
            divergence={"verdict": "near-tie", "gap_top2": 0.1},
        ),
    ]
    curves = {"llamacpp": {"model": "m", "prefix": 8, "ratios": {1: 1.0, 2: 1.5, 4: 2.0}, "rows": []}}
    rows, ceilings = summarize(records, curves)
    by = {r["method"]: r for r in rows}
    assert by["ar"]["speedup"] == pytest.approx(1.0)
    assert by["ngram"]["speedup"] == pytest.approx((6 / 2.0) / (6 / 3.0))
    # per prompt: 2x on p1, 1x on p2 (the summed ratio above weighs p1's longer time more)
    paired = by["ngram"]["decode_speedup_paired"]
    assert paired["median"] == pytest.approx(1.5) and paired["geomean"] == pytest.approx(2**0.5)
    assert paired["n"] == 2 and by["ngram"]["speedup_paired"]["median"] == pytest.approx(1.5)
    assert by["ngram"]["identical"] == 1 and by["ngram"]["near_tie"] == 1 and by["ngram"]["bugs"] == 0
    assert by["ngram"]["acceptance_rate"] == pytest.approx(0.5)
    assert by["ngram"]["bound_trace"] is not None and by["ngram"]["efficiency"] is not None
    assert ceilings["llamacpp"]["k"] == 3
    result = {
        "header": {
            "tag": "unit",
            "target": "m",
            "backends": ["llamacpp"],
            "command": "speclive bench decode",
        },
        "summary": rows,
        "ceilings": ceilings,
        "divergences": [],
        "bugs": [],
        "cost_curves": curves,
        "records": records,
        "notes": [],
    }
    paths = write_decode_outputs(result, tmp_path, "unit")
    assert json.loads(paths["json"].read_text())["summary"][0]["method"] == "ar"
    md = paths["md"].read_text()
    assert "## s" in md and "| ngram |" in md and "speclive bench decode" in md
    assert "| 1.50 [1.00, 2.00] (gm 1.41) |" in md  # the per-prompt ratio with its interval
    assert paths["png"].read_bytes()[:8] == PNG_MAGIC


def test_all_small_preset_parses() -> None:
    args = _parser().parse_args(["bench", "all-small", "--out", "x"])
    assert args.func.__name__ == "cmd_all_small"
    args = _parser().parse_args(
        ["bench", "decode", "--sets", "mtbench", "--methods", "ar,ngram", "--limit", "3"]
    )
    assert args.sets == ["mtbench"] and args.methods == ["ar", "ngram"] and args.limit == 3


def test_machine_info() -> None:
    info = report.machine_info()
    assert info["cores"] and info["cpu"]
    assert report.header_lines({"machine": info})[0].startswith("machine:")


def test_cpu_detail_tells_host_generations_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from speclive import sysinfo

    block = (
        "processor\t: {i}\ncpu family\t: 25\nmodel\t\t: {m}\nmodel name\t: AMD EPYC\nflags\t\t: fpu {f}\n\n"
    )
    zen4 = tmp_path / "zen4"
    zen4.write_text(block.format(i=0, m=17, f="avx avx2 avx512f") + block.format(i=1, m=99, f="avx"))
    zen3 = tmp_path / "zen3"
    zen3.write_text(block.format(i=0, m=1, f="avx avx2"))
    real_path = sysinfo.Path
    # /proc/cpuinfo is read once per process: this test reads two machines, then the real one
    # is read again by the tests after it
    try:
        monkeypatch.setattr(sysinfo, "Path", lambda p: zen4 if p == "/proc/cpuinfo" else real_path(p))
        sysinfo._cpuinfo.cache_clear()
        assert sysinfo.cpu_detail() == "family 25 model 17, avx512f"  # the first processor's block
        monkeypatch.setattr(sysinfo, "Path", lambda p: zen3 if p == "/proc/cpuinfo" else real_path(p))
        sysinfo._cpuinfo.cache_clear()
        assert sysinfo.cpu_detail() == "family 25 model 1, avx2"
    finally:
        sysinfo._cpuinfo.cache_clear()
    header = {"machine": {"cpu": "AMD EPYC", "cpu_detail": "family 25 model 1, avx2", "cores": 2}}
    assert report.header_lines(header)[0].startswith("machine: AMD EPYC (family 25 model 1, avx2) | 2 cores")


# ------------------------------------------------------------------------------------ end to end
@pytest.mark.llamacpp
def test_decode_bench_end_to_end(tmp_path: Path) -> None:
    _need_smollm2()
    argv = [
        "bench",
        "decode",
        "--target",
        SMOL,
        "--backend",
        "llamacpp",
        "--sets",
        "code-edit,mtbench",
        "--limit",
        "1",
        "--max-tokens",
        "16",
        "--methods",
        "ar,ngram,llama-cpp-python",
        "--out",
        str(tmp_path),
        "--tag",
        "t",
        "--curve-ks",
        "1,2,4",
        "--curve-repeats",
        "1",
        "--no-progress",
    ]
    rc = _run_cli(argv)
    data = json.loads((tmp_path / "decode-t.json").read_text())
    # a divergence from AR at a clear logit gap is a bug (the bench exits 1): never accepted
    assert data["bugs"] == [] and rc == 0
    assert set(data) >= {"header", "summary", "records", "divergences", "bugs", "cost_curves", "ceilings"}
    assert data["header"]["machine"]["cores"]
    assert data["header"]["command"].startswith("speclive bench decode")
    assert data["header"]["methods"] == ["ar@llamacpp", "ngram@llamacpp", "llama-cpp-python@llamacpp"]
    rows = data["summary"]
    assert {(r["set"], r["method"]) for r in rows} == {
        (s, m) for s in ("code-edit", "mtbench") for m in ("ar", "ngram", "llama-cpp-python")
    }
    for r in rows:
        assert r["errors"] == 0 and r["prompts"] == 1
        assert r["new_tokens"] > 0 and r["e2e_tps"] > 0 and r["speedup"] > 0
        if r["method"] != "ar":
            assert r["compared"] == 1
            # identical, or a flip at a near-tie that the gap check classified
            assert r["bugs"] == 0 and r["unknown_divergences"] == 0
            assert r["identical"] + r["near_tie"] == 1
    assert len(data["records"]) == 6
    assert all(len(r["token_ids"]) <= 16 for r in data["records"])
    assert data["cost_curves"]["llamacpp"]["ratios"]["1"] == pytest.approx(1.0)
    md = (tmp_path / "decode-t.md").read_text()
    assert "## code-edit" in md and "## mtbench" in md and "llama-cpp-python" in md
    assert (tmp_path / "decode-t.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.llamacpp
def test_costcurve_writes_files(tmp_path: Path) -> None:
    _need_smollm2()
    rc = _run_cli(
        [
            "bench",
            "costcurve",
            "--model",
            SMOL,
            "--backend",
            "llamacpp",
            "--ks",
            "1,2,4",
            "--repeats",
            "2",
            "--prefix",
            "64",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    stem = tmp_path / f"costcurve-{SMOL}-llamacpp"
    data = json.loads(stem.with_suffix(".json").read_text())
    assert [r["k"] for r in data["rows"]] == [1, 2, 4]
    assert all(r["ms"] > 0 and len(r["samples_ms"]) == 2 for r in data["rows"])
    assert data["rows"][0]["ratio"] == pytest.approx(1.0)
    assert "t(k)/t(1)" in stem.with_suffix(".md").read_text()
    assert stem.with_suffix(".png").read_bytes()[:8] == PNG_MAGIC


def test_replicas_and_hybrid_against_best_single() -> None:
    """``NAME#TAG`` runs the same method again (an A/A control); the hybrid is judged against
    the best single drafter per set with a bootstrap interval over prompts."""
    import numpy as np

    from speclive_bench.methods import method_base
    from speclive_bench.talon import hybrid_vs_best, talon_markdown

    assert method_base("suffix#2") == "suffix" and method_base("hybrid") == "hybrid"
    rng = np.random.default_rng(1)
    recs = []
    # per method: throughput factor vs AR on set "a" and set "b"
    speed = {
        "ar": (1.0, 1.0),
        "ngram": (1.10, 1.0),
        "suffix": (1.20, 1.02),
        "suffix#2": (1.20, 1.02),
        "hybrid": (1.30, 0.90),
    }
    for s_i, s in enumerate(("a", "b")):
        for p in range(12):
            base_wall = 4.0 + p % 3
            for m, f in speed.items():
                wall = base_wall / f[s_i] * (1 + 0.005 * rng.standard_normal())
                recs.append(
                    {
                        "set": s,
                        "prompt_id": f"p{p}",
                        "label": m,
                        "token_ids": [1] * 96,
                        "new_tokens": 96,
                        "wall_s": wall,
                    }
                )
    hv = hybrid_vs_best(recs, n_boot=500)
    a, b = hv["a"], hv["b"]
    assert a["best_single"] == "suffix" and b["best_single"] == "suffix"
    assert a["hybrid_vs_best"]["verdict"] == "faster" and abs(a["hybrid_vs_best"]["ratio"] - 1.3 / 1.2) < 0.01
    c = b["hybrid_vs_best"]
    assert c["verdict"] == "slower" and c["lo"] <= c["ratio"] <= c["hi"] < 1.0
    rep = a["replicas"][0]
    assert (rep["a"], rep["b"]) == ("suffix#2", "suffix") and rep["lo"] < 1.0 < rep["hi"]
    result = {"header": {"target": "t", "backends": ["llamacpp"]}, "summary": [], "hybrid_vs_best": hv}
    from unittest import mock

    with mock.patch("speclive_bench.report.markdown_preamble", return_value=[]):
        md = talon_markdown(result)
    assert "| b | suffix |" in md and "slower" in md and "suffix#2 / suffix" in md


def test_results_get_provenance_and_a_dirty_tree_may_not_write_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "benchmarks" / "results"
    other = tmp_path / "elsewhere"
    data = {"header": {"command": "speclive bench x"}, "rows": [1]}
    report.write_json(results / "x.json", data)
    report.write_json(other / "x.json", data)
    got = json.loads((results / "x.json").read_text())
    prov = got["provenance"]
    assert prov["command"] == "speclive bench x"
    assert set(prov) >= {"commit", "clean", "cpu", "kernel", "created"}
    assert "provenance" not in json.loads((other / "x.json").read_text())  # scratch output stays as it is
    kept = {"provenance": {"commit": "abc"}, "rows": []}
    report.write_json(results / "y.json", kept)
    assert json.loads((results / "y.json").read_text())["provenance"] == {"commit": "abc"}
    monkeypatch.setattr(report, "git_state", lambda *a, **k: ("abc123+dirty", True))
    with pytest.raises(ConfigError, match="uncommitted"):
        report.refuse_dirty_results(results)
    report.refuse_dirty_results(other)  # anywhere else is fine
    assert main(["bench", "turns", "--stage", "signals", "--out", str(results)]) == 2
    monkeypatch.setattr(report, "git_state", lambda *a, **k: ("abc123", False))
    report.refuse_dirty_results(results)
