"""Would an int8 Whisper encoder cut the final pass? whisper-base's encoder over a trimmed
window (audio + 1 s), float32 against torch's dynamic int8 quantization of its linear layers.

The final transcript of a streaming turn waits for one encoder pass over the whole turn; this
measures what int8 would save and how far its output moves (relative L2 error of the encoder
output) on Piper-spoken MT-Bench sentences.

    python benchmarks/asr_encoder_int8.py [--out benchmarks/results/asr-encoder-int8.md]
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings
from pathlib import Path

import numpy as np


def main() -> int:
    import torch

    from speclive.asr.audio import to_mono_16k
    from speclive.asr.whisper import load_whisper
    from speclive.tts.piper import PiperTTS
    from speclive.tts.sentences import split_sentences
    from speclive_bench.datasets import mtbench_questions
    from speclive_bench.report import provenance, provenance_line

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/asr-encoder-int8.md"))
    ap.add_argument("--clips", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    tts = PiperTTS("piper-joe-medium", varied=False)
    texts = [split_sentences(q["prompt"])[0] for q in mtbench_questions()[: args.clips]]
    clips = []
    for t in texts:
        a = tts.synthesize(t)
        clips.append(to_mono_16k(a.samples, a.sample_rate))
    target = load_whisper("whisper-base", audio_margin_s=1.0)
    fp32 = target.model.model.encoder
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        int8 = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(fp32), {torch.nn.Linear}, dtype=torch.qint8
        )

    def encode(enc, audio: np.ndarray):
        feats = target.feature_extractor(audio, sampling_rate=16_000, return_tensors="pt").input_features
        frames = target.encoder_frames(len(audio))
        F = torch.nn.functional
        x = F.gelu(enc.conv1(feats[..., : 2 * frames]))
        x = F.gelu(enc.conv2(x)).permute(0, 2, 1) + enc.embed_positions.weight[:frames]
        for layer in enc.layers:
            x = layer(x, None)
        return enc.layer_norm(x)[0]

    rows = []
    with torch.inference_mode():
        for audio in clips:
            times = {}
            outs = {}
            for name, enc in (("fp32", fp32), ("int8", int8)):
                encode(enc, audio)
                ts = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    outs[name] = encode(enc, audio)
                    ts.append(time.perf_counter() - t0)
                times[name] = 1000 * float(np.median(ts))
            err = float((outs["fp32"] - outs["int8"]).norm() / outs["fp32"].norm())
            rows.append((len(audio) / 16_000, times["fp32"], times["int8"], err))
    prov = provenance(
        "python benchmarks/asr_encoder_int8.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items())
    )
    lines = [
        "# whisper-base encoder: float32 against dynamic int8 (audio + 1 s window)",
        "",
        provenance_line(prov),
        f"- torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"median of {args.repeats} runs per clip",
        f"- command: `{prov['command']}`",
        "",
        "| audio s | fp32 ms | int8 ms | speed-up | relative L2 error of the output |",
        "|---|---|---|---|---|",
    ]
    for s, a, b, e in rows:
        lines.append(f"| {s:.1f} | {a:.1f} | {b:.1f} | {a / b:.2f}x | {e:.3f} |")
    sp = np.median([a / b for _, a, b, _ in rows])
    er = np.median([e for *_, e in rows])
    lines += ["", f"Median speed-up {sp:.2f}x at a median relative error of {er:.3f}."]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
