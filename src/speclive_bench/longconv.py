"""``speclive bench longconv``: long realtime conversations until the KV cells run out.

``speclive serve`` runs as a separate process with a small context (``--n-ctx``: the KV cells
every conversation shares), so that ``--sessions`` conversations of ``--turns`` turns cannot
all stay in the cache: a turn that needs cells evicts the least recently used conversation,
whose next turn prefills it again (``restore_evicted``, ``speclive_kv_cell_evictions`` and
``speclive_kv_restores`` on ``/metrics``).

Each session is a realtime WebSocket in chat mode (text answers, no speech synthesis, greedy)
speaking short questions (Piper) sent faster than real time; the server's VAD ends each turn
on the trailing silence. One turn runs at a time: the sessions take ``--burst`` consecutive
turns each, in turn, so the first turn of a block finds its conversation evicted once the
cells are full and the others find it resident. ``/metrics`` is read before and after every
turn: a turn during which the restores went up is a *restored* turn.

Once the server has stopped, every answer is computed again from a fresh state: the same
GGUF and context size in this process, the server's voice prompt, the conversation so far (the
transcripts and answers the session had) and the turn's transcript (``PredictiveResponder``
on a new KV state, with the server's conversation window, restarted turn by turn as the
session's was, so it leaves out the same oldest turns). An answer equal to it is *equal*;
otherwise the first differing token is read off plain greedy decoding's logits there: a top-2
gap below ``report.NEAR_TIE_GAP`` is a *near-tie* flip (quantized kernels depend on the batch
shape), a larger one a *bug*. The conversations are saved to the temporary folder before the check
(``longconv-<tag>-turns.json``); ``--turns-from`` runs the check alone on such a file.
Results: ``benchmarks/results/longconv-<tag>.{json,md}``.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from websockets.sync.client import ClientConnection, connect

from speclive.common_options import asr_draft_option, asr_model_option, model_option, threads_option
from speclive.live.voicechat import voice_predgen
from speclive.loader import load_backend
from speclive.options import OptionSet, option
from speclive.server.config import SERVE_OPTIONS
from speclive.server.inproc import free_port
from speclive.server.realtime_settings import conversation_window
from speclive.sessions.predictive import PredictiveResponder
from speclive_bench import report
from speclive_bench.exactness import ar_logit_gap
from speclive_bench.fuzz_realtime import scrape
from speclive_bench.serve import start_server, stop_server
from speclive_bench.soak import _spoken as spoken

#: the questions a conversation asks, session ``i`` starting at question ``8 * i``
QUESTIONS = (
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Why is the sky blue during the day?",
    "Name three colors of the rainbow.",
    "What do bees make from flowers?",
    "How far away is the moon?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water?",
    "Can you recommend a book about space?",
    "What is the largest ocean on our planet?",
    "How do airplanes stay in the air?",
    "What is the tallest mountain in the world?",
    "Tell me a fun fact about elephants.",
    "What is the main ingredient of guacamole?",
    "How many days are in a leap year?",
    "Which planet is known as the red planet?",
    "What language do people speak in Brazil?",
    "How many minutes are in an hour?",
    "What is the opposite of hot?",
    "Why do leaves change color in autumn?",
    "What animal is the king of the jungle?",
    "How do I make a cup of tea?",
    "What is the fastest land animal?",
    "Which season comes after winter?",
    "What do plants need to grow?",
    "How many strings does a guitar have?",
    "What is the freezing point of water?",
    "Who painted the Mona Lisa?",
    "What is the capital of Japan?",
    "How many continents are there?",
    "What gas do we breathe in to live?",
    "What is a good name for a cat?",
)
#: the classes of a compared answer
VERDICTS = ("equal", "near-tie", "bug")


@dataclass
class LongConvOptions:
    """Settings of ``bench longconv``; each field with a flag is its command-line option."""

    sessions: int = option(4, "--sessions", parse=int, help="conversations at once", always=True)
    turns: int = option(30, "--turns", parse=int, help="turns of each conversation", always=True)
    #: the server's context size: the KV cells all conversations share
    n_ctx: int = option(512, "--n-ctx", parse=int, help="the server's context (KV cells)", always=True)
    #: consecutive turns a session takes before the next one speaks
    burst: int = option(2, "--burst", parse=int, help="consecutive turns per session", always=True)
    #: the realtime chat method (``cascade``: the answer starts at the end of the turn)
    method: str = option("cascade", "--method", help="realtime chat method", always=True)
    #: the turns whose answers are computed again from a fresh state: ``restored`` or ``all``
    check: str = option(
        "restored",
        "--check",
        choices=("restored", "all"),
        help="answers checked against a fresh state",
        always=True,
    )
    model: str = model_option("smollm2-135m-instruct", always=True)
    asr_model: str = asr_model_option("whisper-tiny.en", always=True)
    asr_draft: str = asr_draft_option("self:1", always=True)
    #: llama.cpp threads of the server and the reference: one, since on a shared machine the
    #: threads of one decode wait for each other whenever one of them is not scheduled
    threads: int = threads_option(1, help="llama.cpp threads (server and reference)", always=True)
    #: the conversations of an earlier run (the JSON it saved before its check): only the check
    #: runs, on these, with the settings given here (which should be that run's)
    turns_from: Path | None = option(None, "--turns-from", parse=Path, help="check a saved run's turns")
    out: Path = report.out_option()
    #: results stem longconv-<tag> (the command sets the default: the model)
    tag: str | None = option(None, "--tag", help="results name: longconv-<tag>.*", always=True)
    command: str = ""


OPTIONS = OptionSet(LongConvOptions)


def add_longconv_parser(sub: Any) -> None:
    p = sub.add_parser(
        "longconv", help="long realtime conversations until KV-cell evictions; restored answers"
    )
    OPTIONS.add_to(p)
    p.set_defaults(func=cmd_longconv)


def schedule(sessions: int, turns: int, burst: int) -> list[int]:
    """The session of each turn in order: ``burst`` consecutive turns each, round robin, until
    every session has taken ``turns``."""
    done = [0] * sessions
    order: list[int] = []
    while min(done) < turns:
        for s in range(sessions):
            k = min(max(1, burst), turns - done[s])
            order += [s] * k
            done[s] += k
    return order


# ---- the conversations -------------------------------------------------------------------------
def _open_session(url: str, method: str) -> ClientConnection:
    """A realtime chat session answering in text (no speech synthesis), 16 kHz input."""
    ws = connect(url.replace("http://", "ws://") + "/v1/realtime", open_timeout=120, max_size=None)
    first = json.loads(ws.recv(timeout=120))
    if first.get("type") != "session.created":
        raise RuntimeError(f"expected session.created, got {first.get('type')}")
    update = {"modalities": ["text"], "speclive": {"sample_rate": 16_000, "mode": "chat", "method": method}}
    ws.send(json.dumps({"type": "session.update", "session": update}))
    while (kind := json.loads(ws.recv(timeout=120)).get("type")) != "session.updated":
        if kind == "error":
            raise RuntimeError("session.update refused")
    return ws


def take_turn(ws: ClientConnection, audio: np.ndarray, timeout: float = 300.0) -> dict[str, Any]:
    """Send one spoken question (faster than real time; its trailing silence ends the turn) and
    read the events until its response is done: transcript, answer, status, errors."""
    rec: dict[str, Any] = {"errors": []}
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    step = 32_000  # 1 s of 16 kHz 16-bit audio per append
    t0 = time.perf_counter()
    for i in range(0, len(pcm), step):
        chunk = base64.b64encode(pcm[i : i + step]).decode()
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
    deadline = t0 + timeout
    while True:
        msg = json.loads(ws.recv(timeout=max(1.0, deadline - time.perf_counter())))
        kind = msg.get("type")
        if kind == "speclive.turn_metrics":
            rec["transcript"], rec["answer"] = msg.get("transcript"), msg.get("answer")
        elif kind == "error":
            rec["errors"].append(msg["error"].get("code"))
        elif kind == "response.done":
            rec["status"] = msg["response"]["status"]
            rec["turn_s"] = round(time.perf_counter() - t0, 3)
            return rec


def converse(
    url: str, opts: LongConvOptions, audio: Sequence[np.ndarray], log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Every session's turns in ``schedule`` order, one at a time; per turn the transcript, the
    answer, the history it answered with and the eviction / restore counts it saw."""
    http = httpx.Client(base_url=url, timeout=60)
    wss = [_open_session(url, opts.method) for _ in range(opts.sessions)]
    history: list[list[dict[str, str]]] = [[] for _ in wss]
    asked = [0] * opts.sessions
    records: list[dict[str, Any]] = []
    try:
        order = schedule(opts.sessions, opts.turns, opts.burst)
        for n, s in enumerate(order):
            before = scrape(http)
            q = (8 * s + asked[s]) % len(QUESTIONS)
            rec = take_turn(wss[s], audio[q])
            after = scrape(http)
            rec |= {"session": s, "turn": asked[s], "question": QUESTIONS[q], "history": list(history[s])}
            for key in ("kv_cell_evictions", "kv_restores"):
                rec[key] = after.get(key, 0.0) - before.get(key, 0.0)
            rec["restored"] = rec["kv_restores"] > 0
            records.append(rec)
            asked[s] += 1
            if rec.get("answer") is not None:
                history[s] += [
                    {"role": "user", "content": rec.get("transcript") or ""},
                    {"role": "assistant", "content": rec["answer"]},
                ]
            log(f"  session {s} turn {asked[s] - 1}: {rec.get('turn_s')} s")
            if (n + 1) % 10 == 0 or n + 1 == len(order):
                log(
                    f"  {n + 1}/{len(order)} turns, evictions {after.get('kv_cell_evictions', 0):.0f}, "
                    f"restores {after.get('kv_restores', 0):.0f}"
                )
    finally:
        for ws in wss:
            ws.close()
        http.close()
    return records


# ---- the fresh-state reference -----------------------------------------------------------------
def divergence_position(tok: Any, answer: str, ref_ids: Sequence[int]) -> int:
    """The first token of ``ref_ids`` whose text leaves ``answer`` (the served answer is text:
    its own tokenization need not be the reference's); ``len(ref_ids)`` when the reference
    text is all a prefix of the answer (the answer goes on past it)."""
    for k in range(len(ref_ids)):
        if not answer.startswith(tok.decode(list(ref_ids[: k + 1]))):
            return k
    return len(ref_ids)


def classify(
    answer: str, reference: str, gap_top2: float | None, near_tie: float = report.NEAR_TIE_GAP
) -> str:
    """``equal``, or, at the first difference, a ``near-tie`` (plain greedy's top-2 logit gap
    below ``near_tie``) or a ``bug``."""
    if answer == reference:
        return "equal"
    return "near-tie" if gap_top2 is not None and gap_top2 < near_tie else "bug"


def check_against_fresh(
    llm: Any, records: list[dict[str, Any]], log: Callable[[str], None], restored_only: bool = False
) -> None:
    """Each answered turn's answer (``restored_only``: each restored turn's) from a fresh state
    (module docstring): every such record gets ``reference`` and ``verdict``, a differing one
    its ``divergence``."""
    # the server's voice prompt, answer length and conversation window (its share of the cells)
    pcfg = voice_predgen(context_tokens=conversation_window(llm))
    todo = [
        r
        for r in records
        if r.get("answer") is not None
        and r.get("transcript") is not None
        and (r["restored"] or not restored_only)
    ]
    for k, r in enumerate(todo):
        resp = PredictiveResponder(llm, pcfg, mode="cascade")
        history = r["history"]
        for n in range(2, len(history), 2):  # the oldest turns left out as the session left them
            resp.restart(history[:n])
        resp.restart(history)
        try:
            prompt = resp.prompt_ids(r["transcript"])
            res = resp.finish(r["transcript"])
        finally:
            resp.close()
        r["reference"] = res.response
        gap = None
        if r["answer"] != res.response:
            pos = divergence_position(llm.tokenizer, r["answer"], res.token_ids)
            div = ar_logit_gap(llm, prompt, res.token_ids, pos, None)
            r["divergence"] = {"position": pos, **div}
            gap = div["gap_top2"]
        r["verdict"] = classify(r["answer"], res.response, gap)
        log(f"  checked {k + 1}/{len(todo)}: session {r['session']} turn {r['turn']}: {r['verdict']}")
        if r["verdict"] == "bug":
            log(
                f"BUG? session {r['session']} turn {r['turn']} (restored: {r['restored']}): the answer "
                f"differs at token {r['divergence']['position']} (top-2 gap {gap:.3f})"
            )


# ---- figures -----------------------------------------------------------------------------------
def summarize(records: Sequence[dict[str, Any]], final: dict[str, float]) -> dict[str, Any]:
    """Turns, the server's evictions and restores, and the verdicts of restored and other turns."""
    out: dict[str, Any] = {
        "turns": len(records),
        "answered": sum(1 for r in records if r.get("answer") is not None),
        "errors": sum(
            len(r.get("errors") or []) + (r.get("status", "completed") != "completed") for r in records
        ),
        "kv_cell_evictions": final.get("kv_cell_evictions", 0.0),
        "kv_restores": final.get("kv_restores", 0.0),
        "turns_per_session": {},
    }
    for s in sorted({r["session"] for r in records}):
        out["turns_per_session"][str(s)] = sum(1 for r in records if r["session"] == s)
    for name, rows in (
        ("restored", [r for r in records if r.get("restored")]),
        ("resident", [r for r in records if not r.get("restored")]),
    ):
        checked = [r for r in rows if "verdict" in r]
        out[name] = {"turns": len(rows), "checked": len(checked)} | {
            v: sum(1 for r in checked if r["verdict"] == v) for v in VERDICTS
        }
    first = next((i for i, r in enumerate(records) if r.get("kv_cell_evictions")), None)
    out["first_eviction_turn"] = first  # the index of the first turn that evicted (None: none)
    out["turn_s_median"] = (
        float(np.median([r["turn_s"] for r in records if "turn_s" in r])) if records else None
    )
    return out


def longconv_markdown(result: dict[str, Any]) -> str:
    s, h = result["summary"], result["header"]
    lines = report.markdown_preamble("Long conversations: KV-cell evictions and restored answers", h)
    st = h["settings"]
    lines += [
        f"{st['sessions']} realtime conversations of {st['turns']} turns each ({st['method']}, greedy, text "
        f"answers), {st['burst']} consecutive turns per session in turn, on a server with a "
        f"{st['n_ctx']}-token context (the KV cells all conversations share). The answers of "
        f"{'every turn' if st.get('check') == 'all' else 'the restored turns'} were "
        "computed again from a fresh state (same GGUF, voice prompt, history and transcript); a "
        "difference is a near-tie flip when "
        f"plain greedy's top-2 logit gap at the first differing token is below {report.NEAR_TIE_GAP}, a bug "
        "otherwise.",
        "",
        "| turns | answered | errors | KV-cell evictions | restores | first eviction at turn |",
        "|---|---|---|---|---|---|",
        f"| {s['turns']} | {s['answered']} | {s['errors']} | {s['kv_cell_evictions']:.0f} | "
        f"{s['kv_restores']:.0f} | {s['first_eviction_turn']} |",
        "",
        "| turns | count | checked | equal | near-tie | bug |",
        "|---|---|---|---|---|---|",
    ]
    for name, label in (("restored", "after a restore"), ("resident", "conversation resident")):
        v = s[name]
        lines.append(
            f"| {label} | {v['turns']} | {v['checked']} | {v['equal']} | {v['near-tie']} | {v['bug']} |"
        )
    return "\n".join(lines)


# ---- the run -----------------------------------------------------------------------------------
def hold_conversations(opts: LongConvOptions, log: Callable[[str], None]) -> dict[str, Any]:
    """Start the server, hold the conversations, stop it: the turns' ``records``, the server's
    ``final`` counts and the conversations' ``run_s``."""
    log(f"speaking {len(QUESTIONS)} questions with Piper ...")
    audio = spoken(QUESTIONS, "piper-joe-medium")  # with the silence that ends a turn after each
    port = free_port()
    server = SERVE_OPTIONS.preset(
        port=port,
        model=opts.model,
        asr_model=opts.asr_model,
        asr_draft=opts.asr_draft,
        n_ctx=opts.n_ctx,
        threads=opts.threads,
        max_sessions=opts.sessions,
        # one turn runs at a time, its audio sent at once: no turn is refused for its wait, and
        # a session waiting for the others' turns is not closed as idle
        max_wait_s=0.0,
        realtime_idle_s=0.0,
    )
    cmd = [
        *SERVE_OPTIONS.argv([sys.executable, "-m", "speclive.cli", "serve"], server),
        "--log-level",
        "warning",
    ]
    opts.out.mkdir(parents=True, exist_ok=True)
    srv = start_server(
        f"longconv-{opts.tag or opts.model}", cmd, port, opts.out, timeout=900, ready="/health"
    )
    t0 = time.perf_counter()
    try:
        records = converse(srv.url, opts, audio, log)
        final = scrape(httpx.Client(base_url=srv.url, timeout=60))
    finally:
        stop_server(srv)
    return {"records": records, "final": final, "run_s": round(time.perf_counter() - t0, 1)}


def save_turns(held: dict[str, Any], path: Path) -> Path:
    """``hold_conversations``'s output as JSON (``--turns-from`` checks it again later)."""
    path.write_text(json.dumps(held, indent=1) + "\n")
    return path


def run_longconv(opts: LongConvOptions, log: Callable[[str], None]) -> dict[str, Any]:
    """Hold the conversations (or read them: ``--turns-from``), then check the answers. The
    conversations are saved to the temporary folder before the check, so a check cut short
    can be run again on them."""
    load_avg_start = report.load_avg()
    if opts.turns_from is not None:
        held = json.loads(opts.turns_from.read_text())
    else:
        held = hold_conversations(opts, log)
        saved = Path(tempfile.gettempdir()) / f"longconv-{opts.tag or opts.model}-turns.json"
        log(f"conversations saved to {save_turns(held, saved)} (--turns-from checks them again)")
    records, final = held["records"], held["final"]
    log("answers from fresh states ...")
    # the server's context and KV states (``ChatEngine.load``), in a process of its own
    llm = load_backend(
        opts.model, "llamacpp", n_ctx=opts.n_ctx, threads=opts.threads, max_states=max(4, opts.sessions)
    )
    check_against_fresh(llm, records, log, restored_only=opts.check == "restored")
    settings = {
        k: getattr(opts, k) for k in ("sessions", "turns", "n_ctx", "burst", "method", "threads", "check")
    }
    header = {
        "machine": report.machine_info(load_avg_start),
        "target": opts.model,
        "models": {"llm": opts.model, "asr": f"{opts.asr_model} (+{opts.asr_draft} draft)"},
        "settings": settings,
        "command": opts.command,
    }
    return {
        "header": header,
        "summary": summarize(records, final) | {"run_s": held["run_s"]},
        "turns": records,
    }


def cmd_longconv(args: argparse.Namespace) -> int:
    opts = OPTIONS.build(args)
    opts.tag = opts.tag or opts.model
    opts.command = OPTIONS.command(["speclive", "bench", "longconv"], opts)
    report.refuse_dirty_results(opts.out)
    result = run_longconv(opts, lambda m: print(m, file=sys.stderr, flush=True))
    for p in report.write_result_files(result, opts.out, f"longconv-{opts.tag}", longconv_markdown, None):
        print(f"wrote {p}", file=sys.stderr)
    print(longconv_markdown(result))
    s = result["summary"]
    return 1 if s["errors"] or s["restored"]["bug"] or s["resident"]["bug"] else 0
