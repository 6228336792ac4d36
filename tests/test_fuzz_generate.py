"""The generating fuzzer's logic (``speclive_bench.fuzz_generate``) without a model: the drawn
plans, the response tracker's protocol checks, the REST checks against a fake transport, the
report; and the server bug it found (audio deltas of a response after its ``response.done``).

The real run is ``speclive bench fuzz --responses N`` (minutes on a real model).
"""

from __future__ import annotations

import asyncio
import json
import random
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from speclive.live import events as ev
from speclive.server.realtime_conversation import Conversation
from speclive_bench.fuzz_generate import (
    MAX_BUDGET,
    MID_ANSWER,
    GenerateReport,
    ResponseTracker,
    RestPlan,
    TrackedConn,
    draw_budget,
    realtime_plan,
    rest_one,
    rest_plan,
    rss_bytes,
)
from speclive_bench.reliability import generate_markdown


def test_budgets_cover_one_to_256_and_plans_are_seeded():
    rng = random.Random(0)
    budgets = [draw_budget(rng) for _ in range(2000)]
    assert min(budgets) == 1 and max(budgets) == MAX_BUDGET
    assert all(1 <= b <= MAX_BUDGET for b in budgets)
    assert sum(b > 64 for b in budgets) > 200  # long answers are asked for, not only short ones
    a = [rest_plan(random.Random(7), "m").body for _ in range(3)]
    b = [rest_plan(random.Random(7), "m").body for _ in range(3)]
    assert a == b
    plans = [rest_plan(rng, "m") for _ in range(500)]
    assert any(p.body["stream"] and p.cancel_after_chunks is not None for p in plans)
    assert any(not p.body["stream"] and p.give_up_s is not None for p in plans)
    assert all(p.cancel_after_chunks is None or p.body["stream"] for p in plans)


def test_realtime_plans_use_every_mid_answer_action():
    rng = random.Random(1)
    turns = [t for _ in range(300) for t in realtime_plan(rng)]
    assert {t.action for t in turns} == set(MID_ANSWER)
    assert all(t.update for t in turns if t.action == "session.update")
    for _ in range(100):  # a disconnect ends the session's plan
        plan = realtime_plan(rng)
        assert all(t.action != "disconnect" for t in plan[:-1])


def _events(rid: str, deltas: int, status: str = "completed") -> list[dict]:
    out = [{"type": "response.created", "response": {"id": rid}}]
    out.append({"type": "response.output_item.added", "response_id": rid, "item": {"id": f"item_{rid}"}})
    out += [{"type": "response.output_audio.delta", "response_id": rid}] * deltas
    return out + [{"type": "response.done", "response": {"id": rid, "status": status}}]


def test_tracker_counts_generated_responses_and_flags_protocol_violations():
    t = ResponseTracker()
    for m in _events("r1", 3) + _events("r2", 0, "cancelled") + _events("r3", 0, "completed"):
        t.feed(m)
    assert t.generated() == 2  # output, or cancelled; r3 said nothing
    assert t.items["r1"] == "item_r1" and not t.open() and not t.violations
    t.feed({"type": "response.output_audio.delta", "response_id": "r1"})
    t.feed({"type": "response.done", "response": {"id": "r9"}})
    t.feed({"type": "response.created", "response": {"id": "r4"}})
    assert [w for w, _ in t.violations] == [
        "response.output_audio.delta after response.done",
        "response.done without response.created",
    ]
    assert t.open() == ["r4"] and t.current() == "r4"
    t.feed({"type": "response.output_audio.done", "response_id": "r4"})
    t.feed({"type": "response.output_audio.delta", "response_id": "r4"})
    assert t.violations[-1][0] == "response.output_audio.delta after response.output_audio.done"


def _client(handler) -> httpx.Client:
    return httpx.Client(base_url="http://test", transport=httpx.MockTransport(handler))


def _completion(tokens: int, finish: str = "length") -> dict:
    msg = {"role": "assistant", "content": "x" * tokens}
    return {"choices": [{"message": msg, "finish_reason": finish}], "usage": {"completion_tokens": tokens}}


def test_rest_checks_budgets_refusals_and_5xx():
    report = GenerateReport()
    plan = RestPlan({"model": "m", "messages": [], "stream": False, "max_tokens": 5})
    rest_one(_client(lambda r: httpx.Response(200, json=_completion(5))), plan, report)
    assert report.rest_generated == 1 and report.rest_tokens == 5 and not report.violations
    rest_one(_client(lambda r: httpx.Response(200, json=_completion(6))), plan, report)
    assert "over max_tokens 5" in report.violations[-1][0]
    overloaded = {"error": {"message": "busy", "type": "x", "param": None, "code": "server_overloaded"}}
    refuse = httpx.Response(503, json=overloaded, headers={"Retry-After": "1"})
    rest_one(_client(lambda r: refuse), plan, report)
    assert report.rest_refused == 1 and len(report.violations) == 1
    rest_one(_client(lambda r: httpx.Response(500, text="boom")), plan, report)
    assert report.violations[-1][0] == "REST 500: server error"
    assert report.to_dict()["rest"]["5xx_not_refusals"] == 1


def _sse(*objs: object) -> bytes:
    return b"".join(f"data: {o if isinstance(o, str) else json.dumps(o)}\n\n".encode() for o in objs)


def test_rest_streams_must_finish_unless_the_client_left():
    chunk = {"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]}
    last = {"choices": [{"delta": {}, "finish_reason": "stop"}]}
    report = GenerateReport()
    plan = RestPlan({"model": "m", "messages": [], "stream": True, "max_tokens": 9})
    rest_one(_client(lambda r: httpx.Response(200, content=_sse(chunk, last, "[DONE]"))), plan, report)
    assert report.rest_generated == 1 and not report.violations
    rest_one(_client(lambda r: httpx.Response(200, content=_sse(chunk, chunk))), plan, report)
    assert "without a finish reason" in report.violations[-1][0]
    left = RestPlan(plan.body, cancel_after_chunks=0)
    rest_one(_client(lambda r: httpx.Response(200, content=_sse(chunk, chunk))), left, report)
    assert report.rest_left_mid_answer == 1 and report.rest_generated == 3 and len(report.violations) == 1


def test_generate_markdown_reports_rss_before_during_after():
    report = GenerateReport(rss_before=1_000_000_000, rss_after=1_020_000_000)
    report.rss = [(0.0, 1_000_000_000), (5.0, 1_050_000_000)]
    d = report.to_dict()
    assert d["rss"]["growth_after_pct"] == 2.0 and d["rss"]["during_max_bytes"] == 1_050_000_000
    text = "\n".join(generate_markdown(d))
    assert "before 1.000 GB" in text and "(+2.00 %)" in text
    assert "no mapping's resident memory grew by 8 MiB" in text
    assert rss_bytes() > 0
    report.rss_steps = [
        {"t": 305.1, "kind": "anon_other", "start": "0x7f00", "mapped_mib": 96.0,
         "resident_before_mib": 0.0, "resident_after_mib": 96.0, "new": True},
    ]  # fmt: skip
    text = "\n".join(generate_markdown(report.to_dict()))
    assert "305 s: anon_other at 0x7f00 (96.0 MiB mapped, new), resident 0.0 → 96.0 MiB" in text
    report.rss_steps = report.rss_steps * 15
    text = "\n".join(generate_markdown(report.to_dict()))
    assert text.count("305 s: anon_other") == 12 and "and 3 more (the JSON's" in text


def test_no_audio_delta_of_a_response_after_its_done():
    """A cancel that lands while an answer's audio goes out (the send awaits) ends the response:
    the rest of that sentence's audio is not sent after its ``response.output_audio.done``."""
    sent: list[tuple[str, dict]] = []

    async def main() -> None:
        settings = SimpleNamespace(output_rate=24_000, speak=True)
        conv: Conversation

        async def send(type_: str, **payload: object) -> None:
            sent.append((type_, payload))
            if type_ == "response.output_audio.delta" and len(sent) < 8:
                asyncio.get_running_loop().create_task(conv.cancel_response())
            await asyncio.sleep(0)  # a socket write yields to the session's other tasks

        async def error(*a: object, **k: object) -> None:
            pass

        conv = Conversation(send, error, lambda: settings)
        chunk = ev.AudioChunk(t=0.0, samples=np.zeros(24_000, np.float32), sample_rate=24_000)
        await conv.on_event(chunk)
        await asyncio.sleep(0.01)

    asyncio.run(main())
    types = [t for t, _ in sent]
    assert "response.done" in types
    assert "response.output_audio.delta" not in types[types.index("response.output_audio.done") :]


def test_a_cancelled_answer_taken_up_again_does_not_silence_the_next_answer():
    """``response.cancel``, then the user goes on (the pipeline withdraws the answer with
    ``Interrupted`` and sends no metrics for it): the next answer is a response of its own."""
    sent: list[tuple[str, dict]] = []

    async def main() -> None:
        settings = SimpleNamespace(output_rate=24_000, speak=False)

        async def send(type_: str, **payload: object) -> None:
            sent.append((type_, payload))

        async def error(*a: object, **k: object) -> None:
            pass

        conv = Conversation(send, error, lambda: settings)
        await conv.on_event(ev.AnswerDelta(0.0, text="first "))
        await conv.cancel_response()
        await conv.on_event(ev.AnswerDelta(0.1, text="dropped "))  # the cancelled answer's rest
        await conv.on_event(ev.Interrupted(0.2, played=""))
        await conv.on_event(ev.AnswerDelta(0.3, text="second "))
        await conv.on_event(ev.TurnMetrics(0.4, turn=2, answer="second "))

    asyncio.run(main())
    done = [p["response"] for t, p in sent if t == "response.done"]
    assert [d["status"] for d in done] == ["cancelled", "completed"]
    assert [d["output"][0]["content"][0]["transcript"] for d in done] == ["first ", "second "]


@pytest.mark.parametrize("n", [0, 1])
def test_report_counts_add_up(n):
    report = GenerateReport(rest_generated=n, realtime_generated=2)
    assert report.generated == n + 2 and report.to_dict()["generated_responses"] == n + 2


def test_a_session_refused_while_the_server_is_full_is_a_refusal_not_a_violation():
    report = GenerateReport()
    conn = TrackedConn.__new__(TrackedConn)  # no server: only the classification is tested
    conn.report, conn.tag, conn.refused, conn.close_code = report.ws, "generate", False, 1013
    conn.violation("no session.created", "None")
    assert conn.refused and not report.ws.violations
    conn.close_code = 1000
    conn.violation("no session.created", "None")
    assert len(report.ws.violations) == 1
