"""``bench live``'s voice-chat summary on made-up records (the benchmark itself runs minutes)."""

from __future__ import annotations

import pytest

from speclive_bench.live import BASELINES, chat_markdown, summarize_chat

METHODS = ("predgen", *BASELINES)
#: latency per method (seconds) on every sample; predgen's end-of-turn delay is 0.5 s
LATENCY = {"predgen": 0.8, "cascade": 2.0, "prefill": 1.2, "preemptive": 1.0}


def _records(n: int = 6) -> list[dict]:
    out = []
    for i in range(n):
        for m in METHODS:
            eot = 0.5 if m == "predgen" else 0.45
            out.append(
                {
                    "id": i,
                    "voice": "piper",
                    "method": m,
                    "latency_s": LATENCY[m] + 0.01 * i,
                    "eot_delay_s": eot,
                    "audio_ready_at_eot": m == "predgen" and i % 2 == 0,
                    "max_lag_s": 0.1,
                    "wer": 0.0,
                }
            )
    return out


def test_ratios_and_their_ceilings_are_paired_over_the_samples():
    rows = {r["method"]: r for r in summarize_chat(_records(), METHODS)}
    pg = rows["predgen"]
    assert pg["ready_at_eot"] == 0.5
    # ratio = baseline median / predgen median (the medians of 0.8..0.85 and 2.0..2.05)
    assert pg["vs_cascade_median"][0] == pytest.approx(2.025 / 0.825)
    # ceiling = baseline median / predgen's own end-of-turn delay (0.5 s on every sample)
    assert pg["ceiling_vs_cascade_median"][0] == pytest.approx(2.025 / 0.5)
    assert pg["ceiling_vs_prefill_median"][0] == pytest.approx(1.225 / 0.5)
    assert pg["ceiling_vs_preemptive_median"][0] == pytest.approx(1.025 / 0.5)
    # a ratio never exceeds its ceiling, since no answer plays before the end of turn
    for b in BASELINES:
        assert pg[f"vs_{b}_median"][0] <= pg[f"ceiling_vs_{b}_median"][0]
    # the baselines get ratios against each other, but no ceiling
    assert "vs_cascade_median" in rows["prefill"] and "ceiling_vs_cascade_median" not in rows["prefill"]


def test_the_markdown_shows_the_ceilings():
    summary = summarize_chat(_records(), METHODS)
    result = {"header": {"command": "speclive bench live ..."}, "summary": summary}
    md = chat_markdown(result)
    assert "| predgen | 4.05× [" in md  # the ceiling vs cascade, with its interval
    assert md.count("| predgen |") == 3  # latency, ratios, ceilings


def test_the_house_ratio_is_the_median_of_per_sample_ratios():
    """``vs_<baseline>``: per sample baseline / method, its median, interval, geomean and p90;
    it differs from the ratio of medians when the samples differ in how they gain."""
    recs = _records(5)
    # predgen gains 4x on one sample and nothing on the others: per sample the median is 1.0
    for r in recs:
        if r["method"] == "cascade":
            r["latency_s"] = 1.0
        if r["method"] == "predgen":
            r["latency_s"] = 0.25 if r["id"] == 0 else 1.0
    pg = {r["method"]: r for r in summarize_chat(recs, METHODS)}["predgen"]
    v = pg["vs_cascade"]
    assert v["median"] == pytest.approx(1.0) and v["n"] == 5
    assert v["geomean"] == pytest.approx(4 ** (1 / 5)) and v["p90"] > 2.0
    assert v["lo"] <= v["median"] <= v["hi"]
    md = chat_markdown({"header": {"command": "x"}, "summary": [pg]})
    assert "| predgen | 1.00 [" in md and "(gm 1.32)" in md
