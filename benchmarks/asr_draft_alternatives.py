"""Microbenchmark: what one tiny.en draft token costs, by how the draft is run.

Sizes the SpecASR levers "encode only the audio" and "let CTranslate2 draft" on a real
LibriVox clip (the first of Debian's pocketsphinx-testdata), 2 torch threads:

- speclive's int8 decoder (``load_whisper(..., int8=True)``), one-token ``extend`` after the
  prompt and ten transcript tokens, cross-attention over Whisper's full 1500 frames and over
  the audio + 1 s only (``audio_margin_s=1.0``); plus the encoder of each;
- CTranslate2's int8 tiny.en (faster-whisper's runtime) given the same trimmed encoder output:
  ``generate`` keeps no decoder cache between calls, so a draft call pays the prompt and the
  cross-attention keys again; the table gives one call for 1 and for 9 new tokens (greedy, no
  early stop) and the cost per further token.

Run under the CPU lock on a quiet machine and paste the output into
``benchmarks/results/asr-draft-alternatives.md``:

    flock /tmp/speclive-cpu.lock env PYTHONPATH=src python benchmarks/asr_draft_alternatives.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np


def _median_ms(fn: Callable[[], object], n: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    import ctranslate2
    import torch

    from speclive.asr.whisper import load_whisper
    from speclive.models.install import model_dir
    from speclive_bench.asr import librivox_clips

    torch.set_num_threads(2)
    clip = librivox_clips()[0]
    print(f"clip {clip.name}, {clip.seconds:.1f} s; torch threads 2")
    print()
    print("| draft | frames | encoder ms | one-token step ms (median of 60) |")
    print("|---|---|---|---|")
    trimmed_out = None
    context: list[int] = []
    for margin in (None, 1.0):
        d = load_whisper("whisper-tiny.en", int8=True, audio_margin_s=margin)
        enc_ms = _median_ms(lambda d=d: d.set_audio(clip.audio), 5, warmup=1)
        st = d.new_state()
        if not context:
            context = list(d.specials.prompt) + d.tokenizer.encode(" " + clip.reference)[:10]
        d.extend(st, context)

        def step(d=d, st=st, ctx=context) -> None:
            d.extend(st, [ctx[-1]])
            d.truncate(st, len(ctx))

        frames = d.context.cross_k[0].shape[-1]
        label = "speclive int8, full window" if margin is None else f"speclive int8, audio + {margin:g} s"
        print(f"| {label} | {frames} | {enc_ms:.0f} | {_median_ms(step, 60):.2f} |")
        if margin is not None:
            trimmed_out = d.context.encoder_out.contiguous().numpy()[None]
    assert trimmed_out is not None
    ct2 = ctranslate2.models.Whisper(
        str(model_dir("whisper-tiny.en")), device="cpu", compute_type="int8", intra_threads=2
    )
    feats = ctranslate2.StorageView.from_array(np.ascontiguousarray(trimmed_out))

    def call(new: int) -> Callable[[], object]:
        return lambda: ct2.generate(
            feats,
            [context],
            beam_size=1,
            max_length=len(context) + new,
            return_logits_vocab=True,
            suppress_blank=False,
            suppress_tokens=[],
        )

    one, nine = _median_ms(call(1), 15), _median_ms(call(9), 15)
    got = len(call(9)()[0].sequences_ids[0])  # type: ignore[index]
    print()
    print("| CTranslate2 int8 tiny.en, audio + 1 s, cacheless `generate` | ms |")
    print("|---|---|")
    print(f"| one call, 1 new token (prompt of {len(context)} tokens) | {one:.2f} |")
    print(f"| one call, 9 new tokens (it returned {got}) | {nine:.2f} |")
    print(f"| per further token | {(nine - one) / max(1, got - 1):.2f} |")


if __name__ == "__main__":
    main()
