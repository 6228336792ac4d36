"""``speclive bench predgen``: PredGen Table 1 on this machine (MT-Bench, turns 1 and 2).

Every question is spoken by a simulated user at ``--cpm`` characters per minute (honest
clock: speculative compute that overruns the input delays the final step) and answered by
each method side by side, in an order rotated per question:

- ``baseline``: the plain cascade: wait for the full prompt, generate, synthesize the first
  sentence, then speak;
- ``greedy``, ``topk:3``, ``reflection``: PredGen verifiers.

Reported per method and turn: TTFS, NFETFS, audio latency (real Piper synthesis time), how
often the pre-synthesized audio was used, speedup of the mean audio latency over the
baseline's, agreement of the answer with the baseline's, and optionally a judge score
(MT-Bench single-answer prompt ``single-v1``, judged by the largest local model). Turn 2
carries turn 1 (question + the baseline's answer) as history, for every method alike.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from speclive.common_options import backend_option, max_tokens_option, model_option
from speclive.decoder import GenerationConfig, SpeculativeDecoder
from speclive.loader import load_backend, make_drafter
from speclive.models.install import install, installed_path
from speclive.options import option
from speclive.sessions.predictive import PredictiveResponder, chat_prompt, parse_method
from speclive.sessions.simulate import simulate_user
from speclive.tts.piper import PiperTTS
from speclive_bench import report
from speclive_bench.datasets import mtbench_questions
from speclive_bench.exactness import ar_logit_gap, first_divergence
from speclive_bench.harness import rotated

METHODS = ("baseline", "greedy", "topk:3", "reflection")


@dataclass
class PredGenBenchOptions:
    """Settings of ``bench predgen``; each field with a flag is its command-line option."""

    model: str = model_option(always=True)
    backend: str = backend_option(always=True)
    device: str = report.hf_device_option()
    methods: Sequence[str] = option(
        METHODS,
        "--methods",
        help="baseline and verifiers (greedy, topk:K, reflection), each optionally with options "
        "@sentence|@chunks (how the first sentence is verified), @fits (pre-synthesize only what "
        "fits before the next word) and @eager (every new first sentence at once)",
        always=True,
    )
    turns: Sequence[int] = option((1, 2), "--turns", parse=int, always=True)
    limit: int | None = option(
        20, "--limit", parse=int, help="MT-Bench questions (spread over the 80)", always=True
    )
    cpm: float = option(
        600.0, "--cpm", parse=float, help="user speaking rate, characters per minute", always=True
    )
    max_tokens: int = max_tokens_option(128, always=True)
    tts: bool = option(True, "--no-tts")
    judge: str | None = option(
        None, "--judge", help="judge model for MT-Bench scores (e.g. qwen2.5-coder-1.5b-instruct)"
    )
    #: a greedy answer may differ from the baseline's first where AR's top-2 logit gap is below this
    near_tie: float = report.NEAR_TIE_GAP
    out: Path = report.out_option()
    tag: str = option("", "--tag", help="results name: predgen-<tag>.* (default: model-backend)", always=True)
    plot: bool = report.plot_option()
    command: str = ""


def _spread(n: int, limit: int | None) -> list[int]:
    if limit is None or limit >= n:
        return list(range(n))
    return [int(i * n / limit) for i in range(limit)]


def _judge_prompt() -> dict[str, str]:
    install("mt-bench", progress=False)
    path = installed_path("mt-bench", "judge_prompts.jsonl")
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["name"] == "single-v1":
            return row
    raise RuntimeError(f"single-v1 judge prompt missing from {path}")


class Judge:
    """MT-Bench single-answer grading (1-10) by a local model, greedy.

    A small judge often explains at length, or loops, without ever writing its ``[[rating]]``.
    Then the verdict is asked for the way a reader would: the reply is cut after its first
    ``explain_tokens`` tokens, ``"Rating: [["`` is appended to it as the judge's own words, and
    the judge completes the number (``forced`` in ``judge()``'s result).
    """

    def __init__(self, model: str, backend: str, max_tokens: int = 256, explain_tokens: int = 128):
        self.backend = load_backend(model, backend)
        self.decoder = SpeculativeDecoder(self.backend, make_drafter("ngram", self.backend))
        self.cfg = GenerationConfig(max_tokens=max_tokens)
        self.ask_cfg = GenerationConfig(max_tokens=4)  # the number after "Rating: [["
        self.explain_tokens = explain_tokens
        self.template = _judge_prompt()

    def judge(self, question: str, answer: str) -> dict[str, Any]:
        """``{"score": float | None, "judgment": text, "forced": bool}``."""
        t = self.template
        msgs = [
            {"role": "system", "content": t["system_prompt"]},
            {"role": "user", "content": t["prompt_template"].format(question=question, answer=answer)},
        ]
        prompt = self.backend.tokenizer.chat(msgs)
        out = self.decoder.run(prompt, self.cfg)
        score = _parse_rating(out.text)
        if score is not None:
            return {"score": score, "judgment": out.text, "forced": False}
        tok = self.backend.tokenizer
        said = tok.decode(out.token_ids[: self.explain_tokens]).rstrip()
        ask = prompt + tok.encode(said + "\n\nRating: [[")
        tail = self.decoder.run(ask, self.ask_cfg).text
        return {
            "score": _rating(re.match(r"\s*" + _NUMBER, tail)),
            "judgment": said + "\n\nRating: [[" + tail,
            "forced": True,
        }


#: a rating as the judge writes it: an integer or a decimal
_NUMBER = r"(\d+(?:\.\d+)?)"


def _rating(m: re.Match[str] | None) -> float | None:
    """The score a matched ``_NUMBER`` gives, capped at the scale's 10."""
    return min(10.0, float(m.group(1))) if m else None


def _parse_rating(text: str) -> float | None:
    return _rating(
        re.search(r"\[\[" + _NUMBER + r"\]\]", text) or re.search(r"[Rr]ating:\s*" + _NUMBER, text)
    )


def run_predgen_bench(opts: PredGenBenchOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    load_avg_start = report.load_avg()  # before the models load
    backend = load_backend(opts.model, opts.backend, device=opts.device)
    tts = None
    if opts.tts:
        tts = PiperTTS()
        tts.synthesize("Warm up.")
    q1, q2 = mtbench_questions(1), mtbench_questions(2)
    idx = _spread(len(q1), opts.limit)
    header = _predgen_header(opts, backend, tts, len(idx), load_avg_start)
    for line in report.header_lines(header):
        log(line)
    warm = PredictiveResponder(backend, max_tokens=4, baseline=True)
    warm.finish("Hello.")
    warm.close()
    records: list[dict[str, Any]] = []
    methods = list(opts.methods)
    bar = tqdm(total=len(idx) * len(opts.turns) * len(methods), desc="predgen", unit="answer")
    for n, i in enumerate(idx):
        turn1_answer = None
        for turn in opts.turns:
            question = (q1 if turn == 1 else q2)[i]
            history: list[dict[str, str]] = []
            if turn == 2:
                history = turn2_history(q1[i]["prompt"], turn1_answer or "")
            # the baseline first (turn 2 continues its answer), the others rotated
            for method in ["baseline", *rotated([m for m in methods if m != "baseline"], n)]:
                if method not in methods:
                    continue
                bar.set_postfix_str(f"q{question['id']} t{turn} {method}")
                rec = _answer(backend, tts, opts, method, question, turn, history)
                if method == "baseline" and turn == 1:
                    turn1_answer = rec["response"]
                records.append(rec)
                bar.update(1)
    bar.close()
    if opts.judge:
        judge = Judge(opts.judge, opts.backend)
        for rec in tqdm(records, desc="judge", unit="answer"):
            rec.update(judge.judge(rec["question"], rec["response"]))
    _mark_agreement(records)
    header["settings"]["near_tie_gap"] = opts.near_tie
    check_greedy_exactness(records, backend, opts.near_tie)
    return {"header": header, "summary": summarize(records, methods, opts.turns), "records": records}


def _predgen_header(
    opts: PredGenBenchOptions, backend: Any, tts: Any, questions: int, load_avg_start: list[float] | None
) -> dict[str, Any]:
    return {
        "machine": report.machine_info(load_avg_start),
        "target": backend.name,
        "backends": backend.kind,
        "settings": {
            "device": opts.device,
            "cpm": opts.cpm,
            "max_tokens": opts.max_tokens,
            "questions": questions,
            "turns": list(opts.turns),
            "tts": tts.name if tts else None,
            "judge": opts.judge,
            "greedy decoding": True,
        },
        "methods": list(opts.methods),
        "command": opts.command,
    }


def _answer(
    backend: Any,
    tts: Any,
    opts: PredGenBenchOptions,
    method: str,
    question: dict[str, Any],
    turn: int,
    history: list[dict[str, str]],
) -> dict[str, Any]:
    """One method answers one question typed by the simulated user: its record."""
    # "VERIFIER[@OPTION...]", e.g. greedy@chunks (sessions.predictive.parse_method)
    verifier, kw = ("greedy", {}) if method == "baseline" else parse_method(method)
    s = PredictiveResponder(
        backend,
        tts=tts,
        history=history,
        max_tokens=opts.max_tokens,
        speak_rest=False,
        baseline=method == "baseline",
        verifier=verifier,
        **kw,
    )
    try:
        resp, tl = simulate_user(s, question["prompt"], opts.cpm)
    finally:
        s.close()
    wait = tl["wait_s"]
    return {
        "id": question["id"],
        "category": question["category"],
        "turn": turn,
        "method": method,
        "question": question["prompt"],
        "response": resp.response,
        "token_ids": resp.token_ids,
        "first_sentence": resp.first_sentence,
        "ttfs_ms": 1000 * (wait + resp.ttfs_s),
        "nfetfs": resp.nfetfs,
        "audio_latency_ms": 1000 * (wait + resp.audio_latency_s),
        "wait_ms": 1000 * wait,
        "presynth_used": resp.presynth_used,
        "updates": len(tl["updates"]),
        "input_s": tl["input_s"],
        "speculation_s": sum(u["compute_s"] for u in tl["updates"]),
    }


def turn2_history(question: str, answer: str) -> list[dict[str, str]]:
    """Turn 2's history: the turn-1 question and the baseline's answer (every method alike)."""
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def _is_greedy(method: str) -> bool:
    return method != "baseline" and parse_method(method)[0] == "greedy"


def check_greedy_exactness(
    records: list[dict[str, Any]], backend: Any, near_tie: float = report.NEAR_TIE_GAP
) -> list[dict]:
    """Classify every greedy answer that differs from the baseline's (the engine's rule).

    At the first differing token, plain AR is re-run on the baseline's prompt and answer and
    the top-2 logit gap there is read (``bench.exactness.ar_logit_gap``). Below ``near_tie`` the
    two choices are a near-tie, which a quantized backend may flip between batch shapes (a
    verification pass vs a one-token step); a larger gap is a BUG (a wrong mask, position or
    cache reuse). Marks ``rec["divergence"]``; returns the divergences.
    """

    base = {(r["id"], r["turn"]): r for r in records if r["method"] == "baseline"}
    found = []
    for r in records:
        b = base.get((r["id"], r["turn"]))
        if b is None or r["identical"] or not _is_greedy(r["method"]):
            continue
        pos = first_divergence(b["token_ids"], r["token_ids"])
        if pos is None:
            continue
        history = []
        if r["turn"] == 2:
            first = base.get((r["id"], 1))
            if first is None:  # the history's answer is not in this result
                r["divergence"] = {"position": pos, "verdict": "unchecked", "why": "no turn-1 baseline"}
                continue
            history = turn2_history(first["question"], first["response"])
        # the simulated user speaks words: the session's prompt has its whitespace normalized
        prompt = chat_prompt(backend.tokenizer, " ".join(r["question"].split()), history)
        other = r["token_ids"][pos] if pos < len(r["token_ids"]) else None
        g = ar_logit_gap(backend, prompt, b["token_ids"], pos, other)
        d = {"id": r["id"], "turn": r["turn"], "method": r["method"], "position": pos, **g}
        d["verdict"] = "near-tie" if g["gap_top2"] < near_tie else "bug"
        if d["verdict"] == "bug":
            report.loud(
                [
                    f"BUG: predgen {r['method']} differs from the baseline on q{r['id']} turn {r['turn']} "
                    f"at token {pos}, where the AR top-2 logit gap is {g['gap_top2']:.3f}"
                ]
            )
        r["divergence"] = d
        found.append(d)
    return found


def _mark_agreement(records: list[dict[str, Any]]) -> None:
    base = {(r["id"], r["turn"]): r for r in records if r["method"] == "baseline"}
    for r in records:
        b = base.get((r["id"], r["turn"]))
        r["identical"] = b is not None and r["token_ids"] == b["token_ids"]
        r["same_first_sentence"] = b is not None and r["first_sentence"] == b["first_sentence"]


def summarize(records: list[dict[str, Any]], methods: Sequence[str], turns: Sequence[int]) -> list[dict]:
    rows = []
    for turn in turns:
        base = [r for r in records if r["turn"] == turn and r["method"] == "baseline"]
        base_lat = statistics.fmean(r["audio_latency_ms"] for r in base) if base else None
        for m in methods:
            rs = [r for r in records if r["turn"] == turn and r["method"] == m]
            if not rs:
                continue
            lat = statistics.fmean(r["audio_latency_ms"] for r in rs)
            scores = [r["score"] for r in rs if r.get("score") is not None]
            rows.append(
                {
                    "turn": turn,
                    "method": m,
                    "n": len(rs),
                    "ttfs_ms": statistics.fmean(r["ttfs_ms"] for r in rs),
                    "nfetfs": statistics.fmean(r["nfetfs"] for r in rs),
                    "latency_ms": lat,
                    "median_latency_ms": statistics.median(r["audio_latency_ms"] for r in rs),
                    "speedup": base_lat / lat if base_lat and lat else None,
                    "presynth": sum(r["presynth_used"] for r in rs) / len(rs),
                    "identical": sum(r["identical"] for r in rs),
                    # differing greedy answers by verdict (check_greedy_exactness)
                    **{
                        key: sum(r.get("divergence", {}).get("verdict") == v for r in rs)
                        if _is_greedy(m)
                        else None
                        for key, v in (("near_tie", "near-tie"), ("bugs", "bug"), ("unchecked", "unchecked"))
                    },
                    "same_first": sum(r["same_first_sentence"] for r in rs),
                    "score": statistics.fmean(scores) if scores else None,
                    "wait_ms": statistics.fmean(r["wait_ms"] for r in rs),
                }
            )
    return rows


COLUMNS = [
    ("method", "method", 0),
    ("n", "answers", 0),
    ("ttfs_ms", "TTFS ms", 0),
    ("nfetfs", "NFETFS", 2),
    ("latency_ms", "audio latency ms", 0),
    ("median_latency_ms", "median latency ms", 0),
    ("speedup", "speedup (latency)", 2),
    ("presynth", "pre-synth used", 2),
    ("identical", "identical to baseline", 0),
    ("near_tie", "near-tie flips", 0),
    ("bugs", "BUGS", 0),
    ("unchecked", "differ, unchecked", 0),
    ("same_first", "same first sentence", 0),
    ("score", "judge score", 2),
    ("wait_ms", "overrun wait ms", 0),
]


def markdown(result: dict[str, Any]) -> str:
    h = result["header"]
    lines = report.markdown_preamble("speclive PredGen benchmark (voice chat, MT-Bench)", h)
    lines += [
        "Each question is spoken at the given characters per minute (whole words only); latencies are "
        "measured from the end of the user's input with an honest clock (speculation that overruns the "
        "input delays the final step: *overrun wait*). *TTFS* = time to the first sentence's text; "
        "*NFETFS* = LLM passes until then (1 = the final verification accepted it, judge passes included); "
        "*audio latency* adds the first sentence's TTS time unless its pre-synthesized audio was used; "
        "*speedup* = baseline mean latency / mean latency; *identical* = answers token-identical to the "
        "baseline's; a greedy answer that differs must differ first at a *near-tie* (plain AR's top-2 "
        "logit gap there below the near-tie gap: a quantized backend may flip it between batch shapes), "
        "a larger gap is a *BUG*; *judge* = MT-Bench single-v1 score by the judge model.",
        "",
    ]
    for turn in h["settings"]["turns"]:
        rows = [r for r in result["summary"] if r["turn"] == turn]
        lines += [f"## turn {turn}", "", report.md_table(COLUMNS, rows), ""]
    return "\n".join(lines)


def plot(path: Path, result: dict[str, Any]) -> Path:
    plt = report._pyplot()
    summ = result["summary"]
    turns = result["header"]["settings"]["turns"]
    fig, ax = plt.subplots(figsize=(8, 4))
    methods = list(dict.fromkeys(r["method"] for r in summ))
    width = 0.8 / max(1, len(turns))
    for j, turn in enumerate(turns):
        vals = [
            next((r["latency_ms"] for r in summ if r["turn"] == turn and r["method"] == m), 0)
            for m in methods
        ]
        xs = [i + j * width for i in range(len(methods))]
        bars = ax.bar(xs, vals, width, label=f"turn {turn}")
        for b, v in zip(bars, vals, strict=True):
            ax.annotate(f"{v:.0f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks([i + width * (len(turns) - 1) / 2 for i in range(len(methods))], methods)
    ax.set(ylabel="mean audio latency (ms)", title=f"PredGen: {result['header']['target']} + Piper, MT-Bench")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(result: dict[str, Any], out: Path, tag: str, plot_it: bool = True) -> list[Path]:
    return report.write_result_files(result, out, tag, markdown, plot if plot_it else None)
