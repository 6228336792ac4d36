"""``bench longconv``'s logic on made-up runs (the run itself takes minutes: ``speclive bench longconv``)."""

from __future__ import annotations

from typing import Any

from speclive_bench import report
from speclive_bench.longconv import (
    classify,
    divergence_position,
    longconv_markdown,
    schedule,
    summarize,
)


class _CharTokenizer:
    """One token per character (ids are code points)."""

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def test_schedule_gives_every_session_its_turns_in_bursts():
    order = schedule(sessions=3, turns=5, burst=2)
    assert order == [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2, 0, 1, 2]
    assert all(order.count(s) == 5 for s in range(3))
    assert schedule(2, 2, 1) == [0, 1, 0, 1]
    assert schedule(2, 1, 0) == [0, 1]  # a burst below one is one


def test_divergence_position_reads_the_served_text_not_its_tokens():
    tok = _CharTokenizer()
    ref = [ord(c) for c in "Paris is big"]
    assert divergence_position(tok, "Paris is nice", ref) == len("Paris is ")
    assert divergence_position(tok, "Paris is big", ref) == len(ref)
    assert divergence_position(tok, "Paris is bigger", ref) == len(ref)  # the answer goes on
    assert divergence_position(tok, "", ref) == 0


def test_classify_counts_near_ties_apart_from_bugs():
    assert classify("a", "a", None) == "equal"
    assert classify("a", "b", report.NEAR_TIE_GAP / 2) == "near-tie"
    assert classify("a", "b", report.NEAR_TIE_GAP * 2) == "bug"
    assert classify("a", "b", None) == "bug"  # no gap read: not excused
    assert classify("a", "b", 0.3, near_tie=0.2) == "bug"


def _rec(session: int, restored: bool, verdict: str | None, **kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "session": session,
        "restored": restored,
        "answer": "x",
        "turn_s": 1.0,
        "kv_cell_evictions": 0.0,
        "kv_restores": float(restored),
        "errors": [],
        "status": "completed",
    }
    if verdict is not None:
        r["verdict"] = verdict
    return r | kw


def test_summary_splits_restored_and_resident_turns():
    records = [
        _rec(0, False, "equal"),
        _rec(1, False, "near-tie", kv_cell_evictions=2.0),
        _rec(0, True, "equal", turn_s=3.0),
        _rec(1, True, "near-tie"),
        _rec(0, True, "bug", errors=["server_error"]),
        _rec(1, False, None, answer=None, status="failed"),
    ]
    s = summarize(records, {"kv_cell_evictions": 5.0, "kv_restores": 3.0})
    assert s["turns"] == 6 and s["answered"] == 5 and s["errors"] == 2
    assert s["kv_cell_evictions"] == 5.0 and s["kv_restores"] == 3.0  # the server's own counts
    assert s["turns_per_session"] == {"0": 3, "1": 3}
    assert s["restored"] == {"turns": 3, "checked": 3, "equal": 1, "near-tie": 1, "bug": 1}
    assert s["resident"] == {"turns": 3, "checked": 2, "equal": 1, "near-tie": 1, "bug": 0}
    assert s["first_eviction_turn"] == 1
    assert s["turn_s_median"] == 1.0
    header = {
        "command": "speclive bench longconv",
        "settings": {"sessions": 2, "turns": 3, "n_ctx": 512, "burst": 2, "method": "cascade"},
    }
    md = longconv_markdown({"header": header, "summary": s})
    assert "| 6 | 5 | 2 | 5 | 3 | 1 |" in md
    assert "| after a restore | 3 | 3 | 1 | 1 | 1 |" in md


def test_summary_of_a_run_without_evictions():
    s = summarize([_rec(0, False, "equal")], {})
    assert s["kv_cell_evictions"] == 0.0 and s["first_eviction_turn"] is None
    assert s["restored"]["turns"] == 0


def test_a_saved_run_is_checked_again_without_a_server(tmp_path, monkeypatch):
    from pathlib import Path

    from speclive_bench import longconv

    held = {
        "records": [_rec(0, True, None, transcript="hi", history=[]), _rec(1, False, None, transcript="yo")],
        "final": {"kv_cell_evictions": 1.0, "kv_restores": 1.0},
        "run_s": 12.5,
    }
    path = longconv.save_turns(held, tmp_path / "turns.json")
    checked: list[bool] = []

    def check(llm: Any, records: list[dict[str, Any]], log: Any, restored_only: bool = False) -> None:
        checked.append(restored_only)
        for r in records:
            if r["restored"] or not restored_only:
                r["verdict"] = "equal"

    monkeypatch.setattr(longconv, "load_backend", lambda *a, **kw: object())
    monkeypatch.setattr(longconv, "check_against_fresh", check)
    monkeypatch.setattr(longconv, "hold_conversations", lambda *a: (_ for _ in ()).throw(AssertionError))
    opts = longconv.LongConvOptions(turns_from=Path(path), out=tmp_path, command="cmd")
    result = longconv.run_longconv(opts, lambda m: None)
    assert checked == [True]
    s = result["summary"]
    assert s["turns"] == 2 and s["kv_restores"] == 1.0 and s["run_s"] == 12.5
    assert s["restored"]["equal"] == 1 and s["resident"]["checked"] == 0
    assert result["header"]["settings"]["check"] == "restored"
