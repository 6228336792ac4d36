"""Microbenchmark: one decoder step of the int8 tiny.en draft, by LM-head vocabulary size.

Sizes the SpecASR lever "a cheaper draft head": the median time of a one-token ``extend``
(after the decoder prompt, over 10 s of noise audio: the cross-attention always spans
Whisper's 1500 frames) with the full head and with the most frequent 16384 / 8192 / 4096 ids,
plus the head's matmul alone. Run under the CPU lock on a quiet machine:

    PYTHONPATH=src python benchmarks/asr_draft_step.py
"""

from __future__ import annotations

import time

import numpy as np


def main() -> None:
    import torch

    from speclive.asr.whisper import load_whisper

    torch.set_num_threads(2)
    audio = (np.random.default_rng(0).standard_normal(16000 * 10) * 0.01).astype(np.float32)
    print("| head vocabulary | step ms (median of 50) | head matmul ms |")
    print("|---|---|---|")
    for vocab in (None, 16384, 8192, 4096):
        d = load_whisper("whisper-tiny.en", vocab_limit=vocab, int8=True)
        d.set_audio(audio)
        st = d.new_state()
        d.extend(st, list(d.specials.prompt))
        steps = []
        for i in range(60):
            t0 = time.perf_counter()
            d.extend(st, [400 + i])
            steps.append(time.perf_counter() - t0)
        x = torch.randn(1, d.d_model)
        heads = []
        for _ in range(50):
            t0 = time.perf_counter()
            d.head(x)
            heads.append(time.perf_counter() - t0)
        name = "full (51864)" if vocab is None else str(vocab)
        print(f"| {name} | {1000 * np.median(steps[10:]):.2f} | {1000 * np.median(heads):.2f} |")


if __name__ == "__main__":
    main()
