"""``benchmarks/copy_bound.py``: the copy oracle's runs and its cheapest draft lengths."""

from __future__ import annotations

from bench_scripts import load_benchmark_script

cb = load_benchmark_script("copy_bound")
#: drafts of up to this many tokens: the curves below are given up to passes of 65
LONGEST = 64


def test_copy_runs_are_the_longest_verbatim_prefix_found_in_the_context():
    # the context grows by the output: at position 3, "1 2" is in the prompt, "2" later too
    assert cb.copy_runs([1, 2, 3, 4], [2, 3, 9, 1, 2]) == [2, 1, 0, 2, 1]
    assert cb.copy_runs([5], [7, 7, 7]) == [0, 1, 1]  # the output's own repetition counts


def test_the_oracle_drafts_the_cheapest_lengths_on_the_cost_curve():
    flat = [0.0] + [1.0] * (LONGEST + 1)  # every pass costs one step, whatever it verifies
    # 6 tokens; a 5-token copy at the start: one pass takes 6 tokens
    assert cb.copy_oracle_cost([5, 0, 0, 0, 0, 0], flat) == 1.0
    assert cb.copy_oracle_cost([0] * 6, flat) == 6.0  # nothing to copy: one token a pass
    # verification as dear as decoding (t(n) = n): drafting gains nothing
    linear = [float(n) for n in range(LONGEST + 2)]
    assert cb.copy_oracle_cost([5, 4, 3, 2, 1, 0], linear) == 6.0
    # copies shorter than min_run are not drafted
    assert cb.copy_oracle_cost([1, 0, 1, 0], flat, min_run=2) == 4.0
    assert cb.copy_oracle_cost([1, 0, 1, 0], flat) == 2.0


def test_curve_interpolates_between_the_measured_rows():
    t = cb.curve([{"k": 1, "ms": 10.0}, {"k": 3, "ms": 20.0}])
    assert t == [0.0, 1.0, 1.5, 2.0]  # up to the longest measured pass, no further


def test_a_perfect_free_draft_model_takes_the_longest_draft():
    flat = [0.0] + [1.0] * (LONGEST + 1)
    assert cb.model_draft_bound(flat, 0.0, 1.0) == (LONGEST + 1, LONGEST)
    linear = [float(n) for n in range(LONGEST + 2)]
    assert cb.model_draft_bound(linear, 0.1, 0.9) == (1.0, 0)  # never pays: plain decoding
