"""``benchmarks/predgen_judge.py``: scores paired by question, agreement, the report."""

from __future__ import annotations

import pytest
from bench_scripts import load_benchmark_script


@pytest.fixture(scope="module")
def pj():
    return load_benchmark_script("predgen_judge")


def test_paired_difference_interval(pj):
    same = pj.paired_difference([5, 6, 7], [5, 6, 7])
    assert same == {"mean": 0.0, "lo": 0.0, "hi": 0.0}
    d = pj.paired_difference([8, 9, 7, 8], [6, 7, 5, 6])  # always +2
    assert d["mean"] == d["lo"] == d["hi"] == 2.0
    noisy = pj.paired_difference([9, 1, 8, 2, 7], [5, 5, 5, 5, 5])
    assert noisy["lo"] < noisy["mean"] < noisy["hi"]


def test_summary_pairs_by_question_and_counts_unscored(pj):
    recs = [
        {"id": 1, "method": "baseline", "score": 6.0, "identical": True},
        {"id": 2, "method": "baseline", "score": 8.0, "identical": True},
        {"id": 1, "method": "topk:3", "score": 5.0, "identical": False, "forced": True},
        {"id": 2, "method": "topk:3", "score": None, "identical": True},
    ]
    rows = {r["method"]: r for r in pj.summarize(recs, ["baseline", "topk:3"])}
    assert rows["baseline"]["mean_score"] == 7.0 and "vs_baseline" not in rows["baseline"]
    t = rows["topk:3"]
    assert (t["answers"], t["scored"], t["identical_to_baseline"], t["forced"]) == (2, 1, 1, 1)
    assert t["vs_baseline"]["mean"] == -1.0  # only question 1 has both scores
    result = {
        "header": {
            "source": "x.json",
            "source_command": "speclive bench predgen",
            "judge": "j",
            "backend": "llamacpp",
            "questions": 2,
            "ids": [1, 2],
            "machine": {},
            "command": "python benchmarks/predgen_judge.py x.json",
        },
        "summary": pj.summarize(recs, ["baseline", "topk:3"]),
    }
    md = pj.markdown(result)
    assert "| topk:3 | 2 | 5.00 | -1.00 [-1.00, -1.00] | 1 | 1 | 1 |" in md


def test_judge_asks_for_the_rating_when_the_reply_has_none():
    """A real (small) judge cut off after 8 tokens has written no ``[[rating]]``: the judge is
    then asked to complete ``Rating: [[`` after its own words, and a 1-10 score comes back."""
    from speclive_bench.predgen import Judge, _parse_rating

    judge = Judge("smollm2-135m-instruct", "llamacpp", max_tokens=8)
    out = judge.judge("What is the capital of France?", "The capital of France is Paris.")
    assert out["forced"] is True
    assert "Rating: [[" in out["judgment"]
    assert out["score"] is not None and 1.0 <= out["score"] <= 10.0
    assert _parse_rating("Fine answer. Rating: [[7]]") == 7.0
    assert _parse_rating("Rating: 12") == 10.0 and _parse_rating("no verdict") is None
