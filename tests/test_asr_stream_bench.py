"""``bench asr --stream`` and the live bench's ASR variants: statistics and tables on made-up
runs (no model)."""

from __future__ import annotations

import pytest

from speclive.errors import ConfigError
from speclive_bench import asr_stream
from speclive_bench.live import _asr_variant
from speclive_bench.stats import paired_ratio


def _run(passes: list[tuple[str, int, str]], latency: float, cpu: float) -> dict:
    return {
        "text": passes[-1][2],
        "final_latency_s": latency,
        "cpu_s": cpu,
        "wall_s": cpu / 2,
        "passes": [
            {
                "kind": k,
                "decoder_passes": n,
                "tokens": 5,
                "decoder_ms": 10.0 * n,
                "encoder_ms": 50.0,
                "text": t,
            }
            for k, n, t in passes
        ],
        "identical_passes": len(passes),
        "compared_passes": len(passes),
    }


def _rows() -> list[dict]:
    rows = []
    for i in range(6):
        ar = _run([("partial", 10, "a b"), ("final", 12, "a b c")], 0.5 + 0.01 * i, 4.0)
        prev = _run([("partial", 3, "a b"), ("final", 2, "a b c")], 0.2, 2.0)
        rows.append(
            {"clip": f"c{i}", "audio_s": 5.0 + i, "reference": "a b c", "runs": {"ar": ar, "previous": prev}}
        )
    return rows


def test_summary_pairs_per_turn_ratios():
    s = {r["method"]: r for r in asr_stream.summarize(_rows(), ["ar", "previous"])}
    p = s["previous"]
    assert p["partial_passes_vs_ar"]["median"] == pytest.approx(0.3)
    assert p["cpu_vs_ar"]["median"] == pytest.approx(0.5) and p["cpu_vs_ar"]["geomean"] == pytest.approx(0.5)
    assert p["final_p50_ms"] == pytest.approx(200) and p["turns_le10s"] == 6
    assert p["partial_wer"] == 0.0 and p["final_wer"] == 0.0
    assert p["identical"] == p["compared"] == 12
    md = asr_stream.markdown({"summary": list(s.values()), "header": {}})
    assert "| previous |" in md and "0.30 [0.30, 0.30]" in md


def test_paired_ratio_interval_holds_the_median():
    r = paired_ratio([1, 2, 4, 8], [1, 1, 1, 1])
    assert r["lo"] <= r["median"] <= r["hi"] and r["n"] == 4
    assert paired_ratio([0.0], [1.0])["median"] is None


def test_method_selection_adds_its_references():
    assert asr_stream.with_references(["previous"]) == ["ar", "previous"]
    assert asr_stream.with_references(["draft-partials"]) == ["ar", "draft-partials/plain", "draft-partials"]
    assert asr_stream.with_references([]) == list(asr_stream.METHODS)
    with pytest.raises(ConfigError):
        asr_stream.with_references(["beam"])


def test_live_bench_asr_variants():
    assert _asr_variant("predgen") == ("predgen", {})
    assert _asr_variant("predgen:topk:3/no-stream-draft") == ("predgen:topk:3", {"stream_draft": False})
    assert _asr_variant("cascade/draft-partials") == ("cascade", {"stream_partials": "draft"})
    with pytest.raises(ValueError):
        _asr_variant("predgen/fast")
