"""``speclive bench serve``: ``speclive serve`` against other OpenAI-compatible servers.

The peers (``--peers``, ``speclive_bench.serve_peers``): llama-cpp-python's server, plain or
with its prompt-lookup drafter, and llama.cpp's own ``llama-server`` with ``-np`` slots and
continuous batching, plain, with a draft model or with its n-gram speculation. Every server runs
as a subprocess on loopback with the same GGUF, the same thread count and the same context,
and is driven by the same streaming HTTP client (OpenAI chat completions, SSE, greedy). Only one
server computes at a time; the others idle.

- *1 client*: each prompt goes to every server one after the other, the order rotated per
  prompt; ``--passes`` runs all prompts again (the rotation continues). Per request: time to
  first token (request sent -> first content delta), request latency and tokens per second
  (completion tokens / request time), completion tokens counted with the GGUF's own tokenizer
  for every server; whether the texts are identical to speclive's. Against each peer: the
  median of per-request tok/s ratios (paired by prompt and pass) with its 95 % bootstrap
  interval, and the latency p50 / p99 of each server with theirs.
Sampling is plain greedy everywhere (llama-cpp-python's default repeat penalty is turned off)
and llama-cpp-python queues concurrent requests (``--interrupt_requests False``; its default
cancels the running request when a new one arrives).

- *N clients*: N threads share the prompts, one server at a time, the servers' order rotated
  per pass (at least two passes: A B, then B A); aggregate tokens per second (all completion
  tokens / wall time), per-request latency p50 / p99 with bootstrap intervals, and against
  each peer the aggregate ratio (paired by pass) and the p99 ratio (paired by prompt and pass).
  These requests are not streamed: llama-cpp-python's server (0.3.x, with the FastAPI and
  sse-starlette releases installed here) ends a running stream as "disconnected" when a second
  streaming request arrives, even with ``--interrupt_requests False``; whole responses queue.
  The passes send the same prompts again, which users do not: with ``--fresh-servers`` every
  server is started again before each of its passes, so nothing one pass cached (speclive's
  prompt cache, llama-server's slots, its ngram-mod pool) serves the next.

A couple of warm-up requests per server come first (after every start) and are not counted.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from speclive.backends.llamacpp_buffers import extra_buffers_safe
from speclive.common_options import drafter_option, max_tokens_option, model_option, threads_option
from speclive.errors import ConfigError
from speclive.knowledge import DIR_ENV
from speclive.loader import DEFAULT_MODEL
from speclive.models.resolve import resolve
from speclive.options import OptionSet, option
from speclive.server.config import SERVE_OPTIONS
from speclive.server.inproc import free_port
from speclive.tts.piper import PiperTTS
from speclive_bench import datasets, report, serve_peers
from speclive_bench.harness import rotated
from speclive_bench.live import chat_questions, speak
from speclive_bench.serve_stats import concurrent_table, single_table, summarize
from speclive_bench.stats import percentile


@dataclass
class ServeBenchOptions:
    """Settings of ``bench serve``; each field with a flag is its command-line option."""

    #: None: the server's default model (the command resolves it before writing its command line)
    model: str | None = model_option(
        None, help="registry name or .gguf (default: the server's default model)", always=True
    )
    sets: list[str] = option(
        ["mtbench", "code-edit"],
        "--sets",
        help="prompt sets: mtbench, code-edit; none: the realtime phase only",
        always=True,
    )
    limit: int = option(8, "--limit", parse=int, help="prompts per set", always=True)
    #: the prompts of each set (``sets``, ``limit``): the command loads them
    prompts: dict[str, list[str]] = field(default_factory=dict)
    max_tokens: int = max_tokens_option(128, always=True)
    #: the concurrent phase's clients (0: the 1-client phase alone)
    clients: int = option(
        8, "--clients", parse=int, help="clients at once (0: no concurrent phase)", always=True
    )
    #: the 1-client phase (off: the concurrent and realtime phases alone)
    single: bool = option(True, "--no-single", help="skip the 1-client phase")
    #: llama.cpp threads of each server (default: every core)
    threads: int = threads_option(os.cpu_count() or 2, always=True)
    n_ctx: int = 4096
    drafter: str = drafter_option(always=True)
    warmup: int = 2
    #: spoken questions for the realtime phase (0: no realtime phase)
    voice_questions: int = option(
        6,
        "--voice-questions",
        parse=int,
        help="spoken questions for the realtime phase (0: none)",
        always=True,
    )
    #: the realtime phase's concurrencies (sessions at once)
    voice_sessions: list[int] = option(
        [1, 4], "--voice-sessions", parse=int, help="realtime sessions at once, comma-separated", always=True
    )
    #: speclive's ``--max-sessions`` (None: enough for every client and voice session at once)
    max_sessions: int | None = option(
        None, "--max-sessions", parse=int, help="speclive's --max-sessions (default: clients)"
    )
    #: the servers speclive is measured against (``serve_peers.PEERS``)
    peers: list[str] = option(
        ["llama_cpp.server"],
        "--peers",
        help=f"peer servers, comma-separated: {', '.join(serve_peers.PEERS)}",
        always=True,
    )
    #: the 1-client prompts run this many times (the N-client phase: at least twice)
    passes: int = option(1, "--passes", parse=int, help="interleaved passes over the prompts", always=True)
    #: llama-server-draft's -md; speclive's --draft-model with --drafter model/crossvocab/hybrid
    draft_model: str = option(
        "qwen2.5-coder-0.5b-instruct", "--draft-model", help="draft model (llama-server -md)", always=True
    )
    #: speclive's --prompt-cache (llama-server keeps each slot's last prompt by default)
    prompt_cache: bool = option(
        False,
        "--prompt-cache",
        help="run speclive with --prompt-cache (llama-server caches by default)",
        always=True,
    )
    #: restart every server before each concurrent pass: nothing a server cached in one pass
    #: (a prompt cache, llama-server's slots, ngram-mod's pool) serves the same prompts again
    fresh_servers: bool = option(
        False,
        "--fresh-servers",
        help="restart every server before each concurrent pass (no cache carries over)",
        always=True,
    )
    #: llama-server's slots (None: --clients)
    slots: int | None = option(None, "--slots", parse=int, help="llama-server's -np (default: --clients)")
    out: Path = report.out_option()
    #: results stem serve-<tag> (the command sets the default: the model)
    tag: str | None = option(None, "--tag", help="results name: serve-<tag>.*", always=True)
    plot: bool = report.plot_option()
    command: str = ""


OPTIONS = OptionSet(ServeBenchOptions)


@dataclass
class Request:
    server: str
    prompt_set: str
    prompt: str
    text: str = ""
    tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    error: str = ""
    #: which pass over the prompts (``--passes``)
    pass_index: int = 0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.total_s if self.total_s > 0 else 0.0


@dataclass
class Running:
    name: str
    url: str
    proc: subprocess.Popen
    log: Path
    extra: dict[str, Any] = field(default_factory=dict)


def start_server(
    name: str,
    cmd: list[str],
    port: int,
    log_dir: Path,
    timeout: float = 600,
    ready: str = "/v1/models",
    log_tag: str = "",
    env: dict[str, str] | None = None,
) -> Running:
    """Start ``cmd`` (``env``: variables added to this process's) and wait until ``GET ready``
    answers; its output goes to a log file (``<name><log_tag>.log``)."""
    log = log_dir / f"{name.replace('.', '_')}{log_tag}.log"
    fh = log.open("w")
    proc = subprocess.Popen(
        cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1", **(env or {})}
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; see {log}:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}{ready}", timeout=2).status_code == 200:
                return Running(name, url, proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{name} did not start within {timeout:.0f} s; see {log}")


def stop_server(srv: Running) -> None:
    srv.proc.terminate()
    try:
        srv.proc.wait(30)
    except subprocess.TimeoutExpired:
        srv.proc.kill()


def chat_stream(
    url: str, model: str, prompt: str, max_tokens: int, count: Callable[[str], int], stream: bool = True
) -> Request:
    """One greedy chat completion, streamed or whole; timings from the client's side."""
    req = Request(server="", prompt_set="", prompt=prompt)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        # llama-cpp-python's server applies a repeat penalty of 1.1 unless told otherwise:
        # plain greedy on both sides (speclive ignores the unknown field)
        "repeat_penalty": 1.0,
        "stream": stream,
    }
    parts: list[str] = []
    t0 = time.perf_counter()
    if not stream:
        try:
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
            if r.status_code != 200:
                req.error = f"HTTP {r.status_code}: {r.text[:200]}"
            else:
                parts.append(r.json()["choices"][0]["message"]["content"] or "")
        except (httpx.HTTPError, ValueError, KeyError) as e:
            req.error = f"{type(e).__name__}: {e}"
        req.total_s = req.ttft_s = time.perf_counter() - t0
        req.text = "".join(parts)
        req.tokens = count(req.text)
        return req
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
            if r.status_code != 200:
                r.read()
                req.error = f"HTTP {r.status_code}: {r.text[:200]}"
                return req
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices") or []:
                    delta = (choice.get("delta") or {}).get("content") or ""
                    if delta:
                        if not parts:
                            req.ttft_s = time.perf_counter() - t0
                        parts.append(delta)
    except httpx.HTTPError as e:
        req.error = f"{type(e).__name__}: {e}"
    req.total_s = time.perf_counter() - t0
    req.text = "".join(parts)
    req.tokens = count(req.text)
    return req


def _concurrent(
    srv: Running,
    model: str,
    prompts: list[str],
    clients: int,
    opts: ServeBenchOptions,
    count,
    pass_index: int = 0,
) -> dict[str, Any]:
    """``clients`` threads share ``prompts``; aggregate throughput, latency percentiles and the
    per-request records (prompt index, tokens, latency; no texts)."""
    results: list[tuple[int, Request]] = []
    lock = threading.Lock()
    queue = list(enumerate(prompts))

    def client() -> None:
        while True:
            with lock:
                if not queue:
                    return
                k, p = queue.pop(0)
            r = chat_stream(srv.url, model, p, opts.max_tokens, count, stream=False)
            with lock:
                results.append((k, r))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for _, r in results if not r.error]
    lat = [r.total_s for r in ok]
    return {
        "server": srv.name,
        "pass": pass_index,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "tokens": sum(r.tokens for r in ok),
        "wall_s": wall,
        "aggregate_tok_s": sum(r.tokens for r in ok) / wall if wall > 0 else 0.0,
        "latency_p50_s": percentile(lat, 50, "nearest") or 0.0,
        "latency_p99_s": percentile(lat, 99, "nearest") or 0.0,
        "error_samples": sorted({r.error for _, r in results if r.error})[:3],
        "records": [
            {"prompt": k, "tokens": r.tokens, "latency_s": round(r.total_s, 4), "error": r.error}
            for k, r in sorted(results, key=lambda kr: kr[0])
        ],
    }


def voice_session(url: str, audio: np.ndarray, speech_end_s: float, method: str) -> dict[str, Any]:
    """One spoken question through ``WS /v1/realtime`` at a microphone's pace (100 ms chunks,
    16 kHz). Latency: the chunk holding the end of speech was sent -> the first answer audio
    arrived (what a caller hears, network and queueing included)."""
    from websockets.sync.client import connect

    ws_url = url.replace("http://", "ws://") + "/v1/realtime"
    rec: dict[str, Any] = {"method": method, "latency_s": None, "error": "", "first_audio_t": None}
    step = 1600
    end_sample = int(speech_end_s * 16_000)
    try:
        with connect(ws_url, open_timeout=60, max_size=None) as ws:
            ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {"speclive": {"mode": "chat", "method": method, "sample_rate": 16_000}},
                    }
                )
            )
            sent: dict[str, float] = {}
            reader = threading.Thread(target=_read_events, args=(ws, rec, sent), daemon=True)
            reader.start()  # events are read while the audio is still being sent, as a client does
            t0 = time.perf_counter()
            for k, i in enumerate(range(0, len(audio), step)):
                due = t0 + k * step / 16_000
                time.sleep(max(0.0, due - time.perf_counter()))
                chunk = (np.clip(audio[i : i + step], -1, 1) * 32767).astype("<i2").tobytes()
                ws.send(
                    json.dumps(
                        {"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()}
                    )
                )
                if "end" not in sent and i + step >= end_sample:
                    sent["end"] = time.perf_counter()
            reader.join(120)
            if rec["first_audio_t"] is not None:
                rec["latency_s"] = rec["first_audio_t"] - sent.get("end", t0)
    except Exception as e:  # a failed session is a counted error, not the end of the run
        rec["error"] = f"{type(e).__name__}: {e}"
    if rec["latency_s"] is None and not rec["error"]:
        rec["error"] = "no answer audio"
    return rec


def _read_events(ws: Any, rec: dict[str, Any], sent: dict[str, float]) -> None:
    """Read a session's events until its answer is done; note when the first answer audio came."""
    deadline = time.perf_counter() + 180
    try:
        while time.perf_counter() < deadline:
            msg = json.loads(ws.recv(timeout=max(0.1, deadline - time.perf_counter())))
            kind = msg["type"]
            if kind == "response.output_audio.delta" and rec["first_audio_t"] is None:
                rec["first_audio_t"] = time.perf_counter()
            elif kind == "conversation.item.input_audio_transcription.completed":
                rec["transcript"] = msg["transcript"]
            elif kind == "speclive.turn_metrics":
                rec["server_latency_s"] = msg.get("latency_s")
            elif kind == "error":
                rec["error"] = msg["error"]["message"]
            elif kind == "response.done":
                return
    except Exception as e:  # a closed or failed session is a counted error
        rec["error"] = rec["error"] or f"{type(e).__name__}: {e}"


def _wait_idle(url: str, timeout: float = 60) -> None:
    """Until the server holds no session (a closed session's slot is released asynchronously)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=5).json().get("live_sessions", 0) == 0:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


def _sessions_at_once(
    url: str, batch: list[tuple[str, np.ndarray, float]], method: str
) -> list[dict[str, Any]]:
    """One voice session per spoken question in ``batch``, all at once (a thread each)."""
    out: list[dict[str, Any]] = [{} for _ in batch]

    def run(j: int) -> None:
        text, audio, end_s = batch[j]
        out[j] = voice_session(url, audio, end_s, method) | {"question": text}

    threads = [threading.Thread(target=run, args=(j,)) for j in range(len(batch))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _voice_phase(url: str, opts: ServeBenchOptions, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Spoken MT-Bench questions (Piper) through the WebSocket, PredGen and the cascade
    alternating, at each concurrency (that many sessions at once, different questions)."""

    tts = PiperTTS()
    spoken = []
    for q in chat_questions(opts.voice_questions):
        s = speak(tts, q["prompt"], None, tail_s=2.0)
        spoken.append((q["prompt"], s["audio"], s["input_s"] - 2.0))
    records: list[dict[str, Any]] = []
    methods = ("predgen", "cascade")
    for i in range(len(spoken)):
        for conc in opts.voice_sessions:
            order = methods if i % 2 == 0 else methods[::-1]
            for method in order:
                batch = [spoken[(i + j) % len(spoken)] for j in range(conc)]
                _wait_idle(url)
                out = _sessions_at_once(url, batch, method)
                records += [r | {"concurrency": conc} for r in out]
                log(f"voice: question {i + 1}/{len(spoken)}, {conc} session(s), {method}")
    return records


def concurrent_passes(
    names: Sequence[str],
    passes: int,
    run_pass: Callable[[str, int], dict[str, Any]],
    restart: Callable[[str, int], None] | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """At least two passes of every server, the servers' order rotated per pass; ``restart``
    (``--fresh-servers``) starts a server again right before each of its passes."""
    rows = []
    for k in range(max(2, passes)):
        for name in rotated(names, k):
            if restart is not None:
                log(f"restarting {name} for pass {k + 1} ...")
                restart(name, k)
            rows.append(run_pass(name, k))
    return rows


def run_serve_bench(opts: ServeBenchOptions, log: Callable[[str], None]) -> dict[str, Any]:
    from llama_cpp import Llama

    gguf = resolve(opts.model).gguf
    if gguf is None:
        raise RuntimeError(f"{opts.model} has no GGUF file: every server needs one")
    vocab = Llama(str(gguf), vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False)) if text else 0

    header = {"machine": report.machine_info(), "target": opts.model, "gguf": Path(gguf).name}
    log_dir = Path(tempfile.mkdtemp(prefix="speclive-bench-serve-"))  # the servers' output
    log(f"server logs in {log_dir}")
    # speclive computes that many requests at once (their verification passes batched)
    sessions = opts.max_sessions or max(opts.clients, *opts.voice_sessions, 1)
    # without prompt sets only the realtime phase runs (and only speclive is started)
    names = server_names(opts) if opts.prompts else ("speclive",)
    cmds = _server_commands(opts, str(gguf), names, sessions)
    servers: dict[str, Running] = {}
    concurrent: list[dict[str, Any]] = []
    models: dict[str, str] = {}
    warm = next(iter(opts.prompts.values()), [])[: opts.warmup]

    def start(name: str, log_tag: str = "") -> None:
        """Start ``name`` and send it the warm-up requests (not counted)."""
        port, cmd = cmds[name]
        srv = start_server(
            name,
            cmd,
            port,
            log_dir,
            ready=serve_peers.ready_path(name),
            log_tag=log_tag,
            env=server_env(name, log_dir),
        )
        servers[name] = srv
        models[name] = httpx.get(f"{srv.url}/v1/models").json()["data"][0]["id"]
        for p in warm:
            chat_stream(srv.url, models[name], p, opts.max_tokens, count)

    def restart(name: str, k: int) -> None:
        stop_server(servers.pop(name))
        start(name, f"-pass{k + 1}")

    def run_pass(name: str, k: int) -> dict[str, Any]:
        log(f"{opts.clients} clients on {name}, pass {k + 1} ...")
        return _concurrent(servers[name], models[name], all_prompts, opts.clients, opts, count, k)

    try:
        for name in names:
            log(f"starting {name} ...")
            start(name)
        single = _single_client(servers, models, opts, count, log) if opts.single else []
        all_prompts = [p for v in opts.prompts.values() for p in v]
        if opts.prompts and opts.clients:
            concurrent = concurrent_passes(
                names, opts.passes, run_pass, restart if opts.fresh_servers else None, log
            )
        voice = _voice_phase(servers["speclive"].url, opts, log) if opts.voice_questions else []
    finally:
        for srv in servers.values():
            stop_server(srv)
    header |= {
        "settings": _serve_settings(opts, sessions),
        "command": opts.command,
        "servers": {n: {"command": c} for n, (_, c) in cmds.items()} | _llama_server_build(names),
    }
    return {
        "header": header,
        "single": [r.__dict__ for r in single],
        "concurrent": concurrent,
        "voice": voice,
        "summary": summarize(single, concurrent, names) | {"voice": summarize_voice(voice)},
    }


def server_env(name: str, run_dir: Path) -> dict[str, str] | None:
    """Variables a server of the run starts with: speclive's saved knowledge (what its drafters
    learn across requests) lives in ``run_dir``, so it starts from the priors in every run and
    stays within it (across its passes and restarts, as a server's does); a run never starts
    from what earlier runs on the machine taught the drafters."""
    return {DIR_ENV: str(run_dir / "speclive-knowledge")} if name == "speclive" else None


def server_names(opts: ServeBenchOptions) -> tuple[str, ...]:
    """speclive, then the peers of the run."""
    return ("speclive", *serve_peers.check_peers(opts.peers))


def _llama_server_build(names: tuple[str, ...]) -> dict[str, Any]:
    """The llama-server build's record (version, flags, build time), when a peer used it."""
    if not serve_peers.needs_llama_server(names):
        return {}
    binary = serve_peers.find_llama_server()
    out: dict[str, Any] = {"binary": str(binary)}
    for name in ("build.json", "version.txt"):
        f = binary.parent / name
        if f.is_file():
            out[name] = json.loads(f.read_text()) if name.endswith(".json") else f.read_text().strip()
    return {"llama-server build": out}


def _server_commands(
    opts: ServeBenchOptions, gguf: str, names: tuple[str, ...], sessions: int
) -> dict[str, tuple[int, list[str]]]:
    """Each server's port and command line on ``gguf``: speclive computing ``sessions``
    requests at once (their verification passes batched), the peers as ``serve_peers`` has them."""
    py = sys.executable
    out: dict[str, tuple[int, list[str]]] = {}
    for name in names:
        port = free_port()
        if name != "speclive":
            out[name] = (port, serve_peers.peer_command(name, _peer_setup(opts, gguf, port, names)))
            continue
        drafted = opts.drafter in ("model", "crossvocab", "hybrid")
        out[name] = (
            port,
            SERVE_OPTIONS.argv(
                [py, "-m", "speclive.cli", "serve"],
                SERVE_OPTIONS.preset(
                    port=port,
                    model=opts.model or DEFAULT_MODEL,
                    drafter=opts.drafter,
                    draft_model=opts.draft_model if drafted else None,
                    threads=opts.threads,
                    n_ctx=opts.n_ctx,
                    max_sessions=sessions,
                    prompt_cache=opts.prompt_cache,
                ),
            ),
        )
    return out


def _peer_setup(
    opts: ServeBenchOptions, gguf: str, port: int, names: tuple[str, ...]
) -> serve_peers.PeerSetup:
    """What a peer gets: the run's GGUF, threads, context, llama-server's slots and draft."""
    draft = None
    if "llama-server-draft" in names:
        draft_gguf = resolve(opts.draft_model).gguf
        if draft_gguf is None:
            raise ConfigError(f"draft model {opts.draft_model} has no GGUF file (llama-server -md needs one)")
        draft = str(draft_gguf)
    return serve_peers.PeerSetup(
        gguf=gguf,
        port=port,
        threads=opts.threads,
        n_ctx=opts.n_ctx,
        slots=opts.slots or max(1, opts.clients),
        draft_gguf=draft,
        repack=extra_buffers_safe(Path(gguf)),
    )


def _single_client(
    servers: dict[str, Running], models: dict[str, str], opts: ServeBenchOptions, count, log
) -> list[Request]:
    """Every prompt on every server, one request at a time, the servers' order rotated per
    prompt; ``opts.passes`` times over (the rotation goes on across passes)."""
    single: list[Request] = []
    names = list(servers)
    total = sum(len(v) for v in opts.prompts.values()) * opts.passes
    i = 0
    for k in range(opts.passes):
        for set_name, prompts in opts.prompts.items():
            for p in prompts:
                for name in rotated(names, i):
                    r = chat_stream(servers[name].url, models[name], p, opts.max_tokens, count)
                    r.server, r.prompt_set, r.pass_index = name, set_name, k
                    single.append(r)
                i += 1
                log(f"1 client: {i}/{total} prompts")
    return single


def _serve_settings(opts: ServeBenchOptions, sessions: int) -> dict[str, Any]:
    return {
        "max_tokens": opts.max_tokens,
        "clients": opts.clients,
        "threads": opts.threads,
        "n_ctx": opts.n_ctx,
        "drafter": opts.drafter,
        "draft_model": opts.draft_model,
        "peers": list(opts.peers),
        "passes": opts.passes,
        "single_client_phase": opts.single,
        "llama_server_slots": opts.slots or max(1, opts.clients),
        "warmup_requests": opts.warmup,
        "prompts": {k: len(v) for k, v in opts.prompts.items()},
        "voice_questions": opts.voice_questions,
        "voice_concurrency": list(opts.voice_sessions),  # the key earlier results use
        "speclive_max_sessions": sessions,
        "speclive_prompt_cache": opts.prompt_cache,
        "fresh_servers": opts.fresh_servers,
        "speclive_knowledge": "private to the run, empty at its start",
    }


def summarize_voice(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency and method: median / p90 voice-to-voice latency, errors; the median
    ratio cascade / PredGen."""
    rows = []
    for conc in sorted({r["concurrency"] for r in records}):
        row: dict[str, Any] = {"concurrency": conc}
        for m in ("predgen", "cascade"):
            lat = sorted(
                r["latency_s"]
                for r in records
                if r["concurrency"] == conc and r["method"] == m and r["latency_s"] is not None
            )
            row[m] = {
                "median_s": statistics.median(lat) if lat else None,
                "p90_s": percentile(lat, 90, "nearest"),
                "n": len(lat),
                "errors": sum(
                    1 for r in records if r["concurrency"] == conc and r["method"] == m and r["error"]
                ),
            }
        a, b = row["predgen"]["median_s"], row["cascade"]["median_s"]
        row["ratio"] = b / a if a and b else None
        rows.append(row)
    return rows


def result_servers(result: dict[str, Any]) -> tuple[str, ...]:
    """speclive and the peers of a result (older results: llama_cpp.server)."""
    return ("speclive", *result["header"].get("settings", {}).get("peers", ["llama_cpp.server"]))


def serve_markdown(result: dict[str, Any]) -> str:
    h = result["header"]
    servers = result_servers(result)
    lines = report.markdown_preamble(f"speclive serve vs {', '.join(servers[1:])}", h)
    s = result["summary"]
    if s["single"] or result.get("concurrent"):
        passes = h.get("settings", {}).get("passes", 1)
        lines += [
            "Every server: the same GGUF, threads and context, greedy, streamed (SSE) to the same client; "
            "completion tokens counted with the GGUF's tokenizer for all. *1 client*: every prompt to "
            f"every server, order rotated per prompt, {passes} pass(es); ratios paired per prompt and "
            "pass, 95 % bootstrap intervals in brackets. *Concurrent*: the clients share all prompts, "
            "whole (not streamed) responses; each server measured once per pass (at least two, order "
            "rotated), the passes averaged and their requests pooled."
            + (
                " Every server was started again before each of its passes (`--fresh-servers`):"
                " nothing cached in one pass served the next."
                if h["settings"].get("fresh_servers")
                else ""
            )
            + (
                " speclive's drafters learn across requests (saved knowledge); that knowledge"
                " started empty (the priors) in a directory private to this run."
                if h["settings"].get("speclive_knowledge")
                else ""
            ),
            "",
            *([*single_table(s["single"], servers), ""] if s["single"] else []),
            *concurrent_table(s["concurrent"], servers, h["settings"]["clients"]),
        ]
        c = s["concurrent"]
        if "aggregate_ratio" in c:
            lines += ["", f"Aggregate throughput, speclive / {servers[1]}: **{c['aggregate_ratio']:.2f}×**"]
    lines += _voice_table(s.get("voice") or [])
    return "\n".join(lines)


def _voice_table(voice: list[dict[str, Any]]) -> list[str]:
    if not voice:
        return []
    lines = [
        "",
        "Realtime voice chat through `WS /v1/realtime` (spoken MT-Bench questions, Piper, streamed "
        "at 1x in 100 ms chunks; latency = the chunk with the end of speech sent -> first answer "
        "audio received):",
        "",
        "| sessions at once | PredGen median s | p90 s | cascade median s | p90 s | cascade / PredGen "
        "| errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in voice:
        p, q = r["predgen"], r["cascade"]
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}×"
        lines.append(
            f"| {r['concurrency']} | {report._fmt(p['median_s'])} | {report._fmt(p['p90_s'])} | "
            f"{report._fmt(q['median_s'])} | {report._fmt(q['p90_s'])} | "
            f"{ratio} | {p['errors'] + q['errors']} |"
        )
    return lines


def plot_serve(path: Path, result: dict[str, Any]) -> Path:
    """Bars: median tok/s per prompt set (1 client) and aggregate tok/s (N clients), per server,
    for the phases that ran; the realtime phase's latency when it ran alone."""
    plt = report._pyplot()
    s = result["summary"]
    concurrent = bool(s.get("concurrent"))
    if not s["single"] and not concurrent:  # the realtime phase only: voice-to-voice latency
        rows = s.get("voice") or []
        fig, ax = plt.subplots(figsize=(6, 3.4))
        w = 0.38
        for k, m in enumerate(("predgen", "cascade")):
            xs = [i + (k - 0.5) * w for i in range(len(rows))]
            ax.bar(xs, [r[m]["median_s"] or 0 for r in rows], w, label=m)
        ax.set_xticks(range(len(rows)), [f"{r['concurrency']} session(s)" for r in rows])
        ax.set_ylabel("median voice-to-voice latency (s)")
        ax.set_title(f"WS /v1/realtime ({result['header']['target']})", fontsize=10)
        ax.legend(frameon=False)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path
    servers = result_servers(result)
    groups = [f"{g}, 1 client" for g in s["single"]]
    groups += [f"{result['header']['settings']['clients']} clients (aggregate)"] if concurrent else []
    vals = {
        n: [(s["single"][g].get(n) or {}).get("tok_s") or 0 for g in s["single"]]
        + ([s["concurrent"].get(n, {}).get("aggregate_tok_s", 0)] if concurrent else [])
        for n in servers
    }
    fig, ax = plt.subplots(figsize=(7 + len(servers), 3.6))
    w = 0.8 / len(servers)
    for k, n in enumerate(servers):
        xs = [i + (k - (len(servers) - 1) / 2) * w for i in range(len(groups))]
        ax.bar(xs, vals[n], w, label=n)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("tokens / s")
    ax.set_title(f"speclive serve vs {', '.join(servers[1:])} ({result['header']['target']})", fontsize=10)
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def add_serve_bench_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="speclive serve vs peer OpenAI servers (llama-cpp-python, llama-server): TTFT, tok/s, N clients",
    )
    OPTIONS.add_to(p)
    p.set_defaults(func=cmd_serve_bench)


def _prompt_sets(names: list[str], limit: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name in names:
        if name == "none":
            continue
        if name == "mtbench":
            qs = datasets.mtbench_questions(1)
            step = max(1, len(qs) // limit)
            out[name] = [q["prompt"] for q in qs[::step][:limit]]
        elif name == "code-edit":
            out[name] = [r["prompt"] for r in datasets.code_edit_prompts(limit)]
        else:
            raise ConfigError(f"unknown prompt set {name!r}; known: mtbench, code-edit")
    return out


def cmd_serve_bench(args: argparse.Namespace) -> int:
    opts = OPTIONS.build(args)
    serve_peers.check_peers(opts.peers)
    if opts.passes < 1:
        raise ConfigError(f"--passes must be at least 1, not {opts.passes}")
    if serve_peers.needs_llama_server(opts.peers):
        serve_peers.find_llama_server()  # a missing build is an error now, not after loading
    opts.prompts = _prompt_sets(opts.sets, opts.limit)
    opts.model = opts.model or DEFAULT_MODEL
    opts.tag = opts.tag or opts.model
    opts.command = OPTIONS.command(["speclive", "bench", "serve"], opts)
    # a stopped run (SIGTERM) still stops the servers it started (run_serve_bench's finally)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run_serve_bench(opts, lambda m: print(m, file=sys.stderr))
    for p in report.write_result_files(
        result, opts.out, f"serve-{opts.tag}", serve_markdown, plot_serve if opts.plot else None
    ):
        print(f"wrote {p}", file=sys.stderr)
    print(serve_markdown(result))
    return 0
