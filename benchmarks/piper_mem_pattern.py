"""What onnxruntime's memory patterns cost Piper in memory and give it in speed.

onnxruntime records the memory plan of each input shape a session meets (``enable_mem_pattern``,
on by default) and keeps it. Piper's input is the phonemes of one piece of text, so a server that
speaks its answers meets a new shape at nearly every sentence. This synthesizes N sentences of
3 to 25 words drawn from a fixed vocabulary (with digits) and a fixed seed, after `reserve()`
and 20 sentences of warm-up, and reads malloc's blocks in use and the resident size (after
``malloc_trim``) before and after, and the time per sentence:

- ``pattern``: onnxruntime's default (memory patterns on; what Piper ran with before);
- ``speclive``: the session as speclive builds it (``tts.piper._session``: patterns off).

Each case runs in a fresh process, on one thread, without the voice's random variation, and
hashes the audio it made: equal hashes mean the same samples.

    python benchmarks/piper_mem_pattern.py [--n 400] [--out benchmarks/results/piper-mem-pattern.md]
"""

from __future__ import annotations

import sys

PROBE = """
import ctypes, hashlib, json, random, sys, time
import speclive.tts.piper as piper
from speclive.server.memory import heap_bytes, resident_bytes
case, n = sys.argv[1], int(sys.argv[2])
if case == "pattern":
    def with_patterns(path, threads):  # speclive's session, memory patterns left on
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    piper._session = with_patterns
WORDS = ("the quick brown fox jumps over a lazy dog while seven tired engineers measure memory "
         "in 22 servers at 3.5 GHz and nobody knows why it grows so slowly").split()
rng = random.Random(0)
texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 25))).capitalize() + "."
         for _ in range(n + 20)]
trim = ctypes.CDLL("libc.so.6").malloc_trim
def reading():
    trim(0)
    return {"in_use": heap_bytes()["in_use"], "rss": resident_bytes()}
tts = piper.PiperTTS("piper-joe-medium", threads=1, varied=False)
tts.reserve()
for t in texts[:20]:
    tts.synthesize(t)
start = reading()
digest = hashlib.sha256()
t0 = time.perf_counter()
for t in texts[20:]:
    digest.update(tts.synthesize(t).samples.tobytes())
s = time.perf_counter() - t0
end = reading()
print(json.dumps({"start": start, "end": end, "ms": 1000 * s / n, "sha256": digest.hexdigest()}))
"""

CASES = {
    "pattern": "onnxruntime's default (memory patterns on)",
    "speclive": "the session as speclive builds it (patterns off)",
}


def main() -> int:
    from speclive_bench.report import probe_script_setup, provenance_line, run_probe, write_result_files

    args, prov = probe_script_setup(
        __doc__.splitlines()[0], "piper_mem_pattern", "benchmarks/results/piper-mem-pattern.md", 400
    )
    result: dict = {"provenance": prov, "n": args.n, "cases": {}}
    mib = 2**20
    lines = [
        "# Piper's memory and speed with and without onnxruntime's memory patterns",
        "",
        provenance_line(prov),
        f"- command: `{prov['command']}`",
        f"- piper-joe-medium without random variation, one thread; {args.n} sentences of 3 to 25"
        " words (seeded) after `reserve()` and 20 of warm-up; each case in a fresh process;"
        " readings after `malloc_trim`",
        "",
        "| case | blocks in use | resident | ms per sentence | audio (sha256, first 12) |",
        "|---|---|---|---|---|",
    ]
    for case, what in CASES.items():
        r = run_probe(PROBE, case, str(args.n))
        in_use = r["end"]["in_use"] - r["start"]["in_use"]
        rss = r["end"]["rss"] - r["start"]["rss"]
        result["cases"][case] = {**r, "in_use_bytes": in_use, "rss_bytes": rss}
        lines.append(
            f"| {what} | {in_use / mib:+.1f} MiB | {rss / mib:+.1f} MiB | {r['ms']:.1f}"
            f" | {r['sha256'][:12]} |"
        )
    same = len({c["sha256"] for c in result["cases"].values()}) == 1
    result["same_audio"] = same
    lines += ["", f"Same audio in both cases: {'yes' if same else 'no'}."]
    write_result_files(result, args.out.parent, args.out.stem, lambda _: "\n".join(lines), None)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
