"""Fuzzing of ``WS /v1/realtime``: generated event scripts and hostile clients.

``fuzz_realtime(url, config, events=N)`` opens one connection per generated script (hypothesis:
valid and broken events of every client type, wrong field types, JSON that is not an object,
text that is not JSON, binary frames, base64 that is not audio, real audio, events in any order,
and now and then a disconnect without a close frame), then runs the hostile clients one by one:
a frame over the size limit, a flood over the event rate, a client that stops reading, a client
that leaves mid-answer, a turn longer than the limit, a silent client (idle timeout).

Invariants checked on every connection:

- every server frame is a JSON object with a ``type`` and an ``event_id``; every ``error``
  event has a non-empty ``code`` and ``message``;
- the server answers a sentinel event after the script (the session still works) unless it
  closed the connection, and it closes only with a clean code (1000, 1008, 1009, 1013), never
  1011 (internal error) or without a close frame;
- a control session held open for the whole run gets nothing but its own replies (no crossed
  state) and still answers after each batch; ``/health`` answers 200 after each batch;
- afterwards no session is left open, and the event loop holds no more tasks than before
  (``/metrics``: ``speclive_live_sessions``, ``speclive_asyncio_tasks``).

The caller runs the server in-process and counts its ``ERROR`` log records (a crashed session
logs one); ``speclive bench fuzz`` and ``tests/test_realtime_fuzz.py`` do.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from speclive.server.audio import pcm16, resample

#: close codes a server may end a connection with after bad input (1000 normal, 1008 policy:
#: auth or a client that stopped reading, 1009 frame too big, 1013 server full)
CLEAN_CLOSES = frozenset({1000, 1008, 1009, 1013})
CLIENT_TYPES = (
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "response.create",
    "response.cancel",
    "conversation.item.create",
    "conversation.item.truncate",
    "conversation.item.delete",
    "transcription_session.update",
)
#: frames above uvicorn's default WebSocket message limit (16 MiB)
HUGE_FRAME_BYTES = 17 * 1024 * 1024
#: the longest an event flood goes on waiting for the server's rate limit
FLOOD_MAX_S = 30.0


@dataclass
class RealtimeFuzzReport:
    scripts: int = 0
    #: client frames sent, generated and hostile; of them, in generated scripts
    events: int = 0
    generated_events: int = 0
    server_events: Counter = field(default_factory=Counter)
    error_codes: Counter = field(default_factory=Counter)
    close_codes: Counter = field(default_factory=Counter)
    aborted: int = 0
    #: connections refused with 1013 (server full) and tried again
    refused: int = 0
    #: (why, detail)
    violations: list[tuple[str, str]] = field(default_factory=list)
    #: hostile client -> what happened (passed or the violation)
    scenarios: dict[str, str] = field(default_factory=dict)
    scenario_seconds: dict[str, float] = field(default_factory=dict)
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "scripts": self.scripts,
            "events": self.events,
            "generated_events": self.generated_events,
            "server_events": dict(self.server_events.most_common()),
            "error_codes": dict(self.error_codes.most_common()),
            "close_codes": {str(k): v for k, v in sorted(self.close_codes.items())},
            "aborted_connections": self.aborted,
            "refused_full": self.refused,
            "violations": [list(v) for v in self.violations],
            "scenarios": self.scenarios,
            "scenario_seconds": self.scenario_seconds,
            "before": self.before,
            "after": self.after,
            "seconds": round(self.seconds, 2),
        }


#: the leak-relevant gauges of ``/metrics`` (and the KV cache's evictions and restores), by
#: their name in a sample
LEAK_GAUGES = {
    "speclive_live_sessions": "sessions",
    "speclive_asyncio_tasks": "tasks",
    "process_resident_memory_bytes": "rss_bytes",
    "process_open_fds": "open_fds",
    "speclive_memory_trimmed_bytes_total": "trimmed_bytes",
    'speclive_memory_heap_bytes{kind="in_use"}': "heap_in_use_bytes",
    'speclive_memory_heap_bytes{kind="arenas"}': "heap_arenas_bytes",
    'speclive_memory_heap_bytes{kind="mapped"}': "heap_mapped_bytes",
    "speclive_kv_cell_evictions_total": "kv_cell_evictions",
    "speclive_kv_restores_total": "kv_restores",
}


def scrape(http: httpx.Client, want: dict[str, str] | None = None) -> dict[str, float]:
    """The gauges of ``/metrics`` named in ``want`` (metric line name, labels included -> name in
    the sample; default ``LEAK_GAUGES``) that the server has."""
    want = LEAK_GAUGES if want is None else want
    out: dict[str, float] = {}
    for line in http.get("/metrics").text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in want:
            out[want[name]] = float(value)
    return out


# ---- generated scripts ---------------------------------------------------------------------
def _strategies(speech: np.ndarray | None):
    """(script strategy): a list of actions ``(kind, payload)``."""
    from hypothesis import strategies as st

    leaf = (
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**63)
        | st.floats(allow_nan=False)
        | st.text(max_size=24)
    )
    anything = st.recursive(
        leaf,
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=4),
        max_leaves=8,
    )

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    audio = st.one_of(
        st.binary(max_size=4096).map(b64),  # PCM16 noise, maybe of odd length
        st.text(max_size=64),  # not base64
        st.just(b64(b"\x00\x00" * 4800)),  # 0.2 s of silence at 24 kHz
        anything,
    )
    session = _session_strategy(st, anything)
    event = st.one_of(
        st.fixed_dictionaries({"type": st.just("session.update"), "session": session}),
        st.fixed_dictionaries({"type": st.just("input_audio_buffer.append"), "audio": audio}),
        st.fixed_dictionaries(
            {"type": st.sampled_from(CLIENT_TYPES)},
            optional={"event_id": anything, "session": anything, "audio": anything, "item": anything},
        ),
        st.dictionaries(st.text(max_size=12), anything, max_size=4),  # no type, or a wrong one
        anything,  # not an object
    )
    action = st.one_of(
        event.map(lambda e: ("json", e)),
        st.text(max_size=200).map(lambda t: ("text", t)),  # mostly not JSON
        st.binary(max_size=256).map(lambda b: ("binary", b)),
        st.just(("speak", None)) if speech is not None else st.nothing(),
    )
    script = st.tuples(st.lists(action, min_size=1, max_size=40), st.booleans(), st.floats(0, 1))
    return script


def _session_strategy(st: Any, anything: Any) -> Any:
    """``session.update`` payloads: known fields with good, bad and arbitrary values."""
    return st.fixed_dictionaries(
        {},
        optional={
            "modalities": st.sampled_from([["text"], ["audio", "text"], ["video"], "audio"]) | anything,
            "voice": st.sampled_from(["alloy", "echo", "piper-joe-medium", ""]) | anything,
            "turn_detection": st.sampled_from([None, {"type": "server_vad"}, {"type": "nope"}]) | anything,
            "input_audio_format": st.sampled_from(["pcm16", "g711_ulaw"]) | anything,
            "audio": st.fixed_dictionaries(
                {},
                optional={
                    "input": st.fixed_dictionaries(
                        {},
                        optional={
                            "format": st.fixed_dictionaries(
                                {},
                                optional={
                                    "type": st.sampled_from(["audio/pcm", "audio/pcmu"]),
                                    "rate": st.sampled_from([16000, 24000, 8000, 0]) | anything,
                                },
                            )
                        },
                    )
                },
            )
            | anything,
            "speclive": st.fixed_dictionaries(
                {},
                optional={
                    "mode": st.sampled_from(["chat", "translate", "transcribe", "sing"]) | anything,
                    "method": st.sampled_from([None, "predgen", "cascade", "ssbd", "ar", "bogus"]) | anything,
                    "verifier": st.sampled_from(["greedy", "topk:3", "nope"]) | anything,
                    "target_lang": st.sampled_from(["de", "fr", "xx"]) | anything,
                    "sample_rate": st.sampled_from([16000, 24000, 44100]) | anything,
                },
            )
            | anything,
        },
    )


def _speech_chunks(speech: np.ndarray, rate: int = 24_000, chunk_s: float = 0.1) -> list[str]:
    x = resample(speech, 16_000, rate)
    n = int(rate * chunk_s)
    return [base64.b64encode(pcm16(x[i : i + n])).decode("ascii") for i in range(0, len(x), n)]


class _Conn:
    """One client connection and the checks on what the server sends it."""

    def __init__(self, ws_url: str, headers: dict[str, str], report: RealtimeFuzzReport, tag: str, **kw: Any):
        from websockets.sync.client import connect

        self.report, self.tag = report, tag
        # a full server (1013) is a fair answer: the client comes back (sessions that just ended
        # are still winding down on the server)
        deadline = time.time() + 120
        while True:
            self.ws = connect(ws_url, additional_headers=headers, open_timeout=60, max_size=None, **kw)
            self.received: list[dict] = []
            self.close_code: int | None = None
            first = self.recv(60)
            if self.close_code != 1013 or time.time() > deadline:
                break
            report.refused += 1
            time.sleep(0.2)
        if first is None or first.get("type") != "session.created":
            self.violation("no session.created", repr(first)[:200])

    def violation(self, why: str, detail: str) -> None:
        self.report.violations.append((f"{self.tag}: {why}", detail))

    def send(self, data: str | bytes) -> bool:
        from websockets.exceptions import ConnectionClosed

        try:
            self.ws.send(data)
            self.report.events += 1
            return True
        except ConnectionClosed as e:
            self._closed(e)
            return False

    def _closed(self, e: Exception) -> None:
        rcvd = getattr(e, "rcvd", None)
        self.close_code = rcvd.code if rcvd is not None else 1006
        self.report.close_codes[self.close_code] += 1
        if self.close_code not in CLEAN_CLOSES:
            self.violation("unclean close", f"code {self.close_code} {getattr(rcvd, 'reason', '')!r}")

    def recv(self, timeout: float) -> dict | None:
        """The next server event (checked), or None on timeout or close."""
        from websockets.exceptions import ConnectionClosed

        if self.close_code is not None:
            return None
        try:
            raw = self.ws.recv(timeout=timeout)
        except TimeoutError:
            return None
        except ConnectionClosed as e:
            self._closed(e)
            return None
        try:
            msg = json.loads(raw)
        except (TypeError, ValueError):
            self.violation("server frame is not JSON", repr(raw)[:200])
            return None
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str) or "event_id" not in msg:
            self.violation("server event without type/event_id", repr(msg)[:200])
            return msg if isinstance(msg, dict) else None
        self.report.server_events[msg["type"]] += 1
        if msg["type"] == "error":
            err = msg.get("error")
            if not isinstance(err, dict) or not err.get("code") or not err.get("message"):
                self.violation("error event without code/message", repr(msg)[:200])
            else:
                self.report.error_codes[err["code"]] += 1
        self.received.append(msg)
        return msg

    def sentinel(self, timeout: float = 120, report_missing: bool = True) -> bool:
        """Send an unknown event and wait for its error: the session still answers."""
        eid = f"sentinel_{uuid.uuid4().hex[:12]}"
        if not self.send(json.dumps({"type": "speclive.fuzz.sentinel", "event_id": eid})):
            return False
        deadline = time.time() + timeout
        while time.time() < deadline:
            msg = self.recv(max(0.1, deadline - time.time()))
            if msg is None:
                if self.close_code is not None:
                    return False
                continue
            if msg.get("type") == "error" and (msg.get("error") or {}).get("event_id") == eid:
                return True
        if report_missing:
            self.violation("no answer to the sentinel", f"within {timeout:g} s")
        return False

    def wait_for(self, pred: Callable[[dict], bool], timeout: float) -> dict | None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            msg = self.recv(max(0.1, deadline - time.time()))
            if msg is not None and pred(msg):
                return msg
            if self.close_code is not None:
                return None
        return None

    def abort(self) -> None:
        """Leave without a close frame (the TCP connection just ends)."""
        self.report.aborted += 1
        with contextlib.suppress(OSError):
            self.ws.socket.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self.ws.close_socket()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()


def _error_codes(conn: _Conn) -> set[str]:
    return {(m.get("error") or {}).get("code") for m in conn.received if m.get("type") == "error"}


# ---- the run -------------------------------------------------------------------------------
def fuzz_realtime(
    url: str,
    config: Any,
    events: int,
    api_key: str | None = None,
    speech: np.ndarray | None = None,
    seed: int = 0,
    scenarios: bool = True,
    only: set[str] | None = None,
    batch_events: int = 500,
    progress: Callable[[int], None] | None = None,
) -> RealtimeFuzzReport:
    """Send at least ``events`` generated client events, then (``scenarios``) the hostile
    clients. ``config``: the server's ``ServerConfig`` (its limits shape the scenarios);
    ``speech``: a spoken question at 16 kHz for scripts and scenarios that talk."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    ws_url = url.replace("http://", "ws://", 1) + "/v1/realtime"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    report = RealtimeFuzzReport()
    chunks = _speech_chunks(speech) if speech is not None else []
    t0 = time.perf_counter()
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        report.before = scrape(http)
        control = _Control(_Conn(ws_url, headers, report, "control"), config.realtime_idle_s)
        next_check = batch_events

        def check_batch() -> None:
            if not control.alive():
                report.violations.append(("the control session stopped answering", ""))
            if http.get("/health").status_code != 200:
                report.violations.append(("/health is not 200 after a batch", ""))

        @settings(
            max_examples=10**9,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @hseed(seed)
        @given(script=_strategies(speech if chunks else None))
        def run(script) -> None:
            nonlocal next_check
            if report.events >= events:
                raise _Enough
            actions, abort, abort_at = script
            report.scripts += 1
            conn = _Conn(ws_url, headers, report, f"script {report.scripts}")
            try:
                _play(conn, actions, int(abort_at * len(actions)) if abort else None, chunks)
            finally:
                if report.events >= next_check:
                    next_check += batch_events
                    check_batch()
                if progress is not None:
                    progress(min(report.events, events))

        # the example that reaches ``events`` raises ``_Enough``, which ends hypothesis' run
        with contextlib.suppress(_Enough):
            run()
        report.generated_events = report.events
        if report.events < events:
            report.violations.append(("generation stopped early", f"{report.events} events sent"))
        check_batch()
        if scenarios:
            _scenarios(ws_url, headers, config, report, chunks, http, only)
            check_batch()
        control.close()
        _check_leaks(report, http)
    report.seconds = time.perf_counter() - t0
    return report


def _play(conn: _Conn, actions: list[tuple[str, Any]], cut: int | None, chunks: list[str]) -> None:
    """Send a script's actions on ``conn`` (leaving without a close at action ``cut``), then the
    sentinel and a close; stops where the server closed."""
    for i, (kind, payload) in enumerate(actions):
        if i == cut:
            conn.abort()
            return
        if kind == "json":
            ok = conn.send(json.dumps(payload))
        elif kind == "text":
            ok = conn.send(payload)
        elif kind == "binary":
            ok = conn.send(payload)
        else:  # speak: a whole question, as fast as it goes
            ok = all(conn.send(json.dumps({"type": "input_audio_buffer.append", "audio": c})) for c in chunks)
        if not ok:
            return
    conn.sentinel()
    conn.close()


def _check_leaks(report: RealtimeFuzzReport, http: httpx.Client) -> None:
    """Once the server settled: no session left open, no more than two tasks left behind."""
    report.after = _settled(http, report.before)
    if report.after.get("sessions", 0) > report.before.get("sessions", 0):
        report.violations.append(("sessions left open", json.dumps(report.after)))
    if report.after.get("tasks", 0) > report.before.get("tasks", 0) + 2:
        report.violations.append(("tasks left behind", f"{report.before} -> {report.after}"))


def _raw_connect(ws_url: str, headers: dict[str, str]) -> socket.socket:
    """A WebSocket connection on a plain socket (handshake done), for a client that never
    reads: library clients keep reading in the background."""
    import os
    from urllib.parse import urlsplit

    u = urlsplit(ws_url)
    sock = socket.create_connection((u.hostname, u.port or 80), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {u.path} HTTP/1.1",
        f"Host: {u.hostname}:{u.port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("the server closed the connection during the handshake")
        head += chunk
    if not head.startswith(b"HTTP/1.1 101"):
        raise ConnectionError(f"handshake refused: {head.splitlines()[0]!r}")
    return sock


def _client_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    """One masked, final client frame (RFC 6455, 5.2)."""
    import os
    import struct

    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    mask = os.urandom(4)
    body = (np.frombuffer(payload, np.uint8) ^ np.resize(np.frombuffer(mask, np.uint8), n)).tobytes()
    return head + mask + body


def _last_close_code(sock: socket.socket, timeout: float = 30) -> int:
    """Read the server's frames to the end: the code of its close frame, or 1006 without one."""
    import struct

    sock.settimeout(timeout)
    buf = bytearray()
    with contextlib.suppress(OSError):
        while chunk := sock.recv(1 << 20):
            buf += chunk
    i = 0
    while i + 2 <= len(buf):
        opcode, n = buf[i] & 0x0F, buf[i + 1] & 0x7F
        j = i + 2
        if n == 126:
            (n,) = struct.unpack("!H", buf[j : j + 2])
            j += 2
        elif n == 127:
            (n,) = struct.unpack("!Q", buf[j : j + 8])
            j += 8
        if opcode == 0x8 and n >= 2 and j + 2 <= len(buf):
            return struct.unpack("!H", buf[j : j + 2])[0]
        i = j + n
    return 1006


class _Control:
    """The session held open for the whole run: a thread keeps asking it a sentinel (often
    enough that it is never idle) and checks that nothing but its own replies arrive."""

    def __init__(self, conn: _Conn, idle_s: float):
        self.conn = conn
        self.period = min(2.0, idle_s / 3) if idle_s > 0 else 2.0
        self.failed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fuzz-control")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            n = len(self.conn.received)
            if not self.conn.sentinel():
                self.failed = True
                return
            stray = [m["type"] for m in self.conn.received[n:] if m.get("type") != "error"]
            if stray:
                self.conn.violation("events of no request of its own", repr(stray)[:200])
            self._stop.wait(self.period)

    def alive(self) -> bool:
        return not self.failed and self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(150)
        self.conn.close()


class _Enough(Exception):
    """Raised in the generated test once enough events were sent (hypothesis stops there)."""


def _settled(http: httpx.Client, before: dict[str, float], timeout: float = 60) -> dict[str, float]:
    """The gauges once the server has wound down what the run left (sessions close in the
    background after a disconnect)."""
    deadline = time.time() + timeout
    now = scrape(http)
    while time.time() < deadline:
        if now.get("sessions", 0) <= before.get("sessions", 0) and now.get("tasks", 0) <= before.get(
            "tasks", 0
        ):
            break
        time.sleep(0.5)
        now = scrape(http)
    return now


# ---- hostile clients ---------------------------------------------------------------------------
def _wait_sessions(http: httpx.Client, most: float, timeout: float) -> bool:
    """True once the server holds at most ``most`` live sessions (within ``timeout``)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if scrape(http).get("sessions", 0) <= most:
            return True
        time.sleep(0.5)
    return False


@dataclass
class _Scene:
    """What a hostile-client scenario works with: the server's address, limits and counters."""

    ws_url: str
    headers: dict
    config: Any
    report: RealtimeFuzzReport
    chunks: list[str]
    http: httpx.Client


def _huge_frame(sc: _Scene) -> str | None:
    conn = _Conn(sc.ws_url, sc.headers, sc.report, "huge frame")
    conn.send("x" * HUGE_FRAME_BYTES)
    conn.wait_for(lambda m: False, 30)
    return None if conn.close_code == 1009 else f"close code {conn.close_code}, expected 1009"


def _event_flood(sc: _Scene) -> str | None:
    # (a client that reads: the replies are taken in by the connection's reader thread)
    conn = _Conn(sc.ws_url, sc.headers, sc.report, "event flood", max_queue=None)
    # twice the burst at once; a machine that sends (or serves) slower than the limit
    # goes on in batches until the server says so, for FLOOD_MAX_S at most
    n = int(4 * sc.config.realtime_events_per_s) + 50
    sent, t0, limited = 0, time.perf_counter(), False
    while not limited and conn.close_code is None:
        if sent >= n and time.perf_counter() - t0 > FLOOD_MAX_S:
            break
        sent += sum(conn.send('{"type": "input_audio_buffer.clear"}') for _ in range(min(n, 1000)))
        while conn.recv(0) is not None:  # what the server said so far
            pass
        limited = "rate_limit_exceeded" in _error_codes(conn)
    flood_s = time.perf_counter() - t0
    # a sentinel may itself be dropped over the rate: once the bucket refills one is answered
    ok = False
    for _ in range(10):
        if conn.close_code is not None:
            break
        time.sleep(0.5)  # the bucket refills
        if ok := conn.sentinel(timeout=1.0, report_missing=False):
            break
    conn.close()
    if "rate_limit_exceeded" not in _error_codes(conn):
        return f"{sent} events in {flood_s:.1f} s and no rate_limit_exceeded"
    return None if ok else "the session stopped answering after the flood"


def _stops_reading(sc: _Scene) -> str | None:
    # a client that sends and never reads: the server's writes back up, and after its send
    # timeout it gives up on the client and frees the session
    baseline = scrape(sc.http).get("sessions", 0)
    sock = _raw_connect(sc.ws_url, sc.headers)
    # each update is echoed back in full by session.updated: the server's writes pile up fast
    big = json.dumps({"type": "session.update", "session": {"instructions": "p" * 200_000}})
    sent = 0
    # the client gives up on a blocked send only after the server's send timeout: a shorter
    # wait would stop it while the kernel's socket buffers are still growing, the server's
    # writes then all fit, and the session ends as idle (1000), not as a slow consumer
    sock.settimeout(sc.config.realtime_send_timeout_s + 2.0)
    deadline = time.time() + sc.config.realtime_send_timeout_s + 60
    try:
        while time.time() < deadline:
            sock.sendall(_client_frame(big.encode()))
            sc.report.events += 1
            sent += 1
            time.sleep(1.5 / sc.config.realtime_events_per_s)  # under the rate limit
    except OSError:  # TimeoutError too: the server stopped reading us in turn
        pass
    released = _wait_sessions(sc.http, most=baseline, timeout=sc.config.realtime_send_timeout_s + 60)
    code = _last_close_code(sock)
    sock.close()
    sc.report.close_codes[code] += 1
    if not released:
        return f"the session of a client that stopped reading was not released ({sent} updates)"
    # the close frame queues behind the writes that never went out: the client may see the
    # connection just end (1006) once it reads again
    return None if code in (1008, 1006) else f"closed with {code} after {sent} updates"


def _leaves_mid_answer(sc: _Scene) -> str | None:
    if not sc.chunks:
        return None
    conn = _Conn(sc.ws_url, sc.headers, sc.report, "leaves mid-answer")
    one_s_silence = base64.b64encode(b"\0" * 48_000).decode("ascii")
    for c in sc.chunks + [one_s_silence] * 3:
        conn.send(json.dumps({"type": "input_audio_buffer.append", "audio": c}))
    got = conn.wait_for(lambda m: m.get("type") in ("response.created", "speclive.speculation"), 120)
    conn.abort()
    return None if got is not None else "no answer began"


def _long_turn(sc: _Scene) -> str | None:
    if not sc.chunks or sc.config.max_turn_s > 30:
        return None  # too long to speak past the limit in a run
    conn = _Conn(sc.ws_url, sc.headers, sc.report, "long turn")
    reps = int(sc.config.max_turn_s / (0.1 * len(sc.chunks))) + 2
    for _ in range(reps):
        for c in sc.chunks:
            conn.send(json.dumps({"type": "input_audio_buffer.append", "audio": c}))
    got = conn.wait_for(lambda m: (m.get("error") or {}).get("code") == "turn_too_long", 120)
    ok = got is not None and conn.sentinel()
    conn.close()
    if got is None:
        return f"no turn_too_long error (close code {conn.close_code})"
    return None if ok else f"the session died after turn_too_long (close code {conn.close_code})"


def _idle(sc: _Scene) -> str | None:
    if not 0 < sc.config.realtime_idle_s <= 30:
        return None
    conn = _Conn(sc.ws_url, sc.headers, sc.report, "idle")
    got = conn.wait_for(
        lambda m: (m.get("error") or {}).get("code") == "session_idle_timeout",
        sc.config.realtime_idle_s + 30,
    )
    conn.wait_for(lambda m: False, 10)
    if got is None:
        return "no session_idle_timeout error"
    return None if conn.close_code == 1000 else f"closed with {conn.close_code}, expected 1000"


#: the hostile clients, by name (``fuzz_realtime(only=...)``), each returning its problem or None
SCENARIOS: dict[str, Callable[[_Scene], str | None]] = {
    "huge frame": _huge_frame,
    "event flood": _event_flood,
    "stops reading": _stops_reading,
    "leaves mid-answer": _leaves_mid_answer,
    "long turn": _long_turn,
    "idle": _idle,
}


def _scenarios(
    ws_url: str,
    headers: dict,
    config: Any,
    report: RealtimeFuzzReport,
    chunks: list[str],
    http: httpx.Client,
    only: set[str] | None = None,
) -> None:
    sc = _Scene(ws_url, headers, config, report, chunks, http)
    for name, fn in SCENARIOS.items():
        if only is not None and name not in only:
            continue
        n = len(report.violations)
        t0 = time.perf_counter()
        try:
            problem = fn(sc)
        except Exception as e:  # a scenario that raises is a finding, not a crash of the run
            problem = f"{type(e).__name__}: {e}"
        if problem:
            report.violations.append((f"scenario {name}", problem))
        report.scenarios[name] = problem or ("violations" if len(report.violations) > n else "ok")
        report.scenario_seconds[name] = round(time.perf_counter() - t0, 2)
