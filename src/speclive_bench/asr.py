"""``speclive bench asr``: Whisper AR vs plain SD vs SpecASR (ablation) on real and synthetic speech.

Clips: the five LibriVox clips of Debian's ``pocketsphinx-testdata`` (reference transcripts in
its ``transcription`` file) plus Piper-synthesized first sentences of MT-Bench questions (the
sentence is the reference). Every method decodes every clip; token ids are compared with the
AR run of the same backend on every clip (``identical``), WER (``report.word_error_rate``) is computed on
lower-cased, punctuation-free text. The clips run clip-major, each clip through every method in
a rotated order, so a slow spell of the shared machine hits all methods alike. Times are per
10 s of audio (the paper's Table II): draft ms (draft passes), target ms (verification and
prompt passes), total decoder ms; the target's encoder (the same for all methods) and a
separate draft model's own encoder are reported apart and in the end-to-end column.

The verification cost curve t(k)/t(1) of the target decoder is measured on this machine; the
*bound* of a variant is the speedup it would reach if drafting were free (AR ms / its target
ms), ``of bound`` how much of it the variant achieves.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speclive.asr.audio import load_audio, to_mono_16k
from speclive.asr.transcribe import TranscribeConfig, Transcriber
from speclive.asr.whisper import load_whisper
from speclive.drafting.specasr import SpecASRConfig
from speclive.tts.piper import PiperTTS
from speclive.tts.sentences import split_sentences
from speclive_bench.costcurve import CURVE_COLUMNS
from speclive_bench.datasets import mtbench_questions
from speclive_bench.harness import rotated
from speclive_bench.report import _pyplot, markdown_preamble, md_table, word_error_rate

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")


@dataclass
class Clip:
    name: str
    source: str
    audio: np.ndarray
    reference: str

    @property
    def seconds(self) -> float:
        return len(self.audio) / 16_000


@dataclass
class Variant:
    label: str
    method: str
    draft: str = ""
    sd_len: int = 8
    specasr: dict[str, Any] = field(default_factory=dict)
    #: a separate draft encodes only the audio plus this margin (s); None: the full 30 s window
    draft_margin_s: float | None = None


def default_variants(
    draft: str, self_draft: str | None, draft_margin_s: float | None = 1.0, faster_whisper: bool = True
) -> list[Variant]:
    """The ablation ladder (paper Table II) for one draft, plus a shorter one for the self-draft.

    With ``draft_margin_s`` two rows are added: the draft encoding only the audio plus that
    margin, for plain SD (so "best SD" has it too) and for SpecASR with every technique.
    ``faster_whisper``: the CTranslate2 CPU peer row (it runs on the CPU only).
    """
    every = dict(recycle=True, cost_stop=True, sparse_tree=True)
    out = [Variant("faster-whisper AR", "faster-whisper")] if faster_whisper else []
    out += [
        Variant("AR", "ar"),
        Variant("SD (8,1)", "sd", draft, 8),
        Variant("SD (16,1)", "sd", draft, 16),
        Variant("+ adaptive single seq.", "specasr", draft, specasr=dict()),
        Variant("+ recycling", "specasr", draft, specasr=dict(recycle=True)),
        Variant("+ cost-aware stop", "specasr", draft, specasr=dict(recycle=True, cost_stop=True)),
        Variant(
            "+ sparse tree (no tree verify)",
            "specasr",
            draft,
            specasr=dict(recycle=True, cost_stop=True, sparse_tree=True, tree_verify=False),
        ),
        Variant("+ sparse tree + tree verify", "specasr", draft, specasr=every),
    ]
    if draft_margin_s is not None and not draft.startswith("self"):
        out += [
            Variant(
                f"SD (8,1), draft audio +{draft_margin_s:g} s", "sd", draft, 8, draft_margin_s=draft_margin_s
            ),
            Variant(
                f"+ draft audio +{draft_margin_s:g} s",
                "specasr",
                draft,
                specasr=every,
                draft_margin_s=draft_margin_s,
            ),
        ]
    if self_draft:
        out += [
            Variant(f"SD (8,1) {self_draft}", "sd", self_draft, 8),
            Variant(
                f"SpecASR {self_draft}",
                "specasr",
                self_draft,
                specasr=every,
            ),
        ]
    return out


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split())


def save_clips(clips: list[Clip], folder: Path) -> None:
    """Write clips as 16 kHz WAVs plus ``clips.json`` (name, source, reference), so a machine
    without Piper or Debian's test data (a lent GPU) runs the same audio (``clips_from``)."""
    import wave

    folder.mkdir(parents=True, exist_ok=True)
    meta = []
    for c in clips:
        with wave.open(str(folder / f"{c.name}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16_000)
            w.writeframes((np.clip(c.audio, -1, 1) * 32767).astype("<i2").tobytes())
        meta.append({"name": c.name, "source": c.source, "reference": c.reference})
    (folder / "clips.json").write_text(json.dumps(meta, indent=1) + "\n")


def clips_from(folder: Path) -> list[Clip]:
    """The clips ``save_clips`` wrote, in their order (read with the standard library alone)."""
    import wave

    out = []
    for m in json.loads((folder / "clips.json").read_text()):
        with wave.open(str(folder / f"{m['name']}.wav"), "rb") as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        out.append(Clip(m["name"], m["source"], pcm.astype(np.float32) / 32767.0, m["reference"]))
    return out


def librivox_clips() -> list[Clip]:
    if not LIBRIVOX.is_dir():
        return []
    refs: dict[str, str] = {}
    for line in (LIBRIVOX / "transcription").read_text().splitlines():
        m = re.match(r"<s>(.*)</s>\s*\((.*)\)", line.strip())
        if m:
            refs[m.group(2)] = m.group(1).strip()
    return [
        Clip(p.stem, "librivox", load_audio(p), refs.get(p.stem, "")) for p in sorted(LIBRIVOX.glob("*.wav"))
    ]


def piper_clips(n: int) -> list[Clip]:
    tts = PiperTTS("piper-joe-medium")
    out = []
    for q in mtbench_questions()[:n]:
        sent = split_sentences(q["prompt"])[0]
        a = tts.synthesize(sent)
        out.append(Clip(f"mtbench-{q['id']}", "piper", to_mono_16k(a.samples, a.sample_rate), sent))
    return out


def cost_curve(target: Any, audio: np.ndarray, ks: list[int], repeats: int = 5) -> list[dict[str, float]]:
    """t(k) of one decoder extend of k tokens after the prompt (median of ``repeats``)."""
    target.set_audio(audio)
    st = target.new_state()
    prompt = target.specials.prompt
    target.extend(st, prompt)
    rows = []
    for k in ks:
        ts = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            target.extend(st, [target.specials.eos - 1000] * k)
            ts.append(time.perf_counter() - t0)
            target.truncate(st, len(prompt))
        rows.append({"k": k, "ms": 1000 * float(np.median(ts[1:]))})
    t1 = rows[0]["ms"]
    for r in rows:
        r["ratio"] = r["ms"] / t1
        r["per_token_ms"] = r["ms"] / r["k"]
    return rows


def run_asr_bench(
    model: str = "whisper-base",
    draft: str = "whisper-tiny.en",
    self_draft: str | None = "self:2",
    n_piper: int = 5,
    draft_margin_s: float | None = 1.0,
    curve_ks: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64),
    log: Callable[[str], None] = print,
    device: str = "cpu",
    clips: list[Clip] | None = None,
) -> dict[str, Any]:
    """Every variant on every clip (module docstring). ``clips``: given audio instead of the
    LibriVox and Piper clips; ``device``: the torch device of the Whisper models (the
    faster-whisper peer, a CPU build, runs only with ``device="cpu"``)."""

    clips = clips if clips is not None else librivox_clips() + piper_clips(n_piper)
    if not clips:
        raise RuntimeError("no clips: install pocketsphinx-testdata or allow Piper clips")
    audio_s = sum(c.seconds for c in clips)
    log(f"{len(clips)} clips, {audio_s:.1f} s of audio")
    target = load_whisper(model, device=device)
    variants = default_variants(draft, self_draft, draft_margin_s, faster_whisper=device == "cpu")
    runners = _transcribers(variants, model, target, device, clips[0].audio)
    results, target_enc_ms = _transcribe_all(variants, runners, target, clips, log)
    for tr in runners:
        tr.close()
    ar_index = next(i for i, v in enumerate(variants) if v.method == "ar")
    ar_ids = {c.name: results[ar_index][ci].token_ids for ci, c in enumerate(clips)}
    rows: list[dict[str, Any]] = []
    for vi, v in enumerate(variants):
        row = _variant_row(v, clips, results[vi], target_enc_ms[vi], ar_ids, audio_s)
        rows.append(row)
        log(
            f"{v.label:34s} total {row['total_ms_10s']:7.0f} ms/10s  draft {row['draft_ms_10s']:6.0f}  "
            f"tau {row['tau'] or 0:.2f}  WER {row['wer']:.3f}  identical {row['identical']}"
        )
    _add_speedups(rows, draft)
    curve = cost_curve(target, clips[0].audio, list(curve_ks))
    # a perfect draft of k-1 tokens commits k tokens per pass of cost t(k)/t(1) (paper max: 24 + 1)
    ideal = max(c["k"] / c["ratio"] for c in curve if c["k"] <= 25)
    return {
        "clips": [
            {"name": c.name, "source": c.source, "seconds": c.seconds, "reference": c.reference}
            for c in clips
        ],
        "audio_s": audio_s,
        "rows": rows,
        "curve": curve,
        "ideal_bound": ideal,
        "model": model,
        "draft": draft,
        "self_draft": self_draft,
    }


def _transcribers(
    variants: Sequence[Variant], model: str, target: Any, device: str, warm_audio: np.ndarray
) -> list[Transcriber]:
    """One transcriber per variant (draft models loaded once each), each warmed up on
    ``warm_audio`` (which also loads faster-whisper)."""
    drafts: dict[tuple[str, float | None], Any] = {}
    runners = []
    for v in variants:
        spec = SpecASRConfig(**v.specasr)
        cfg = TranscribeConfig(
            model=model,
            method=v.method,
            draft=v.draft or "self",
            sd_len=v.sd_len,
            specasr=spec,
            draft_audio_margin_s=v.draft_margin_s,
        )
        dback = None
        if v.draft and not v.draft.startswith("self"):
            key = (v.draft, v.draft_margin_s)
            if key not in drafts:
                drafts[key] = load_whisper(
                    v.draft,
                    vocab_limit=cfg.draft_vocab,
                    int8=cfg.draft_int8 and device == "cpu",
                    audio_margin_s=v.draft_margin_s,
                    device=device,
                )
            dback = drafts[key]
        tr = Transcriber(cfg, target=None if v.method == "faster-whisper" else target, draft_backend=dback)
        tr.transcribe(warm_audio)
        runners.append(tr)
    return runners


def _transcribe_all(
    variants: Sequence[Variant],
    runners: Sequence[Transcriber],
    target: Any,
    clips: Sequence[Clip],
    log: Callable[[str], None],
) -> tuple[list[list[Any]], list[list[float]]]:
    """Every clip with every variant: (results, the target's encoder ms) per variant and clip.

    Clip-major order, each clip's variants in a rotated order: a slow spell of this shared
    machine then lands on every method alike instead of on whichever row ran during it."""
    results: list[list[Any]] = [[None] * len(clips) for _ in variants]
    target_enc_ms = [[0.0] * len(clips) for _ in variants]
    for ci, c in enumerate(clips):
        for vi in rotated(range(len(variants)), ci):
            results[vi][ci] = runners[vi].transcribe(c.audio)
            if variants[vi].method != "faster-whisper":
                target_enc_ms[vi][ci] = target.context.encode_s * 1000
        log(f"clip {ci + 1}/{len(clips)} ({c.name}) done")
    return results, target_enc_ms


def _variant_row(
    v: Variant,
    clips: Sequence[Clip],
    results: Sequence[Any],
    target_enc_ms: Sequence[float],
    ar_ids: Mapping[str, Any],
    audio_s: float,
) -> dict[str, Any]:
    """One variant's row: tokens, forwards, milliseconds per 10 s of audio, WER, identity."""
    tot = {"decode_ms": 0.0, "draft_ms": 0.0, "verify_ms": 0.0, "encode_ms": 0.0, "draft_encode_ms": 0.0}
    tf = df = toks = 0
    identical = True
    hyps, refs, per_clip = [], [], []
    for ci, c in enumerate(clips):
        r = results[ci]
        s = r.stats
        tot["decode_ms"] += s.decode_ms
        tot["draft_ms"] += s.draft_ms
        tot["verify_ms"] += s.verify_ms
        enc_t = target_enc_ms[ci]
        tot["encode_ms"] += enc_t
        tot["draft_encode_ms"] += max(0.0, s.encode_ms - enc_t)
        tf += s.target_forwards
        df += s.draft_forwards
        toks += s.new_tokens
        ids = r.token_ids
        same = ar_ids.get(c.name) == ids if v.method not in ("ar", "faster-whisper") else None
        if same is False:
            identical = False
        hyps.append(_norm(r.text))
        refs.append(_norm(c.reference))
        per_clip.append({"clip": c.name, "text": r.text, "tokens": s.new_tokens, "identical": same})
    per10 = 10.0 / audio_s
    return {
        "label": v.label,
        "method": v.method,
        "draft": v.draft or "-",
        "sd_len": v.sd_len if v.method == "sd" else None,
        "specasr": v.specasr if v.method == "specasr" else None,
        "tokens": toks,
        "target_forwards": tf,
        "draft_forwards": df,
        "tau": toks / tf if tf else None,
        "draft_ms_10s": tot["draft_ms"] * per10 if v.method not in ("ar", "faster-whisper") else 0.0,
        "target_ms_10s": tot["verify_ms"] * per10 if v.method != "faster-whisper" else None,
        "total_ms_10s": tot["decode_ms"] * per10,
        "encoder_ms_10s": tot["encode_ms"] * per10,
        "draft_encoder_ms_10s": tot["draft_encode_ms"] * per10,
        "e2e_ms_10s": (tot["decode_ms"] + tot["encode_ms"] + tot["draft_encode_ms"]) * per10,
        "wer": word_error_rate(refs, hyps),
        "identical": identical if v.method not in ("ar", "faster-whisper") else None,
        "clips": per_clip,
    }


def _add_speedups(rows: Sequence[dict[str, Any]], draft: str) -> None:
    """Speedups over ``ar`` (decode and end to end), SpecASR's over the best plain SD with
    ``draft``, and the bound a free draft would give."""
    ar = next(r for r in rows if r["method"] == "ar")
    plain = {r["label"]: r for r in rows if r["method"] == "sd" and r["draft"] == draft}
    best_sd = min((r["total_ms_10s"] for r in plain.values()), default=None)
    for r in rows:
        r["speedup_vs_ar"] = ar["total_ms_10s"] / r["total_ms_10s"] if r["total_ms_10s"] else None
        r["e2e_speedup_vs_ar"] = ar["e2e_ms_10s"] / r["e2e_ms_10s"] if r["e2e_ms_10s"] else None
        r["speedup_vs_best_sd"] = (
            best_sd / r["total_ms_10s"] if best_sd and r["method"] == "specasr" else None
        )
        bound = ar["total_ms_10s"] / r["target_ms_10s"] if r.get("target_ms_10s") else None
        r["bound"] = bound if r["method"] not in ("ar", "faster-whisper") else None
        r["of_bound"] = r["speedup_vs_ar"] / bound if r["bound"] else None


COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("label", "method", 0),
    ("draft", "draft", 0),
    ("draft_ms_10s", "draft ms", 0),
    ("target_ms_10s", "target ms", 0),
    ("total_ms_10s", "total ms", 0),
    ("speedup_vs_ar", "decode speedup vs AR", 2),
    ("speedup_vs_best_sd", "vs best SD", 2),
    ("tau", "τ", 2),
    ("target_forwards", "target passes", 0),
    ("draft_forwards", "draft passes", 0),
    ("bound", "free-draft bound", 2),
    ("of_bound", "of bound", 2),
    ("draft_encoder_ms_10s", "draft encoder ms", 0),
    ("e2e_ms_10s", "e2e ms (+encoders)", 0),
    ("e2e_speedup_vs_ar", "e2e speedup", 2),
    ("wer", "WER", 3),
    ("identical", "identical to AR", 0),
)


def markdown(result: dict[str, Any]) -> str:
    lines = markdown_preamble("ASR: Whisper AR vs SD vs SpecASR (per 10 s of audio)", result["header"])
    lines += [
        f"{len(result['clips'])} clips, {result['audio_s']:.1f} s of audio. Times are decoder ms per 10 s of "
        "audio (target encoder apart: "
        f"{result['rows'][1]['encoder_ms_10s']:.0f} ms per 10 s, the same for every method on this backend). "
        "A separate draft model (tiny.en) also runs its own encoder: see the draft-encoder and e2e columns. "
        "faster-whisper's total includes its own encoder.",
        "",
        md_table(COLUMNS, result["rows"]),
        "",
        "## Verification cost curve of the target decoder",
        "",
        md_table(CURVE_COLUMNS, result["curve"]),
        "",
        f"Best speedup a perfect free draft could give at these costs: {result['ideal_bound']:.2f}x "
        "(max over k <= 25 of k / (t(k)/t(1))).",
    ]
    return "\n".join(lines)


def plot(path: Path, result: dict[str, Any]) -> Path:
    plt = _pyplot()
    rows = [r for r in result["rows"]]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [2.2, 1]})
    ys = range(len(rows))
    d = [r["draft_ms_10s"] or 0.0 for r in rows]
    t = [r["target_ms_10s"] or 0.0 for r in rows]
    other = [max(0.0, r["total_ms_10s"] - a - b) for r, a, b in zip(rows, d, t, strict=True)]
    a1.barh(ys, t, label="target (verify + prompt)")
    a1.barh(ys, d, left=t, label="draft passes")
    a1.barh(
        ys,
        other,
        left=[x + y for x, y in zip(t, d, strict=True)],
        label="other (Python, bridge) / faster-whisper total",
    )
    a1.set_yticks(list(ys), [r["label"] + (f"  [{r['draft']}]" if r["draft"] != "-" else "") for r in rows])
    a1.invert_yaxis()
    a1.set_xlabel("decoder ms per 10 s of audio")
    a1.legend(fontsize=8)
    a1.grid(True, axis="x", alpha=0.3)
    ks = [c["k"] for c in result["curve"]]
    a2.plot(ks, [c["ratio"] for c in result["curve"]], "o-", label="measured t(k)/t(1)")
    a2.plot(ks, ks, "--", color="grey", label="linear")
    a2.set_xscale("log", base=2)
    a2.set_yscale("log", base=2)
    a2.set_xlabel("k tokens in one decoder pass")
    a2.legend(fontsize=8)
    a2.grid(True, alpha=0.3)
    fig.suptitle(f"{result['model']} on CPU: AR vs SD vs SpecASR")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
