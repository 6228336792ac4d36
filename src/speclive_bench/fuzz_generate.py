"""Fuzzing that generates: real answers under random interruptions (``speclive bench fuzz
--responses N``).

The schema and event fuzzers (``fuzz.py``, ``fuzz_realtime.py``) send mostly requests the
server refuses; this one makes the server answer, and interrupts it while it does:

- REST: ``POST /v1/chat/completions`` with a short prompt, ``max_tokens`` drawn from 1 to 256
  (log-uniform, plus the edges), ``stream`` true or false, and often a client that leaves
  mid-answer (a stream closed after a random number of chunks, a whole request given up after
  a random timeout);
- realtime: sessions of one to three spoken turns (a question spoken at 24 kHz, silence, a
  commit); while the answer plays the client does one of: ``response.cancel``,
  ``conversation.item.truncate`` of the answer's item, ``session.update`` (instructions,
  voice, modalities or turn detection), ``input_audio_buffer.append`` (speech: a barge-in, or
  noise), ``conversation.item.create`` with text plus ``response.create`` with a
  ``max_response_output_tokens`` budget, or nothing; sometimes it disconnects mid-answer.

Counts (``GenerateReport``): a REST response is *generated* when the server sent content
(a non-empty message, a content chunk) or the client closed a stream after its first chunk (a
whole request the client gave up on is counted apart, as left mid-answer); a
realtime response is *generated* when its ``response.done`` came after ``response.created``
with output (a transcript or audio delta) or with status ``cancelled``. Created responses and
``response.done`` by status are counted apart.

Invariants: no 5xx but clean refusals (503 ``server_overloaded`` with ``Retry-After``, counted
apart); every 4xx is an OpenAI error object; a whole completion has a choice, a finish reason
and ``usage.completion_tokens`` within ``max_tokens``; a finished stream ends with
``data: [DONE]`` after a chunk with a finish reason; realtime: every frame is checked as in
``fuzz_realtime`` (JSON, ``type``, ``event_id``, error objects), no event of a response after
its ``response.done``, no ``response.done`` without ``response.created``, and every response
created ends with a ``response.done`` before the session's sentinel is answered (a client that
disconnects mid-answer excepted).

The server's resident memory (``/proc/<pid>/status`` of the process that serves; the
benchmark runs the server in-process, so this is the server and its fuzzing clients) is
sampled before, every few seconds during, and after the run once the server settled.
"""

from __future__ import annotations

import base64
import json
import math
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from speclive_bench import mappings
from speclive_bench.fuzz import error_object_problem
from speclive_bench.fuzz_realtime import RealtimeFuzzReport, _Conn, _settled, _speech_chunks, scrape

#: the largest answer budget drawn
MAX_BUDGET = 256
PROMPTS = (
    "Hi!",
    "What is the capital of France?",
    "Count from one to fifty.",
    "Write a short poem about the sea.",
    "Explain what a neural network is.",
    "List ten fruits.",
    "Tell me a long story about a dragon.",
    "2+2=?",
    "Translate 'good morning' into German.",
    "Why is the sky blue? Answer in detail.",
)
INSTRUCTIONS = ("Answer briefly.", "You are a pirate.", "Speak slowly and in detail.", "")
VOICES = ("alloy", "echo", "nova", "piper-joe-medium")
#: what a realtime client does while an answer plays, and how often (weights)
MID_ANSWER = {
    "cancel": 3,
    "truncate": 2,
    "session.update": 2,
    "append speech": 1,
    "append noise": 1,
    "item.create + response.create": 2,
    "disconnect": 1,
    "nothing": 2,
}


def rss_bytes(pid: int | None = None) -> int:
    """Resident memory of a process (``VmRSS`` of ``/proc/<pid>/status``), in bytes."""
    with open(f"/proc/{pid or os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """A thread sampling a process's RSS every ``period`` seconds: ``series`` of (s, bytes);
    ``watch`` also reads its mappings then and keeps those that stepped up
    (``mappings.StepWatch``; ``watch.found``)."""

    def __init__(self, period: float = 5.0, pid: int | None = None) -> None:
        self.period, self.pid = period, pid
        self.series: list[tuple[float, int]] = []
        self.watch = mappings.StepWatch(pid or os.getpid())
        self._t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fuzz-rss")

    def _run(self) -> None:
        while not self._stop.is_set():
            t = round(time.perf_counter() - self._t0, 1)
            self.series.append((t, rss_bytes(self.pid)))
            self.watch.sample(t)
            self._stop.wait(self.period)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def draw_budget(rng: random.Random) -> int:
    """An answer budget in 1..MAX_BUDGET: the edges now and then, else log-uniform."""
    r = rng.random()
    if r < 0.05:
        return 1
    if r < 0.15:
        return MAX_BUDGET
    return max(1, min(MAX_BUDGET, int(math.exp(rng.uniform(0, math.log(MAX_BUDGET))))))


@dataclass
class RestPlan:
    """One generated chat request and how the client treats it."""

    body: dict[str, Any]
    #: streams: close after this many chunks (None: read to the end)
    cancel_after_chunks: int | None = None
    #: whole requests: give up after this many seconds (None: wait)
    give_up_s: float | None = None


def rest_plan(rng: random.Random, model: str) -> RestPlan:
    """A chat request with a real budget, streamed or not, maybe left mid-answer."""
    messages: list[dict[str, str]] = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(INSTRUCTIONS) or "Be helpful."})
    if rng.random() < 0.3:  # an earlier exchange
        messages += [
            {"role": "user", "content": rng.choice(PROMPTS)},
            {"role": "assistant", "content": "Sure."},
        ]
    messages.append({"role": "user", "content": rng.choice(PROMPTS)})
    body: dict[str, Any] = {"model": model, "messages": messages, "stream": rng.random() < 0.6}
    body["max_completion_tokens" if rng.random() < 0.2 else "max_tokens"] = draw_budget(rng)
    if rng.random() < 0.3:
        body["temperature"] = rng.choice([0.0, 0.7, 1.5])
    if rng.random() < 0.15:
        body["stop"] = rng.choice([".", ["\n", "!"], "the"])
    if body["stream"] and rng.random() < 0.3:
        body["stream_options"] = {"include_usage": True}
    plan = RestPlan(body)
    if rng.random() < 0.4:  # the client leaves mid-answer
        if body.get("stream"):
            plan.cancel_after_chunks = rng.randint(0, 40)
        else:
            plan.give_up_s = rng.uniform(0.05, 2.0)
    return plan


@dataclass
class TurnPlan:
    """One spoken turn of a realtime session and what the client does mid-answer."""

    action: str
    #: the action comes after this many output deltas of the answer
    after_deltas: int
    budget: int = 0
    update: dict[str, Any] = field(default_factory=dict)


def session_update(rng: random.Random) -> dict[str, Any]:
    """A ``session.update`` payload changing one to three things a client changes mid-answer."""
    choices: dict[str, Callable[[], Any]] = {
        "instructions": lambda: rng.choice(INSTRUCTIONS),
        "voice": lambda: rng.choice(VOICES),
        "modalities": lambda: rng.choice([["text"], ["audio", "text"]]),
        "turn_detection": lambda: rng.choice(
            [None, {"type": "server_vad"}, {"type": "semantic_vad", "eagerness": "high"}]
        ),
    }
    keys = rng.sample(sorted(choices), rng.randint(1, 3))
    return {k: choices[k]() for k in keys}


def realtime_plan(rng: random.Random) -> list[TurnPlan]:
    """One to three turns, each with its mid-answer action."""
    names, weights = zip(*MID_ANSWER.items(), strict=True)
    turns = []
    for _ in range(rng.randint(1, 3)):
        action = rng.choices(names, weights)[0]
        turn = TurnPlan(action, rng.randint(0, 12), draw_budget(rng))
        if action == "session.update":
            turn.update = session_update(rng)
        turns.append(turn)
        if action == "disconnect":
            break
    return turns


class ResponseTracker:
    """Follows the responses of one realtime connection through the server's events."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.done: dict[str, str] = {}
        #: (response id, stream) pairs whose ``<stream>.done`` came
        self.parts_done: set[tuple[str, str]] = set()
        #: response id -> its output item's id
        self.items: dict[str, str] = {}
        self.output: Counter = Counter()
        self.violations: list[tuple[str, str]] = []

    def feed(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type", "")
        if kind == "response.created":
            rid = (msg.get("response") or {}).get("id")
            if rid in self.created:
                self.violations.append(("response.created twice", str(rid)))
            self.created.append(rid)
            return
        if kind == "response.done":
            rid = (msg.get("response") or {}).get("id")
            if rid not in self.created:
                self.violations.append(("response.done without response.created", str(rid)))
            elif rid in self.done:
                self.violations.append(("response.done twice", str(rid)))
            self.done[rid] = str((msg.get("response") or {}).get("status"))
            return
        rid = msg.get("response_id")
        if rid is None:
            return
        if rid in self.done:
            self.violations.append((f"{kind} after response.done", str(rid)))
        elif rid not in self.created:
            self.violations.append((f"{kind} before response.created", str(rid)))
        elif kind.endswith(".delta") and (rid, kind[: -len(".delta")]) in self.parts_done:
            self.violations.append((f"{kind} after {kind[: -len('.delta')]}.done", str(rid)))
        if kind.endswith(".done"):
            self.parts_done.add((rid, kind[: -len(".done")]))
        if kind == "response.output_item.added":
            self.items[rid] = str((msg.get("item") or {}).get("id"))
        if kind.endswith(".delta"):
            self.output[rid] += 1

    def open(self) -> list[str]:
        """Responses created and not done."""
        return [r for r in self.created if r not in self.done]

    def generated(self) -> int:
        """Responses done after output, or cancelled (see the module's definition)."""
        return sum(1 for r, s in self.done.items() if self.output[r] > 0 or s == "cancelled")

    def current(self) -> str | None:
        return self.created[-1] if self.created and self.created[-1] not in self.done else None

    def deltas(self, rid: str | None) -> int:
        return self.output[rid] if rid else 0


@dataclass
class GenerateReport:
    rest_requests: int = 0
    rest_statuses: Counter = field(default_factory=Counter)
    #: REST: answered with content, left by the client mid-answer
    rest_generated: int = 0
    rest_left_mid_answer: int = 0
    rest_refused: int = 0
    rest_tokens: int = 0
    budgets: Counter = field(default_factory=Counter)
    realtime_sessions: int = 0
    #: sessions refused with 1013 (server full) for the whole of the client's retries
    realtime_refused: int = 0
    realtime_turns: int = 0
    realtime_created: int = 0
    realtime_done: Counter = field(default_factory=Counter)
    realtime_generated: int = 0
    #: turns whose answer never began (no response.created)
    realtime_no_answer: int = 0
    mid_answer: Counter = field(default_factory=Counter)
    ws: RealtimeFuzzReport = field(default_factory=RealtimeFuzzReport)
    violations: list[tuple[str, str]] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)
    #: mappings whose resident memory stepped up between two of the sampler's readings
    rss_steps: list[dict[str, Any]] = field(default_factory=list)
    rss_before: int = 0
    rss_after: int = 0
    seconds: float = 0.0
    stopped_by_time: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def generated(self) -> int:
        return self.rest_generated + self.realtime_generated

    def add_violation(self, why: str, detail: str) -> None:
        with self.lock:
            self.violations.append((why, detail[:300]))

    def to_dict(self) -> dict[str, Any]:
        five = sum(v for k, v in self.rest_statuses.items() if k >= 500)
        during = [b for _, b in self.rss]
        return {
            "generated_responses": self.generated,
            "rest": {
                "requests": self.rest_requests,
                "statuses": {str(k): v for k, v in sorted(self.rest_statuses.items())},
                "5xx_not_refusals": five - self.rest_refused,
                "refused_503": self.rest_refused,
                "generated": self.rest_generated,
                "left_mid_answer": self.rest_left_mid_answer,
                "completion_tokens": self.rest_tokens,
            },
            "budgets": {
                "1": self.budgets["1"],
                "2-16": self.budgets["2-16"],
                "17-64": self.budgets["17-64"],
                "65-255": self.budgets["65-255"],
                "256": self.budgets["256"],
            },
            "realtime": {
                "sessions": self.realtime_sessions,
                "sessions_refused": self.realtime_refused,
                "turns": self.realtime_turns,
                "responses_created": self.realtime_created,
                "responses_done": dict(self.realtime_done),
                "generated": self.realtime_generated,
                "turns_without_answer": self.realtime_no_answer,
                "mid_answer_actions": dict(self.mid_answer.most_common()),
                "server_events": dict(self.ws.server_events.most_common()),
                "error_codes": dict(self.ws.error_codes.most_common()),
                "close_codes": {str(k): v for k, v in sorted(self.ws.close_codes.items())},
                "client_events": self.ws.events,
            },
            "violations": [list(v) for v in self.violations + self.ws.violations],
            "rss": {
                "before_bytes": self.rss_before,
                "during_max_bytes": max(during, default=0),
                "after_bytes": self.rss_after,
                "growth_after_pct": round(100 * (self.rss_after / self.rss_before - 1), 2)
                if self.rss_before
                else None,
                "series_s_bytes": self.rss,
                "steps": self.rss_steps,
            },
            "seconds": round(self.seconds, 1),
            "stopped_by_time": self.stopped_by_time,
        }


def budget_bin(n: int) -> str:
    if n <= 1:
        return "1"
    if n >= MAX_BUDGET:
        return "256"
    return "2-16" if n <= 16 else "17-64" if n <= 64 else "65-255"


# ---- REST ----------------------------------------------------------------------------------
def _refused(status: int, headers: Any, content: bytes) -> bool:
    """A clean refusal: 503 ``server_overloaded`` with ``Retry-After``."""
    if status != 503 or "retry-after" not in headers:
        return False
    try:
        return json.loads(content)["error"]["code"] == "server_overloaded"
    except (ValueError, KeyError, TypeError):
        return False


def _check_whole(body: dict[str, Any], budget: int) -> tuple[str | None, bool, int]:
    """(problem, content?, completion tokens) of a whole chat completion."""
    try:
        choice = body["choices"][0]
        text = choice["message"]["content"]
        tokens = int(body["usage"]["completion_tokens"])
    except (KeyError, IndexError, TypeError, ValueError):
        return "completion without choices[0].message.content and usage", False, 0
    if choice.get("finish_reason") not in ("stop", "length"):
        return f"finish_reason {choice.get('finish_reason')!r}", bool(text), tokens
    if tokens > budget:
        return f"{tokens} completion tokens over max_tokens {budget}", bool(text), tokens
    return None, bool(text), tokens


def _stream(http: httpx.Client, plan: RestPlan, budget: int) -> tuple[int, Any, bytes, dict[str, Any]]:
    """Read (or leave) a stream: (status, headers, error body, what was seen)."""
    seen: dict[str, Any] = {"chunks": 0, "content": 0, "finish": None, "done": False, "left": False}
    seen["tokens"], seen["problem"] = 0, None
    with http.stream("POST", "/v1/chat/completions", json=plan.body) as r:
        if r.status_code != 200:
            return r.status_code, r.headers, r.read(), seen
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                seen["done"] = True
                break
            try:
                obj = json.loads(line[6:])
            except ValueError:
                seen["problem"] = f"stream line is not JSON: {line[:100]!r}"
                break
            if "error" in obj:
                seen["problem"] = f"error in the stream: {line[:200]}"
            for c in obj.get("choices") or []:
                seen["content"] += bool((c.get("delta") or {}).get("content"))
                seen["finish"] = c.get("finish_reason") or seen["finish"]
            seen["tokens"] = int((obj.get("usage") or {}).get("completion_tokens") or seen["tokens"])
            seen["chunks"] += 1
            if plan.cancel_after_chunks is not None and seen["chunks"] > plan.cancel_after_chunks:
                seen["left"] = True  # leaving the block closes the connection mid-stream
                break
        return 200, r.headers, b"", seen


def rest_one(http: httpx.Client, plan: RestPlan, report: GenerateReport) -> None:
    """Send one planned chat request, check what came back and count it."""
    body = plan.body
    budget = int(body.get("max_tokens") or body.get("max_completion_tokens") or MAX_BUDGET)
    generated = left = False
    tokens, problem = 0, None
    try:
        if body.get("stream"):
            status, headers, content, seen = _stream(http, plan, budget)
            generated = seen["content"] > 0 or (seen["left"] and seen["chunks"] > 0)
            left, tokens, problem = seen["left"], seen["tokens"], seen["problem"]
            if status == 200 and not left and problem is None:
                if not seen["done"] or seen["finish"] not in ("stop", "length"):
                    problem = f"stream ended without a finish reason and [DONE]: {seen}"
                elif tokens > budget:
                    problem = f"{tokens} completion tokens over max_tokens {budget}"
        else:
            timeout = plan.give_up_s if plan.give_up_s is not None else 300
            r = http.post("/v1/chat/completions", json=body, timeout=timeout)
            status, headers, content = r.status_code, r.headers, r.content
            if status == 200:
                problem, generated, tokens = _check_whole(r.json(), budget)
    except httpx.TimeoutException:
        status, headers, content, left = 0, {}, b"", True
    with report.lock:
        report.rest_requests += 1
        report.budgets[budget_bin(budget)] += 1
        report.rest_statuses[status] += 1
        report.rest_generated += generated
        report.rest_left_mid_answer += left
        report.rest_tokens += tokens
        if _refused(status, headers, content):
            report.rest_refused += 1
            return
    if status and status != 200:
        problem = error_object_problem(status, content)
    if problem is not None:
        report.add_violation(f"REST {status}: {problem}", json.dumps(body)[:200])


# ---- realtime ------------------------------------------------------------------------------
class TrackedConn(_Conn):
    """A realtime connection whose every server event also goes through a ``ResponseTracker``."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.tracker = ResponseTracker()
        #: the server kept refusing the session (1013) for as long as the client retried
        self.refused = False
        super().__init__(*args, **kw)

    def violation(self, why: str, detail: str) -> None:
        # a session refused as the server was full (1013) is a clean refusal, not a fault
        if why == "no session.created" and self.close_code == 1013:
            self.refused = True
            return
        super().violation(why, detail)

    def recv(self, timeout: float) -> dict | None:
        msg = super().recv(timeout)
        if msg is not None:
            self.tracker.feed(msg)
        return msg

    def send_json(self, event: dict[str, Any]) -> bool:
        return self.send(json.dumps(event))

    def speak(self, chunks: list[str], silence: str) -> bool:
        """A spoken turn: the question, a second of silence, a commit (for sessions without
        server VAD; with it, the silence ends the turn and the commit changes nothing)."""
        for c in [*chunks, silence]:
            if not self.send_json({"type": "input_audio_buffer.append", "audio": c}):
                return False
        return self.send_json({"type": "input_audio_buffer.commit"})

    def quiet(self, timeout: float, still_s: float = 2.0) -> None:
        """Read until no response is open and nothing came for ``still_s`` (or ``timeout``)."""
        deadline = time.time() + timeout
        last = time.time()
        while time.time() < deadline and self.close_code is None:
            if self.recv(0.2) is not None:
                last = time.time()
            elif not self.tracker.open() and time.time() - last > still_s:
                return


def mid_answer(conn: TrackedConn, turn: TurnPlan, rid: str, rng: random.Random, chunks: list[str]) -> None:
    """Do the turn's action while response ``rid`` plays."""
    a = turn.action
    if a == "cancel":
        conn.send_json({"type": "response.cancel"})
    elif a == "truncate":
        conn.send_json(
            {
                "type": "conversation.item.truncate",
                "item_id": conn.tracker.items.get(rid, "item_unknown"),
                "content_index": 0,
                "audio_end_ms": rng.randint(0, 3000),
            }
        )
    elif a == "session.update":
        conn.send_json({"type": "session.update", "session": turn.update})
    elif a == "append speech":  # a barge-in: the user talks over the answer
        for c in chunks:
            conn.send_json({"type": "input_audio_buffer.append", "audio": c})
    elif a == "append noise":
        noise = (np.random.default_rng(rng.randint(0, 2**31)).normal(0, 800, 7200)).astype("<i2")
        conn.send_json(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(noise.tobytes()).decode()}
        )
    elif a == "item.create + response.create":
        text = {"type": "input_text", "text": rng.choice(PROMPTS)}
        item = {"type": "message", "role": "user", "content": [text]}
        conn.send_json({"type": "conversation.item.create", "item": item})
        key = rng.choice(["max_output_tokens", "max_response_output_tokens"])
        conn.send_json({"type": "response.create", "response": {key: turn.budget}})


def realtime_one(
    ws_url: str,
    headers: dict[str, str],
    turns: list[TurnPlan],
    chunks: list[str],
    rng: random.Random,
    report: GenerateReport,
) -> None:
    """One realtime session playing ``turns``; counts its responses and checks them."""
    silence = base64.b64encode(b"\0" * 48_000).decode("ascii")
    conn = TrackedConn(ws_url, headers, report.ws, "generate")
    if conn.refused:
        with report.lock:
            report.realtime_refused += 1
        return
    t, left = conn.tracker, False
    for turn in turns:
        with report.lock:
            report.realtime_turns += 1
            report.mid_answer[turn.action] += 1
            report.budgets[budget_bin(turn.budget)] += turn.action == "item.create + response.create"
        n = len(t.created)
        if not conn.speak(chunks, silence):
            break
        conn.wait_for(lambda m, n=n: len(t.created) > n, 90)
        if len(t.created) <= n:
            with report.lock:
                report.realtime_no_answer += 1
            continue
        rid = t.created[n]
        k = turn.after_deltas
        conn.wait_for(lambda m, rid=rid, k=k: t.deltas(rid) >= k or rid in t.done, 90)
        if turn.action == "disconnect":
            conn.abort()
            left = True
            break
        mid_answer(conn, turn, rid, rng, chunks)
        conn.quiet(120)
    if not left and conn.close_code is None:
        conn.sentinel()
        conn.quiet(120)
        for rid in t.open():
            conn.violation("no response.done", rid)
        conn.close()
    with report.lock:
        report.realtime_sessions += 1
        report.realtime_created += len(t.created)
        report.realtime_done.update(t.done.values())
        report.realtime_generated += t.generated()
        report.violations += [(f"realtime: {w}", d) for w, d in t.violations]


# ---- the run -------------------------------------------------------------------------------
def fuzz_generate(
    url: str,
    responses: int,
    model: str,
    speech: np.ndarray,
    api_key: str | None = None,
    seed: int = 0,
    max_seconds: float = 3600.0,
    rest_clients: int = 2,
    realtime_clients: int = 2,
    rss_period_s: float = 5.0,
    settle_s: float = 15.0,
    progress: Callable[[int], None] | None = None,
) -> GenerateReport:
    """Generate at least ``responses`` responses (REST and realtime clients at once) or go on
    for ``max_seconds``; RSS before (after a warm-up request and turn), during and after."""
    ws_url = url.replace("http://", "ws://", 1) + "/v1/realtime"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    chunks = _speech_chunks(speech)
    report = GenerateReport()
    with httpx.Client(base_url=url, headers=headers, timeout=300) as http:
        # warm-up (not counted): every model is loaded before the memory is measured
        rest_one(
            http,
            RestPlan({"model": model, "messages": [{"role": "user", "content": "Hi"}]}),
            GenerateReport(),
        )
        realtime_one(ws_url, headers, [TurnPlan("nothing", 0)], chunks, random.Random(seed), GenerateReport())
        time.sleep(3)
        gauges = scrape(http)
        report.rss_before = rss_bytes()
        t0 = time.perf_counter()
        deadline = t0 + max_seconds

        def more() -> bool:
            if report.generated >= responses:
                return False
            report.stopped_by_time |= time.perf_counter() > deadline
            return not report.stopped_by_time

        def rest_loop(i: int) -> None:
            rng = random.Random(f"{seed}-rest-{i}")
            with httpx.Client(base_url=url, headers=headers, timeout=300) as client:
                while more():
                    plan = rest_plan(rng, model)
                    _guarded(lambda plan=plan: rest_one(client, plan, report), "REST client", report)
                    if progress is not None:
                        progress(report.generated)

        def realtime_loop(i: int) -> None:
            rng = random.Random(f"{seed}-realtime-{i}")
            while more():
                turns = realtime_plan(rng)
                _guarded(
                    lambda turns=turns: realtime_one(ws_url, headers, turns, chunks, rng, report),
                    "realtime client",
                    report,
                )

        loops = [(rest_loop, i) for i in range(rest_clients)] + [
            (realtime_loop, i) for i in range(realtime_clients)
        ]
        with RssSampler(rss_period_s) as sampler:
            threads = [threading.Thread(target=f, args=(i,), daemon=True) for f, i in loops]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            report.seconds = time.perf_counter() - t0
            _settled(http, gauges)
            time.sleep(settle_s)
        report.rss, report.rss_steps = sampler.series, sampler.watch.found
        report.rss_after = rss_bytes()
        if http.get("/health").status_code != 200:
            report.add_violation("/health is not 200 after the run", "")
    return report


def _guarded(f: Callable[[], None], who: str, report: GenerateReport) -> None:
    """Run one request or session: an exception is a finding, and the client goes on."""
    try:
        f()
    except Exception as e:
        report.add_violation(f"{who} raised", f"{type(e).__name__}: {e}")
        time.sleep(1.0)
