"""Overload and faults, without models: admission by measured capacity, a model failing
mid-answer, a client leaving mid-answer.

The estimator is checked on its own with a fake clock (``ModelWorker(clock=...)``), the REST
refusal with a worker held busy by a call whose measured cost is known, the realtime paths with
a scripted voice pipeline (``FakeVoice``, put in place of ``pipeline_for``) that answers in
"decoder steps" of a few milliseconds and slices its work at the unit's deadline as the real
pipelines do.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("websockets")

import httpx  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

import speclive.server.realtime_session as rt_session  # noqa: E402
from speclive.decoder import GenerationStats  # noqa: E402
from speclive.live import events as ev  # noqa: E402
from speclive.server.app import create_app  # noqa: E402
from speclive.server.audio import pcm16  # noqa: E402
from speclive.server.capacity import (  # noqa: E402
    CALIBRATE_AFTER,
    DEFAULT_WORK_S,
    HEADROOM,
    MAX_SCALE,
    WORK_WINDOW,
    Admission,
    Overloaded,
    TurnCosts,
    wait_estimate,
)
from speclive.server.chat import ChatDelta, ChatDone  # noqa: E402
from speclive.server.config import ServerConfig  # noqa: E402
from speclive.server.inproc import serve_in_thread  # noqa: E402
from speclive.server.realtime_session import RealtimeSession  # noqa: E402
from speclive.server.realtime_settings import SessionClock  # noqa: E402
from speclive.server.worker import URGENT, ModelWorker, Stream  # noqa: E402


# ---- the estimator ------------------------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_wait_estimate_and_turn_costs():
    assert wait_estimate(None, []) == 0.0
    assert wait_estimate((2.0, 0.5), [1.0, 0.25]) == pytest.approx(2.75)
    assert wait_estimate((2.0, 3.0), [1.0]) == pytest.approx(1.0)  # the current turn overran: 0 left
    costs = TurnCosts()
    assert costs.call_s("never.seen") == 0.0 and costs.stream_s() == 0.0
    costs.observe_call("a", 1.0)
    costs.observe_call("a", 2.0)  # a moving average: 0.8 * 1 + 0.2 * 2
    assert costs.call_s("a") == pytest.approx(1.2)
    costs.observe_call("b", 4.0)
    assert costs.call_s("unseen") == pytest.approx(0.8 * 1.2 + 0.2 * 4.0)  # any call's average
    costs.observe_stream(0.1)
    assert costs.stream_s() == pytest.approx(0.1) and costs.stream_s(own=0.5) == 0.5


def test_worker_prices_the_foreground_work_queued_ahead():
    clock = FakeClock()
    worker = ModelWorker("test", clock=clock)
    gate, running = threading.Event(), threading.Event()

    def hold() -> None:
        running.set()
        gate.wait(10)

    def quick() -> None:
        clock.t += 0.5  # the fake clock: this call takes 0.5 s

    def withdrawn() -> None:
        pass

    def speculate() -> None:
        pass

    worker.costs.observe_call(hold.__qualname__, 4.0)
    worker.costs.observe_call(quick.__qualname__, 0.5)
    worker.costs.observe_call(withdrawn.__qualname__, 100.0)
    worker.costs.observe_call(speculate.__qualname__, 100.0)
    worker.costs.observe_stream(0.25)

    async def main() -> None:
        assert worker.wait_s() == 0.0  # idle: everything starts at once
        worker.submit(hold)
        assert running.wait(5)
        calls = [worker.submit(quick) for _ in range(3)]
        worker.submit(withdrawn).cancel()  # withdrawn: not counted
        worker.submit_background(speculate)  # background: a new foreground turn goes first
        stream = worker.stream(lambda: iter([1, 2]))
        clock.t = 1.0
        # 3 s left of the call in progress, three calls of 0.5 s, one stream turn of 0.25 s
        assert worker.wait_s() == pytest.approx(3.0 + 1.5 + 0.25)
        clock.t = 9.0  # the call in progress overran its average: nothing is counted for it
        assert worker.wait_s() == pytest.approx(1.5 + 0.25)
        gate.set()
        assert [x async for x in stream] == [1, 2]
        for c in calls:
            c.result(5)
        assert stream.turn_s is not None  # the stream's own turns were timed

    asyncio.run(main())
    worker.close()
    assert worker.wait_s() == 0.0
    assert worker.costs.call_s(quick.__qualname__) == pytest.approx(0.5)  # timed with the clock
    assert worker.costs.call_s(hold.__qualname__) == pytest.approx(0.8 * 4.0 + 0.2 * 9.0)


def test_worker_serves_the_work_owed_the_longest_first():
    """Units owed from an earlier moment (an admitted turn's, ``URGENT`` audio) go ahead of the
    work queued after it; without ``since`` the queue is FIFO."""
    clock = FakeClock()
    worker = ModelWorker("test", clock=clock)
    gate, running = threading.Event(), threading.Event()
    order: list[str] = []

    def hold() -> None:
        running.set()
        gate.wait(10)

    worker.submit(hold)
    assert running.wait(5)
    clock.t = 5.0
    futs = [worker.submit(order.append, "late-1")]
    clock.t = 6.0
    futs.append(worker.submit(order.append, "late-2"))
    futs.append(worker.submit_since(2.0, order.append, "turn admitted at 2"))
    futs.append(worker.submit_since(URGENT, order.append, "audio"))
    futs.append(worker.submit_since(2.0, order.append, "its next unit"))
    gate.set()
    for f in futs:
        f.result(5)
    worker.close()
    assert order == ["audio", "turn admitted at 2", "its next unit", "late-1", "late-2"]


def test_a_long_unit_lets_the_urgent_calls_through_between_its_steps():
    worker = ModelWorker("test")
    order: list[str] = []
    gate = threading.Event()

    def long_unit() -> float:
        order.append("step 1")
        gate.wait(10)  # meanwhile: audio (urgent) and another turn's unit are queued
        spent = worker.run_urgent()
        order.append("step 2")
        return spent

    fut = worker.submit_since(1.0, long_unit)
    while not fut.running():
        time.sleep(0.001)
    later = worker.submit_since(2.0, order.append, "the next turn")
    audio = [worker.submit_since(URGENT, order.append, f"audio {i}") for i in range(2)]
    gate.set()
    assert fut.result(5) >= 0.0
    later.result(5)
    assert all(a.done() for a in audio)
    assert order == ["step 1", "audio 0", "audio 1", "step 2", "the next turn"]
    with pytest.raises(RuntimeError, match="worker's own thread"):
        worker.run_urgent()  # not from another thread
    worker.close()


def test_admission_reserves_what_admitted_turns_owe_before_their_first_output():
    waits = {"chat": 1.0, "speech": 0.0}
    refused: list[str] = []
    clock = FakeClock()
    bound = 10.0 / HEADROOM  # estimates may fill 10 s of it
    adm = Admission(bound, waits.__getitem__, refused.append, clock=clock)
    assert adm.work_s("chat") == DEFAULT_WORK_S  # until a turn was measured
    a = adm.admit_realtime("chat", "chat")  # 1 s queued + its own 1 s
    assert a.estimate_s == pytest.approx(2.0) and adm.reserved_s("chat") == pytest.approx(1.0)
    assert adm.wait_s("chat") == pytest.approx(2.0)  # a REST request waits for the reservation too
    with pytest.raises(Overloaded):  # until turns were measured, one open turn at a time
        adm.admit_realtime("chat", "chat")
    for _ in range(CALIBRATE_AFTER):
        a.work_s = 3.0  # its units took 3 worker seconds
        clock.t += a.estimate_s  # and it waited as estimated: the calibration stays at 1
        adm.first_output(a)
        assert adm.reserved_s("chat") == 0.0 and adm.open_turns("chat") == 0
        a = adm.admit_realtime("chat", "chat")
    adm.withdraw(a)
    assert adm.work_s("chat") == pytest.approx(3.0)  # learned from the measured turns
    turns = [adm.admit_realtime("chat", "chat") for _ in range(2)]
    assert [t.estimate_s for t in turns] == pytest.approx([4.0, 7.0])  # each waits for those before
    turns[0].work_s = 1.0  # 2 s of it are still owed
    assert adm.reserved_s("chat") == pytest.approx(5.0)
    with pytest.raises(Overloaded) as refusal:  # 1 + 5 + 3 = 9 s, but its user waited 1.5 s already
        adm.admit_realtime("chat", "chat", waited_s=1.5)
    err = refusal.value
    assert err.status == 503 and err.code == "server_overloaded" and err.headers == {"Retry-After": "11"}
    assert refused == ["realtime", "realtime"] and adm.open_turns("chat") == 2
    assert adm.check_realtime("chat", "chat") == pytest.approx(9.0)  # checked, not reserved
    assert adm.open_turns("chat") == 2
    for t in turns:
        adm.withdraw(t)  # ended without output: nothing learned, nothing owed
    assert adm.reserved_s("chat") == 0.0 and adm.work_s("chat") == pytest.approx(3.0)
    adm.admit("chat", "chat")
    waits["speech"] = bound + 0.6
    with pytest.raises(Overloaded) as refusal:
        adm.admit("speech", "speech")
    assert refusal.value.retry_after == 14  # rounded up
    Admission(0.0, lambda _: 1e9).admit("chat", "chat")  # 0: no bound


def test_realtime_estimates_are_calibrated_to_the_p98_of_the_waits_that_followed():
    """A loaded worker's turns wait longer than their estimate: the scale tracks the 98th
    percentile of real wait over estimate (from estimates of CALIBRATE_FROM_S or more, once
    CALIBRATE_AFTER turns were measured, between 1 and MAX_SCALE)."""
    clock = FakeClock()
    adm = Admission(10.0, {"chat": 1.0}.__getitem__, clock=clock)

    def turn(ratio: float, work: float = 1.0) -> bool:
        """A turn of ``work`` worker seconds that waits ``ratio`` times its uncalibrated
        estimate; whether that was over the calibrated estimate it was admitted with."""
        res = adm.admit_realtime("chat", "chat")
        res.work_s = work
        clock.t += ratio * res.base_s
        adm.first_output(res)
        return ratio * res.base_s > res.estimate_s

    for _ in range(CALIBRATE_AFTER):
        turn(10.0)  # the first turns cost what the default said nothing about: no lesson
    assert adm.scale("chat") == 1.0
    rng = np.random.default_rng(0)
    over = [turn(r) for r in rng.uniform(1.0, 3.0, 4000)]
    assert 0.005 < np.mean(over[2000:]) < 0.05  # about 2 % of the turns wait longer than estimated
    assert 2.5 < adm.scale("chat") <= MAX_SCALE
    for _ in range(200):
        turn(100.0)
    assert adm.scale("chat") == MAX_SCALE
    fast = Admission(10.0, {"chat": 0.0}.__getitem__, clock=clock)
    for _ in range(CALIBRATE_AFTER + 2):
        res = fast.admit_realtime("chat", "chat")
        res.work_s = 0.1  # an idle estimate (0.1 s learned) teaches nothing
        clock.t += 5.0
        fast.first_output(res)
    assert fast.scale("chat") == 1.0


def test_the_work_of_a_turn_is_the_median_of_the_last_ones_measured():
    adm = Admission(10.0, {"chat": 0.0}.__getitem__, clock=FakeClock())
    for work in [30.0, 20.0, *[2.0] * 9]:  # two warm-up turns, then the usual ones
        res = adm.admit_realtime("chat", "chat")
        res.work_s = work
        adm.first_output(res)
    assert adm.work_s("chat") == 2.0
    assert adm.work_s("translate") == DEFAULT_WORK_S  # each mode its own
    for _ in range(WORK_WINDOW):
        res = adm.admit_realtime("chat", "chat")
        res.work_s = 3.0
        adm.first_output(res)
    assert adm.work_s("chat") == 3.0  # only the last WORK_WINDOW count


# ---- REST: 503 + Retry-After at once --------------------------------------------------------------
class Chat:
    """A chat engine without a model: each decoder step (``step_s``) gives "ab"; ``forever``
    never ends. ``started`` counts the steps begun; ``started_at_close`` is that count when
    the generation was closed."""

    name = "scripted"
    n_ctx = 1000
    max_parallel = None
    backend = None

    def __init__(self, step_s: float = 0.002):
        self.step_s = step_s
        self.started = 0
        self.started_at_close: int | None = None
        self.closed = threading.Event()

    def generate(self, messages, params):
        forever = messages[-1]["content"] == "forever"
        n = 0
        try:
            while forever or n < 3:
                n += 1
                self.started += 1
                time.sleep(self.step_s)
                yield ChatDelta("ab", 1, 0, 0)
            yield ChatDone(
                GenerationStats(prompt_tokens=1, new_tokens=n, target_forwards=n, finish_reason="eos")
            )
        finally:
            self.started_at_close = self.started
            self.closed.set()


class Speech:
    name = "fake-voice"
    tts = None

    def synthesize(self, text: str, speed: float = 1.0):
        return SimpleNamespace(samples=np.zeros(2205, np.float32), sample_rate=22_050, duration_s=0.1)


def _metric(text: str, name: str) -> float:
    return next((float(x.split()[-1]) for x in text.splitlines() if x.split(" ")[0] == name), 0.0)


def test_rest_requests_over_the_bound_get_503_with_retry_after_at_once():
    chat = Chat()
    app = create_app(ServerConfig(model="scripted", max_wait_s=5.0), chat=chat, speech=Speech())
    svc = app.state.speclive
    gate, running = threading.Event(), threading.Event()

    def hold() -> None:  # the chat worker is busy with a call measured at 30 s
        running.set()
        gate.wait(20)

    worker = svc.worker("chat")
    worker.costs.observe_call(hold.__qualname__, 30.0)
    body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        try:
            worker.submit(hold)
            assert running.wait(5)
            t0 = time.perf_counter()
            r = http.post("/v1/chat/completions", json=body)
            refused_in = time.perf_counter() - t0
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "server_overloaded"
            assert 25 <= int(r.headers["retry-after"]) <= 30  # the estimate, rounded up
            assert refused_in < 3  # at once, not after waiting in line
            # the speech worker is idle: its requests are still served
            speech = {"model": "tts-1", "input": "Hello.", "voice": "alloy", "response_format": "pcm"}
            assert http.post("/v1/audio/speech", json=speech).status_code == 200
            text = http.get("/metrics").text
            assert _metric(text, "speclive_admission_max_wait_seconds") == 5.0
            assert _metric(text, 'speclive_worker_wait_seconds{worker="chat"}') > 25
            assert _metric(text, 'speclive_admission_wait_seconds{kind="chat"}') > 25
            assert _metric(text, 'speclive_admission_wait_seconds{kind="speech"}') < 1
            assert _metric(text, 'speclive_admission_refusals_total{kind="chat",reason="capacity"}') == 1
        finally:
            gate.set()
        deadline = time.time() + 10
        while worker.wait_s() > 0 and time.time() < deadline:
            time.sleep(0.01)
        r = http.post("/v1/chat/completions", json=body)  # the worker is free again: served
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ababab"


# ---- client disconnects: compute freed within one decoder step -------------------------------------
@pytest.fixture
def cancel_marks(monkeypatch):
    """The step count of the engine in ``marks["chat"]`` at the first ``Stream.cancel()``."""
    marks: dict = {}
    cancel = Stream.cancel

    def marking(self) -> None:
        if "chat" in marks and "at_cancel" not in marks:
            marks["at_cancel"] = marks["chat"].started
        cancel(self)

    monkeypatch.setattr(Stream, "cancel", marking)
    return marks


@pytest.mark.parametrize("stream", [True, False])
def test_a_chat_client_that_leaves_frees_the_worker_within_one_decoder_step(cancel_marks, stream):
    chat = Chat(step_s=0.005)
    cancel_marks["chat"] = chat
    app = create_app(ServerConfig(model="scripted"), chat=chat)
    body = {"model": "scripted", "messages": [{"role": "user", "content": "forever"}], "stream": stream}
    with serve_in_thread(app) as url:
        if stream:
            with (
                httpx.Client(base_url=url, timeout=30) as http,
                http.stream("POST", "/v1/chat/completions", json=body) as r,
            ):
                lines = r.iter_lines()
                for _ in range(5):
                    next(lines)
        else:
            with httpx.Client(base_url=url, timeout=0.3) as http, pytest.raises(httpx.ReadTimeout):
                http.post("/v1/chat/completions", json=body)  # the client gives up and hangs up
        left = time.perf_counter()
        assert chat.closed.wait(10)
        freed_in = time.perf_counter() - left
    after_cancel = chat.started_at_close - cancel_marks["at_cancel"]
    print(f"chat stream={stream}: {after_cancel} steps began after the cancel; freed {freed_in:.3f} s after")
    assert after_cancel <= 1, (after_cancel, chat.started_at_close, cancel_marks)
    assert freed_in < 5


# ---- realtime: a scripted voice pipeline ---------------------------------------------------------
@dataclass
class Plan:
    """What the ``FakeVoice`` pipelines of a test do, and what they did."""

    steps: int = 4  #: decoder steps per answer
    step_s: float = 0.002
    #: the answer (counted over the session, from 1) whose decoder step ``fail_step`` raises
    fail_answer: int = 0
    fail_step: int = 1
    answers: int = 0
    started: int = 0
    aborted: int = 0
    pipelines: list = field(default_factory=list)
    #: an answer's metrics stay with the pipeline, which no longer reports work (a turn the
    #: policy ended early, whose speaker may still go on): its response is still open
    hold_metrics: bool = False
    #: set when a unit of an answer's decoder steps begins
    slicing: threading.Event = field(default_factory=threading.Event)


class FakeVoice:
    """A voice chat without models: a loud chunk opens a turn, a silent one ends it; the answer
    is a final transcript, ``plan.steps`` decoder steps (text deltas) sliced at the unit's
    deadline as ``VoiceChat`` slices them, then a sentence of audio and the turn's metrics."""

    background = False

    def __init__(self, plan: Plan):
        self.plan = plan
        self.clock = SessionClock()
        self.turn: SimpleNamespace | None = None
        self.left = 0
        self.history: list[dict] = []
        self.cfg = SimpleNamespace(turn=SimpleNamespace(end_s=0.5))
        plan.pipelines.append(self)

    @property
    def working(self) -> bool:
        return self.turn is not None

    def push(self, chunk: np.ndarray) -> list[ev.Event]:
        events: list[ev.Event] = []
        for i in range(0, len(chunk), 1600):  # 0.1 s pieces: appends may arrive together
            loud = float(np.abs(chunk[i : i + 1600]).max(initial=0.0)) > 0.1
            if loud and self.turn is None:
                self.turn = SimpleNamespace(ended=False, answer=0)
                events.append(ev.SpeechStarted(self.clock()))
            elif not loud and self.turn is not None and not self.turn.ended:
                self.turn.ended = True
                events.append(ev.SpeechStopped(self.clock(), end_of_turn=True))
        return events

    def step(self, deadline: float | None = None) -> list[ev.Event] | None:
        turn = self.turn
        if turn is None or not turn.ended:
            return None
        if not turn.answer:
            self.plan.answers += 1
            turn.answer, self.left = self.plan.answers, self.plan.steps
            return [ev.TranscriptFinal(self.clock(), text=f"question {turn.answer}")]
        events: list[ev.Event] = []
        self.plan.slicing.set()
        while self.left:
            events.append(self._decoder_step(turn.answer))
            if deadline is None or self.clock() >= deadline:
                return events
        self.history += [{"role": "user", "content": f"question {turn.answer}"}]
        self.turn = None
        audio = ev.AudioChunk(self.clock(), samples=np.zeros(2400, np.float32), sample_rate=24_000)
        metrics = ev.TurnMetrics(self.clock(), turn=turn.answer, answer="word " * self.plan.steps)
        return [*events, audio] if self.plan.hold_metrics else [*events, audio, metrics]

    def _decoder_step(self, answer: int) -> ev.Event:
        self.plan.started += 1
        if answer == self.plan.fail_answer and self.plan.steps - self.left + 1 == self.plan.fail_step:
            raise RuntimeError("injected model failure")
        time.sleep(self.plan.step_s)
        self.left -= 1
        return ev.AnswerDelta(self.clock(), text="word ")

    def abort(self) -> None:
        self.plan.aborted += 1


@pytest.fixture
def voice(monkeypatch):
    """A server whose realtime sessions run ``FakeVoice`` pipelines; yields (url, app, plan)."""
    plan = Plan()
    monkeypatch.setattr(rt_session, "pipeline_for", lambda settings, models, turn: FakeVoice(plan))
    config = ServerConfig(model="scripted", max_wait_s=5.0)
    app = create_app(config, chat=Chat(), speech=Speech(), live_transcriber=object())
    with serve_in_thread(app) as url:
        yield url.replace("http://", "ws://") + "/v1/realtime", app, plan


def _say(ws, loud: bool) -> None:
    x = np.full(2400, 0.5 if loud else 0.0, np.float32)  # 0.1 s at 24 kHz
    ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16(x)).decode()}))


def _until(ws, want: str, timeout: float = 20) -> list[dict]:
    """Events up to and with the first of type ``want``."""
    out: list[dict] = []
    deadline = time.time() + timeout
    while True:
        try:
            out.append(json.loads(ws.recv(timeout=max(0.1, deadline - time.time()))))
        except TimeoutError:
            raise AssertionError(f"no {want} in {timeout} s; got {[e['type'] for e in out]}") from None
        if out[-1]["type"] == want:
            return out


def _turn(ws) -> list[dict]:
    """One spoken turn; the events up to its response.done."""
    _say(ws, True)
    _say(ws, False)
    return _until(ws, "response.done")


def _wait_released(app, timeout: float = 10) -> None:
    deadline = time.time() + timeout
    while app.state.speclive.sessions.live and time.time() < deadline:
        time.sleep(0.02)
    assert app.state.speclive.sessions.live == 0


def test_realtime_turn_over_the_bound_is_refused_with_an_error_and_1013(voice, monkeypatch):
    url, app, plan = voice
    svc = app.state.speclive
    with connect(url, open_timeout=10) as ws:
        _until(ws, "session.created")
        done = _turn(ws)[-1]  # an idle server answers
        assert done["response"]["status"] == "completed"
        assert svc.admission.work_s("chat") > 0  # measured on that turn
        assert svc.admission.open_turns("chat") == 0  # its reservation closed at its first output
        monkeypatch.setattr(svc.worker("chat"), "wait_s", lambda: 30.0)  # the worker is swamped
        _say(ws, True)
        _say(ws, False)
        t0 = time.perf_counter()
        events = _until(ws, "error")
        types = [e["type"] for e in events]
        assert "input_audio_buffer.committed" in types and "response.created" not in types, types
        err = events[-1]["error"]
        assert err["code"] == "server_overloaded" and "retry" in err["message"], err
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1013
        assert time.perf_counter() - t0 < 3  # at once
    assert plan.answers == 1  # the refused turn was not computed
    with connect(url, open_timeout=10) as ws:  # a new session is refused at once, as when full
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1013 and "overloaded" in closed.value.rcvd.reason
    _wait_released(app)
    text = svc.metrics.render().decode()
    assert _metric(text, 'speclive_admission_refusals_total{kind="realtime",reason="capacity"}') == 2
    assert _metric(text, 'speclive_realtime_work_to_first_output_seconds{mode="chat"}') > 0
    assert _metric(text, 'speclive_admission_open_turns{worker="chat"}') == 0


def test_a_model_failure_mid_answer_is_an_error_and_the_session_goes_on(voice):
    url, app, plan = voice
    # a decoder step longer than a pipeline unit (0.1 s): each step is a worker call of its own,
    # so the second answer's first delta goes out before its second step fails
    plan.step_s, plan.fail_answer, plan.fail_step = 0.11, 2, 2
    with connect(url, open_timeout=10) as ws:
        _until(ws, "session.created")
        assert _turn(ws)[-1]["response"]["status"] == "completed"
        events = _turn(ws)  # the second answer fails in its second decoder step
        types = [e["type"] for e in events]
        err = next(e["error"] for e in events if e["type"] == "error")
        assert err["code"] == "server_error", err
        assert types.index("response.output_audio_transcript.delta") < types.index("error"), types
        assert events[-1]["response"]["status"] == "failed", types
        events = _turn(ws)  # the session goes on: the next turn is answered
        assert events[-1]["response"]["status"] == "completed"
        assert not any(e["type"] == "error" for e in events)
        answer = next(e for e in events if e["type"] == "response.output_audio_transcript.done")
        assert answer["transcript"] == "word " * plan.steps
    _wait_released(app)
    # the failed pipeline was dropped; the new one went on with the conversation so far
    assert len(plan.pipelines) == 2 and plan.aborted == 2
    assert plan.pipelines[1].history[0] == {"role": "user", "content": "question 1"}


def test_a_pipeline_replaced_under_an_open_response_ends_it_first(voice):
    # a session.update that needs another pipeline, while the answer's metrics are held: the
    # old pipeline is dropped, and its response still gets its response.done
    url, app, plan = voice
    plan.hold_metrics = True
    with connect(url, open_timeout=10) as ws:
        _until(ws, "session.created")
        _say(ws, True)
        _say(ws, False)
        rid = _until(ws, "response.created")[-1]["response"]["id"]
        _until(ws, "response.output_audio.delta")
        update = {"turn_detection": {"type": "server_vad", "silence_duration_ms": 900}}
        ws.send(json.dumps({"type": "session.update", "session": update}))
        events = _until(ws, "session.updated")
        done = [e for e in events if e["type"] == "response.done"]
        assert [d["response"]["id"] for d in done] == [rid], [e["type"] for e in events]
        assert done[0]["response"]["status"] == "incomplete"
        plan.hold_metrics = False
        assert _turn(ws)[-1]["response"]["status"] == "completed"  # the new pipeline answers
    _wait_released(app)
    assert len(plan.pipelines) == 2


@pytest.mark.parametrize("queued", [False, True])
def test_a_realtime_client_that_leaves_mid_answer_frees_the_worker_within_one_decoder_step(
    voice, monkeypatch, queued
):
    """The server stops the answer's compute after the decoder step in progress (its session
    clock passes the unit's deadline), and a unit still queued when the client left computes
    nothing (``queued``: the worker is held while the client leaves). Before, either computed
    on to its deadline (0.1 s: here up to 20 steps) for nobody."""
    url, app, plan = voice
    plan.steps, plan.step_s = 2000, 0.005  # a 10 s answer, 20 decoder steps per 0.1 s slice
    marks: dict = {}
    stopped = threading.Event()
    stop = RealtimeSession.stop_compute

    def marking(self) -> None:
        marks.setdefault("at_stop", plan.started)
        stop(self)
        stopped.set()

    monkeypatch.setattr(RealtimeSession, "stop_compute", marking)
    gate, holding = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        gate.wait(10)

    worker = app.state.speclive.worker("chat")
    # this client stops reading while the answer streams, so its close frame's reply waits behind
    # what it has not read: it hangs up after 1 s instead of the library's 10 s
    with connect(url, open_timeout=10, close_timeout=1) as ws:
        _until(ws, "session.created")
        _say(ws, True)
        _say(ws, False)
        _until(ws, "response.output_audio_transcript.delta")
        plan.slicing.clear()
        assert plan.slicing.wait(10)  # the client leaves while a unit of the answer computes
        if queued:  # the worker is held; the session's next unit waits in line behind it
            worker.submit(hold)
            assert holding.wait(10)
            deadline = time.time() + 10
            while not worker.pending and time.time() < deadline:
                time.sleep(0.005)
            assert worker.pending
    assert stopped.wait(10)
    gate.set()
    _wait_released(app)
    after = plan.started - marks["at_stop"]
    print(f"realtime queued={queued}: {after} decoder steps began after the server saw the client leave")
    assert plan.aborted == 1
    assert after <= (0 if queued else 1), after
