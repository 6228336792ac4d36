"""The final transcription pass of a live turn when its trimmed window loops: wider windows
first (``TranscribeConfig.loop_retry_margins_s``) against straight to Whisper's full window.

Live pipelines run whisper-base on the turn's audio plus 1 s (``asr_margin_s``), not the 30 s
window. On short turns that window often makes Whisper start its text over instead of ending
it; the loop guard then decodes the turn again. Over the full window that costs the encoder
about 1.1 s on two cores; over the audio plus 5 s, a fraction of it. For every turn of the
spoken turn set (``speclive bench turns``'s 94 turns, 3 voices, noise) the final pass covers
the turn up to its true end + 0.1 s (the pause the VAD waits for), drafted by a partial pass
over the same audio less its last second, as in the live pipeline. Settings run in an order
rotated per turn; the partial pass is not timed.

    python benchmarks/asr_loop_retry.py [--out benchmarks/results/asr-loop-retry.md]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

#: setting -> (margin of the first window, wider margins tried before the full window)
SETTINGS: dict[str, tuple[float, tuple[float, ...]]] = {
    "full window": (1.0, ()),
    "audio + 5 s, then full": (1.0, (5.0,)),
    "audio + 5 s always": (5.0, ()),
}


def _final_pass(tr, margin: float, ladder: tuple[float, ...], audio: np.ndarray) -> dict:
    from speclive.asr.passes import StreamPasses

    tr.target.audio_margin_s, tr.cfg.loop_retry_margins_s = margin, ladder
    passes = StreamPasses(tr)
    if len(audio) > 24_000:
        passes.run(audio[:-16_000])  # the partial pass before the end: the final's draft
    t0 = time.perf_counter()
    res = passes.run(audio, final=True)
    ms = 1000 * (time.perf_counter() - t0)
    return {"ms": ms, "text": res.text, "loops": res.stats.loops, "retries": res.stats.loop_retries}


def run(limit: int) -> dict:
    from tqdm import tqdm

    from speclive.live.build import LiveModelsConfig, load_live_models
    from speclive_bench.turns import read_wav
    from speclive_bench.turnset import load_turnset, turns

    models = load_live_models(LiveModelsConfig(need_llm=False, voice=None))
    tr = models.transcriber
    manifest = load_turnset(log=lambda s: None)
    items = turns(manifest)[: limit or None]
    names = list(SETTINGS)
    rows: list[dict] = []
    for i, t in enumerate(tqdm(items, desc="turns", unit="turn")):
        audio = read_wav(t["path"])[: int((t["speech_end_t"] + 0.1) * 16_000)]
        k = i % len(names)
        row = {"turn": t["id"], "split": t["split"], "voice": t["voice"], "text": t["text"], "results": {}}
        for name in names[k:] + names[:k]:
            row["results"][name] = _final_pass(tr, *SETTINGS[name], audio)
        rows.append(row)
    return {"models": {"asr": tr.target.name, "method": tr.cfg.method}, "rows": rows}


def summarize(rows: list[dict]) -> dict:
    from speclive_bench.report import word_error_rate
    from speclive_bench.stats import paired_ratio

    base = next(iter(SETTINGS))
    looping = [r for r in rows if r["results"][base]["loops"]]
    out = {}
    for name in SETTINGS:
        ms = np.array([r["results"][name]["ms"] for r in rows])
        out[name] = {
            "n": len(rows),
            "p50_ms": float(np.median(ms)),
            "p90_ms": float(np.percentile(ms, 90)),
            "mean_ms": float(ms.mean()),
            "wer": word_error_rate([r["text"] for r in rows], [r["results"][name]["text"] for r in rows]),
            "loops": sum(r["results"][name]["loops"] for r in rows),
            "retries": sum(r["results"][name]["retries"] for r in rows),
            "vs_full": paired_ratio(
                [r["results"][base]["ms"] for r in rows], [r["results"][name]["ms"] for r in rows], p90=True
            ),
            "vs_full_looping": paired_ratio(
                [r["results"][base]["ms"] for r in looping], [r["results"][name]["ms"] for r in looping]
            ),
            "looping_p50_ms": (
                float(np.median([r["results"][name]["ms"] for r in looping])) if looping else None
            ),
            "same_text_as_full": sum(r["results"][name]["text"] == r["results"][base]["text"] for r in rows),
        }
    return {"looping_turns": len(looping), "settings": out}


def markdown(result: dict) -> str:
    from speclive_bench.report import provenance_line

    prov, s = result["provenance"], result["summary"]
    lines = [
        "# The final pass of a live turn whose trimmed window loops: wider windows, then the full one",
        "",
        provenance_line(prov),
        f"- command: `{prov['command']}`",
        f"- model: {result['models']['asr']} ({result['models']['method']}); {len(result['rows'])} turns "
        "(turnset-v1, all splits), each cut at its true end + 0.1 s, drafted by a partial pass "
        "over the audio less its last second; settings rotated per turn",
        f"- turns whose first window (audio + 1 s) loops: {s['looping_turns']} of {len(result['rows'])}",
        "",
        "| setting | final pass p50 / p90 / mean ms | vs full window, per turn: median [95 % CI] / p90 "
        "| on looping turns: p50 ms, median ratio [95 % CI] | WER | texts equal to the full window's "
        "| loops / retries that looped |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in s["settings"].items():
        r, lr = v["vs_full"], v["vs_full_looping"]
        lp = "–" if v["looping_p50_ms"] is None else f"{v['looping_p50_ms']:.0f}"
        lines.append(
            f"| {name} | {v['p50_ms']:.0f} / {v['p90_ms']:.0f} / {v['mean_ms']:.0f} "
            f"| {r['median']:.2f}× [{r['lo']:.2f}, {r['hi']:.2f}] / {r['p90']:.2f}× "
            f"| {lp}, {lr['median']:.2f}× [{lr['lo']:.2f}, {lr['hi']:.2f}] "
            f"| {v['wer']:.3f} | {v['same_text_as_full']} / {v['n']} | {v['loops']} / {v['retries']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    from speclive_bench.report import provenance

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/asr-loop-retry.md"))
    ap.add_argument("--limit", type=int, default=0, help="turns (0: all)")
    args = ap.parse_args()
    prov = provenance(" ".join(["python", "benchmarks/asr_loop_retry.py", *sys.argv[1:]]))
    result = {"provenance": prov, **run(args.limit)}
    result["summary"] = summarize(result["rows"])
    text = markdown(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
