"""``speclive bench live``: voice-to-voice latency of the live pipelines against their baselines.

Chat: MT-Bench turn-1 questions are spoken by two different synthetic voices (Piper's joe and
espeak-ng), every third one with a mid-sentence pause shorter than the end-of-turn silence,
padded with silence, and played into ``VoiceChat`` on the honest simulated clock (every second
of VAD, ASR, LLM and TTS compute is charged while the audio arrives at 1x). The same spoken
sample is answered by every method side by side, in an order rotated per sample: PredGen
(greedy; optionally top-k) and the baselines ``cascade``, ``prefill`` and ``preemptive`` on the
same models. Reported per method: median and p90 voice-to-voice latency (end of speech -> first
answer audio can play) with bootstrap intervals, the ratio of medians against each baseline
(paired bootstrap over samples), how often the first sentence's audio was ready when the end of
turn was detected, the transcripts' WER against the spoken text, answer identity against the
cascade where the final transcripts match (a greedy difference must be a near-tie of the
quantized backend, else it is a BUG), and the longest input queueing.

Translate: MT-Bench sentences spoken the same way, translated live by ``LiveTranslator`` with
SSBD, AR re-translation and the cascade (one translation at the end of each turn). Reported:
display latency per live update (input time of the newest words -> the updated translation
shown), flicker (normalized erasure of the displays), translation compute seconds, and chrF of
each method's final translation against the cascade's.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speclive.asr.audio import SAMPLE_RATE, to_mono_16k
from speclive.common_options import backend_option, max_tokens_option, model_option
from speclive.live.build import LiveModelsConfig, load_live_models, make_pipeline
from speclive.live.clock import VirtualClock, play
from speclive.live.vad import TurnConfig
from speclive.options import option
from speclive.sessions.metrics import normalized_erasure
from speclive.sessions.predictive import SYSTEM_PROMPT, PredGenConfig, chat_prompt
from speclive.sessions.retranslate import RetranslateConfig
from speclive.sessions.simulate import split_sentences
from speclive.tts.espeak import EspeakTTS
from speclive.tts.piper import PiperTTS
from speclive_bench import report
from speclive_bench.datasets import mtbench_questions
from speclive_bench.exactness import ar_logit_gap, first_divergence
from speclive_bench.harness import run_interleaved
from speclive_bench.ssbd import _quality, bench_sentences
from speclive_bench.stats import paired_ratio, percentile_ci, percentile_ratio, ratio_text

CHAT_METHODS = ("predgen", "cascade", "prefill", "preemptive")
TRANSLATE_METHODS = ("ssbd", "ar", "cascade")
VOICES = ("piper", "espeak")
BASELINES = ("cascade", "prefill", "preemptive")


@dataclass
class LiveBenchOptions:
    """Settings of ``bench live``; each field with a flag is its command-line option."""

    pipeline: str = option("chat", "--pipeline", choices=("chat", "translate"), always=True)
    model: str = model_option(always=True)
    backend: str = backend_option(always=True)
    methods: Sequence[str] = option(
        CHAT_METHODS,
        "--methods",
        help="chat: predgen, predgen:topk:K, cascade, prefill, preemptive (default: predgen and the "
        "three baselines), each optionally with a streaming-ASR variant: /no-stream-draft, "
        "/draft-partials; translate: ssbd, ar, cascade",
        always=True,
    )
    voices: Sequence[str] = option(VOICES, "--voices", help="piper, espeak", always=True)
    limit: int = option(
        12, "--limit", parse=int, help="questions (chat) or utterances (translate)", always=True
    )
    max_tokens: int = max_tokens_option(64, always=True)
    target_lang: str = option("de", "--target-lang")
    beta: float = option(0.2, "--beta", parse=float)
    end_s: float = option(0.5, "--end-silence", parse=float, help="silence (s) that ends a turn", always=True)
    pause_s: float = option(
        0.2, "--pause", parse=float, help="silence (s) that starts speculative final work", always=True
    )
    #: chat: the first spoken unit may be a clause of this many words or more (0: a sentence)
    first_clause_words: int = option(
        4,
        "--first-clause",
        parse=int,
        help="chat: the first spoken unit may be a clause of at least this many words (0: a sentence)",
    )
    asr_margin_s: float | None = 1.0
    seed: int = 0
    out: Path = report.out_option()
    tag: str = option("", "--tag", help="results name: live-<pipeline>-<tag>.*", always=True)
    plot: bool = report.plot_option()
    command: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# ---- spoken material ----------------------------------------------------------------------
def _voice(name: str):
    if name == "piper":
        return PiperTTS()
    if name == "espeak":
        return EspeakTTS()
    raise ValueError(f"unknown voice {name!r}; known: {', '.join(VOICES)}")


def _split_for_pause(text: str) -> tuple[str, str] | None:
    """Two halves at the comma (or word boundary) nearest the middle."""
    words = text.split()
    if len(words) < 6:
        return None
    mid = len(words) // 2
    commas = [i + 1 for i, w in enumerate(words[:-2]) if w.endswith(",") and i >= 2]
    cut = min(commas, key=lambda i: abs(i - mid)) if commas else mid
    return " ".join(words[:cut]), " ".join(words[cut:])


def _trim(audio: np.ndarray, level: float = 0.02, frame: int = 320) -> np.ndarray:
    """``audio`` without its leading and trailing silence (20 ms frames under ``level`` x peak)."""
    k = len(audio) // frame
    if k == 0:
        return audio
    env = np.abs(audio[: k * frame]).reshape(k, frame).max(axis=1)
    loud = np.nonzero(env >= level * max(float(env.max()), 1e-9))[0]
    if loud.size == 0:
        return audio[:0]
    return audio[loud[0] * frame : (loud[-1] + 1) * frame]


def speak(
    tts,
    text: str,
    pause_s: float | None,
    lead_s: float = 0.6,
    tail_s: float = 2.0,
    sentence_gap_s: float = 0.25,
) -> dict[str, Any]:
    """``text`` spoken by ``tts`` at 16 kHz: each sentence synthesized on its own, its silences
    trimmed, joined by ``sentence_gap_s`` (a voice's own sentence pauses vary and can be longer
    than an end-of-turn silence); optionally a ``pause_s`` pause inside the middle sentence."""

    sentences = split_sentences(text) or [text]
    pieces: list[tuple[str, float]] = []  # (text, silence after it)
    paused = False
    mid = len(sentences) // 2
    for i, sent in enumerate(sentences):
        gap = sentence_gap_s if i < len(sentences) - 1 else 0.0
        halves = _split_for_pause(sent) if pause_s and i == mid else None
        if halves is not None:
            pieces += [(halves[0], pause_s or 0.0), (halves[1], gap)]
            paused = True
        else:
            pieces.append((sent, gap))
    z = lambda s: np.zeros(int(s * SAMPLE_RATE), np.float32)  # noqa: E731
    out: list[np.ndarray] = [z(lead_s)]
    for piece, after in pieces:
        a = tts.synthesize(piece)
        out += [_trim(to_mono_16k(a.samples, a.sample_rate)), z(after)]
    out.append(z(tail_s))
    audio = np.concatenate(out)
    return {"audio": audio, "paused": paused, "input_s": len(audio) / SAMPLE_RATE}


def chat_questions(limit: int, max_chars: int = 160) -> list[dict[str, Any]]:
    """Spoken-style MT-Bench turn-1 questions: one line, no code, at most ``max_chars``."""
    pool = [
        q
        for q in mtbench_questions(1)
        if len(q["prompt"]) <= max_chars
        and "\n" not in q["prompt"]
        and not any(c in q["prompt"] for c in "`{}=")
    ]
    if limit >= len(pool):
        return pool
    step = len(pool) / limit
    return [pool[int(i * step)] for i in range(limit)]


def _wer(ref: str, hyp: str) -> float:
    norm = lambda s: " ".join(re.sub(r"[^\w' ]", " ", s.lower()).split())  # noqa: E731
    return report.word_error_rate([norm(ref)], [norm(hyp)]) if norm(ref) else 0.0


# ---- the chat benchmark ---------------------------------------------------------------------
#: a method's streaming-ASR suffix (``predgen/no-stream-draft``) -> make_pipeline's settings
ASR_VARIANTS = {
    "": {},
    "no-stream-draft": {"stream_draft": False},
    "draft-partials": {"stream_partials": "draft"},
}


def _asr_variant(method: str) -> tuple[str, dict[str, Any]]:
    """``predgen/draft-partials`` -> (``predgen``, its streaming-ASR settings)."""
    base, _, variant = method.partition("/")
    if variant not in ASR_VARIANTS:
        known = ", ".join(f"/{v}" for v in ASR_VARIANTS if v)
        raise ValueError(f"unknown ASR variant {variant!r} in {method!r}; known: {known}")
    return base, ASR_VARIANTS[variant]


def _mode_and_verifier(method: str) -> tuple[str, str]:
    """``predgen`` / ``predgen:topk:3`` / a baseline name -> (pipeline mode, verifier)."""
    if method.startswith("predgen"):
        return "predgen", method.partition(":")[2] or "greedy"
    return method, "greedy"


def _chat_samples(questions: Sequence[dict[str, Any]], voices: dict[str, Any]) -> list[dict[str, Any]]:
    """Every question in every voice; every third question with a mid-sentence pause."""
    samples = []
    for i, q in enumerate(questions):
        for v, tts in voices.items():
            pause = 0.35 if i % 3 == 2 else None
            samples.append(
                {"id": q["id"], "question": q["prompt"], "voice": v, **speak(tts, q["prompt"], pause)}
            )
    return samples


def _chat_settings(opts: LiveBenchOptions, questions: Sequence[Any], samples: Sequence[dict]) -> dict:
    return {
        "questions": len(questions),
        "voices": list(opts.voices),
        "samples": len(samples),
        "mid-sentence pauses": sum(s["paused"] for s in samples),
        "end-of-turn silence s": opts.end_s,
        "pause s": opts.pause_s,
        "first unit": f"clause of >= {opts.first_clause_words} words"
        if opts.first_clause_words
        else "sentence",
        "max_tokens": opts.max_tokens,
        "clock": "simulated, compute charged (VirtualClock)",
        "chunk s": 0.1,
    }


def _chat_run(models, opts: LiveBenchOptions, turn: TurnConfig, s: dict[str, Any], method: str):
    """One spoken sample through one chat method: (its record, the played result)."""
    base, asr = _asr_variant(method)
    mode, verifier = _mode_and_verifier(base)
    pcfg = PredGenConfig(
        verifier=verifier,
        max_tokens=opts.max_tokens,
        line_breaks=True,
        speak_rest=False,
        first_clause_words=opts.first_clause_words,
    )
    pipe = make_pipeline("chat", models, mode=mode, clock=VirtualClock(), turn=turn, predgen=pcfg, **asr)
    res = play(pipe, s["audio"])
    turns = [e for e in res.events if e.type == "turn_metrics"]
    answers = pipe.answers  # type: ignore[attr-defined]
    rec: dict[str, Any] = {
        "id": s["id"],
        "voice": s["voice"],
        "paused": s["paused"],
        "method": method,
        "question": s["question"],
        "turns": len(turns),
        "max_lag_s": res.max_lag_s,
    }
    if turns:
        m = turns[-1]
        rec.update(
            transcript=m.transcript,
            wer=_wer(s["question"], m.transcript),
            answer=m.answer,
            token_ids=answers[-1].token_ids if answers else [],
            latency_s=m.latency_s,
            audio_ready_s=m.audio_ready_s,
            eot_delay_s=m.eot_delay_s,
            audio_ready_at_eot=m.audio_ready_at_eot,
            asr_s=m.asr_s,
            llm_s=m.llm_s,
            tts_s=m.tts_s,
            asr_passes=m.asr_passes,
            target_forwards=m.target_forwards,
            speculations=m.speculations,
            drafted=m.drafted,
            accepted=m.accepted,
            first_sentence=m.extra.get("first_sentence"),
            presynth_used=m.extra.get("presynth_used"),
        )
    return rec, res


def run_live_chat_bench(opts: LiveBenchOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    load_avg_start = report.load_avg()  # before the models load
    models = load_live_models(
        LiveModelsConfig(model=opts.model, backend=opts.backend, asr_margin_s=opts.asr_margin_s)
    )
    models.warm_up()
    questions = chat_questions(opts.limit)
    samples = _chat_samples(questions, {v: _voice(v) for v in opts.voices})
    header = _header(models, opts, load_avg_start, _chat_settings(opts, questions, samples))
    for line in report.header_lines(header):
        log(line)
    turn = TurnConfig(pause_s=opts.pause_s, end_s=opts.end_s)
    timeline: dict[str, Any] = {}

    def run_one(method: str, s: dict[str, Any]) -> dict[str, Any]:
        rec, res = _chat_run(models, opts, turn, s, method)
        if s is samples[0]:
            timeline[method] = [e.to_json() for e in res.events if e.type != "answer_delta"]
        return rec

    records = run_interleaved(
        samples,
        opts.methods,
        run_one,
        desc="live chat",
        unit="turn",
        postfix=lambda method, s: f"q{s['id']} {s['voice']} {method}",
        catch=False,
    )
    check_identity(records, models.llm)
    summary = summarize_chat(records, opts.methods)
    return {
        "header": header,
        "summary": summary,
        "records": records,
        "timeline": {
            "sample": {k: samples[0][k] for k in ("id", "voice", "question", "input_s")},
            **timeline,
        },
        "waveform": _envelope(samples[0]["audio"]),
    }


def _header(
    models, opts: LiveBenchOptions, load_avg_start: list[float] | None, settings: dict[str, Any]
) -> dict[str, Any]:
    """The run header: machine (with the load average read before the models loaded), models,
    settings, methods and the reproducing command."""
    cfg = models.cfg
    names = {
        "llm": models.llm.name,
        "asr": f"{cfg.asr_model} (+{cfg.asr_draft} draft, {cfg.asr_method}, "
        f"window audio+{opts.asr_margin_s}s)",
    }
    if models.tts is not None:
        names["tts"] = models.tts.name
    return {
        "machine": report.machine_info(load_avg_start),
        "target": models.llm.name,
        "backends": opts.backend,
        "models": names,
        "settings": settings,
        "methods": list(opts.methods),
        "command": opts.command,
    }


def _envelope(audio: np.ndarray, frame_s: float = 0.02) -> list[float]:
    n = int(frame_s * 16000)
    k = len(audio) // n
    return [round(float(x), 4) for x in np.abs(audio[: k * n]).reshape(k, n).max(axis=1)]


def check_identity(records: list[dict[str, Any]], backend) -> None:
    """Every greedy method's answer against the cascade's for the same sample, where the final
    transcripts match: identical, a near-tie of the backend (plain AR's top-2 logit gap at the
    first difference below ``report.NEAR_TIE_GAP``), or a BUG."""

    base = {(r["id"], r["voice"]): r for r in records if r["method"] == "cascade" and "token_ids" in r}
    for r in records:
        b = base.get((r["id"], r["voice"]))
        if r["method"] == "cascade" or b is None or "token_ids" not in r:
            continue
        if r["transcript"] != b["transcript"]:
            r["identity"] = "other transcript"
            continue
        pos = first_divergence(r["token_ids"], b["token_ids"])
        if pos is None:
            r["identity"] = "identical"
            continue
        if ":" in r["method"]:  # a relaxed verifier may differ by design
            r["identity"] = "differs (relaxed verifier)"
            continue
        prompt = chat_prompt(backend.tokenizer, b["transcript"], [], SYSTEM_PROMPT)
        other = r["token_ids"][pos] if pos < len(r["token_ids"]) else None
        gap = ar_logit_gap(backend, prompt, b["token_ids"], pos, other)
        r["divergence"] = {"position": pos, **gap}
        r["identity"] = "near-tie" if gap["gap_top2"] < report.NEAR_TIE_GAP else "BUG"
        if r["identity"] == "BUG":
            report.loud(
                [
                    f"BUG: {r['method']} differs from the cascade on q{r['id']} ({r['voice']}) at token "
                    f"{pos} where plain AR's top-2 gap is {gap['gap_top2']:.3f}"
                ]
            )


def summarize_chat(records: list[dict[str, Any]], methods: Sequence[str]) -> list[dict[str, Any]]:
    ok = [r for r in records if r.get("latency_s") is not None]
    keys = sorted({(r["id"], r["voice"]) for r in ok})
    # samples every method answered: ratios are paired over them
    full = [
        k
        for k in keys
        if all(any(r["method"] == m and (r["id"], r["voice"]) == k for r in ok) for m in methods)
    ]
    lat = {m: {(r["id"], r["voice"]): r["latency_s"] for r in ok if r["method"] == m} for m in methods}
    rows = []
    for m in methods:
        rs = [r for r in records if r["method"] == m]
        vals = [lat[m][k] for k in full]
        med = percentile_ci(vals, 50)
        p90 = percentile_ci(vals, 90)
        row: dict[str, Any] = {
            "method": m,
            "samples": len(vals),
            "median_s": med[0],
            "median_ci": [med[1], med[2]],
            "p90_s": p90[0],
            "p90_ci": [p90[1], p90[2]],
            "mean_s": statistics.fmean(vals) if vals else None,
            "ready_at_eot": sum(bool(r.get("audio_ready_at_eot")) for r in rs) / max(1, len(rs)),
            "eot_delay_s": statistics.median([r["eot_delay_s"] for r in rs if "eot_delay_s" in r] or [0.0]),
            "wer": statistics.fmean([r["wer"] for r in rs if "wer" in r] or [0.0]),
            "max_lag_s": max((r["max_lag_s"] for r in rs), default=0.0),
            "identical": sum(r.get("identity") == "identical" for r in rs),
            "near_ties": sum(r.get("identity") == "near-tie" for r in rs),
            "bugs": sum(r.get("identity") == "BUG" for r in rs),
            "compared": sum("identity" in r for r in rs),
            "accepted": sum(r.get("accepted", 0) for r in rs),
            "drafted": sum(r.get("drafted", 0) for r in rs),
            "llm_s": statistics.fmean([r["llm_s"] for r in rs if "llm_s" in r] or [0.0]),
            "asr_s": statistics.fmean([r["asr_s"] for r in rs if "asr_s" in r] or [0.0]),
        }
        # no answer plays before the end of turn is detected: a method's own end-of-turn delay
        # is the least latency it could have, so baseline / that delay bounds its ratio
        eot = {(r["id"], r["voice"]): r["eot_delay_s"] for r in ok if r["method"] == m and "eot_delay_s" in r}
        base_m = m.partition("/")[0]
        if base_m != m and base_m in methods:  # an ASR variant: its ASR seconds against the base's
            asr = {
                mm: {(r["id"], r["voice"]): r["asr_s"] for r in ok if r["method"] == mm and "asr_s" in r}
                for mm in (m, base_m)
            }
            both = [k for k in full if k in asr[m] and k in asr[base_m]]
            row["asr_vs_base"] = paired_ratio([asr[base_m][k] for k in both], [asr[m][k] for k in both])
            row["latency_vs_base"] = paired_ratio([lat[base_m][k] for k in both], [lat[m][k] for k in both])
        for b in BASELINES:
            if b in lat and b != m:
                base_vals = [lat[b][k] for k in full]
                # the house ratio: per sample, baseline / method (paired_ratio's new / base)
                row[f"vs_{b}"] = paired_ratio(vals, base_vals, p90=True)
                row[f"vs_{b}_median"] = percentile_ratio(base_vals, vals, 50)
                row[f"vs_{b}_p90"] = percentile_ratio(base_vals, vals, 90)
                if m not in BASELINES and all(k in eot for k in full):
                    row[f"ceiling_vs_{b}_median"] = percentile_ratio(base_vals, [eot[k] for k in full], 50)
        rows.append(row)
    return rows


def _ci(v: Any) -> str:
    if not v or v[0] is None:
        return "–"
    return f"{v[0]:.2f}× [{v[1]:.2f}, {v[2]:.2f}]"


def chat_markdown(result: dict[str, Any]) -> str:
    h = result["header"]
    lines = report.markdown_preamble("speclive live voice chat: voice-to-voice latency", h)
    lines += [
        "Each spoken question is played into the pipeline in 100 ms chunks on a simulated clock that "
        "charges every second of compute (VAD, streaming ASR, LLM, TTS share the CPU, as live). "
        "*Latency* = end of the user's speech (VAD) -> the first answer audio can play (never before "
        "the end of turn is detected). Intervals: 95 % bootstrap over samples; ratios are paired over "
        "the same samples. *Ready at EOT*: the first sentence's audio existed when the end of turn was "
        "detected. *Identity*: answers against the cascade's on the same sample and transcript "
        "(near-tie = a flip where plain AR's top-2 logit gap is below "
        f"{report.NEAR_TIE_GAP}; BUG otherwise).",
        "",
        "| method | median latency s [95 % CI] | p90 s [95 % CI] | ready at EOT | identical / near-tie / BUG "
        "(of compared) | WER | max input lag s | LLM s | ASR s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["summary"]:
        lines.append(
            f"| {r['method']} | {r['median_s']:.2f} [{r['median_ci'][0]:.2f}, {r['median_ci'][1]:.2f}] | "
            f"{r['p90_s']:.2f} [{r['p90_ci'][0]:.2f}, {r['p90_ci'][1]:.2f}] | "
            f"{100 * r['ready_at_eot']:.0f} % | "
            f"{r['identical']} / {r['near_ties']} / {r['bugs']} ({r['compared']}) | {100 * r['wer']:.1f} % | "
            f"{r['max_lag_s']:.2f} | {r['llm_s']:.2f} | {r['asr_s']:.2f} |"
        )
    variants = [r for r in result["summary"] if r.get("asr_vs_base")]
    if variants:
        lines += [
            "",
            "Streaming-ASR variants against the same method with the default ASR: the median of "
            "per-sample ratios (variant / default) with its 95 % bootstrap interval and geometric mean:",
            "",
            "| method | ASR seconds per turn | latency |",
            "|---|---|---|",
        ]
        for r in variants:
            a, b = (ratio_text(r[k]) for k in ("asr_vs_base", "latency_vs_base"))
            lines.append(f"| {r['method']} | {a} | {b} |")
    lines += [
        "",
        "Lower latency, as a ratio baseline / method. *Per sample*: the median of the per-sample "
        "ratios, 95 % bootstrap interval in brackets, geometric mean (gm) after it, and the ratios' "
        "p90. *p50 / p50* and *p90 / p90*: the baseline's percentile over the method's, paired "
        "bootstrap interval.",
        "",
        "| method | vs cascade, per sample | p90 of the ratios | vs cascade p50 / p50 | vs cascade p90 / p90 "
        "| vs prefill, per sample | vs preemptive, per sample |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["summary"]:
        if r["method"] in BASELINES:
            continue
        p90 = (r.get("vs_cascade") or {}).get("p90")
        lines.append(
            f"| {r['method']} | {ratio_text(r.get('vs_cascade'))} | "
            f"{'–' if p90 is None else f'{p90:.2f}'} | {_ci(r.get('vs_cascade_median'))} | "
            f"{_ci(r.get('vs_cascade_p90'))} | {ratio_text(r.get('vs_prefill'))} | "
            f"{ratio_text(r.get('vs_preemptive'))} |"
        )
    ceilings = [r for r in result["summary"] if r.get("ceiling_vs_cascade_median")]
    if ceilings:
        lines += [
            "",
            "The most each ratio could be: the baseline's latency over the method's own end-of-turn "
            "delay (its first audio playing the moment the end of turn is detected), paired:",
            "",
            "| method | ceiling vs cascade (median) | vs prefill (median) | vs preemptive (median) |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['method']} | {_ci(r.get('ceiling_vs_cascade_median'))} | "
            f"{_ci(r.get('ceiling_vs_prefill_median'))} | {_ci(r.get('ceiling_vs_preemptive_median'))} |"
            for r in ceilings
        ]
    return "\n".join(lines)


def chat_plot(path: Path, result: dict[str, Any]) -> Path:
    """Left: one turn's timeline per method (speech, partials, speculation, end of turn, first
    audio); right: each method's latency distribution."""
    plt = report._pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [2.2, 1]})
    tl = result["timeline"]
    methods = [m for m in result["header"]["methods"] if m in tl]
    env = np.asarray(result["waveform"])
    ts = np.arange(env.size) * 0.02
    for row, m in enumerate(methods):
        y = len(methods) - row
        ax.fill_between(
            ts,
            y - 0.35 * env / max(env.max(), 1e-6),
            y + 0.35 * env / max(env.max(), 1e-6),
            color="0.8",
            lw=0,
        )
        evs = tl[m]
        for e in evs:
            if e["type"] == "transcript_partial":
                ax.plot(e["t"], y + 0.3, "|", color="tab:blue", ms=10)
            elif e["type"] == "speculation":
                ax.plot(e["t"], y - 0.3, "^", color="tab:orange", ms=6)
            elif e["type"] == "speech_stopped" and e["end_of_turn"]:
                ax.axvline(
                    e["audio_t"],
                    ymin=(y - 0.5) / (len(methods) + 1),
                    ymax=(y + 0.5) / (len(methods) + 1),
                    color="k",
                    ls=":",
                )
                ax.plot(e["t"], y, "s", color="k", ms=6)
            elif e["type"] == "audio" and e["sentence"] == 0:
                ax.plot(e["play_at"], y, "*", color="tab:green", ms=14)
                ax.annotate(f"{e['play_at']:.2f}s", (e["play_at"], y + 0.12), fontsize=8)
    ax.set_yticks(range(len(methods), 0, -1), methods)
    ax.set_xlabel("input time (s)")
    s = tl["sample"]
    ax.set_title(
        f"one turn (q{s['id']}, {s['voice']}): | partial  ^ speculation  ■ end of turn  ★ first audio",
        fontsize=9,
    )
    ms = [r["method"] for r in result["summary"]]
    data = [
        [r["latency_s"] for r in result["records"] if r["method"] == m and r.get("latency_s") is not None]
        for m in ms
    ]
    bx.boxplot(data, tick_labels=ms, showfliers=True)
    bx.set_ylabel("voice-to-voice latency (s)")
    bx.set_title("latency per method (all samples)", fontsize=9)
    bx.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_outputs(result: dict[str, Any], out: Path, tag: str, plot_it: bool = True) -> list[Path]:
    if result["header"].get("pipeline") == "translate":
        return report.write_result_files(
            result, out, tag, translate_markdown, translate_plot if plot_it else None
        )
    return report.write_result_files(result, out, tag, chat_markdown, chat_plot if plot_it else None)


# ---- the live translation benchmark ---------------------------------------------------------
def translate_utterances(limit: int) -> list[str]:
    """Utterances of two consecutive benchmark sentences each (a sentence is committed while
    the next is spoken)."""
    sents = bench_sentences(2 * limit)
    return [" ".join(sents[i : i + 2]) for i in range(0, len(sents) - 1, 2)][:limit]


def run_live_translate_bench(opts: LiveBenchOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    load_avg_start = report.load_avg()  # before the models load
    models = load_live_models(
        LiveModelsConfig(model=opts.model, backend=opts.backend, asr_margin_s=opts.asr_margin_s, voice=None)
    )
    models.warm_up()
    texts = translate_utterances(opts.limit)
    voices = {v: _voice(v) for v in opts.voices}
    samples = [
        {"id": i, "source": t, "voice": v, **speak(tts, t, None)}
        for i, t in enumerate(texts)
        for v, tts in voices.items()
    ]
    header = _header(
        models,
        opts,
        load_avg_start,
        {
            "utterances": len(texts),
            "voices": list(opts.voices),
            "samples": len(samples),
            "target language": opts.target_lang,
            "beta": opts.beta,
            "mask_k": 3,
            "end-of-turn silence s": opts.end_s,
            "max_tokens": opts.max_tokens,
            "clock": "simulated, compute charged (VirtualClock)",
        },
    )
    header["pipeline"] = "translate"
    for line in report.header_lines(header):
        log(line)
    turn = TurnConfig(pause_s=opts.pause_s, end_s=opts.end_s)
    records = run_interleaved(
        samples,
        opts.methods,
        lambda method, s: _translate_run(models, opts, turn, s, method),
        desc="live translate",
        unit="utterance",
        postfix=lambda method, s: f"u{s['id']} {s['voice']} {method}",
        catch=False,
    )
    return {"header": header, "summary": summarize_translate(records, opts), "records": records}


def _translate_run(models, opts: LiveBenchOptions, turn: TurnConfig, s: dict[str, Any], method: str) -> dict:
    """One spoken utterance through one translation method: its record."""
    rcfg = RetranslateConfig(target_lang=opts.target_lang, beta=opts.beta, max_tokens=opts.max_tokens)
    pipe = make_pipeline("translate", models, mode=method, clock=VirtualClock(), turn=turn, retranslate=rcfg)
    res = play(pipe, s["audio"])
    turns = [e for e in res.events if e.type == "turn_metrics"]
    updates = [u for m in turns for u in m.extra.get("updates", [])]
    live = [u for u in updates if not u["final"]]
    finals = [u for u in updates if u["final"]]
    end = turns[-1].speech_end_t if turns else None
    return {
        "id": s["id"],
        "voice": s["voice"],
        "method": method,
        "source": s["source"],
        "transcript": " ".join(m.transcript for m in turns),
        "wer": _wer(s["source"], " ".join(m.transcript for m in turns)),
        "translation": " ".join(m.translation for m in turns),
        "display_latencies": [u["t"] - u["audio_t"] for u in live],
        "final_latency_s": (finals[-1]["t"] - end) if finals and end is not None else None,
        "ne": normalized_erasure([u["display"] for u in updates], opts.target_lang) if updates else None,
        "updates": len(live),
        "llm_s": sum(m.llm_s for m in turns),
        "asr_s": sum(m.asr_s for m in turns),
        "max_lag_s": res.max_lag_s,
    }


def summarize_translate(records: list[dict[str, Any]], opts: LiveBenchOptions) -> list[dict[str, Any]]:
    methods = list(opts.methods)
    keys = sorted({(r["id"], r["voice"]) for r in records})
    by = {(r["method"], r["id"], r["voice"]): r for r in records}
    ref = {k: by[("cascade", *k)]["translation"] for k in keys if ("cascade", *k) in by}

    def per_sample_median(m: str) -> list[float]:
        out = []
        for k in keys:
            lat = by.get((m, *k), {}).get("display_latencies") or []
            out.append(float(np.median(lat)) if lat else float("nan"))
        return out

    rows = []
    for m in methods:
        rs = [r for r in records if r["method"] == m]
        pooled = [x for r in rs for x in r["display_latencies"]]
        med = percentile_ci(pooled, 50) if pooled else (None, None, None)
        p90 = percentile_ci(pooled, 90) if pooled else (None, None, None)
        hyps = [by[(m, *k)]["translation"] for k in keys if k in ref and (m, *k) in by]
        refs = [ref[k] for k in keys if k in ref and (m, *k) in by]
        q = _quality(hyps, refs, opts.target_lang) if hyps else {"chrf": None, "bleu": None}
        nes = [r["ne"] for r in rs if r["ne"] is not None]
        row: dict[str, Any] = {
            "method": m,
            "samples": len(rs),
            "updates": len(pooled),
            "median_display_s": med[0],
            "median_display_ci": [med[1], med[2]],
            "p90_display_s": p90[0],
            "p90_display_ci": [p90[1], p90[2]],
            "final_latency_s": statistics.median(
                [r["final_latency_s"] for r in rs if r["final_latency_s"] is not None] or [float("nan")]
            ),
            "ne": statistics.fmean(nes) if nes else None,
            "llm_s": statistics.fmean([r["llm_s"] for r in rs] or [0.0]),
            "chrf_vs_cascade": q["chrf"],
            "wer": statistics.fmean([r["wer"] for r in rs] or [0.0]),
            "max_lag_s": max((r["max_lag_s"] for r in rs), default=0.0),
        }
        if m != "ar" and "ar" in methods and m != "cascade":
            base, new = per_sample_median("ar"), per_sample_median(m)
            pairs = [(b, x) for b, x in zip(base, new, strict=True) if np.isfinite(b) and np.isfinite(x)]
            if pairs:
                row["vs_ar_display"] = percentile_ratio([b for b, _ in pairs], [x for _, x in pairs], 50)
                # per utterance: AR's median display latency / the method's (paired_ratio's new / base)
                row["vs_ar"] = paired_ratio([x for _, x in pairs], [b for b, _ in pairs], p90=True)
            ar_ne = [r["ne"] for r in records if r["method"] == "ar" and r["ne"] is not None]
            if ar_ne and nes and statistics.fmean(ar_ne) > 0:
                row["ne_vs_ar"] = statistics.fmean(nes) / statistics.fmean(ar_ne)
        rows.append(row)
    return rows


def translate_markdown(result: dict[str, Any]) -> str:
    h = result["header"]
    lines = report.markdown_preamble("speclive live translation: what a viewer sees", h)
    lines += [
        "Each spoken utterance (two sentences) is played in 100 ms chunks on a simulated clock that "
        "charges every second of compute. *Display latency*: input time of the newest words a live "
        "update covers -> that update's translation is shown (ASR pass, queueing and translation "
        "included), pooled over all live updates, 95 % bootstrap CI. *Final*: end of speech -> the "
        "final translation. *NE*: normalized erasure of the displayed text (flicker). *chrF*: the "
        "final translation against the cascade's (one translation of the final transcript). "
        "*Ratio vs AR*: per utterance, AR's median display latency over the method's; the median of "
        "those ratios, 95 % bootstrap interval in brackets, geometric mean (gm) after it.",
        "",
        "| method | live updates | median display s [95 % CI] | p90 display s | final s | NE | NE / AR's | "
        "chrF vs cascade | LLM s | ratio vs AR |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["summary"]:
        ci = r["median_display_ci"]
        med = (
            "–"
            if r["median_display_s"] is None
            else f"{r['median_display_s']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"
        )
        cells = [
            r["method"],
            str(r["updates"]),
            med,
            _f(r["p90_display_s"]),
            _f(r["final_latency_s"]),
            _f(r["ne"]),
            _f(r.get("ne_vs_ar")),
            _f(r["chrf_vs_cascade"], 1),
            _f(r["llm_s"]),
            ratio_text(r.get("vs_ar")) if r.get("vs_ar") else _ci(r.get("vs_ar_display")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _f(v: Any, digits: int = 2) -> str:
    return "–" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f"{v:.{digits}f}"


def translate_plot(path: Path, result: dict[str, Any]) -> Path:
    """Display latency distribution per method, and flicker against it."""
    plt = report._pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    ms = [r["method"] for r in result["summary"]]
    data = [[x for r in result["records"] if r["method"] == m for x in r["display_latencies"]] for m in ms]
    live = [(m, d) for m, d in zip(ms, data, strict=True) if d]
    if live:
        ax.boxplot([d for _, d in live], tick_labels=[m for m, _ in live])
    ax.set_ylabel("display latency per live update (s)")
    ax.set_title("new words heard -> updated translation shown", fontsize=9)
    for r in result["summary"]:
        if r["median_display_s"] is not None and r["ne"] is not None:
            bx.plot(r["median_display_s"], r["ne"], "o", ms=9)
            bx.annotate(r["method"], (r["median_display_s"], r["ne"]), fontsize=9)
    bx.set_xlabel("median display latency (s)")
    bx.set_ylabel("normalized erasure (flicker)")
    bx.set_title("latency vs flicker (lower left is better)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
