"""What new Whisper encoder lengths cost in memory, with torch's oneDNN and without it.

A live server encodes the audio heard so far plus a margin, so nearly every transcription pass
meets an input length the encoder has not seen. torch's CPU operators go through oneDNN, which
builds a kernel for each new shape and keeps it in a cache of 1,024. This encodes N new lengths
(1 s of audio and up, 20 ms apart: one encoder frame each) with ``whisper-tiny.en`` trimmed to
the audio plus 1 s, as the server's Whisper runs, then the first half of them again, and reads
malloc's blocks in use and the resident size (after ``malloc_trim``) around them:

- ``onednn``: torch's default operators (what the encoder ran with before);
- ``speclive``: the encoder as it runs now (``asr.whisper._onednn_off``).

Each case runs in a fresh process, on one thread.

    python benchmarks/encoder_length_memory.py [--n 400] [--out benchmarks/results/encoder-length-memory.md]
"""

from __future__ import annotations

import sys

PROBE = """
import contextlib, ctypes, json, sys, time
import torch
import speclive.asr.whisper as whisper
from speclive.server.memory import heap_bytes, resident_bytes
case, n = sys.argv[1], int(sys.argv[2])
if case == "onednn":
    whisper._onednn_off = lambda torch, device: contextlib.nullcontext()
torch.set_num_threads(1)
trim = ctypes.CDLL("libc.so.6").malloc_trim
w = whisper.load_whisper("whisper-tiny.en", audio_margin_s=1.0)
feats = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(0)) * 0.1
lengths = [16_000 + 320 * i for i in range(n)]
def reading():
    trim(0)
    return {"in_use": heap_bytes()["in_use"], "rss": resident_bytes()}
with torch.inference_mode():
    w._encode(feats, 8_000)
    start = reading()
    t0 = time.perf_counter()
    for x in lengths:
        w._encode(feats, x)
    new_s = time.perf_counter() - t0
    after_new = reading()
    t0 = time.perf_counter()
    for x in lengths[: n // 2]:
        w._encode(feats, x)
    seen_s = time.perf_counter() - t0
    after_seen = reading()
print(json.dumps({"start": start, "after_new": after_new, "after_seen": after_seen,
                  "new_ms": 1000 * new_s / n, "seen_ms": 1000 * seen_s / (n // 2)}))
"""

CASES = {
    "onednn": "torch's default operators (oneDNN)",
    "speclive": "the encoder as speclive runs it (oneDNN off)",
}


def main() -> int:
    from speclive_bench.report import probe_script_setup, provenance_line, run_probe, write_result_files

    args, prov = probe_script_setup(
        __doc__.splitlines()[0], "encoder_length_memory", "benchmarks/results/encoder-length-memory.md", 400
    )
    result: dict = {"provenance": prov, "n": args.n, "cases": {}}
    mib = 2**20
    lines = [
        "# Memory kept by new Whisper encoder lengths",
        "",
        provenance_line(prov),
        f"- command: `{prov['command']}`",
        f"- whisper-tiny.en, audio + 1 s; {args.n} new lengths (1 s of audio and up, one encoder"
        f" frame apart), then the first {args.n // 2} again; one thread, each case in a fresh"
        " process; readings after `malloc_trim`",
        "",
        "| case | blocks in use: new lengths | the same lengths again | resident: new lengths"
        " | ms per encode (new / seen) |",
        "|---|---|---|---|---|",
    ]
    for case, what in CASES.items():
        r = run_probe(PROBE, case, str(args.n))
        new_in_use = r["after_new"]["in_use"] - r["start"]["in_use"]
        seen_in_use = r["after_seen"]["in_use"] - r["after_new"]["in_use"]
        new_rss = r["after_new"]["rss"] - r["start"]["rss"]
        result["cases"][case] = {
            **r,
            "new_in_use_bytes": new_in_use,
            "seen_in_use_bytes": seen_in_use,
            "new_rss_bytes": new_rss,
        }
        lines.append(
            f"| {what} | {new_in_use / mib:+.1f} MiB | {seen_in_use / mib:+.1f} MiB"
            f" | {new_rss / mib:+.1f} MiB | {r['new_ms']:.1f} / {r['seen_ms']:.1f} |"
        )
    write_result_files(result, args.out.parent, args.out.stem, lambda _: "\n".join(lines), None)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
