"""``bench turns``' scoring on synthetic pauses and playbacks (no models): cut-offs, talk-over,
latency after the true end, the sweep and its calibration, the tables and the plot."""

from __future__ import annotations

import numpy as np
import pytest

from speclive.live.turnpolicy import TurnPolicy, TurnPolicyConfig
from speclive_bench import turns as tb


def _turn(**kw):
    base = {
        "id": "c00t1",
        "conversation": "c00",
        "voice": "piper",
        "kind": "paused",
        "text": "So I was thinking about getting a dog.",
        "speech_start_t": 0.5,
        "speech_end_t": 3.0,
        "pauses": [[1.2, 2.0]],
        "piece_spans": [[0.5, 1.2], [2.0, 3.0]],
    }
    return {**base, **kw}


def test_score_turn_counts_cut_offs_talk_over_and_the_latency_after_the_true_end():
    t = _turn()
    # offset 10 s: the turn starts at 10 s of the input; audio at 11.5 (inside the pause), cut at
    # 12.2 (0.2 s over the resumed speech), and the real answer 0.4 s after the true end
    plays = [
        {"start_t": 11.5, "end_t": 12.2, "cut": True},
        {"start_t": 13.4, "end_t": 15.0, "cut": False},
        {"start_t": 30.0, "end_t": 31.0, "cut": False},  # another turn's window
    ]
    s = tb.score_turn(t, 10.0, plays, (10.0, 20.0))
    assert abs(s["latency_s"] - 0.4) < 1e-9
    assert (s["long_pauses"], s["cut_long_pauses"], s["early_audio"]) == (1, 1, 1)
    assert abs(s["talk_over_s"] - 0.2) < 1e-9
    assert np.allclose([p["start_t"] for p in s["playbacks"]], [1.5, 3.4])
    quiet = tb.score_turn(t, 0.0, [{"start_t": 3.2, "end_t": 4.0, "cut": False}], (0.0, 9.0))
    assert (
        quiet["cut_long_pauses"] == 0 and quiet["talk_over_s"] == 0 and abs(quiet["latency_s"] - 0.2) < 1e-9
    )
    assert tb.score_turn(t, 0.0, [], (0.0, 9.0))["latency_s"] is None


def test_classify_matches_vad_pauses_to_the_ground_truth():
    t = _turn()
    mid = tb.classify({"speech_end": 1.25, "at": 1.35, "resume": 2.05, "start": 0.5}, t)
    end = tb.classify({"speech_end": 3.05, "at": 3.15, "resume": None, "start": 0.5}, t)
    gap = tb.classify({"speech_end": 0.9, "at": 1.0, "resume": 1.05, "start": 0.5}, t)
    assert (mid["label"], end["label"], gap["label"]) == ("mid", "end", "mid")
    assert abs(mid["true_pause_s"] - 0.8) < 1e-9 and gap["true_pause_s"] == 0.0


def _rows():
    """Ends with a confident model, long mid pauses where it is unsure, in two splits."""
    rows = []
    for i in range(20):
        split = "dev" if i % 2 else "test"
        common = {"turn": f"t{i}", "split": split, "speech_end": 2.0, "at": 2.1, "true_end": 2.0}
        rows.append(
            {
                **common,
                "label": "end",
                "resume": None,
                "true_pause_s": 0.0,
                "vad_lag_s": 0.05,
                "audio_p": 0.9,
                "text_p": 0.8,
                "text_p_norm": 0.01,
            }
        )
        rows.append(
            {
                **common,
                "turn": f"t{i}",
                "label": "mid",
                "speech_end": 1.0,
                "resume": 1.8,
                "true_pause_s": 0.8,
                "vad_lag_s": None,
                "audio_p": 0.6 if i % 5 else 0.3,
                "text_p": 0.02 if i % 5 else 0.9,
                "text_p_norm": 0.0,
            }
        )
    return rows


def test_evaluate_and_calibrate_trade_waiting_against_cut_offs():
    rows = [r for r in _rows() if r["split"] == "dev"]
    silence = tb.evaluate(rows, TurnPolicy(TurnPolicyConfig(kind="silence", max_silence_s=1.0)))
    assert silence["false_cutoffs"] == 0 and abs(silence["wait_p50"] - 1.05) < 1e-9
    short = tb.evaluate(rows, TurnPolicy(TurnPolicyConfig(kind="silence", max_silence_s=0.5)))
    assert short["false_cutoffs"] == 1.0  # every 0.8 s pause is cut
    fused = tb.evaluate(rows, TurnPolicy(TurnPolicyConfig(kind="fused", threshold=0.5, max_silence_s=2.0)))
    assert fused["wait_p50"] < 0.2 and 0 < fused["false_cutoffs"] < 0.5  # the text vetoes most pauses
    cal = tb.calibrate(rows, [r for r in _rows() if r["split"] == "test"])
    assert cal["low/fused"]["dev"]["false_cutoffs"] == 0.0
    assert cal["high/fused"]["dev"]["wait_p50"] <= cal["low/fused"]["dev"]["wait_p50"]
    assert cal["low/silence"]["dev"]["wait_p50"] > cal["low/fused"]["dev"]["wait_p50"]


def test_summary_tables_and_plot(tmp_path):
    recs = []
    for i in range(6):
        for policy, method, lat, comp in (
            ("silence:0.5", "cascade", 1.0, 2.0),
            ("fused", "predgen", 0.4, 2.5),
            ("fused", "predgen/sentence", 0.8, 2.5),
        ):
            recs.append(
                {
                    "turn": f"t{i}",
                    "policy": policy,
                    "method": method,
                    "kind": "complete",
                    "latency_s": lat + 0.01 * i,
                    "long_pauses": 0,
                    "cut_long_pauses": 0,
                    "talk_over_s": 0.0,
                    "compute_s": comp,
                    "identity": "identical" if method == "predgen" else None,
                    "true_end_t": 2.0,
                    "speech_end_vad": 2.1,
                    "decided_t": 2.2,
                    "audio_start_t": 2.4,
                    "asr_s": 0.3,
                    "llm_s": 0.2,
                    "tts_s": 0.1,
                }
            )
    configs = [("silence:0.5", "cascade"), ("fused", "predgen"), ("fused", "predgen/sentence")]
    summary = tb.summarize(recs, configs)
    fused = summary[1]
    # a variant is paired with its method under the same policy, turn by turn
    assert "vs_method" not in fused and 1.8 < summary[2]["vs_method"]["median"] < 2.0
    assert abs(fused["latency_p50"] - 0.425) < 1e-9 and fused["identical"] == 6
    assert abs(fused["extra_compute_s"] - 0.5) < 1e-9
    assert 0.3 < fused["vs_cascade"]["median"] < 0.5
    w = fused["waterfall"]
    assert abs(w["vad_lag_s"] - 0.1) < 1e-9 and abs(w["decision_s"] - 0.1) < 1e-9
    assert abs(w["audio_s"] - 0.2) < 1e-9 and w["llm_s"] == 0.2
    rows = _rows()
    result = {
        "header": {"machine": {}, "command": "speclive bench turns"},
        "summary": summary,
        "records": recs,
        "signals": [{**r, "audio_ms": 50.0, "asr_ms": 300.0, "text_ms": 60.0} for r in rows],
        "sweep": {"dev": tb.sweep([r for r in rows if r["split"] == "dev"]), "test": tb.sweep(rows)},
        "calibration": tb.calibrate(rows, rows),
        "normalisation": {
            "dev": {"raw": tb._separation(rows, "text_p"), "normalised": tb._separation(rows, "text_p_norm")}
        },
    }
    md = tb.markdown(result)
    assert "| fused | predgen | 6 |" in md and "low" in md and "normalised" in md
    assert "| fused | predgen | 0.10 | 0.10 | 0.20 | 0.30 | 0.20 | 0.10 |" in md  # the waterfall
    paths = tb.write_outputs(result, tmp_path, "unit")
    assert [p.suffix for p in paths] == [".json", ".md", ".png"] and all(p.stat().st_size for p in paths)


def test_live_configs_and_policy_names():
    opts = tb.TurnsBenchOptions()
    cfgs = tb.live_configs(opts)
    assert cfgs[0] == ("silence:0.5", "cascade")
    assert ("text", "predgen") in cfgs and ("text", "prefill") not in cfgs and ("fused", "preemptive") in cfgs
    assert tb._policy_config("silence:0.8", "auto")[1].end_s == 0.8
    assert tb._policy_config("fused", "high")[2].eagerness == "high"
    try:
        tb._policy_config("psychic", "auto")
    except ValueError as e:
        assert "psychic" in str(e)
    else:  # pragma: no cover
        raise AssertionError("an unknown policy must fail")
    assert tb.normalise("Hello, World! It's me.") == "hello world it's me"


def test_a_method_variant_runs_the_method_with_its_voice_settings():
    opts = tb.TurnsBenchOptions(methods=["predgen", "predgen/sentence"], policies=["fused"])
    assert tb.live_configs(opts) == [
        ("silence:0.5", "cascade"),
        ("fused", "predgen"),
        ("fused", "predgen/sentence"),
    ]
    assert tb.split_method("predgen/sentence") == ("predgen", "sentence")
    assert tb.voice_config(32).first_words > 0
    assert tb.voice_config(32, "sentence").first_words == 0
    with pytest.raises(ValueError, match="predgen/sentence"):
        tb.live_configs(tb.TurnsBenchOptions(methods=["predgen/psychic"]))
