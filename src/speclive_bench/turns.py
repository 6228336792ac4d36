"""``speclive bench turns``: how soon the answer is heard after the speaker's true last word, and
how often it cuts them off, for each end-of-turn policy, on the spoken turn set.

The material is ``bench.turnset`` (94 turns, 3 voices, rates, noise, mid-turn pauses, 32
conversations split into ``dev`` and ``test``), with ground truth from how it was assembled.

Stage 1, **signals** (the eot-bench way: a decision at every pause of >= 100 ms, from what was
heard so far). Each turn's WAV goes through the Silero VAD with the live thresholds; at every
pause the VAD reports, the turn's audio up to it is read by:

- the audio model (Smart Turn v3.2) -> ``audio_p``;
- whisper-base (the live pipeline's final pass) -> the transcript;
- the answering LM -> ``text_p``, P(end-of-user-message token) after the transcript, with the
  conversation's earlier user turns as history; and ``text_p_norm`` on the transcript
  lower-cased without punctuation (the normalisation LiveKit's detector is trained on).

A pause is the **end** when the VAD's speech end is the turn's true end, else **mid**; a mid
pause is *cut off* by a policy when the silence the policy needs is shorter than the silence
there was before the voice came back. Sweeping each policy's threshold and fallback gives false
cut-offs (of mid pauses matched to true pauses >= 0.4 s) against the silence waited at the end
(VAD lag included) on ``dev``; each eagerness preset is the fastest setting within its
false-cut-off budget, and is reported on ``test``.

Stage 2, **live**: every conversation of the chosen split is played into ``VoiceChat`` at real
time on the honest virtual clock (every second of VAD, ASR, LM, turn model and TTS compute is
charged), one turn after another, each followed by silence until its answer has played, for
each (policy, method). Per turn: the first answer audio after the **true** end of speech; false
cut-offs (answer audio that starts inside a true mid-turn pause); talk-over (answer audio
overlapping the speaker's speech); the answer's identity with the cascade's greedy answer to the
same final transcript and history (a difference is a llama.cpp near-tie or a BUG); the compute
per turn against the cascade with the 0.5 s silence. Optionally Pipecat 1.14 on the same audio
(``--peer pipecat``, ``bench.pipecat_peer``).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speclive.common_options import backend_option, max_tokens_option, model_option
from speclive.live.build import LiveModelsConfig, load_live_models, make_pipeline
from speclive.live.clock import VirtualClock, play
from speclive.live.turnpolicy import KINDS, TurnPolicy, TurnPolicyConfig, TurnSignals
from speclive.live.turnpolicy import TEXT_WEIGHT as FUSED_W
from speclive.live.vad import StreamingVAD, TurnConfig, TurnDetector
from speclive.live.voicechat import voice_predgen
from speclive.options import OptionSet, option
from speclive.sessions.predictive import PredGenConfig, PredictiveResponder, chat_prompt
from speclive_bench import report
from speclive_bench.exactness import ar_logit_gap, first_divergence
from speclive_bench.pipecat_peer import run_pipecat
from speclive_bench.stats import paired_ratio, percentile, ratio_text
from speclive_bench.turnset import load_turnset, turns

#: live policies: ``silence:S`` (the VAD timeout alone, S seconds), ``audio``, ``text``, ``fused``
POLICIES = ("silence:0.5", "silence:0.8", "audio", "text", "fused")
METHODS = ("predgen", "prefill", "preemptive")
#: ``METHOD/VARIANT``: the method with other voice settings, to measure one setting in the same
#: interleaved run (``sentence``: the first spoken unit is a whole sentence or a clause, with no
#: word bound, as before ``VOICE_FIRST_WORDS``)
VARIANTS: dict[str, dict[str, Any]] = {"sentence": {"first_words": 0}}
#: mid-turn pauses at least this long count for the false-cut-off target
LONG_PAUSE_S = 0.4
#: a VAD speech end this close to the true end (or later) is the end of the turn
END_TOLERANCE_S = 0.15
#: eagerness -> most false cut-offs (share of long mid-turn pauses) its preset may make on dev
BUDGETS = {"low": 0.15, "medium": 0.20, "high": 0.30}
#: the sweep's grid
THRESHOLDS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97, 0.99)
FALLBACKS = (0.6, 0.8, 1.0, 1.2, 1.6, 2.0)
SAMPLE_RATE = 16_000
#: samples fed at a time in the live stage
CHUNK = 512


@dataclass
class TurnsBenchOptions:
    """Settings of ``bench turns``; each field with a flag is its command-line option."""

    stage: str = option("all", "--stage", choices=("signals", "live", "all"), always=True)
    split: str = option(
        "test", "--split", choices=("dev", "test", "all"), help="turns played live", always=True
    )
    policies: Sequence[str] = option(
        POLICIES, "--policies", help="silence:S, audio, text, fused", always=True
    )
    methods: Sequence[str] = option(
        METHODS,
        "--methods",
        help="predgen, prefill, preemptive; METHOD/sentence: a whole first sentence (VARIANTS)",
        always=True,
    )
    #: (policy, method) pairs beyond predgen: the matrix is predgen x policies, plus these
    #: policies for the other methods (all policies: the full matrix)
    other_policies: Sequence[str] = option(
        ("silence:0.5", "fused"),
        "--other-policies",
        help="policies run with the methods other than predgen (default: silence:0.5 and fused)",
        always=True,
    )
    eagerness: str = option("auto", "--eagerness", choices=("low", "medium", "high", "auto"), always=True)
    model: str = model_option(always=True)
    backend: str = backend_option(always=True)
    max_tokens: int = max_tokens_option(32, help="answer tokens (identity is on these)", always=True)
    limit: int = option(0, "--limit", parse=int, help="conversations per split (0: all)", always=True)
    peer: str = option("none", "--peer", choices=("none", "pipecat"), always=True)
    signals_from: str = option(
        "",
        "--signals-from",
        help="stage 1: re-score the signals of this earlier result file instead of computing them",
    )
    out: Path = report.out_option()
    tag: str = option("", "--tag", help="results name: turns-<tag>.*", always=True)
    plot: bool = report.plot_option()
    command: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


OPTIONS = OptionSet(TurnsBenchOptions)


# ---- stage 1: signals at every pause ---------------------------------------------------------
def read_wav(path: str | Path) -> np.ndarray:
    import wave

    with wave.open(str(path), "rb") as w:
        raw = w.readframes(w.getnframes())
    return np.frombuffer(raw, np.int16).astype(np.float32) / 32768.0


def normalise(text: str) -> str:
    """LiveKit's normalisation of a transcript: lower-cased, punctuation removed."""
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


def vad_pauses(audio: np.ndarray, min_silence_s: float = 0.1) -> list[dict[str, Any]]:
    """Every pause of at least ``min_silence_s`` the live VAD reports in ``audio``:
    ``speech_end`` (the VAD's end of the speech before it), ``at`` (when the pause was reported),
    ``resume`` (when the voice came back; None after the last speech), ``start`` (the turn's
    start)."""

    det = TurnDetector(TurnConfig(pause_s=min_silence_s, end_s=60.0, max_turn_s=600.0))
    out: list[dict[str, Any]] = []
    start = None
    for ch in det.feed(StreamingVAD()(audio)):
        if ch.kind == "start" and start is None:
            start = ch.audio_t
        elif ch.kind == "pause":
            out.append({"speech_end": ch.audio_t, "at": ch.at, "resume": None, "start": start})
        elif ch.kind == "resume" and out:
            out[-1]["resume"] = ch.at
    return out


def classify(p: dict[str, Any], turn: dict[str, Any]) -> dict[str, Any]:
    """The pause against the ground truth: ``end`` (the VAD's speech end is the turn's true end,
    within ``END_TOLERANCE_S``), or ``mid`` with the true pause it falls in (``true_pause_s``;
    0 for a gap inside speech)."""
    is_end = p["speech_end"] >= turn["speech_end_t"] - END_TOLERANCE_S
    true_len = 0.0
    for a, b in turn["pauses"]:
        if a - 0.25 <= p["speech_end"] <= b:
            true_len = b - a
    return {**p, "label": "end" if is_end else "mid", "true_pause_s": 0.0 if is_end else true_len}


def collect_signals(
    models, manifest: dict[str, Any], limit: int = 0, log: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """Stage 1: one row per VAD pause of every turn (module docstring); ``limit``: the first
    conversations of each split only (0: all)."""
    from tqdm import tqdm

    pcfg = voice_config(32)
    rows: list[dict[str, Any]] = []
    smart = models.turn_model()
    all_turns = turns(manifest)
    if limit:
        keep = {
            c["id"]
            for split in ("dev", "test")
            for c in [c for c in manifest["conversations"] if c["split"] == split][:limit]
        }
        all_turns = [t for t in all_turns if t["conversation"] in keep]
    responder = PredictiveResponder(models.llm, pcfg, mode="cascade")
    plain = PredictiveResponder(models.llm, PredGenConfig(**{**pcfg.__dict__, "mode": "cascade"}))
    history: list[dict[str, str]] = []
    conv = None
    for t in tqdm(all_turns, desc="signals", unit="turn"):
        if t["conversation"] != conv:
            conv, history = t["conversation"], []
        audio = read_wav(t["path"])
        for p in vad_pauses(audio):
            p = classify(p, t)
            cut = int((p["speech_end"] + 0.1) * SAMPLE_RATE)
            begin = max(0, int(((p["start"] or 0.0) - 0.3) * SAMPLE_RATE))
            clip = audio[begin:cut]
            t0 = time.perf_counter()
            audio_p = float(smart.predict(clip))
            t1 = time.perf_counter()
            text = " ".join(models.transcriber.transcribe(clip).text.split())
            t2 = time.perf_counter()
            responder.restart(history)
            plain.restart(history)
            text_p = responder.end_of_turn_prob(text) if text else 0.0
            mark_p = responder.end_probs_marked.get(" ".join(text.split()), text_p) if text else 0.0
            norm_p = plain.end_of_turn_prob(normalise(text)) if normalise(text) else 0.0
            t3 = time.perf_counter()
            rows.append(
                {
                    "turn": t["id"],
                    "conversation": t["conversation"],
                    "split": t["split"],
                    "voice": t["voice"],
                    "kind": t["kind"],
                    "noise": t.get("noise"),
                    **{k: p[k] for k in ("speech_end", "at", "resume", "label", "true_pause_s")},
                    "true_end": t["speech_end_t"],
                    "vad_lag_s": p["speech_end"] - t["speech_end_t"] if p["label"] == "end" else None,
                    "transcript": text,
                    "audio_p": audio_p,
                    "text_p": text_p,
                    "text_p_mark": mark_p,
                    "text_p_norm": norm_p,
                    "audio_ms": 1000 * (t1 - t0),
                    "asr_ms": 1000 * (t2 - t1),
                    "text_ms": 1000 * (t3 - t2),
                }
            )
        history = [
            *history,
            {"role": "user", "content": t["text"]},
            {"role": "assistant", "content": "Okay."},
        ]
    return rows


def rescore(rows: Sequence[dict[str, Any]], manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Signals computed earlier, labelled again against the turn set's ground truth."""
    by_id = {t["id"]: t for t in turns(manifest)}
    out = []
    for r in rows:
        t = by_id[r["turn"]]
        r = classify({k: r[k] for k in ("speech_end", "at", "resume")} | r, t)
        r["vad_lag_s"] = r["speech_end"] - t["speech_end_t"] if r["label"] == "end" else None
        out.append(r)
    return out


def voice_config(max_tokens: int, variant: str = ""):
    """The voice chat's PredGen settings, with the benchmark's answer length (and a
    ``VARIANTS`` entry's changes)."""

    return voice_predgen(max_tokens=max_tokens, speak_rest=False, **VARIANTS.get(variant, {}))


def split_method(method: str) -> tuple[str, str]:
    """``(mode, variant)`` of a live method name ``MODE[/VARIANT]`` (``ValueError``: unknown)."""
    mode, _, variant = method.partition("/")
    if mode not in (*METHODS, "cascade") or (variant and variant not in VARIANTS):
        known = ", ".join([*METHODS, *(f"{m}/{v}" for m in METHODS for v in VARIANTS)])
        raise ValueError(f"unknown method {method!r}; known: {known}")
    return mode, variant


# ---- the sweep -------------------------------------------------------------------------------
def _policy(kind: str, threshold: float, max_silence: float, w: float = 0.5):
    return TurnPolicy(
        TurnPolicyConfig(kind=kind, threshold=threshold, max_silence_s=max_silence, text_weight=w)
    )


def evaluate(rows: Sequence[dict[str, Any]], policy, text_key: str = "text_p") -> dict[str, Any]:
    """One policy on the pause rows: false cut-offs (long mid pauses, and every mid pause) and
    the silence waited after the true end (VAD lag + the silence the policy needs)."""

    long_mid = cut_long = mid = cut = 0
    waits: list[float] = []
    by_turn_cut: dict[str, bool] = {}
    ended: set[str] = set()
    for r in rows:
        sig = TurnSignals(audio=r["audio_p"], text=r[text_key])
        need = policy.silence_needed(sig)
        if r["label"] == "end":
            if r["turn"] not in ended:  # the first pause at the end decides (later ones: noise)
                ended.add(r["turn"])
                waits.append(max(0.0, r["vad_lag_s"] or 0.0) + need)
            continue
        # the policy ends a pause it needs less silence for than there was (decided at a frame)
        there = (r["resume"] or 1e9) - r["speech_end"]
        was_cut = bool(need < there) and not by_turn_cut.get(r["turn"])
        mid += 1
        cut += was_cut
        if r["true_pause_s"] >= LONG_PAUSE_S:
            long_mid += 1
            cut_long += was_cut
        if was_cut:
            by_turn_cut[r["turn"]] = True  # the turn was answered early once: later pauses moot
    return {
        "false_cutoffs": cut_long / long_mid if long_mid else None,
        "long_pauses": long_mid,
        "false_cutoffs_all": cut / mid if mid else None,
        "mid_pauses": mid,
        "wait_p50": percentile(waits, 50),
        "wait_p90": percentile(waits, 90),
        "ends": len(waits),
    }


def sweep(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every policy kind over a grid of thresholds, fallbacks (and fused weights)."""
    out = []
    for s in (0.3, 0.4, 0.5, *FALLBACKS):
        ev = evaluate(rows, _policy("silence", 0.5, s))
        out.append({"kind": "silence", "threshold": None, "max_silence": s, **ev})
    kinds = [("audio", (0.5,)), ("text", (0.5,)), ("text_norm", (0.5,)), ("fused", (0.5, 0.7, 0.8, 0.9))]
    if rows and "text_p_mark" in rows[0]:  # signals recorded with the marked variant
        kinds += [("text_mark", (0.5,)), ("fused_mark", (0.5, 0.7, 0.9))]
    for kind, weights in kinds:
        pk = kind.split("_")[0]
        key = {"text_norm": "text_p_norm", "text_mark": "text_p_mark", "fused_mark": "text_p_mark"}.get(
            kind, "text_p"
        )
        for w in weights:
            for th in THRESHOLDS:
                for s in FALLBACKS:
                    ev = evaluate(rows, _policy(pk, th, s, w), key)
                    out.append({"kind": kind, "w": w, "threshold": th, "max_silence": s, **ev})
    return out


def calibrate(dev: Sequence[dict[str, Any]], test: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per eagerness and kind: the setting with the lowest p50 wait on dev whose false cut-offs
    stay within the budget there; its figures on dev and on test."""
    cal: dict[str, Any] = {}
    sw = sweep(dev)
    for eager, budget in BUDGETS.items():
        for kind in ("silence", "audio", "text", "fused", "text_mark", "fused_mark"):
            ok = [
                r
                for r in sw
                if r["kind"] == kind
                and r["false_cutoffs"] is not None
                and r["false_cutoffs"] <= budget + 1e-9
            ]
            if not ok:
                continue
            best = min(ok, key=lambda r: (r["wait_p50"], r["wait_p90"], -r["max_silence"]))
            pol = _policy(
                kind.split("_")[0],
                best["threshold"] or 0.5,
                best["max_silence"],
                best.get("w", 0.5),
            )
            cal[f"{eager}/{kind}"] = {
                "eagerness": eager,
                "kind": kind,
                "budget": budget,
                "threshold": best["threshold"],
                "max_silence": best["max_silence"],
                "w": best.get("w"),
                "dev": {k: best[k] for k in ("false_cutoffs", "false_cutoffs_all", "wait_p50", "wait_p90")},
                "test": evaluate(test, pol, "text_p_mark" if kind.endswith("_mark") else "text_p"),
            }
    return cal


# ---- stage 2: live ---------------------------------------------------------------------------
def _policy_config(name: str, eagerness: str):
    """``(turn_detection, TurnConfig or None, TurnPolicyConfig or None)`` for a live policy name."""

    if name.startswith("silence:"):
        end = float(name.split(":", 1)[1])
        return "server_vad", TurnConfig(pause_s=min(0.2, end), end_s=end), None
    if name not in KINDS:
        raise ValueError(f"unknown policy {name!r}; known: silence:S, audio, text, fused")
    return "semantic", None, TurnPolicyConfig(kind=name, eagerness=eagerness)


def _conversation_audio(
    conv: list[dict[str, Any]], pipe, offsets: list[float], max_wait_s: float = 20.0
) -> Iterator[np.ndarray]:
    """Each turn's WAV in 32 ms chunks (a VAD frame; WebRTC sends 20 ms), then silence until
    its answer has played (at most ``max_wait_s``); ``offsets`` receives each turn's start on
    the input clock."""
    chunk = CHUNK
    sent = 0
    for t in conv:
        offsets.append(sent / SAMPLE_RATE)
        audio = read_wav(t["path"])
        for i in range(0, len(audio), chunk):
            piece = audio[i : i + chunk]
            sent += len(piece)
            yield piece
        silence = np.zeros(chunk, np.float32)
        waited = 0.0
        while waited < max_wait_s:
            now = sent / SAMPLE_RATE
            playing = any(p["end_t"] > now for p in pipe.playbacks)
            if not pipe.working and not playing:
                break
            sent += chunk
            waited += chunk / SAMPLE_RATE
            yield silence
        for _ in range(10):  # a short gap between turns
            sent += chunk
            yield silence


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def score_turn(
    t: dict[str, Any], offset: float, playbacks: Sequence[dict[str, Any]], window: tuple[float, float]
) -> dict[str, Any]:
    """User-felt figures of one turn from the answer audio played in its window (input clock)."""
    true_end = offset + t["speech_end_t"]
    mine = [p for p in playbacks if window[0] <= p["start_t"] < window[1]]
    after = [p["start_t"] for p in mine if p["start_t"] >= true_end - 1e-6]
    long_pauses = [(offset + a, offset + b) for a, b in t["pauses"] if b - a >= LONG_PAUSE_S]
    cut = [any(a <= p["start_t"] < b for p in mine) for a, b in long_pauses]
    early = [p for p in mine if p["start_t"] < true_end - 1e-6]
    speech = [
        (offset + a, offset + b)
        for a, b in t.get("piece_spans") or [(t["speech_start_t"], t["speech_end_t"])]
    ]
    talk = sum(_overlap((p["start_t"], p["end_t"]), s) for p in mine for s in speech)
    return {
        "latency_s": (min(after) - true_end) if after else None,
        "long_pauses": len(long_pauses),
        "cut_long_pauses": sum(cut),
        "early_audio": len(early),
        "talk_over_s": talk,
        "playbacks": [{**p, "start_t": p["start_t"] - offset, "end_t": p["end_t"] - offset} for p in mine],
    }


def run_conversation(models, conv, policy: str, method: str, opts: TurnsBenchOptions) -> list[dict[str, Any]]:
    detection, turn_cfg, pol = _policy_config(policy, opts.eagerness)
    mode, variant = split_method(method)
    pipe = make_pipeline(
        "chat",
        models,
        mode=mode,
        clock=VirtualClock(),
        turn=turn_cfg,
        predgen=voice_config(opts.max_tokens, variant),
        turn_detection=detection,
        policy=pol,
    )
    offsets: list[float] = []
    metrics: list[tuple[Any, list[dict[str, str]]]] = []

    def on_event(e) -> None:
        if e.type == "turn_metrics" and e.transcript:
            hist = list(pipe.history)
            if e.answer and len(hist) >= 2 and hist[-1]["role"] == "assistant":
                hist = hist[:-2]
            metrics.append((e, hist))

    res = play(pipe, _conversation_audio(conv, pipe, offsets), on_event=on_event)
    out = []
    for i, t in enumerate(conv):
        lo = offsets[i]
        hi = offsets[i + 1] if i + 1 < len(offsets) else float("inf")
        in_window = [(m, h) for m, h in metrics if lo <= m.speech_end_t < hi]
        rec: dict[str, Any] = {
            "turn": t["id"],
            "conversation": t["conversation"],
            "voice": t["voice"],
            "kind": t["kind"],
            "noise": t.get("noise"),
            "policy": policy,
            "method": method,
            "text": t["text"],
            **score_turn(t, lo, pipe.playbacks, (lo, hi)),
            "max_lag_s": res.max_lag_s,
        }
        if in_window:
            m, hist = in_window[-1]
            compute = sum(x.asr_s + x.llm_s + x.tts_s + x.extra.get("turn_s", 0.0) for x, _ in in_window)
            rec.update(
                transcript=m.transcript,
                answer=m.answer,
                history=hist,
                speech_end_vad=m.speech_end_t - lo,
                decided_t=None if m.extra.get("decided_t") is None else m.extra["decided_t"] - lo,
                audio_start_t=None if m.extra.get("audio_start_t") is None else m.extra["audio_start_t"] - lo,
                true_end_t=t["speech_end_t"],
                predicted=m.extra.get("predicted"),
                audio_p=m.extra.get("audio_p"),
                text_p=m.extra.get("text_p"),
                asr_s=sum(x.asr_s for x, _ in in_window),
                llm_s=sum(x.llm_s for x, _ in in_window),
                tts_s=sum(x.tts_s for x, _ in in_window),
                turn_s=sum(x.extra.get("turn_s", 0.0) for x, _ in in_window),
                compute_s=compute,
                pipeline_turns=len(in_window),
            )
        out.append(rec)
    return out


def reference_answers(models, records: list[dict[str, Any]], max_tokens: int, log) -> None:
    """The cascade's greedy answer to each record's final transcript and history; each record
    gets ``identity``: identical, near-tie (plain AR's top-2 logit gap at the first difference
    below ``report.NEAR_TIE_GAP``) or BUG."""

    pcfg = voice_config(max_tokens)
    cache: dict[str, Any] = {}
    for r in records:
        if not r.get("transcript") or r.get("answer") is None or r["method"] == "pipecat":
            continue
        key = json.dumps([r["history"], r["transcript"]])
        if key not in cache:
            resp = PredictiveResponder(models.llm, pcfg, mode="cascade", history=r["history"])
            res = resp.finish(r["transcript"])
            cache[key] = (res.response, res.token_ids)
            resp.close()
        ref, ref_ids = cache[key]
        r["reference"] = ref
        if r["answer"] == ref:
            r["identity"] = "identical"
            continue
        ids = models.llm.tokenizer.encode(r["answer"])
        pos = first_divergence(ids, ref_ids) or 0
        prompt = chat_prompt(models.llm.tokenizer, r["transcript"], r["history"], pcfg.system)
        other = ids[pos] if pos < len(ids) else None
        gap = ar_logit_gap(models.llm, prompt, ref_ids, pos, other)
        r["divergence"] = {"position": pos, **gap}
        r["identity"] = "near-tie" if gap["gap_top2"] < report.NEAR_TIE_GAP else "BUG"
        if r["identity"] == "BUG":
            where = f"{r['method']}/{r['policy']} {r['turn']}"
            log(f"BUG? {where}: the answer differs at token {pos} (top-2 gap {gap['gap_top2']:.3f})")


# ---- summaries -------------------------------------------------------------------------------
def waterfall(complete: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Where a complete turn's wait goes, medians in seconds: the VAD's lag behind the true end of
    speech, the turn decision after the VAD's end, the first audio after the decision, and the
    pipeline's ASR / LM / TTS seconds per turn."""

    def med(key: Callable[[dict[str, Any]], float | None]) -> float | None:
        return percentile([key(r) for r in complete], 50)

    def gap(a: str, b: str) -> Callable[[dict[str, Any]], float | None]:
        return lambda r: None if r.get(a) is None or r.get(b) is None else r[b] - r[a]

    return {
        "vad_lag_s": med(gap("true_end_t", "speech_end_vad")),
        "decision_s": med(gap("speech_end_vad", "decided_t")),
        "audio_s": med(gap("decided_t", "audio_start_t")),
        "asr_s": med(lambda r: r.get("asr_s")),
        "llm_s": med(lambda r: r.get("llm_s")),
        "tts_s": med(lambda r: r.get("tts_s")),
    }


def _latency_ratio(complete: Sequence[dict[str, Any]], other: dict[str, dict[str, Any]]) -> dict | None:
    """The paired ratio of these turns' first-audio latency over ``other``'s on the same turns
    (``stats.paired_ratio``); None without a pair."""
    pairs = [
        (other[r["turn"]]["latency_s"], r["latency_s"])
        for r in complete
        if r["turn"] in other and other[r["turn"]].get("latency_s") and r["latency_s"] > 0
    ]
    return paired_ratio([a for a, _ in pairs], [b for _, b in pairs]) if pairs else None


def _put(row: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        row[key] = value


def summarize(records: Sequence[dict[str, Any]], configs: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    base = {r["turn"]: r for r in records if (r["policy"], r["method"]) == ("silence:0.5", "cascade")}
    pc = {r["turn"]: r for r in records if r["method"] == "pipecat"}
    out = []
    for policy, method in configs:
        rs = [r for r in records if r["policy"] == policy and r["method"] == method]
        if not rs:
            continue
        complete = [r for r in rs if r["kind"] == "complete" and r.get("latency_s") is not None]
        lat = [r["latency_s"] for r in complete]
        all_lat = [r["latency_s"] for r in rs if r.get("latency_s") is not None]
        long_p = sum(r["long_pauses"] for r in rs)
        cut = sum(r["cut_long_pauses"] for r in rs)
        ident = [r.get("identity") for r in rs if r.get("identity")]
        row: dict[str, Any] = {
            "policy": policy,
            "method": method,
            "turns": len(rs),
            "latency_p50": percentile(lat, 50),
            "latency_p90": percentile(lat, 90),
            "latency_all_p50": percentile(all_lat, 50),
            "latency_all_p90": percentile(all_lat, 90),
            "false_cutoffs": cut / long_p if long_p else None,
            "cut_pauses": f"{cut}/{long_p}",
            "talk_over_max": max((r["talk_over_s"] for r in rs), default=0.0),
            "talk_over_turns": sum(r["talk_over_s"] > 0 for r in rs),
            "identical": sum(i == "identical" for i in ident),
            "near_ties": sum(i == "near-tie" for i in ident),
            "bugs": sum(i == "BUG" for i in ident),
            "judged": len(ident),
            "compute_s": statistics.mean([r["compute_s"] for r in rs if "compute_s" in r] or [0.0]),
            "unanswered": sum(r.get("latency_s") is None for r in rs),
            "waterfall": waterfall(complete),
        }
        pairs = [
            (base[r["turn"]]["compute_s"], r["compute_s"])
            for r in rs
            if r["turn"] in base and "compute_s" in r and "compute_s" in base[r["turn"]]
        ]
        if pairs and (policy, method) != ("silence:0.5", "cascade"):
            row["extra_compute_s"] = statistics.median(b - a for a, b in pairs)
        if (policy, method) != ("silence:0.5", "cascade"):
            _put(row, "vs_cascade", _latency_ratio(complete, base))
        if method != "pipecat":
            _put(row, "vs_pipecat", _latency_ratio(complete, pc))
        if "/" in method:  # a variant: paired with its method, same policy, same turns
            mode = split_method(method)[0]
            plain = {r["turn"]: r for r in records if (r["policy"], r["method"]) == (policy, mode)}
            _put(row, "vs_method", _latency_ratio(complete, plain))
        out.append(row)
    return out


# ---- the run ---------------------------------------------------------------------------------
def live_configs(opts: TurnsBenchOptions) -> list[tuple[str, str]]:
    configs = [("silence:0.5", "cascade")]
    for m in opts.methods:
        predgen = split_method(m)[0] == "predgen"
        pols = opts.policies if predgen else [p for p in opts.policies if p in opts.other_policies]
        configs += [(p, m) for p in pols]
    return configs


def run_turns_bench(opts: TurnsBenchOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    from tqdm import tqdm

    load_avg_start = report.load_avg()
    prov = report.provenance(opts.command)
    configs = live_configs(opts)  # an unknown method fails before any model loads
    models = load_live_models(LiveModelsConfig(model=opts.model, backend=opts.backend))
    models.warm_up()
    models.turn_model()
    manifest = load_turnset(log=log)
    header = {
        "machine": report.machine_info(load_avg_start),
        "provenance": prov,
        "models": {
            "llm": models.llm.name,
            "asr": f"{models.cfg.asr_model} (+{models.cfg.asr_draft} draft, {models.cfg.asr_method})",
            "tts": getattr(models.tts, "name", None),
            "turn": models.cfg.turn_model,
        },
        "settings": {
            "turn set": f"{manifest.get('name')} ({len(turns(manifest))} turns)",
            "live split": opts.split,
            "eagerness": opts.eagerness,
            "max_tokens": opts.max_tokens,
            "clock": "simulated, compute charged (VirtualClock)",
            "chunk s": CHUNK / SAMPLE_RATE,
            "long pause s": LONG_PAUSE_S,
        },
        "command": opts.command,
        "env": {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")},
    }
    for line in report.header_lines(header):
        log(line)
    result: dict[str, Any] = {"provenance": prov, "header": header}
    if opts.stage in ("signals", "all"):
        if opts.signals_from:
            rows = rescore(json.loads(Path(opts.signals_from).read_text())["signals"], manifest)
            header["settings"]["signals from"] = opts.signals_from
        else:
            rows = collect_signals(models, manifest, opts.limit, log)
        dev = [r for r in rows if r["split"] == "dev"]
        test = [r for r in rows if r["split"] == "test"]
        result["signals"] = rows
        result["sweep"] = {"dev": sweep(dev), "test": sweep(test)}
        result["calibration"] = calibrate(dev, test)
        result["normalisation"] = {
            split: {
                "raw": _separation(rs, "text_p"),
                "normalised": _separation(rs, "text_p_norm"),
                **({"marked": _separation(rs, "text_p_mark")} if rs and "text_p_mark" in rs[0] else {}),
            }
            for split, rs in (("dev", dev), ("test", test))
        }
    if opts.stage in ("live", "all"):
        split = None if opts.split == "all" else opts.split
        convs: dict[str, list[dict[str, Any]]] = {}
        for t in turns(manifest, split):
            convs.setdefault(t["conversation"], []).append(t)
        conv_list = list(convs.values())[: opts.limit or None]
        records: list[dict[str, Any]] = []
        bar = tqdm(total=len(conv_list) * len(configs), desc="live", unit="conv")
        for n, conv in enumerate(conv_list):
            # methods interleaved: each conversation runs every configuration, in rotated order
            k = n % len(configs)
            for policy, method in configs[k:] + configs[:k]:
                bar.set_postfix_str(f"{conv[0]['conversation']} {policy} {method}")
                records += run_conversation(models, conv, policy, method, opts)
                bar.update(1)
        bar.close()
        if opts.peer == "pipecat":
            peer_info: dict[str, Any] = {}
            records += pipecat_records(conv_list, opts, log, peer_info)
            configs.append(("pipecat", "pipecat"))
            header["peer"] = peer_info
        reference_answers(models, records, opts.max_tokens, log)
        result["records"] = records
        result["summary"] = summarize(records, configs)
    return result


def _separation(rows: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """How well a text probability tells ends from mid pauses: medians and the share of ends
    above the highest mid-pause value's 90th percentile."""
    ends = [r[key] for r in rows if r["label"] == "end"]
    mids = [r[key] for r in rows if r["label"] == "mid" and r["true_pause_s"] >= LONG_PAUSE_S]
    cut = percentile(mids, 90) if mids else None
    return {
        "end_p50": percentile(ends, 50),
        "mid_p50": percentile(mids, 50),
        "mid_p90": cut,
        "ends_above_mid_p90": (sum(e > cut for e in ends) / len(ends)) if ends and cut is not None else None,
    }


def pipecat_records(conv_list, opts: TurnsBenchOptions, log, info: dict[str, Any]) -> list[dict[str, Any]]:
    """Pipecat 1.14 on the same conversations, scored like speclive's runs (``info`` receives
    its versions and settings)."""
    pcfg = voice_config(opts.max_tokens)
    jobs = [
        {
            "id": c[0]["conversation"],
            "turns": [
                {
                    "id": t["id"],
                    "wav": t["path"],
                    "duration_s": t["duration_s"],
                    "speech_end_s": t["speech_end_t"],
                }
                for t in c
            ],
        }
        for c in conv_list
    ]
    got = run_pipecat(jobs, system_prompt=pcfg.system, max_tokens=opts.max_tokens, log=log, info=info)
    by_id = {r["id"]: r for r in got}
    out = []
    for conv in conv_list:
        for t in conv:
            r = by_id.get(t["id"], {})
            spans = [{"start_t": a, "end_t": b, "cut": False} for a, b in r.get("bot_audio") or []]
            rec = {
                "turn": t["id"],
                "conversation": t["conversation"],
                "voice": t["voice"],
                "kind": t["kind"],
                "noise": t.get("noise"),
                "policy": "pipecat",
                "method": "pipecat",
                "text": t["text"],
                **score_turn(t, 0.0, spans, (0.0, float("inf"))),
                "transcript": " ".join(x for _, x in r.get("transcripts") or []),
                "answer": " ".join(a for a in r.get("answers") or [] if a),
                "timed_out": r.get("timed_out"),
            }
            out.append(rec)
    return out


# ---- outputs ---------------------------------------------------------------------------------
def _median_ms(rows: Sequence[dict[str, Any]], key: str) -> str:
    return _f(percentile([r[key] for r in rows], 50), 0)


def _f(v: Any, digits: int = 2) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


CAL_COLUMNS = [
    ("eagerness", "eagerness", 0),
    ("kind", "policy", 0),
    ("threshold", "threshold", 2),
    ("max_silence", "fallback s", 2),
    ("w", "w", 2),
    ("dev_cut", "dev cut-offs", 2),
    ("dev_wait", "dev wait p50 / p90 s", 2),
    ("test_cut", "test cut-offs", 2),
    ("test_wait", "test wait p50 / p90 s", 2),
]
NORM_COLUMNS = [
    ("split", "split", 0),
    ("text", "text", 0),
    ("end_p50", "end p50", 3),
    ("mid_p50", "mid p50", 3),
    ("mid_p90", "mid p90", 3),
    ("ends_above_mid_p90", "ends above mid p90", 2),
]
LIVE_COLUMNS = [
    ("policy", "policy", 0),
    ("method", "method", 0),
    ("turns", "turns", 0),
    ("latency_p50", "latency p50 s", 2),
    ("latency_p90", "p90 s", 2),
    ("all", "all turns p50 / p90 s", 2),
    ("cuts", "cut-offs", 2),
    ("talk_over_max", "max talk-over s", 2),
    ("ident", "identical", 0),
    ("near_ties", "near-ties", 0),
    ("bugs", "BUG", 0),
    ("compute_s", "compute s", 2),
    ("extra_compute_s", "extra s", 2),
    ("cascade", "vs cascade p50", 0),
    ("pipecat", "vs Pipecat p50", 0),
    ("method_ratio", "vs its method p50", 0),
]


WATERFALL_COLUMNS = [
    ("policy", "policy", 0),
    ("method", "method", 0),
    ("vad_lag_s", "VAD end after the true end", 2),
    ("decision_s", "decision after the VAD end", 2),
    ("audio_s", "first audio after the decision", 2),
    ("asr_s", "ASR s / turn", 2),
    ("llm_s", "LM s / turn", 2),
    ("tts_s", "TTS s / turn", 2),
]


def _pair(a: Any, b: Any) -> str:
    return f"{_f(a)} / {_f(b)}"


def _live_lines(result: dict[str, Any]) -> list[str]:
    """Stage 2's part of the report: the summary, where the time goes, the near-tie flips."""
    rows = [
        {
            **r,
            "all": _pair(r["latency_all_p50"], r["latency_all_p90"]),
            "cuts": f"{r['cut_pauses']} ({_f(r['false_cutoffs'])})",
            "ident": f"{r['identical']}/{r['judged']}",
            "cascade": ratio_text(r.get("vs_cascade")),
            "pipecat": ratio_text(r.get("vs_pipecat")),
            "method_ratio": ratio_text(r.get("vs_method")),
        }
        for r in result["summary"]
    ]
    lines = [
        "",
        "## Stage 2: live, first answer audio after the true end of speech",
        "",
        "Latency on turns without a mid-turn pause (p50 / p90, s); cut-offs: long mid-turn "
        "pauses in which answer audio started; talk-over: answer audio over the speaker's "
        "speech; identical: answers equal to the cascade's greedy answer to the same transcript "
        "and history (llama.cpp near-ties counted apart); compute: ASR + LM + TTS + turn-model "
        "seconds per turn; extra: the median paired difference to the cascade (silence 0.5 s); "
        "vs its method: a METHOD/VARIANT row paired per turn with METHOD under the same policy.",
        "",
        report.md_table(LIVE_COLUMNS, rows),
        "",
        "Where the time goes on turns without a mid-turn pause (medians, s): the VAD's end of "
        "speech after the true end, the turn decision after the VAD's end, the first audio after "
        "the decision; ASR / LM / TTS seconds per turn.",
        "",
        report.md_table(WATERFALL_COLUMNS, [{**r, **(r.get("waterfall") or {})} for r in result["summary"]]),
    ]
    near = [r for r in result["records"] if r.get("identity") == "near-tie"]
    if near:
        lines += ["", "Near-tie flips (first differing token, plain AR's top-2 logit gap there):", ""]
        for r in near[:20]:
            d = r.get("divergence", {})
            where = f"{r['policy']}/{r['method']} {r['turn']}"
            lines.append(f"- {where}: token {d.get('position')}, gap {_f(d.get('gap_top2'), 3)}")
    return lines


def markdown(result: dict[str, Any]) -> str:
    lines = report.markdown_preamble("Turn-taking on the spoken turn set", result["header"])
    if "calibration" in result:
        rows = [
            {
                **c,
                "dev_cut": c["dev"]["false_cutoffs"],
                "dev_wait": _pair(c["dev"]["wait_p50"], c["dev"]["wait_p90"]),
                "test_cut": c["test"]["false_cutoffs"],
                "test_wait": _pair(c["test"]["wait_p50"], c["test"]["wait_p90"]),
            }
            for c in result["calibration"].values()
        ]
        norm = [
            {"split": split, "text": k, **v}
            for split, d in result["normalisation"].items()
            for k, v in d.items()
        ]
        sig = result["signals"]
        lines += [
            "",
            "## Stage 1: the policies at every VAD pause (the silence waited, no compute)",
            "",
            "Calibrated on dev (the fastest setting within each false-cut-off budget), reported on "
            f"test. False cut-offs: mid-turn pauses >= {LONG_PAUSE_S} s the policy would end; wait: "
            "VAD lag + the silence the policy needs after the true end.",
            "",
            report.md_table(CAL_COLUMNS, rows),
            "",
            "The text signal with and without LiveKit's normalisation (lower-case, no punctuation): "
            "medians at the true end and at long mid pauses, and the share of ends above the mid "
            "pauses' p90.",
            "",
            report.md_table(NORM_COLUMNS, norm),
            "",
            f"Cost per decision (median): Smart Turn {_median_ms(sig, 'audio_ms')} ms, "
            f"whisper final pass {_median_ms(sig, 'asr_ms')} ms, LM probe (both "
            f"variants) {_median_ms(sig, 'text_ms')} ms; {len(sig)} pauses.",
        ]
    if "summary" in result:
        lines += _live_lines(result)
    return "\n".join(lines) + "\n"


def plot(path: Path, result: dict[str, Any]) -> Path:
    plt = report._pyplot()
    panels = [k for k in ("sweep", "records") if k in result] or ["records"]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5), squeeze=False)
    axes = list(axes[0])
    if "sweep" in result:
        ax = axes.pop(0)
        colors = {
            "silence": "gray",
            "audio": "tab:blue",
            "text": "tab:orange",
            "text_norm": "tab:brown",
            "fused": "tab:green",
        }
        for kind, col in colors.items():
            pts = [
                (r["false_cutoffs"], r["wait_p50"])
                for r in result["sweep"]["test"]
                if r["kind"] == kind
                and r["false_cutoffs"] is not None
                and r["wait_p50"] is not None
                and (kind != "fused" or r.get("w") == FUSED_W)
            ]
            front = _pareto(pts)
            if front:
                ax.plot(
                    [100 * x for x, _ in front],
                    [1000 * y for _, y in front],
                    "o-",
                    color=col,
                    label=f"fused (w {FUSED_W})" if kind == "fused" else kind,
                    ms=3,
                )
        ax.set_xlabel(f"false cut-offs (% of mid-turn pauses >= {LONG_PAUSE_S} s)")
        ax.set_ylabel("silence waited after the true end, p50 (ms)")
        ax.set_title("Threshold sweep on test (best settings per cut-off rate)")
        ax.legend()
        ax.grid(alpha=0.3)
    if "records" not in result:
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path
    ax = axes.pop(0)
    recs = [
        r
        for r in result.get("records", [])
        if r["policy"] == "fused" and r["method"] == "predgen" and r.get("audio_start_t") is not None
    ]
    recs = sorted(recs, key=lambda r: r["turn"])[:30]
    for i, r in enumerate(recs):
        end = r["true_end_t"]
        segs = [
            ("VAD lag", r["speech_end_vad"] - end, "tab:gray"),
            ("decision", (r["decided_t"] or r["speech_end_vad"]) - r["speech_end_vad"], "tab:purple"),
            ("to audio", r["audio_start_t"] - (r["decided_t"] or r["speech_end_vad"]), "tab:green"),
        ]
        left = 0.0
        for name, w, col in segs:
            ax.barh(i, 1000 * w, left=1000 * left, color=col, label=name if i == 0 else None)
            left += w
        ax.text(
            1000 * left + 10,
            i,
            f"asr {r['asr_s']:.2f}s llm {r['llm_s']:.2f}s tts {r['tts_s']:.2f}s",
            va="center",
            fontsize=6,
        )
    ax.set_yticks(range(len(recs)), [r["turn"] for r in recs], fontsize=6)
    ax.axvline(300, color="red", lw=0.8, ls="--")
    ax.set_xlabel("ms after the true end of speech")
    ax.set_title("Per-turn waterfall, fused + PredGen (compute charged per turn at right)")
    if recs:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _pareto(pts: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    best: dict[float, float] = {}
    for x, y in pts:
        best[x] = min(y, best.get(x, y))
    out, low = [], float("inf")
    for x in sorted(best):
        if best[x] < low:
            out.append((x, best[x]))
            low = best[x]
    return out


def write_outputs(result: dict[str, Any], out: Path, tag: str, plot_it: bool = True) -> list[Path]:
    name = f"turns-{tag}" if tag else "turns"
    return report.write_result_files(result, out, name, markdown, plot if plot_it else None)


def add_turns_bench_parser(sub: Any) -> None:
    p = sub.add_parser(
        "turns", help="end-of-turn policies on spoken turns: latency after the true end, cut-offs"
    )
    OPTIONS.add_to(p)
    p.set_defaults(func=cmd_turns)


def cmd_turns(args: Any) -> int:
    import sys

    # several runtimes share the cores (Whisper, llama.cpp, ONNX models): OpenMP threads that
    # spin after their work would take the CPU from the next model (the Pipecat peer gets the
    # same setting)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    opts = OPTIONS.build(args)
    opts.command = OPTIONS.command(["speclive", "bench", "turns"], opts)
    for pol in opts.policies:
        _policy_config(pol, opts.eagerness)  # a bad name fails before the models load
    result = run_turns_bench(opts, log=lambda m: print(m, file=sys.stderr, flush=True))
    for path in write_outputs(result, opts.out, opts.tag, plot_it=opts.plot):
        print(f"wrote {path}", file=sys.stderr)
    print(markdown(result))
    return 0
