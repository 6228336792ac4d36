"""The soak's verdicts on made-up runs (the soak itself runs minutes: ``speclive bench soak``)."""

from __future__ import annotations

from types import SimpleNamespace

from speclive_bench.soak import QUESTIONS, closest_question, summarize_soak


def test_closest_question_tolerates_asr_errors():
    assert closest_question("what is the capitol of france", QUESTIONS) == 0
    assert closest_question("how many legs does a spider half", QUESTIONS) == 1


def test_summary_counts_errors_crossed_transcripts_and_growth():
    questions = QUESTIONS[:2]
    turns = [
        {"session": 0, "t": 10.0, "latency_s": 1.0, "transcript": "What is the capital of France?"},
        # session 1 got session 0's transcript: crossed state
        {"session": 1, "t": 20.0, "latency_s": 2.0, "transcript": "What is the capital of France?"},
        {"session": 1, "t": 30.0, "latency_s": None, "transcript": "How many legs does a spider have?"},
        {"session": 0, "t": 40.0, "latency_s": None, "failure": "no answer within 300 s"},
        {"session": 0, "t": 50.0, "latency_s": 3.0, "errors": ["rate_limit_exceeded"]},
        # refused for want of capacity: a clean refusal, not an error, though it has no answer
        {"session": 1, "t": 60.0, "latency_s": None, "refused": True},
    ]
    voices = [
        SimpleNamespace(turns=turns[::2], errors=[], refused=0, refused_turns=0),
        SimpleNamespace(
            turns=turns[1::2], errors=["session 1: ConnectionClosedError"], refused=5, refused_turns=1
        ),
    ]
    chats = [SimpleNamespace(done=7, errors=[], refused=2)]
    samples = [
        {"t": 0.0, "rss_bytes": 100 * 2**20, "open_fds": 10},
        {"t": 30.0, "rss_bytes": 200 * 2**20, "open_fds": 12},
        {"t": 60.0, "rss_bytes": 210 * 2**20, "open_fds": 12, "kv_cell_evictions": 3.0, "kv_restores": 4.0},
    ]
    args = SimpleNamespace(
        sessions=2,
        chat_clients=1,
        minutes=1.0,
        warmup_minutes=0.5,
        model="m",
        asr_model="a",
        asr_draft="d",
        max_wait=2.5,
    )
    r = summarize_soak(args, "cmd", questions, voices, chats, samples, 200)
    s = r["summary"]
    assert s["crossed_transcripts"] == 1 and s["transcribed_turns"] == 3
    # a lost connection, a turn without answer audio, a failed turn, an error event; the
    # refusals (connections, a turn, chat requests) are counted apart
    assert s["errors"] == 4 and s["refused_connects"] == 5
    assert s["refused_turns"] == 1 and s["refused_chats"] == 2
    assert s["turns"] == 6 and s["turns_answered"] == 3 and s["chat_requests"] == 7
    assert abs(s["rss_growth_pct"] - 5.0) < 1e-9  # from the first sample after the warm-up
    assert s["latency_p50_s"] == 2.0 and s["latency_max_s"] == 3.0
    assert s["bound_s"] == 2.5 and s["turns_over_bound"] == 1
    # the first and the last third of a 1-minute run: 1 s (t=10) and 3 s (t=50)
    assert s["latency_p50_first_s"] == 1.0 and s["latency_p50_last_s"] == 3.0
    assert s["latency_p50_last_over_first"] == 3.0
    assert s["kv_cell_evictions"] == 3.0 and s["kv_restores"] == 4.0  # the server's counts at the end


def test_summary_rss_trend_is_the_least_squares_slope_after_warmup():
    # +6 MiB a minute after the warm-up (a jump before it is not part of the trend)
    samples = [{"t": 0.0, "rss_bytes": 50 * 2**20}] + [
        {"t": 60.0 * m, "rss_bytes": (500 + 6 * m) * 2**20, "trimmed_bytes": 2**20 * m} for m in range(1, 6)
    ]
    args = SimpleNamespace(
        sessions=1,
        chat_clients=0,
        minutes=5.0,
        warmup_minutes=1.0,
        model="m",
        asr_model="a",
        asr_draft="d",
        max_wait=0.0,
    )
    voices = [SimpleNamespace(turns=[], errors=[], refused=0)]
    s = summarize_soak(args, "cmd", QUESTIONS[:1], voices, [], samples, 200)["summary"]
    assert abs(s["rss_slope_mib_per_min"] - 6.0) < 1e-6
    assert s["trimmed_mib"] == 5.0


def test_memory_trends_tell_live_blocks_from_what_malloc_holds():
    """RSS that levels off shows in the second half's trend; malloc's blocks in use that stay
    flat while its arenas and mapped blocks grow show as two different trends."""
    from speclive_bench.soak import _memory

    mib = 2**20
    samples = [
        {
            "t": 60.0 * m,
            "rss_bytes": (1000 + min(m, 5) * 60) * mib,  # +60 MiB/min for 5 minutes, then flat
            "heap_in_use_bytes": 500 * mib,
            "heap_arenas_bytes": (600 + 10 * m) * mib,
            "heap_mapped_bytes": 300 * mib,
        }
        for m in range(11)
    ]
    out = _memory(samples, samples[1:], minutes=10)
    assert out["rss_slope_mib_per_min"] > 10 and abs(out["rss_slope_last_half_mib_per_min"]) < 1e-6
    assert abs(out["heap_in_use_slope_mib_per_min"]) < 1e-6
    assert abs(out["heap_held_slope_mib_per_min"] - 10) < 1e-6
    assert out["rss_mib_after_warmup"] == 1060 and out["rss_mib_end"] == 1300
    bare = [{k: v for k, v in s.items() if not k.startswith("heap")} for s in samples]
    assert _memory(bare, bare[1:], minutes=10)["heap_held_slope_mib_per_min"] == 0.0  # off glibc


def test_memory_by_kind_reports_each_kind_and_the_thread_count():
    """A step in one kind of mapping shows in that kind's row alone."""
    from speclive_bench.soak import _memory, soak_markdown

    mib = 2**20
    samples = [
        {
            "t": 60.0 * m,
            "rss_bytes": 1000 * mib,
            "rss_files_bytes": 400 * mib,
            "size_files_bytes": 900 * mib,
            "rss_stacks_bytes": (2 + (8 if m >= 5 else 0)) * mib,  # a thread pool at minute 5
            "threads": 10.0 + (4 if m >= 5 else 0),
        }
        for m in range(11)
    ]
    rows = {r["kind"]: r for r in _memory(samples, samples[1:], minutes=10)["resident_by_kind"]}
    assert set(rows) == {"files", "stacks", "threads"}  # only the kinds that were read
    assert abs(rows["files"]["slope_per_min"]) < 1e-9 and rows["files"]["end"] == 400
    assert rows["stacks"]["after_warmup"] == 2 and rows["stacks"]["end"] == 10
    assert rows["stacks"]["slope_per_min"] > 0.5 and rows["threads"]["end"] == 14
    assert rows["files"]["mapped_end"] == 900 and rows["stacks"]["mapped_end"] is None
    args = SimpleNamespace(
        sessions=1, chat_clients=0, minutes=10.0, warmup_minutes=1.0, model="m",
        asr_model="a", asr_draft="d", max_wait=0.0,
    )  # fmt: skip
    voices = [SimpleNamespace(turns=[], errors=[], refused=0)]
    md = soak_markdown(summarize_soak(args, "cmd", QUESTIONS[:1], voices, [], samples, 200))
    assert "| stacks | 2.0 | 10.0 |" in md and "| files | 400.0 | 400.0 | 0.00 | 900.0 | 900.0 |" in md


def test_the_mappings_steps_are_listed_with_their_minute():
    from speclive_bench.soak import soak_markdown

    args = SimpleNamespace(
        sessions=1, chat_clients=0, minutes=10.0, warmup_minutes=1.0, model="m",
        asr_model="a", asr_draft="d", max_wait=0.0,
    )  # fmt: skip
    voices = [SimpleNamespace(turns=[], errors=[], refused=0)]
    samples = [{"t": 60.0 * m, "rss_bytes": 2.0**30} for m in range(11)]
    step = {
        "t": 1260.0, "kind": "anon_other", "start": "0x7f00", "mapped_mib": 413.3,
        "resident_before_mib": 300.0, "resident_after_mib": 355.0, "new": False,
    }  # fmt: skip
    res = summarize_soak(args, "cmd", QUESTIONS[:1], voices, [], samples, 200, steps=[step])
    assert res["summary"]["resident_steps"][0]["t_min"] == 21.0
    md = soak_markdown(res)
    assert "| 21.0 | anon_other | 0x7f00 | 413.3 | 300.0 | 355.0 | no |" in md
    quiet = soak_markdown(summarize_soak(args, "cmd", QUESTIONS[:1], voices, [], samples, 200))
    assert "No mapping's resident memory grew by 8 MiB or more" in quiet


def test_a_figure_that_rounds_to_zero_is_written_without_a_sign():
    from speclive_bench.report import _fmt

    assert _fmt(-1e-16) == "0.00" and _fmt(-0.004) == "0.00" and _fmt(-0.0, 1) == "0.0"
    assert _fmt(-0.006) == "-0.01" and _fmt(-2.0, 0) == "-2"
