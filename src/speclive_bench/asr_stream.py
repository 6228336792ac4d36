"""``speclive bench asr --stream``: streaming passes drafted by the previous ones, against re-decoding.

Every clip is one spoken turn followed by silence. It is played at real time on a virtual clock
(``asr.streaming.stream_timed``): a LocalAgreement-2 pass after every second of audio, then the
final pass once the first silent frame after the speech has arrived (Silero VAD, the live
pipeline's thresholds). Each stream runs with every method, clip-major and in a rotated order:

- ``ar``: every pass decoded from scratch, one target step per token (plain greedy re-decoding);
- ``specasr``: every pass decoded from scratch with SpecASR's drafts (``--no-stream-draft``,
  the live pipeline's method before it drafted from earlier passes);
- ``chunked``: the newest hypothesis as the draft in chunks sized by the cost curve, recycling
  after a divergence (the previous release's streaming draft);
- ``previous``: the last two hypotheses (chain or tree, ending in end-of-text) proposed whole,
  re-aligned after a divergence (``drafting.hypothesis``, the default now);
- ``previous+tail``: the same, with SpecASR's drafter (the separate draft model) for the words
  no earlier pass heard;
- ``previous+self``: the same, with SpecASR's drafter on a shallow self-draft (the target's
  first decoder layers: no second encoder);
- ``previous+tailfinal``: ``previous`` whose final pass hears only the buffer's end, from a quiet
  point at the start of the last two committed words (``StreamConfig.final_tail_words``): the
  words committed before stay as the partials committed them. Lossy against ``previous``'s final
  pass over the whole turn: its final transcripts are compared with ``previous``'s and with the
  reference; its final pass is checked against plain re-decoding of the same shorter window;
- ``draft-partials``: the partial passes on the draft model (tiny.en, int8 decoder) drafted by
  its previous hypotheses, the final pass on the target drafted by the draft model's last
  hypothesis; ``draft-partials/plain`` the same models decoding every pass from scratch (the
  reference its passes must equal). The draft model runs in float32 with its LM head limited to
  the 8,192 most frequent ids (``draft-partials-fullvocab``: the whole vocabulary, its passes
  not compared). Its partial transcripts are the draft model's: their word error rate against
  the target's partials over the same audio is reported beside it.

Per pass: decoder passes of the target, tokens, encoder and decoder milliseconds, and whether
its token ids equal the ``ar`` pass over the same audio. Per turn: the final transcript's
latency after the first silent frame, and the CPU seconds (process time) of all its passes.
Ratios are paired per turn: the median of per-turn ratios with a 95 % bootstrap interval.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from speclive.asr.audio import to_mono_16k
from speclive.asr.streaming import PassRecognizer, StreamConfig, stream_timed
from speclive.asr.transcribe import TranscribeConfig, Transcriber
from speclive.decoder import SpeculativeDecoder
from speclive.drafting.history import HistoryDrafter
from speclive.errors import ConfigError
from speclive.live.vad import StreamingVAD, last_speech_end
from speclive.tts.piper import PiperTTS
from speclive.tts.sentences import split_sentences
from speclive_bench.asr import Clip
from speclive_bench.datasets import mtbench_questions
from speclive_bench.harness import rotated
from speclive_bench.report import _pyplot, markdown_preamble, md_table, word_error_rate
from speclive_bench.stats import paired_ratio, percentile, ratio_text

METHODS = (
    "ar",
    "specasr",
    "chunked",
    "previous",
    "previous+tail",
    "previous+self",
    "previous+tailfinal",
    "draft-partials/plain",
    "draft-partials",
    "draft-partials-fullvocab",
)
SAMPLE_RATE = 16_000
#: stream settings of the methods that change them (the rest: ``StreamConfig`` defaults)
STREAM_OPTIONS: dict[str, dict[str, Any]] = {"previous+tailfinal": {"final_tail_words": 2}}


# ---- clips ----------------------------------------------------------------------------------
def multi_sentence_turns(n: int, voice: str = "piper-joe-medium", seed: int = 0) -> list[Clip]:
    """``n`` turns of MT-Bench sentences in one voice, the sentences joined by 0.15-0.35 s of
    silence (shorter than the live pipeline's pause, so one turn): sentences are added while the
    turn is shorter than a length drawn from 5-20 s, so the last one may carry it past 20 s."""

    tts = PiperTTS(voice)
    rng = np.random.default_rng(seed)
    sentences = [
        s for q in mtbench_questions() for s in split_sentences(q["prompt"]) if 4 <= len(s.split()) <= 30
    ]
    out: list[Clip] = []
    at = 0
    for i in range(n):
        want = float(rng.uniform(5.0, 20.0))
        parts: list[np.ndarray] = []
        words: list[str] = []
        while at < len(sentences) and sum(len(p) for p in parts) / SAMPLE_RATE < want and len(words) < 60:
            a = tts.synthesize(sentences[at])
            if parts:
                parts.append(np.zeros(int(rng.uniform(0.15, 0.35) * SAMPLE_RATE), np.float32))
            parts.append(to_mono_16k(a.samples, a.sample_rate))
            words.append(sentences[at])
            at += 1
        if not parts:
            break
        out.append(Clip(f"turn-{i:02d}", "piper-multi", np.concatenate(parts), " ".join(words)))
    return out


def with_trailing_silence(clip: Clip, seconds: float = 1.0) -> Clip:
    pad = np.zeros(int(seconds * SAMPLE_RATE), np.float32)
    return Clip(clip.name, clip.source, np.concatenate([clip.audio.astype(np.float32), pad]), clip.reference)


# ---- transcribers -----------------------------------------------------------------------------
def _chunked_transcriber(base: Any) -> Any:
    """A transcriber whose hinted passes draft the newest hypothesis in cost-sized chunks
    (``HistoryDrafter``), as the previous release did; everything else is ``base``'s."""

    class Chunked(Transcriber):
        def _hinted_decoder(self, hints: list[list[int]]) -> SpeculativeDecoder:
            if not hasattr(self, "_hinted"):
                self._history = HistoryDrafter(recycle=True, chunked=True)
                self._hinted = SpeculativeDecoder(self.target, self._history)
            self._history.set_history(hints[0])
            return self._hinted

    return Chunked(base.cfg, target=base.target, draft_backend=base.draft_backend)


def load_transcribers(
    model: str, draft: str, margin_s: float | None, threads: int | None, self_draft: str = "self:2"
) -> dict[str, Any]:
    """One transcriber per method, all on ONE loaded target (and draft)."""
    from dataclasses import replace

    cfg = TranscribeConfig(
        model=model, method="specasr", draft=draft, threads=threads, target_audio_margin_s=margin_s
    )
    spec = Transcriber(cfg)
    ar = Transcriber(replace(cfg, method="ar"), target=spec.target)
    tail = Transcriber(replace(cfg, stream_tail=True), target=spec.target, draft_backend=spec.draft_backend)
    self_tail = Transcriber(replace(cfg, draft=self_draft, stream_tail=True), target=spec.target)
    small = Transcriber(
        replace(cfg, stream_partials="draft"), target=spec.target, draft_backend=spec.draft_backend
    )
    full = Transcriber(
        replace(cfg, stream_partials="draft", stream_partials_vocab=None),
        target=spec.target,
        draft_backend=spec.draft_backend,
    )
    return {
        "ar": (ar, False),
        "specasr": (spec, False),
        "chunked": (_chunked_transcriber(spec), True),
        "previous": (spec, True),
        "previous+tail": (tail, True),
        "previous+self": (self_tail, True),
        "previous+tailfinal": (spec, True),
        "draft-partials/plain": (small, False),
        "draft-partials": (small, True),
        "draft-partials-fullvocab": (full, True),
    }


#: the run whose passes each method must reproduce token for token (plain re-decoding of the
#: same audio on the same models)
REFERENCE = {"draft-partials": "draft-partials/plain", "draft-partials/plain": "draft-partials/plain"}
#: methods whose passes have no plain run in the benchmark to compare with
UNCHECKED = ("draft-partials-fullvocab",)


# ---- running ----------------------------------------------------------------------------------
def run_stream(
    transcriber: Any, draft: bool, clip: Clip, silence_t: float | None, step_s: float, **stream: Any
) -> dict:
    """One clip streamed by one method: its passes, final text and latency, CPU seconds
    (``stream``: ``StreamConfig`` fields). ``final_audio`` holds the final pass's audio."""

    rec = PassRecognizer(transcriber, draft=draft, loop_fallback=False)
    heard: list[np.ndarray] = []
    final_pass = rec.final_pass

    def keep_final(audio: np.ndarray, expect: Sequence[str] | None = None) -> list | None:
        heard.append(audio)
        return final_pass(audio, expect=expect)

    rec.final_pass = keep_final  # type: ignore[method-assign]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    run = stream_timed(clip.audio, rec, StreamConfig(step_s=step_s, buffer_s=25.0, **stream), silence_t)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "text": run.final.text,
        "final_latency_s": run.final_latency_s,
        "cpu_s": cpu,
        "wall_s": wall,
        "passes": [{**r.to_json(), "ids": r.token_ids} for r in rec.passes.records],
        "final_audio": heard[-1] if heard else None,
    }


def _plain_final(ar: Any, run: dict) -> list[int] | None:
    """Plain greedy re-decoding of the final pass's own audio (for a method whose final window
    no other run heard)."""
    audio = run["final_audio"]
    if audio is None:
        return None
    return [int(t) for t in getattr(ar.transcribe(audio, loop_fallback=True), "token_ids", []) or []]


def _check_passes(runs: dict[str, dict], m: str, plain_final: list[int] | None) -> None:
    """Mark how many of method ``m``'s passes equal its reference run's: the partial passes one
    for one, and its final transcript's pass against the reference's final pass (or against
    ``plain_final``, plain re-decoding of the same audio, for a final window of its own)."""
    r = runs[m]
    ref_m = REFERENCE.get(m, "ar")
    if ref_m not in runs or m in UNCHECKED:
        return

    def split(passes: list[dict]) -> tuple[list, list]:
        return [p["ids"] for p in passes if p["kind"] == "partial"], [
            p["ids"] for p in passes if p["kind"] == "final"
        ]

    mine, mine_final = split(r["passes"])
    ref, ref_final = split(runs[ref_m]["passes"])
    if mine_final:
        mine.append(mine_final[-1])
        ref.append(plain_final if plain_final is not None else (ref_final[-1] if ref_final else None))
    same = [a == b for a, b in zip(mine, ref, strict=False)] + [False] * abs(len(mine) - len(ref))
    r["identical_passes"], r["compared_passes"] = sum(same), len(same)


def with_references(methods: Sequence[str]) -> list[str]:
    """``methods`` (all when empty) in ``METHODS`` order, with ``ar`` and the plain runs their
    passes are checked against."""

    want = set(methods or METHODS)
    unknown = want - set(METHODS)
    if unknown:
        raise ConfigError(f"unknown stream methods {sorted(unknown)}; choose from {', '.join(METHODS)}")
    want |= {"ar"} | {REFERENCE[m] for m in want if m in REFERENCE}
    return [m for m in METHODS if m in want]


def run_stream_bench(
    clips: Sequence[Clip],
    transcribers: dict[str, Any],
    methods: Sequence[str] = METHODS,
    step_s: float = 1.0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for i, clip in enumerate(clips):
        silence_t = last_speech_end(StreamingVAD()(clip.audio))
        runs = {}
        for m in rotated(methods, i):
            tr, draft = transcribers[m]
            runs[m] = run_stream(tr, draft, clip, silence_t, step_s, **STREAM_OPTIONS.get(m, {}))
        for m in methods:
            own = m in STREAM_OPTIONS and "ar" in transcribers  # a final window of its own
            _check_passes(runs, m, _plain_final(transcribers["ar"][0], runs[m]) if own else None)
        for m in methods:
            for p in runs[m]["passes"]:
                del p["ids"]
            heard = runs[m].pop("final_audio")
            runs[m]["final_audio_s"] = 0.0 if heard is None else len(heard) / SAMPLE_RATE
        rows.append(
            {
                "clip": clip.name,
                "source": clip.source,
                "audio_s": clip.seconds,
                "silence_t": silence_t,
                "reference": clip.reference,
                "runs": runs,
            }
        )
        parts = ", ".join(
            f"{m} {sum(p['decoder_passes'] for p in runs[m]['passes'])}p"
            f"/{1000 * runs[m]['final_latency_s']:.0f}ms"
            for m in methods
        )
        log(f"[{i + 1}/{len(clips)}] {clip.name} ({clip.seconds:.1f}s): {parts}")
    return {"rows": rows, "methods": list(methods), "summary": summarize(rows, methods)}


# ---- summary ----------------------------------------------------------------------------------
def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split())


def _partial_wer(rows: Sequence[dict], m: str, target: str = "ar") -> float | None:
    """Word error rate of ``m``'s partial transcripts against the target model's partials over
    the same audio (0 for a lossless method on the target)."""
    refs, hyps = [], []
    for r in rows:
        if target not in r["runs"]:
            return None
        a = [p for p in r["runs"][target]["passes"] if p["kind"] == "partial"]
        b = [p for p in r["runs"][m]["passes"] if p["kind"] == "partial"]
        for x, y in zip(a, b, strict=False):
            if _norm(x["text"]):
                refs.append(_norm(x["text"]))
                hyps.append(_norm(y["text"]))
    return word_error_rate(refs, hyps) if refs else None


def summarize(rows: Sequence[dict], methods: Sequence[str]) -> list[dict[str, Any]]:
    def per_turn(m: str, kind: str, key: str) -> list[float]:
        return [float(sum(p[key] for p in r["runs"][m]["passes"] if p["kind"] == kind)) for r in rows]

    out = []
    for m in methods:
        partials = [p for r in rows for p in r["runs"][m]["passes"] if p["kind"] == "partial"]
        finals = [p for r in rows for p in r["runs"][m]["passes"] if p["kind"] == "final"]
        lat = [r["runs"][m]["final_latency_s"] for r in rows]
        short = [r["runs"][m]["final_latency_s"] for r in rows if r["audio_s"] <= 11.0]
        row: dict[str, Any] = {
            "method": m,
            "turns": len(rows),
            "partial_passes": len(partials),
            "partial_dec_passes": statistics.fmean([p["decoder_passes"] for p in partials] or [0]),
            "partial_tokens": statistics.fmean([p["tokens"] for p in partials] or [0]),
            "partial_dec_ms": statistics.fmean([p["decoder_ms"] for p in partials] or [0]),
            "partial_enc_ms": statistics.fmean([p["encoder_ms"] for p in partials] or [0]),
            # per turn: a final window that looped is decoded again (two final passes)
            "final_passes": len(finals),
            "final_dec_passes": statistics.fmean(per_turn(m, "final", "decoder_passes") or [0]),
            "final_dec_ms": statistics.fmean(per_turn(m, "final", "decoder_ms") or [0]),
            "final_enc_ms": statistics.fmean(per_turn(m, "final", "encoder_ms") or [0]),
            "final_p50_ms": 1000 * (percentile(lat, 50) or 0.0),
            "final_p90_ms": 1000 * (percentile(lat, 90) or 0.0),
            "final_p50_le10s_ms": 1000 * (percentile(short, 50) or 0.0),
            "final_p90_le10s_ms": 1000 * (percentile(short, 90) or 0.0),
            "turns_le10s": len(short),
            "cpu_s_turn": statistics.fmean([r["runs"][m]["cpu_s"] for r in rows] or [0]),
            "wall_s_turn": statistics.fmean([r["runs"][m]["wall_s"] for r in rows] or [0]),
            "identical": sum(r["runs"][m].get("identical_passes", 0) for r in rows),
            "partial_wer": _partial_wer(rows, m),
            "final_wer": word_error_rate(
                [_norm(r["reference"]) for r in rows], [_norm(r["runs"][m]["text"]) for r in rows]
            ),
            "compared": sum(r["runs"][m].get("compared_passes", 0) for r in rows),
            "final_audio_s": statistics.fmean([r["runs"][m].get("final_audio_s", 0.0) for r in rows] or [0]),
        }
        if "previous" in methods and m != "previous":
            row["finals_as_previous"] = sum(
                _norm(r["runs"][m]["text"]) == _norm(r["runs"]["previous"]["text"]) for r in rows
            )
        for base in ("ar", "specasr"):
            if base in methods:
                row[f"partial_passes_vs_{base}"] = paired_ratio(
                    per_turn(base, "partial", "decoder_passes"), per_turn(m, "partial", "decoder_passes")
                )
                row[f"cpu_vs_{base}"] = paired_ratio(
                    [r["runs"][base]["cpu_s"] for r in rows], [r["runs"][m]["cpu_s"] for r in rows]
                )
        if "chunked" in methods:
            row["cpu_vs_chunked"] = paired_ratio(
                [r["runs"]["chunked"]["cpu_s"] for r in rows], [r["runs"][m]["cpu_s"] for r in rows]
            )
        out.append(row)
    return out


# ---- output -----------------------------------------------------------------------------------
def markdown(result: dict[str, Any]) -> str:
    lines = markdown_preamble(
        "Streaming ASR: passes drafted by the previous passes", result.get("header", {})
    )
    s = result["summary"]
    for r in s:
        r["identity"] = f"{r['identical']}/{r['compared']}"
        r["vs_ar"] = ratio_text(r.get("partial_passes_vs_ar"))
        r["vs_spec"] = ratio_text(r.get("partial_passes_vs_specasr"))
        r["cpu_ar"] = ratio_text(r.get("cpu_vs_ar"))
        r["cpu_spec"] = ratio_text(r.get("cpu_vs_specasr"))
        r["cpu_chunked"] = ratio_text(r.get("cpu_vs_chunked"))
    lines += [
        "## Streaming passes (every second of audio)",
        "",
        md_table(
            [
                ("method", "method", 0),
                ("partial_passes", "passes", 0),
                ("partial_dec_passes", "decoder passes / pass", 2),
                ("partial_tokens", "tokens / pass", 1),
                ("partial_dec_ms", "decoder ms / pass", 1),
                ("partial_enc_ms", "encoder ms / pass", 1),
                ("vs_ar", "decoder passes vs ar (per turn)", 0),
                ("vs_spec", "vs specasr", 0),
                ("identity", "identical to plain", 0),
                ("partial_wer", "WER vs target partials", 3),
            ],
            s,
        ),
        "",
        "## The final pass (after the first silent frame)",
        "",
        md_table(
            [
                ("method", "method", 0),
                ("final_passes", "final passes", 0),
                ("final_dec_passes", "decoder passes", 2),
                ("final_dec_ms", "decoder ms", 1),
                ("final_enc_ms", "encoder ms", 1),
                ("final_audio_s", "audio s", 1),
                ("final_p50_ms", "latency p50 ms", 0),
                ("final_p90_ms", "p90 ms", 0),
                ("turns_le10s", "turns <= 10 s", 0),
                ("final_p50_le10s_ms", "p50 ms (<= 10 s)", 0),
                ("final_p90_le10s_ms", "p90 ms (<= 10 s)", 0),
                ("final_wer", "WER vs reference", 3),
                ("finals_as_previous", "finals as `previous`'s", 0),
            ],
            s,
        ),
        "",
        "## ASR compute per turn (every pass, CPU seconds of the process)",
        "",
        md_table(
            [
                ("method", "method", 0),
                ("cpu_s_turn", "CPU s / turn", 3),
                ("wall_s_turn", "wall s / turn", 3),
                ("cpu_ar", "CPU vs ar", 0),
                ("cpu_spec", "vs specasr", 0),
                ("cpu_chunked", "vs chunked", 0),
            ],
            s,
        ),
        "",
        "Ratios: the median of per-turn ratios (method / baseline) with its 95 % bootstrap interval and "
        "the geometric mean (gm). Latency: from the end of the first silent frame after the speech to "
        "the final transcript, on a virtual clock that plays the audio at real time and advances by "
        "the measured compute (a pass still running when the frame arrives delays the final one).",
    ]
    return "\n".join(lines)


def plot(path: Path, result: dict[str, Any]) -> Path:
    """Left: encoder and decoder milliseconds per streaming pass, stacked, per method. Right:
    the final transcript's latency after the first silent frame, as a share of turns."""
    plt = _pyplot()
    methods = result["methods"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.4))
    s = {r["method"]: r for r in result["summary"]}
    x = np.arange(len(methods))
    enc = [s[m]["partial_enc_ms"] for m in methods]
    dec = [s[m]["partial_dec_ms"] for m in methods]
    a.bar(x, enc, color="#8172b2", label="encoder")
    a.bar(x, dec, bottom=enc, color="#4c72b0", label="decoder")
    a.set_xticks(x, methods, rotation=25, ha="right", fontsize=8)
    a.set_ylabel("ms per streaming pass")
    a.set_title("one streaming pass")
    a.legend(fontsize=8)
    for m in methods:
        lat = sorted(1000 * r["runs"][m]["final_latency_s"] for r in result["rows"])
        b.plot(lat, np.arange(1, len(lat) + 1) / len(lat), label=m)
    b.axvline(150, color="grey", ls="--", lw=1)
    b.text(160, 0.95, "150 ms", color="grey", fontsize=8)
    b.set_xlim(0, 2000)
    b.set_xlabel("final transcript after the first silent frame (ms)")
    b.set_ylabel("share of turns")
    b.set_title("the final pass")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
