"""``speclive bench soak``: many voice sessions and chat clients against one server for minutes.

``speclive serve`` runs as a separate process (its memory and descriptors are its own, read from
its ``/metrics``). ``--sessions`` realtime clients each hold one WebSocket for the whole run and
speak their own question in a loop at a microphone's pace (100 ms chunks, then silence), waiting
for the answer each time; ``--chat-clients`` threads send chat completions in a loop. Every
``--sample-s`` seconds the server's RSS, open descriptors, event-loop tasks and live sessions are
read.

Figures: turns and chat requests completed, clean refusals (a session or turn refused with close
1013 or ``server_overloaded``, a chat request refused with 503 and ``Retry-After``: the client
backs off and tries again; they are not errors), errors (other error events, failed requests,
closed connections, turns that got no answer), RSS and descriptors after the warm-up and at the end
(growth), crossed transcripts (a turn whose transcript is closer to another session's question
than to its own), voice-to-voice latency (end of speech sent -> first answer audio received)
p50/p99 per time window. Results: ``benchmarks/results/soak-<tag>.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from speclive.common_options import asr_draft_option, asr_model_option, model_option
from speclive.options import OptionSet, option
from speclive.server.audio import resample
from speclive.server.config import SERVE_OPTIONS
from speclive.server.inproc import free_port
from speclive.tts.piper import PiperTTS
from speclive_bench import mappings, report
from speclive_bench.fuzz_realtime import scrape
from speclive_bench.serve import start_server, stop_server
from speclive_bench.stats import percentile

QUESTIONS = (
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Why is the sky blue during the day?",
    "Name three colors of the rainbow.",
    "What do bees make from flowers?",
    "How far away is the moon from the earth?",
    "Who wrote the play Romeo and Juliet?",
    "What is the boiling point of water?",
    "Can you recommend a good book about space?",
    "What is the largest ocean on our planet?",
    "How do airplanes stay in the air?",
    "What is the tallest mountain in the world?",
    "Tell me a fun fact about elephants.",
    "What is the main ingredient of guacamole?",
    "How many days are there in a leap year?",
    "Which planet is known as the red planet?",
)
CHAT_PROMPTS = ("Give me one tip for sleeping well.", "Write a haiku about rain.", "What is 17 times 3?")


@dataclass
class SoakOptions:
    """Settings of ``bench soak``; each field with a flag is its command-line option."""

    sessions: int = option(16, "--sessions", parse=int, help="realtime voice sessions at once", always=True)
    chat_clients: int = option(2, "--chat-clients", parse=int, always=True)
    minutes: float = option(10.0, "--minutes", parse=float, always=True)
    #: RSS and descriptor growth are measured from this point on (None: a fifth of the run)
    warmup_minutes: float | None = option(
        None, "--warmup-minutes", parse=float, help="default: a fifth of the run"
    )
    model: str = model_option("smollm2-135m-instruct", always=True)
    asr_model: str = asr_model_option("whisper-tiny.en", always=True)
    asr_draft: str = asr_draft_option("self:1", always=True)
    #: the server's --max-wait: the bound on an admitted turn's wait for its first audio
    max_wait: float = option(10.0, "--max-wait", parse=float, help="the server's --max-wait (seconds)")
    #: seconds between two readings of the server's metrics
    sample_s: float = option(10.0, "--sample-s", parse=float)
    out: Path = report.out_option()
    #: results stem soak-<tag> (the command sets the default: the model)
    tag: str | None = option(None, "--tag", help="results name: soak-<tag>.*", always=True)
    plot: bool = report.plot_option()
    command: str = ""


OPTIONS = OptionSet(SoakOptions)


def add_soak_parser(sub: Any) -> None:
    p = sub.add_parser("soak", help="realtime voice sessions and chat clients against one server for minutes")
    OPTIONS.add_to(p)
    p.set_defaults(func=cmd_soak)


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def closest_question(transcript: str, questions: tuple[str, ...]) -> int:
    """Index of the question whose words the transcript shares most (Jaccard)."""
    w = _words(transcript)

    def score(q: str) -> float:
        qw = _words(q)
        return len(w & qw) / max(1, len(w | qw))

    return max(range(len(questions)), key=lambda i: score(questions[i]))


def _spoken(questions: tuple[str, ...], voice: str) -> list[np.ndarray]:
    """Each question spoken by Piper, 16 kHz, with 1.5 s of silence after it."""

    tts = PiperTTS(voice)
    out = []
    for q in questions:
        a = tts.synthesize(q)
        x = resample(a.samples, a.sample_rate, 16_000)
        out.append(np.concatenate([np.zeros(3200, np.float32), x, np.zeros(24_000, np.float32)]))
    return out


#: the error code of a turn or request refused for want of capacity (a clean refusal)
OVERLOADED = "server_overloaded"

#: admission's gauges on ``/metrics`` (labelled for the chat worker and voice-chat turns), by
#: their name in a sample
ADMISSION_GAUGES = {
    'speclive_admission_wait_seconds{kind="realtime"}': "admission_wait_s",
    'speclive_admission_reserved_seconds{worker="chat"}': "reserved_s",
    'speclive_admission_open_turns{worker="chat"}': "open_turns",
    'speclive_realtime_work_to_first_output_seconds{mode="chat"}': "work_to_first_output_s",
    'speclive_admission_calibration{mode="chat"}': "calibration",
    'speclive_worker_wait_seconds{worker="chat"}': "worker_wait_s",
}


class _Voice(threading.Thread):
    """One realtime session speaking its question in a loop until ``deadline``."""

    def __init__(self, i: int, url: str, key: str, audio: np.ndarray, deadline: float, t0: float):
        super().__init__(daemon=True, name=f"soak-voice-{i}")
        self.i, self.url, self.key, self.audio, self.deadline, self.t0 = i, url, key, audio, deadline, t0
        self.turns: list[dict[str, Any]] = []
        self.errors: list[str] = []
        #: connection attempts the server refused as busy (1013), retried with back-off
        self.refused = 0
        #: turns the server refused for want of capacity (``server_overloaded``, then 1013)
        self.refused_turns = 0
        self._backoff = 0.0

    def _back_off(self) -> None:
        """Wait before the next attempt after a clean refusal (doubling, 1 to 30 s)."""
        self._backoff = min(30.0, max(1.0, 2 * self._backoff))
        time.sleep(self._backoff)

    def run(self) -> None:
        ws_url = self.url.replace("http://", "ws://") + "/v1/realtime"
        while time.perf_counter() < self.deadline:  # a lost connection is counted, then redialled
            try:
                with connect(
                    ws_url,
                    additional_headers={"Authorization": f"Bearer {self.key}"},
                    open_timeout=120,
                    max_size=None,
                ) as ws:
                    update = {"type": "session.update", "session": {"speclive": {"sample_rate": 16_000}}}
                    ws.send(json.dumps(update))
                    created = json.loads(ws.recv(timeout=120))
                    if created.get("type") != "session.created":
                        raise RuntimeError(f"expected session.created, got {created.get('type')}")
                    while time.perf_counter() < self.deadline:
                        rec = self._turn(ws)
                        self.turns.append(rec)
                        if rec.get("refused"):
                            self.refused_turns += 1
                            break  # the server closes the session with 1013: redial later
                        self._backoff = 0.0
                        if rec.get("failure"):
                            break  # the connection's reader may still be waiting: start afresh
                if self.turns and self.turns[-1].get("refused"):
                    self._back_off()
            except ConnectionClosed as e:
                if e.rcvd is not None and e.rcvd.code == 1013:
                    # the server is full: as a client should, retry later, backing off
                    self.refused += 1
                    self._back_off()
                    continue
                self.errors.append(f"session {self.i}: {type(e).__name__}: {e}")
                time.sleep(1.0)
            except Exception as e:  # the connection failed: an error of the soak
                self.errors.append(f"session {self.i}: {type(e).__name__}: {e}")
                time.sleep(1.0)

    def _turn(self, ws) -> dict[str, Any]:
        rec: dict[str, Any] = {"session": self.i, "t": time.perf_counter() - self.t0, "latency_s": None}
        done = threading.Event()
        sent: dict[str, float] = {}

        def read() -> None:
            try:
                while not done.is_set():
                    msg = json.loads(ws.recv(timeout=300))
                    kind = msg["type"]
                    if kind == "response.output_audio.delta" and rec["latency_s"] is None and "end" in sent:
                        rec["latency_s"] = time.perf_counter() - sent["end"]
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        rec["transcript"] = msg["transcript"]
                    elif kind == "error" and msg["error"].get("code") == OVERLOADED:
                        rec["refused"] = True  # a clean refusal; the server closes with 1013 next
                        rec["refusal"] = msg["error"].get("message")
                    elif kind == "error":
                        rec.setdefault("errors", []).append(msg["error"].get("code"))
                    elif kind == "response.done":
                        rec["status"] = msg["response"]["status"]
                        return
            except Exception as e:
                # after the turn gave up (``done``), closing the connection ends this read: the
                # turn's own failure ("no answer within ...") is the one to keep; a refused turn's
                # connection closes as the refusal said
                if not done.is_set() and not rec.get("refused"):
                    rec["failure"] = f"{type(e).__name__}: {e}"

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        step = 1600
        speech_end = len(self.audio) - 24_000
        t0 = time.perf_counter()
        for k, i in enumerate(range(0, len(self.audio), step)):
            time.sleep(max(0.0, t0 + k * step / 16_000 - time.perf_counter()))
            pcm = (np.clip(self.audio[i : i + step], -1, 1) * 32767).astype("<i2").tobytes()
            try:
                ws.send(
                    json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})
                )
            except ConnectionClosed as e:
                if not rec.get("refused") and (e.rcvd is None or e.rcvd.code != 1013):
                    raise
                rec["refused"] = True  # the turn was refused as it ended, before its trailing silence
                break
            if "end" not in sent and i + step >= speech_end:
                sent["end"] = time.perf_counter()
        reader.join(300)
        done.set()
        if reader.is_alive():
            rec["failure"] = "no answer within 300 s"
        return rec


class _Chat(threading.Thread):
    def __init__(self, i: int, url: str, key: str, deadline: float, t0: float):
        super().__init__(daemon=True, name=f"soak-chat-{i}")
        self.i, self.url, self.key, self.deadline, self.t0 = i, url, key, deadline, t0
        self.done = 0
        self.errors: list[str] = []
        #: requests refused with 503 and Retry-After (retried after that many seconds)
        self.refused = 0

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=300) as http:
            k = self.i
            while time.perf_counter() < self.deadline:
                body = {
                    "model": "default",
                    "messages": [{"role": "user", "content": CHAT_PROMPTS[k % len(CHAT_PROMPTS)]}],
                    "max_tokens": 48,
                }
                k += 1
                try:
                    r = http.post("/v1/chat/completions", json=body)
                    if r.status_code == 200:
                        self.done += 1
                    elif r.status_code == 503 and "retry-after" in r.headers:
                        self.refused += 1  # a clean refusal: come back when the server says
                        time.sleep(min(30.0, max(1.0, float(r.headers["retry-after"]))))
                    else:
                        self.errors.append(f"chat {r.status_code}: {r.text[:200]}")
                        time.sleep(1.0)
                except httpx.HTTPError as e:
                    self.errors.append(f"chat: {type(e).__name__}: {e}")
                    time.sleep(1.0)


def run_soak(opts: SoakOptions) -> dict[str, Any]:
    """Start the server, run the sessions and chat clients for ``opts.minutes``, summarize."""

    load_avg_start = report.load_avg()  # before the server loads its models
    key = "soak-key"
    port = free_port()
    questions = tuple(QUESTIONS[i % len(QUESTIONS)] for i in range(opts.sessions))
    print(f"speaking {len(set(questions))} questions with Piper ...", file=sys.stderr)
    audio = _spoken(tuple(dict.fromkeys(questions)), "piper-joe-medium")
    by_q = dict(zip(dict.fromkeys(questions), audio, strict=True))
    server = SERVE_OPTIONS.preset(
        port=port,
        model=opts.model,
        asr_model=opts.asr_model,
        asr_draft=opts.asr_draft,
        api_key=key,
        max_sessions=opts.sessions + opts.chat_clients + 1,
        max_wait_s=opts.max_wait,
    )
    cmd = [
        *SERVE_OPTIONS.argv([sys.executable, "-m", "speclive.cli", "serve"], server),
        "--log-level",
        "warning",
    ]
    opts.out.mkdir(parents=True, exist_ok=True)
    # the server's log sits beside the result files of its run: soak-<tag>.log
    srv = start_server(f"soak-{opts.tag or opts.model}", cmd, port, opts.out, timeout=900, ready="/health")
    samples: list[dict[str, float]] = []
    watch = mappings.StepWatch(srv.proc.pid)
    try:
        http = httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        t0 = time.perf_counter()
        deadline = t0 + opts.minutes * 60
        voices = [_Voice(i, srv.url, key, by_q[q], deadline, t0) for i, q in enumerate(questions)]
        chats = [_Chat(i, srv.url, key, deadline, t0) for i in range(opts.chat_clients)]
        for th in [*voices, *chats]:
            th.start()
            time.sleep(0.2)  # a staggered start, as callers arrive
        while any(th.is_alive() for th in [*voices, *chats]):
            t = time.perf_counter() - t0
            samples.append({"t": t, **_reading(http, watch, t)})
            last = time.perf_counter() - t0
            print(
                f"  {last / 60:.1f} min: {sum(len(v.turns) for v in voices)} turns, "
                f"{sum(c.done for c in chats)} chats, RSS {samples[-1].get('rss_bytes', 0) / 2**20:.0f} MiB",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(opts.sample_s)
        for th in [*voices, *chats]:
            th.join(400)
        t = time.perf_counter() - t0
        samples.append({"t": t, **_reading(http, watch, t)})
        health = http.get("/health").status_code
    finally:
        stop_server(srv)
    return summarize_soak(
        opts,
        opts.command,
        questions,
        voices,
        chats,
        samples,
        health,
        load_avg_start=load_avg_start,
        steps=watch.found,
    )


def _reading(http: httpx.Client, watch: mappings.StepWatch, t: float) -> dict[str, float]:
    """The server's figures now: its ``/metrics``, admission's gauges, and its resident memory
    by kind of mapping with its thread count (read from ``/proc``; ``mappings``; the mappings'
    steps go to ``watch.found``)."""
    return {**scrape(http), **scrape(http, ADMISSION_GAUGES), **watch.sample(t)}


def _slope_per_min(samples: list[dict[str, float]], key: str) -> float:
    """Least-squares trend of ``key`` over ``samples`` per minute (0 with fewer than 3 points)."""
    pts = [(s["t"] / 60, s[key]) for s in samples if key in s]
    if len(pts) < 3:
        return 0.0
    t, y = np.array(pts).T
    return float(np.polyfit(t, y, 1)[0])


def _turn_errors(turns: Sequence[dict[str, Any]]) -> list[str]:
    """Per turn, in order: its error events, then its failure or a missing answer."""
    errors: list[str] = []
    for t in turns:
        errors += [f"session {t['session']}: error event {c}" for c in t.get("errors", [])]
        if t.get("refused"):
            continue  # a clean refusal: no answer was promised
        if t.get("failure"):
            errors.append(f"session {t['session']}: {t['failure']}")
        elif t.get("latency_s") is None:
            errors.append(f"session {t['session']}: a turn without answer audio")
    return errors


def _mark_own_transcripts(turns: Sequence[dict[str, Any]], questions: tuple[str, ...]) -> int:
    """Mark each transcribed turn ``own`` when its transcript is closest to its session's own
    question; returns how many were another session's (crossed state)."""
    crossed = 0
    for t in turns:
        if t.get("transcript") is not None:
            own = questions[t["session"]]
            t["own"] = questions[closest_question(t["transcript"], questions)] == own
            crossed += not t["own"]
    return crossed


def _latency_windows(lat: Sequence[tuple[float, float]], minutes: float) -> list[dict[str, Any]]:
    """p50 / p99 answer latency per window of the run (a tenth of it, at least a minute)."""
    windows = []
    span = max(60.0, minutes * 60 / 10)
    for w0 in np.arange(0, minutes * 60, span):
        xs = [x for t, x in lat if w0 <= t < w0 + span]
        if xs:
            windows.append(
                {
                    "from_min": round(w0 / 60, 1),
                    "turns": len(xs),
                    "p50_s": percentile(xs, 50),
                    "p99_s": percentile(xs, 99),
                }
            )
    return windows


def _drift(lat: Sequence[tuple[float, float]], minutes: float) -> dict[str, Any]:
    """p50 latency of the run's first and last stretch (10 minutes, a third of shorter runs),
    and the last over the first."""
    span = min(600.0, minutes * 60 / 3)
    first = [x for t, x in lat if t < span]
    last = [x for t, x in lat if t >= minutes * 60 - span]
    p_first, p_last = percentile(first, 50), percentile(last, 50)
    return {
        "drift_span_min": span / 60,
        "latency_p50_first_s": p_first,
        "latency_p50_last_s": p_last,
        "latency_p50_last_over_first": p_last / p_first if p_first and p_last else None,
    }


def _memory(
    samples: list[dict[str, float]], after_warm: list[dict[str, float]], minutes: float
) -> dict[str, float]:
    """RSS after the warm-up and at the end, its trends (after the warm-up, over the second half
    of the run, where a growth that levels off shows), and malloc's trends: blocks in use, and
    arenas + mapped blocks (glibc; 0 where the server has no such figures)."""
    start, end = after_warm[0], samples[-1]
    second_half = [s for s in samples if s["t"] >= minutes * 30]
    held = [
        {**x, "held": x["heap_arenas_bytes"] + x["heap_mapped_bytes"]}
        for x in after_warm
        if "heap_arenas_bytes" in x
    ]
    return {
        "rss_mib_after_warmup": start.get("rss_bytes", 0) / 2**20,
        "rss_mib_end": end.get("rss_bytes", 0) / 2**20,
        "rss_growth_pct": 100 * (end.get("rss_bytes", 0) / max(1.0, start.get("rss_bytes", 1)) - 1),
        "rss_slope_mib_per_min": _slope_per_min(after_warm, "rss_bytes") / 2**20,
        "rss_slope_last_half_mib_per_min": _slope_per_min(second_half, "rss_bytes") / 2**20,
        "heap_in_use_slope_mib_per_min": _slope_per_min(after_warm, "heap_in_use_bytes") / 2**20,
        "heap_held_slope_mib_per_min": _slope_per_min(held, "held") / 2**20,
        "resident_by_kind": _resident_by_kind(after_warm),
    }


def _steps_table(steps: list[dict[str, Any]]) -> list[str]:
    """The markdown lines that list the mappings' steps (none: a line that says so)."""
    least = mappings.STEP_BYTES / 2**20
    if not steps:
        return ["", f"No mapping's resident memory grew by {least:.0f} MiB or more between two readings."]
    return [
        "",
        f"Mappings whose resident memory grew by {least:.0f} MiB or more between two readings"
        " (a new mapping's `before` is 0):",
        "",
        report.md_table(
            [
                ("t_min", "at (min)", 1),
                ("kind", "kind", 0),
                ("start", "address", 0),
                ("mapped_mib", "mapped (MiB)", 1),
                ("resident_before_mib", "resident before (MiB)", 1),
                ("resident_after_mib", "resident after (MiB)", 1),
                ("new", "new mapping", 0),
            ],
            steps,
        ),
    ]


def _resident_by_kind(after_warm: list[dict[str, float]]) -> list[dict[str, Any]]:
    """Per kind of mapping (``mappings.KINDS``) and for the thread count: the reading after the
    warm-up, at the end, and the trend per minute (MiB for memory), with the kind's mapped size
    after the warm-up and at the end; empty without readings."""
    rows = []
    for kind in [*mappings.KINDS, "threads"]:
        key, scale = (kind, 1.0) if kind == "threads" else (f"rss_{kind}_bytes", 2.0**20)
        have = [x for x in after_warm if key in x]
        if len(have) < 2:
            continue
        size = f"size_{kind}_bytes"
        rows.append(
            {
                "kind": kind,
                "after_warmup": have[0][key] / scale,
                "end": have[-1][key] / scale,
                "slope_per_min": _slope_per_min(have, key) / scale,
                "mapped_after_warmup": have[0][size] / scale if size in have[0] else None,
                "mapped_end": have[-1][size] / scale if size in have[-1] else None,
            }
        )
    return rows


def summarize_soak(
    opts: SoakOptions,
    command: str,
    questions: tuple[str, ...],
    voices: list[Any],
    chats: list[Any],
    samples: list[dict[str, float]],
    health: int,
    load_avg_start: list[float] | None = None,
    steps: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The figures of a run (``opts``: its settings; the sessions' and clients' records;
    ``steps``: the server's mappings that grew by a step between two readings,
    ``mappings.StepWatch``)."""
    turns = [t for v in voices for t in v.turns]
    errors = [e for v in voices for e in v.errors] + [e for c in chats for e in c.errors]
    errors += _turn_errors(turns)
    crossed = _mark_own_transcripts(turns, questions)
    warm_s = (opts.warmup_minutes if opts.warmup_minutes is not None else opts.minutes / 5) * 60
    after_warm = [s for s in samples if s["t"] >= warm_s] or samples[-1:]
    start, end = after_warm[0], samples[-1]
    lat = [(t["t"], t["latency_s"]) for t in turns if t.get("latency_s") is not None]
    windows = _latency_windows(lat, opts.minutes)
    all_lat = [x for _, x in lat]
    summary = {
        "turns": len(turns),
        "turns_answered": len(all_lat),
        "chat_requests": sum(c.done for c in chats),
        "errors": len(errors),
        "refused_connects": sum(v.refused for v in voices),
        "refused_turns": sum(getattr(v, "refused_turns", 0) for v in voices),
        "refused_chats": sum(getattr(c, "refused", 0) for c in chats),
        "crossed_transcripts": crossed,
        "transcribed_turns": sum(1 for t in turns if t.get("transcript") is not None),
        **_memory(samples, after_warm, opts.minutes),
        "trimmed_mib": end.get("trimmed_bytes", 0) / 2**20,
        "open_fds_after_warmup": start.get("open_fds"),
        "open_fds_end": end.get("open_fds"),
        "latency_p50_s": percentile(all_lat, 50),
        "latency_p99_s": percentile(all_lat, 99),
        #: the longest wait of an answered (admitted) turn for its first audio
        "latency_max_s": max(all_lat) if all_lat else None,
        "bound_s": opts.max_wait,
        "turns_over_bound": sum(x > opts.max_wait for x in all_lat) if opts.max_wait > 0 else None,
        **_drift(lat, opts.minutes),
        "health_at_end": health,
        "kv_cell_evictions": end.get("kv_cell_evictions"),
        "kv_restores": end.get("kv_restores"),
        "resident_steps": [{**x, "t_min": x["t"] / 60} for x in steps or []],
    }
    header = {
        "machine": report.machine_info(load_avg_start),
        "command": command,
        "models": f"{opts.model} (llama.cpp), {opts.asr_model} (draft {opts.asr_draft}), Piper",
        "settings": {
            "sessions": opts.sessions,
            "chat_clients": opts.chat_clients,
            "minutes": opts.minutes,
            "warmup_s": warm_s,
        },
    }
    return {
        "header": header,
        "summary": summary,
        "windows": windows,
        "samples": samples,
        "turns": turns,
        "errors": errors[:200],
    }


def soak_markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    p50, p99 = report._fmt(s["latency_p50_s"]), report._fmt(s["latency_p99_s"])
    lines = report.markdown_preamble("Soak: realtime voice sessions and chat clients", result["header"])
    lines += [
        "| figure | value |",
        "|---|---|",
        f"| voice turns (answered) | {s['turns']} ({s['turns_answered']}) |",
        f"| chat completions | {s['chat_requests']} |",
        f"| errors | {s['errors']} |",
        f"| connection attempts refused as busy (retried) | {s.get('refused_connects', 0)} |",
        f"| turns refused for want of capacity (error + 1013, retried) | {s.get('refused_turns', 0)} |",
        f"| chat requests refused with 503 + Retry-After (retried) | {s.get('refused_chats', 0)} |",
        f"| crossed transcripts | {s['crossed_transcripts']} of {s['transcribed_turns']} |",
        f"| RSS after warm-up → end (MiB) | {s['rss_mib_after_warmup']:.0f} → {s['rss_mib_end']:.0f} "
        f"({s['rss_growth_pct']:+.1f} %) |",
        f"| RSS trend after warm-up (least squares) | {s.get('rss_slope_mib_per_min', 0):+.1f} MiB/min |",
        f"| RSS trend over the second half of the run | "
        f"{s.get('rss_slope_last_half_mib_per_min', 0):+.1f} MiB/min |",
        f"| malloc trend after warm-up: blocks in use / arenas + mapped blocks | "
        f"{s.get('heap_in_use_slope_mib_per_min', 0):+.1f} / "
        f"{s.get('heap_held_slope_mib_per_min', 0):+.1f} MiB/min |",
        f"| freed heap returned to the OS (malloc_trim) | {s.get('trimmed_mib', 0):.0f} MiB |",
        f"| open fds after warm-up → end | {s['open_fds_after_warmup']} → {s['open_fds_end']} |",
        f"| voice-to-voice p50 / p99 / max (s) | {p50} / {p99} / {report._fmt(s.get('latency_max_s'))} |",
        f"| answered turns over the {s.get('bound_s', '–')} s bound | {s.get('turns_over_bound', '–')} |",
        f"| p50 of the first / last {report._fmt(s.get('drift_span_min'))} min (last / first) | "
        f"{report._fmt(s.get('latency_p50_first_s'))} / {report._fmt(s.get('latency_p50_last_s'))} s "
        f"({report._fmt(s.get('latency_p50_last_over_first'))}) |",
        f"| /health at the end | {s['health_at_end']} |",
        f"| KV evictions for want of cells / restores | {s.get('kv_cell_evictions', '–')} / "
        f"{s.get('kv_restores', '–')} |",
    ]
    if s.get("resident_by_kind"):
        lines += [
            "",
            "Resident memory by kind of mapping (MiB; threads: a count), read from `/proc/PID/smaps`."
            " Resident memory that grows inside a mapped size that does not is pages of fixed"
            " buffers touched for the first time:",
            "",
            report.md_table(
                [
                    ("kind", "kind", 0),
                    ("after_warmup", "resident after warm-up", 1),
                    ("end", "resident at the end", 1),
                    ("slope_per_min", "resident trend per minute", 2),
                    ("mapped_after_warmup", "mapped after warm-up", 1),
                    ("mapped_end", "mapped at the end", 1),
                ],
                s["resident_by_kind"],
            ),
        ]
    lines += _steps_table(s.get("resident_steps") or [])
    lines += [
        "",
        "Latency over time:",
        "",
        report.md_table(
            [
                ("from_min", "from (min)", 1),
                ("turns", "turns", 0),
                ("p50_s", "p50 (s)", 2),
                ("p99_s", "p99 (s)", 2),
            ],
            result["windows"],
        ),
    ]
    if result["errors"]:
        lines += ["", "First errors:", ""] + [f"- {e}" for e in result["errors"][:10]]
    return "\n".join(lines)


def plot_soak(path: Path, result: dict[str, Any]) -> Path:
    plt = report._pyplot()
    smp = result["samples"]
    by_kind = [k for k in mappings.KINDS if any(f"rss_{k}_bytes" in x for x in smp)]
    fig, axes = plt.subplots(3 if by_kind else 2, 1, figsize=(8, 9 if by_kind else 6), sharex=True)
    a, b = axes[0], axes[-1]
    if by_kind:
        _plot_resident_by_kind(axes[1], smp, by_kind)
    a.plot([x["t"] / 60 for x in smp], [x.get("rss_bytes", 0) / 2**20 for x in smp], label="RSS (MiB)")
    heap = [x for x in smp if "heap_in_use_bytes" in x]
    if heap:
        a.plot(
            [x["t"] / 60 for x in heap],
            [x["heap_in_use_bytes"] / 2**20 for x in heap],
            label="malloc in use (MiB)",
        )
        a.legend(loc="center left")
    a.set_ylabel("server RSS (MiB)")
    a2 = a.twinx()
    a2.plot([x["t"] / 60 for x in smp], [x.get("open_fds", 0) for x in smp], color="tab:gray", ls="--")
    a2.set_ylabel("open fds", color="tab:gray")
    turns = [t for t in result["turns"] if t.get("latency_s") is not None]
    b.scatter([t["t"] / 60 for t in turns], [t["latency_s"] for t in turns], s=6, alpha=0.5, label="turn")
    w = result["windows"]
    b.plot([x["from_min"] for x in w], [x["p50_s"] for x in w], "k-", label="p50 per window")
    b.plot([x["from_min"] for x in w], [x["p99_s"] for x in w], "r-", label="p99 per window")
    b.set_xlabel("minutes")
    b.set_ylabel("voice-to-voice latency (s)")
    b.legend(loc="upper left")
    s = result["header"]["settings"]
    fig.suptitle(f"soak: {s['sessions']} voice sessions + {s['chat_clients']} chat clients")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_resident_by_kind(ax: Any, smp: list[dict[str, float]], kinds: list[str]) -> None:
    """Each kind's resident memory (``mappings``) as its change since the first reading."""
    for kind in kinds:
        pts = [(x["t"] / 60, x[f"rss_{kind}_bytes"] / 2**20) for x in smp if f"rss_{kind}_bytes" in x]
        ax.plot([t for t, _ in pts], [v - pts[0][1] for _, v in pts], label=kind.replace("_", " "))
    ax.set_ylabel("resident change (MiB)")
    ax.legend(loc="upper left", fontsize="small", ncol=3)


def cmd_soak(args: argparse.Namespace) -> int:
    opts = OPTIONS.build(args)
    opts.tag = opts.tag or opts.model
    opts.command = OPTIONS.command(["speclive", "bench", "soak"], opts)
    result = run_soak(opts)
    for p in report.write_result_files(
        result, opts.out, f"soak-{opts.tag}", soak_markdown, plot_soak if opts.plot else None
    ):
        print(f"wrote {p}", file=sys.stderr)
    print(soak_markdown(result))
    s = result["summary"]
    return 1 if s["errors"] or s["crossed_transcripts"] else 0
