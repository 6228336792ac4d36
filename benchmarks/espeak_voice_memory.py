"""What selecting Piper's espeak-ng voice costs in memory, and what the speech path holds now.

Piper selects its espeak-ng voice before every text it phonemizes, and espeak-ng allocates the
voice anew without freeing the previous one. This measures malloc's blocks in use (glibc's
``mallinfo2``, after ``malloc_trim``) around N repeated selections of the same voice, and around
N texts phonemized through ``PiperTTS``, which selects the voice only when it changes
(``speclive.tts.piper``). Each case runs in a fresh process.

    python benchmarks/espeak_voice_memory.py [--n 3000] [--out benchmarks/results/espeak-voice-memory.md]
"""

from __future__ import annotations

import sys

PROBE = """
import ctypes, json, sys
from speclive.server.memory import heap_bytes
from speclive.tts.piper import PiperTTS
case, n = sys.argv[1], int(sys.argv[2])
trim = ctypes.CDLL("libc.so.6").malloc_trim
tts = PiperTTS("piper-joe-medium", threads=1)
voice = tts.voice.config.espeak_voice
tts.voice.phonemize("Warm up.")
select = __import__("piper.espeakbridge", fromlist=["x"]).set_voice
while hasattr(select, "selects"):  # espeak-ng's own selection, under speclive's wrapper
    select = select.selects
trim(0)
before = heap_bytes()["in_use"]
for i in range(n):
    if case == "select":
        select(voice)
    else:
        tts.voice.phonemize("What is the capital of France?")
trim(0)
print(json.dumps({"before": before, "after": heap_bytes()["in_use"]}))
"""

CASES = {
    "select": "the same voice selected again (espeak-ng's own call, as Piper makes it per text)",
    "phonemize": "texts phonemized through PiperTTS (voice selected only when it changes)",
}


def main() -> int:
    from speclive_bench.report import probe_script_setup, provenance_line, run_probe, write_result_files

    args, prov = probe_script_setup(
        __doc__.splitlines()[0], "espeak_voice_memory", "benchmarks/results/espeak-voice-memory.md", 3000
    )
    result: dict = {"provenance": prov, "n": args.n, "cases": {}}
    lines = [
        "# Memory held by espeak-ng voice selections",
        "",
        provenance_line(prov),
        f"- command: `{prov['command']}`",
        f"- {args.n} calls per case, each in a fresh process; malloc's blocks in use after `malloc_trim`",
        "",
        "| case | blocks in use, growth | per call |",
        "|---|---|---|",
    ]
    for case, what in CASES.items():
        r = run_probe(PROBE, case, str(args.n))
        grew = r["after"] - r["before"]
        result["cases"][case] = {**r, "growth_bytes": grew, "bytes_per_call": grew / args.n}
        lines.append(f"| {what} | {grew / 2**20:+.2f} MiB | {grew / args.n:+.0f} B |")
    write_result_files(result, args.out.parent, args.out.stem, lambda _: "\n".join(lines), None)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
