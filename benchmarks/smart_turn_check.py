"""Does ``speclive.live.smartturn.SmartTurn`` give Pipecat's Smart Turn v3.2 probabilities?

Runs Pipecat 1.14's own analyzer (``LocalSmartTurnAnalyzerV3``, in its own virtual environment
under ``$SPECLIVE_HOME/peers/smartturn-check``, made on first use with ``pipecat-ai==1.14.0``)
and ``SmartTurn`` on the same arrays, and reports the largest difference in probability and how
often the two agree on "complete" (probability > 0.5), plus the decision time of both on 8 s of
audio (one thread, median of 20).

Clips: the LibriVox WAVs of pocketsphinx's test data (when installed), sentences spoken by
``espeak-ng`` and ``flite``, each cut mid-word (the loudest 10 ms in 40-70 % of its speech), at
a pause (the quietest 30 ms in 30-80 %) and at its end; a 12 s concatenation (the 8 s window);
and fixed synthetic inputs (silence, tones) whose probabilities ``tests/test_smartturn.py``
stores. Every float clip also goes through Pipecat's whole analyzer path as int16 PCM
(``_process_speech_segment``: int16 -> float32 conversion, 8 s trim), against ``SmartTurn`` on
the same int16 array.

Pipecat's analyzer is built for a pipeline (``append_audio`` stamps frames with the wall clock,
``analyze_end_of_turn`` is async): this calls its model step ``_predict_endpoint`` on float
arrays and its segment step ``_process_speech_segment`` on one-chunk int16 buffers directly.

    python benchmarks/smart_turn_check.py [--out benchmarks/results/smart-turn-check.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PIPECAT = "pipecat-ai==1.14.0"
ESPEAK_TEXTS = (
    "What time does the train leave tomorrow morning?",
    "I would like to book a table for two at",
    "Thanks, that is all I needed for today.",
)
FLITE_TEXTS = (
    "Can you tell me how the weather will be this weekend?",
    "My favourite colour is",
    "Please send the report to Anna before Friday.",
)

# The peer side: Pipecat's analyzer on the arrays of an .npz, probabilities and times to JSON.
PEER_SCRIPT = r"""
import json, sys, time
import numpy as np
import onnxruntime
import pipecat
from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3

clips = np.load(sys.argv[1])
an = LocalSmartTurnAnalyzerV3(cpu_count=1, sample_rate=16000)
an.set_sample_rate(16000)
out = {"pipecat": pipecat.__version__, "onnxruntime": onnxruntime.__version__,
       "float": {}, "int16": {}}
for name in clips.files:
    a = clips[name]
    if a.dtype == np.int16:
        state, metrics = an._process_speech_segment([(time.monotonic(), a)])
        out["int16"][name] = metrics.probability
    else:
        out["float"][name] = an._predict_endpoint(a)["probability"]
eight = clips[sys.argv[3]]
an._predict_endpoint(eight)
ts = []
for _ in range(20):
    t0 = time.perf_counter()
    an._predict_endpoint(eight)
    ts.append(1000 * (time.perf_counter() - t0))
out["decision_ms"] = float(np.median(ts))
out["decision_min_ms"] = float(np.min(ts))
json.dump(out, open(sys.argv[2], "w"))
"""


# ---------------------------------------------------------------------------------------- peer env


def peer_python(home: Path, say=print) -> Path:
    """The peer environment's Python, made (venv + pip install) when it does not exist yet.

    onnxruntime is pinned to this interpreter's version, so a difference in probability comes
    from the preprocessing, not from two onnxruntime builds."""
    import onnxruntime

    venv = home / "peers" / "smartturn-check"
    py = venv / "bin" / "python"
    stamp = venv / ".installed"
    want = f"{PIPECAT} onnxruntime=={onnxruntime.__version__}"
    if stamp.is_file() and stamp.read_text().strip() == want:
        return py
    say(f"making {venv} ({want}) ...")
    if venv.exists():
        shutil.rmtree(venv)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *want.split()],
        check=True,
    )
    stamp.write_text(want + "\n")
    return py


# ------------------------------------------------------------------------------------------- clips


def tts_clip(cmd: list[str], wav: Path) -> np.ndarray:
    from speclive.asr.audio import load_audio

    subprocess.run(cmd, check=True, capture_output=True)
    return load_audio(wav)


def cut_points(a: np.ndarray) -> dict[str, int]:
    """Sample indices to cut a spoken clip at: mid-word, at a pause, at the end."""
    hop = 160  # 10 ms
    n = len(a) // hop
    rms = np.sqrt((a[: n * hop].reshape(n, hop).astype(np.float64) ** 2).mean(axis=1))
    voiced = np.flatnonzero(rms > 0.1 * rms.max())
    first, last = int(voiced[0]), int(voiced[-1])
    span = last - first

    def region(lo: float, hi: float) -> slice:
        return slice(first + int(lo * span), first + int(hi * span) + 1)

    r = region(0.4, 0.7)
    loud = r.start + int(np.argmax(rms[r]))
    r = region(0.3, 0.8)
    smooth = np.convolve(rms, np.ones(3) / 3, mode="same")
    quiet = r.start + int(np.argmin(smooth[r]))
    return {"mid-word": loud * hop + hop // 2, "pause": quiet * hop + hop // 2, "end": len(a)}


def synthetic() -> dict[str, np.ndarray]:
    """Fixed int16 inputs (no randomness) whose probabilities ``tests/test_smartturn.py`` stores:
    silence, tone syllables and a harmonic "voice" with a falling pitch envelope. Made in float64
    and rounded to int16, so every platform gets the same samples."""
    t = np.arange(3 * 16_000) / 16_000
    syll = (
        0.3
        * np.sin(2 * np.pi * (140 + 20 * np.sin(2 * np.pi * 0.5 * t)) * t)
        * np.clip(np.sin(2 * np.pi * 2.5 * t), 0, None) ** 2
    )
    phase = 2 * np.pi * np.cumsum(120 + 30 * np.sin(2 * np.pi * 0.7 * t)) / 16_000
    voice = sum(np.sin(k * phase) / k for k in range(1, 12)) * np.clip(np.sin(2 * np.pi * 2 * t), 0, None)
    voice = 0.25 * voice / np.abs(voice).max()

    def pcm(x: np.ndarray) -> np.ndarray:
        return np.round(x * 32767).astype(np.int16)

    return {
        "synthetic/silence-1s": np.zeros(16_000, np.int16),
        "synthetic/syllables-3s": pcm(syll),
        "synthetic/voice-3s": pcm(voice),
        "synthetic/voice-fading-3s": pcm(voice * np.linspace(1.0, 0.2, len(t))),
    }


def to_pcm(a: np.ndarray) -> np.ndarray:
    """Float samples as int16 PCM (``x * 32768`` rounded; int16 WAVs come back exactly)."""
    return np.clip(np.round(a.astype(np.float64) * 32768), -32768, 32767).astype(np.int16)


def make_clips(tmp: Path, say=print) -> tuple[dict[str, np.ndarray], list[str]]:
    from speclive.asr.audio import load_audio
    from speclive_bench.asr import LIBRIVOX  # pocketsphinx-testdata's LibriVox WAVs

    sources: dict[str, np.ndarray] = {}
    notes: list[str] = []
    wavs = sorted(LIBRIVOX.glob("*.wav")) if LIBRIVOX.is_dir() else []
    if not wavs:
        notes.append("pocketsphinx's LibriVox test WAVs not found: no read-speech clips")
    for w in wavs:
        sources[f"librivox/{w.stem.rsplit('-', 1)[-1]}"] = load_audio(w)
    for tool, texts in (("espeak-ng", ESPEAK_TEXTS), ("flite", FLITE_TEXTS)):
        if shutil.which(tool) is None:
            notes.append(f"{tool} not found: no {tool} clips")
            continue
        for i, text in enumerate(texts):
            wav = tmp / f"{tool}-{i}.wav"
            cmd = (
                ["espeak-ng", "-w", str(wav), text]
                if tool == "espeak-ng"
                else ["flite", "-t", text, "-o", str(wav)]
            )
            sources[f"{tool}/{i}"] = tts_clip(cmd, wav)
    clips: dict[str, np.ndarray] = {}
    for name, a in sources.items():
        for where, at in cut_points(a).items():
            clips[f"{name}@{where}"] = a[:at]
    if len(wavs) >= 3:  # longer than the window: only its last 8 s count
        clips["librivox/0870+0890+0930@end"] = np.concatenate(
            [sources[f"librivox/{k}"] for k in ("0870", "0890", "0930")]
        )
    clips.update({k: v.astype(np.float32) / 32768 for k, v in synthetic().items()})
    say(f"{len(clips)} clips from {len(sources)} recordings + {len(synthetic())} synthetic inputs")
    return clips, notes


# -------------------------------------------------------------------------------------------- main


def main() -> int:
    from speclive.live.smartturn import THRESHOLD, SmartTurn, log_mel, window_audio
    from speclive.models.install import speclive_home
    from speclive_bench.report import provenance, provenance_line

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/smart-turn-check.md"))
    args = ap.parse_args()
    t_start = time.perf_counter()

    py = peer_python(speclive_home())
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        clips, notes = make_clips(tmp)
        pcm = {f"{k}#int16": to_pcm(v) for k, v in clips.items()}
        eight = next(k for k, v in clips.items() if len(v) >= 8 * 16_000)
        np.savez(tmp / "clips.npz", **clips, **pcm)
        subprocess.run(
            [str(py), "-c", PEER_SCRIPT, str(tmp / "clips.npz"), str(tmp / "peer.json"), eight], check=True
        )
        peer = json.loads((tmp / "peer.json").read_text())

    st = SmartTurn(threads=1)
    rows = []
    for name, a in clips.items():
        ours, ours16 = st.predict(a), st.predict(pcm[f"{name}#int16"])
        theirs, theirs16 = peer["float"][name], peer["int16"][f"{name}#int16"]
        rows.append(
            {
                "clip": name,
                "seconds": round(len(a) / 16_000, 3),
                "pipecat": theirs,
                "speclive": ours,
                "pipecat_int16": theirs16,
                "speclive_int16": ours16,
            }
        )
    pairs = [(r["pipecat"], r["speclive"]) for r in rows] + [
        (r["pipecat_int16"], r["speclive_int16"]) for r in rows
    ]
    max_diff = max(abs(a - b) for a, b in pairs)
    agree = sum((a > THRESHOLD) == (b > THRESHOLD) for a, b in pairs)

    # the 1-LSB sensitivity of the model itself (Pipecat's numbers): float clips against their
    # int16 rounding (clips that came from int16 WAVs round-trip exactly and are left out)
    requant = [r for r in rows if not np.array_equal(clips[r["clip"]], pcm[f"{r['clip']}#int16"] / 32768)]
    lsb = {
        "clips": len(requant),
        "max_abs_diff": max((abs(r["pipecat"] - r["pipecat_int16"]) for r in requant), default=0.0),
        "flips": sum((r["pipecat"] > THRESHOLD) != (r["pipecat_int16"] > THRESHOLD) for r in requant),
    }
    # the model's output is quantized: the smallest gap between distinct logits seen
    probs = np.unique([p for pair in pairs for p in pair])
    logits = np.log(probs / (1 - probs))
    lsb["logit_step"] = float(np.diff(logits).min()) if len(logits) > 1 else None

    a8 = clips[eight][-8 * 16_000 :]
    load = os.getloadavg()[0]
    feats8 = st.features(a8)
    st.predict(a8)
    total, feats, model = [], [], []
    for _ in range(20):
        st.predict(a8)
        total.append(st.last_ms)
        t0 = time.perf_counter()
        log_mel(window_audio(a8))
        t1 = time.perf_counter()
        st._session.run(None, {st._input: feats8})
        t2 = time.perf_counter()
        feats.append(1000 * (t1 - t0))
        model.append(1000 * (t2 - t1))
    timing = {
        "speclive": float(np.median(total)),
        "speclive_min": float(np.min(total)),
        "features": float(np.median(feats)),
        "model": float(np.median(model)),
        "pipecat": peer["decision_ms"],
        "pipecat_min": peer["decision_min_ms"],
        "threads": 1,
        "runs": 20,
        "clip": eight,
        "load_avg_1min": round(load, 2),
        "cores": os.cpu_count(),
    }

    prov = provenance(
        "python benchmarks/smart_turn_check.py"
        + ("" if args.out == ap.get_default("out") else f" --out {args.out}")
    )
    result = {
        "provenance": prov,
        "pipecat": peer["pipecat"],
        "onnxruntime": peer["onnxruntime"],
        "threshold": THRESHOLD,
        "pairs": len(pairs),
        "max_abs_diff": max_diff,
        "agree": agree,
        "complete_pipecat": sum(a > THRESHOLD for a, _ in pairs),
        "decision_ms_8s": timing,
        "int16_rounding": lsb,
        "notes": notes,
        "rows": rows,
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    lines = [
        "# Smart Turn v3.2: speclive's SmartTurn against Pipecat's own analyzer",
        "",
        provenance_line(prov),
        f"- command: `{prov['command']}` ({result['wall_s']} s)",
        f"- peer: pipecat-ai {peer['pipecat']} `LocalSmartTurnAnalyzerV3(cpu_count=1)` in its own venv, "
        f"onnxruntime {peer['onnxruntime']} on both sides; its `_predict_endpoint` on the float arrays, "
        "its `_process_speech_segment` on the same clips as int16 PCM (the analyzer is built for a "
        "pipeline's wall-clock-stamped frames, so its steps are called directly)",
        "",
        f"**{len(pairs)} probabilities ({len(rows)} clips, float and int16): max |Δp| = {max_diff:.3g}, "
        f"agreement at p > {THRESHOLD}: {agree}/{len(pairs)}** "
        f"({result['complete_pipecat']} complete by Pipecat).",
        "",
        f"Decision time on 8 s of audio (`{eight}`), one thread, median of 20 (min): speclive "
        f"{timing['speclive']:.1f} ms ({timing['speclive_min']:.1f}) = features {timing['features']:.1f} ms "
        f"+ model {timing['model']:.1f} ms; Pipecat {timing['pipecat']:.1f} ms "
        f"({timing['pipecat_min']:.1f}). "
        f"1-min load average {timing['load_avg_1min']} on {timing['cores']} cores (a shared machine).",
        "",
        f"The model itself is sensitive to the last bit of 16-bit audio: on the {lsb['clips']} clips "
        "that are not int16 already (the TTS clips, resampled to 16 kHz), rounding to int16 moves "
        f"Pipecat's own probability by up to {lsb['max_abs_diff']:.3f} ({lsb['flips']} crossings of "
        f"{THRESHOLD}). Its output is quantized (int8 model): the logits seen sit on a grid "
        f"(smallest gap {lsb['logit_step']:.4f}), so equal preprocessing gives equal numbers.",
        "",
    ]
    lines += [f"- note: {n}" for n in notes] + ([""] if notes else [])
    lines += [
        "| clip | s | Pipecat p | speclive p | Pipecat p (int16) | speclive p (int16) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['clip']} | {r['seconds']:.2f} | {r['pipecat']:.6f} | {r['speclive']:.6f} | "
            f"{r['pipecat_int16']:.6f} | {r['speclive_int16']:.6f} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(lines[:10]))
    return 0 if agree == len(pairs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
