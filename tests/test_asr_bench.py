"""``speclive bench asr`` pieces that need no model run: normalization, recycling alignment, reports."""

from __future__ import annotations

import numpy as np
import pytest
from asr_fixtures import tiny

from speclive.drafting.specasr import SpecASRConfig, SpecASRDrafter, _top2
from speclive_bench.asr import COLUMNS, _norm, default_variants, markdown, plot


def test_wer_normalization():
    assert _norm("He was not an ill-disposed young man.") == "he was not an ill disposed young man"
    assert _norm("  Mr. John's  dog!") == "mr john's dog"


def test_top2_is_the_normalized_softmax_top_two():
    rng = np.random.default_rng(0)
    z = rng.normal(size=51865).astype(np.float32) * 3
    z[rng.integers(0, 51865, 500)] = -np.inf
    p = np.exp(z.astype(np.float64) - z.max())
    p /= p.sum()
    order = np.argsort(-p)
    i1, p1, i2, p2 = _top2(z)
    assert (i1, i2) == (order[0], order[1])
    assert abs(p1 - p[order[0]]) < 1e-6 and abs(p2 - p[order[1]]) < 1e-6


def test_recycling_aligns_the_rejected_draft():
    d = SpecASRDrafter(tiny().shallow(1), SpecASRConfig(recycle=True))
    d._last, d._last_probs = [1, 2, 3, 10, 11, 12, 13], [0.9, 0.8, 0.7, 0.6]
    # 10 accepted, the bonus 99 replaced 11: the old rest after it is 12, 13
    assert d._old_rest([1, 2, 3, 10, 99]) == ([12, 13], [0.7, 0.6])
    assert d._old_rest([1, 2, 3, 10, 11, 12, 13, 5]) == ([], [])  # all accepted: nothing left
    assert d._match(12, 1, [12, 13]) == 0 and d._match(13, 0, [12, 13]) == 1 and d._match(7, 0, [12]) == -1
    off = SpecASRDrafter(tiny().shallow(1), SpecASRConfig(recycle=False))
    off._last, off._last_probs = d._last, d._last_probs
    assert off._old_rest([1, 2, 3, 10, 99]) == ([], [])


def test_markdown_and_plot(tmp_path):
    rows = []
    for i, v in enumerate(default_variants("whisper-tiny.en", "self:1")):
        rows.append(
            {
                "label": v.label,
                "draft": v.draft or "-",
                "method": v.method,
                "draft_ms_10s": 10.0 * i,
                "target_ms_10s": 100.0,
                "total_ms_10s": 100.0 + 10 * i,
                "encoder_ms_10s": 50.0,
                "draft_encoder_ms_10s": 5.0,
                "e2e_ms_10s": 160.0 + 10 * i,
                "wer": 0.1,
                "identical": True,
            }
        )
    result = {
        "header": {"machine": {}, "command": "speclive bench asr"},
        "clips": [1, 2],
        "audio_s": 20.0,
        "rows": rows,
        "curve": [
            {"k": 1, "ms": 10.0, "ratio": 1.0, "per_token_ms": 10.0},
            {"k": 8, "ms": 20.0, "ratio": 2.0},
        ],
        "ideal_bound": 4.0,
        "model": "whisper-base",
    }
    md = markdown(result)
    assert "speclive bench asr" in md and "| + recycling |" in md and len(COLUMNS) > 10
    assert plot(tmp_path / "a.png", result).stat().st_size > 1000


def test_cost_stop_shortens_the_trunk_when_verification_rows_are_expensive():
    from asr_fixtures import clips_16k

    from speclive.backends.base import CostModel

    b = tiny()
    b.set_audio(clips_16k()[0][1])
    ctx = b.specials.prompt + b.tokenizer.encode(" The quick brown fox jumps over the")

    def trunk(cost_stop: bool, prior: dict[int, float], spike: bool = False) -> int:
        cfg = SpecASRConfig(max_len=20, threshold=0.0, adaptive=False, cost_stop=cost_stop)
        d = SpecASRDrafter(b.shallow(2), cfg)
        d.start(b, ctx)
        b.cost = CostModel(prior)  # the target's verification cost curve the drafter reads
        if spike:  # one 2-row pass measured 100x a step (a load spike) must not stop drafting
            b.cost.observe(1, 0.01)
            b.cost.observe(2, 1.0)
        n = len(d.propose(ctx, 20).tokens)
        d.close()
        return n

    flat = {1: 1.0, 64: 1.0}  # extra rows free: only the draft steps limit the trunk
    linear = {1: 1.0, 64: 64.0}  # every row costs a full target step: no token can pay
    assert trunk(False, linear) == 20
    assert trunk(True, linear) < trunk(True, flat)
    assert trunk(True, linear) <= 1
    assert trunk(True, flat, spike=True) == trunk(True, flat) >= 2


def test_trimmed_draft_rows_follow_the_margin():
    """The draft-audio rows come in pairs (plain SD and full SpecASR, so "best SD" has the same
    draft), only for a separate draft model and only when a margin is given."""
    rows = default_variants("whisper-tiny.en", None, draft_margin_s=0.5)
    trimmed = [v for v in rows if v.draft_margin_s is not None]
    assert [(v.method, v.draft_margin_s) for v in trimmed] == [("sd", 0.5), ("specasr", 0.5)]
    assert "+0.5 s" in trimmed[1].label and trimmed[1].specasr["sparse_tree"]
    assert all(v.draft_margin_s is None for v in default_variants("whisper-tiny.en", None, None))
    assert all(v.draft_margin_s is None for v in default_variants("self:2", None, 1.0))


def test_draft_margin_argument():
    import argparse

    from speclive.options import parse_margin

    assert parse_margin("none") is None and parse_margin("NONE") is None
    assert parse_margin("1.5") == 1.5 and parse_margin("0") == 0.0
    for bad in ("-1", "soon"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_margin(bad)
