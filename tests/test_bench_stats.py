"""The benchmarks' paired statistics (``speclive_bench.stats``) on fixed numbers: percentiles of
every kind, the paired ratios and their seeded bootstrap intervals (pinned: a result file's
intervals must not move when the code around them does)."""

from __future__ import annotations

import numpy as np
import pytest

from speclive_bench.stats import (
    bootstrap,
    interval,
    paired_ratio,
    percentile,
    percentile_ci,
    percentile_ratio,
    ratio_of_sums,
)

BASE = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
NEW = [1.2, 1.8, 3.3, 4.4, 4.5, 6.6, 7.7, 7.2, 9.9, 12.0]


@pytest.mark.parametrize(
    ("q", "method", "expected"),
    [
        (50, "linear", 35.0),
        (50, "lower", 30.0),
        (50, "nearest", 30.0),  # rank 2.5: a tie goes to the even rank
        (50, "nearest-up", 40.0),  # ... or upwards
        (90, "linear", 55.0),
        (90, "lower", 50.0),
        (90, "nearest", 50.0),
        (90, "nearest-up", 60.0),
        (0, "linear", 10.0),
        (100, "nearest", 60.0),
    ],
)
def test_percentile_methods(q: float, method: str, expected: float) -> None:
    assert percentile([60, 10, 40, 20, 50, 30], q, method) == pytest.approx(expected)  # type: ignore[arg-type]


def test_percentile_skips_none_and_has_none_for_no_data() -> None:
    assert percentile([], 50) is None
    assert percentile([None, None], 90) is None
    assert percentile([None, 3.0, 1.0], 50) == 2.0
    assert percentile([7.0], 99, "nearest") == 7.0
    with pytest.raises(ValueError):
        percentile([1.0], 50, "mean")  # type: ignore[arg-type]


def test_paired_ratio_is_the_median_of_per_sample_ratios() -> None:
    r = paired_ratio([1, 2, 4, 8], [1, 1, 1, 1])  # ratios 1, 1/2, 1/4, 1/8
    assert r["median"] == pytest.approx(0.375) and r["n"] == 4
    assert r["geomean"] == pytest.approx(2**-1.5)
    assert 0.125 <= r["lo"] <= r["median"] <= r["hi"] <= 1.0
    assert "p90" not in r
    # samples without a positive baseline drop out; a constant ratio has no spread
    assert paired_ratio([0.0, 1.0], [5.0, 2.0]) == {
        "median": 2.0,
        "lo": 2.0,
        "hi": 2.0,
        "geomean": 2.0,
        "n": 1,
    }
    assert paired_ratio([0.0], [1.0]) == {"median": None, "lo": None, "hi": None, "geomean": None, "n": 0}
    assert paired_ratio([], [], p90=True)["p90"] is None


def test_paired_ratio_pinned() -> None:
    r = paired_ratio(BASE, NEW, p90=True)
    assert r == pytest.approx(
        {"median": 1.1, "lo": 0.9, "hi": 1.15, "geomean": 1.0539144149273876, "n": 10, "p90": 1.2}
    )


def test_percentile_ratio_and_ci_pinned() -> None:
    assert percentile_ratio(BASE, NEW, 50) == pytest.approx(
        (0.990990990990991, 0.9090909090909091, 1.1111111111111112)
    )
    assert percentile_ratio(BASE, NEW, 90) == pytest.approx(
        (0.9000989119683482, 0.8333333333333334, 1.103448275862069)
    )
    assert percentile_ratio([2, 2, 2], [1, 1, 1]) == (2.0, 2.0, 2.0)
    assert percentile_ratio([], []) == (None, None, None)
    assert percentile_ci(NEW, 50) == pytest.approx((5.55, 3.1, 8.25))
    assert percentile_ci([5, 5, 5], 90) == (5.0, 5.0, 5.0)
    assert percentile_ci([], 50) == (None, None, None)


def test_ratio_of_sums() -> None:
    # throughput 30 tok / 2 s over 20 tok / 4 s; per prompt the ratio is 2 or 4
    ratio, lo, hi = ratio_of_sums([10, 20], [1, 1], [10, 10], [2, 2])
    assert ratio == pytest.approx(3.0) and lo == pytest.approx(2.0) and hi == pytest.approx(4.0)
    assert ratio_of_sums(NEW, BASE, BASE, BASE) == pytest.approx(
        (1.0654545454545454, 0.9849025840853158, 1.130912225705329)
    )


def test_bootstrap_is_paired_and_seeded() -> None:
    a = np.arange(1.0, 11.0)
    # rows stay together: a - a is 0 in every resample, a + a twice a's mean
    assert np.all(bootstrap(lambda x, y: (x - y).sum(1), a, a) == 0)
    sims = bootstrap(lambda x: x.mean(1), a, n=500, seed=3)
    assert sims.shape == (500,)
    assert np.array_equal(sims, bootstrap(lambda x: x.mean(1), a, n=500, seed=3))
    assert not np.array_equal(sims, bootstrap(lambda x: x.mean(1), a, n=500, seed=4))
    lo, hi = interval(sims)
    assert 1.0 <= lo < a.mean() < hi <= 10.0
