"""What other states' KV cells cost one state's passes on llama.cpp, and what offloading parked
states gives back.

speclive's llama.cpp backend keeps every state in one unified KV buffer. llama.cpp sizes each
decode's attention by the highest used cell (``n_kv``), and its CPU flash-attention kernel reads
the mask of every cell below it for every query row and head, so cells that other states hold
cost every pass something, even though no token attends to them. This measures one state's
passes (a 300-token prompt, then one-token steps and 8-, 64- and 256-token chunks) on three
backends of the same GGUF, interleaved pass by pass so that the machine's drift falls on all
three alike:

- ``alone``: the backend holds nothing else;
- ``beside``: 7 other states of 800 tokens each are in the cache (parked, as the prompt cache
  left them before ``offload_parked``);
- ``offloaded``: the same 7 states parked with ``offload_parked``: their cells are in host memory.

Each ratio is the median of the per-pass ratios to ``alone``, with a 95 % bootstrap interval.

    python benchmarks/kv_occupancy.py [--n 24] [--out benchmarks/results/kv-occupancy-qwen1.5b.md]
"""

from __future__ import annotations

import sys
import time

MODEL = "qwen2.5-coder-1.5b-instruct"
THREADS = 2
OTHERS, OTHER_LEN, PROMPT = 7, 800, 300
CASES = ("alone", "beside", "offloaded")
#: passes measured per size: one-token steps get ``--n``, chunks fewer (they take seconds)
CHUNKS = {8: 8, 64: 6, 256: 4}


def main() -> int:
    import numpy as np

    from speclive.backends.llamacpp import LlamaCppBackend
    from speclive.loader import tokenizer_for
    from speclive.models.resolve import resolve
    from speclive_bench.report import probe_script_setup, provenance_line, write_result_files
    from speclive_bench.stats import paired_ratio

    args, prov = probe_script_setup(
        __doc__.splitlines()[0], "kv_occupancy", "benchmarks/results/kv-occupancy-qwen1.5b.md", 24
    )
    ref = resolve(MODEL)
    tok = tokenizer_for(ref)
    rng = np.random.default_rng(0)

    def toks(n: int) -> list[int]:
        return [int(x) for x in rng.integers(1000, 30000, n)]

    cells = PROMPT + 1024 + OTHERS * OTHER_LEN + 512
    backends, states, keep = {}, {}, []
    for case in CASES:
        be = LlamaCppBackend(
            ref.gguf, tok, n_ctx=4096, n_threads=THREADS, max_states=OTHERS + 1, n_cells=cells
        )
        be.offload_parked = case == "offloaded"
        if case != "alone":
            for _ in range(OTHERS):
                o = be.new_state()
                be.extend(o, toks(OTHER_LEN), last_only=True)
                be.park(o)
                keep.append(o)
        backends[case] = be
    prompt = toks(PROMPT)
    for case, be in backends.items():
        states[case] = be.new_state()
        be.extend(states[case], prompt, last_only=True)

    def timed(n_tokens: int, rounds: int) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {c: [] for c in CASES}
        for i in range(rounds):
            batch = toks(n_tokens)
            order = CASES[i % 3 :] + CASES[: i % 3]  # rotated: no case always goes first
            for case in order:
                be, st = backends[case], states[case]
                t0 = time.perf_counter()
                be.extend(st, batch, last_only=n_tokens > 1)
                times[case].append(time.perf_counter() - t0)
        return times

    timed(1, 2)  # warm-up
    sizes = {1: args.n, **CHUNKS}
    result: dict = {
        "provenance": prov,
        "model": MODEL,
        "gguf": ref.gguf.name,
        "threads": THREADS,
        "others": OTHERS,
        "other_len": OTHER_LEN,
        "prompt": PROMPT,
        "n_cells": backends["alone"].n_cells,
        "offloads": backends["offloaded"].offloads,
        "sizes": {},
    }
    lines = [
        "# One state's passes beside other states' KV cells (llama.cpp, unified KV buffer)",
        "",
        provenance_line(prov),
        f"- command: `{prov['command']}`",
        f"- {MODEL} (`{ref.gguf.name}`), {THREADS} threads, flash attention; one state with a {PROMPT}-token"
        f" prompt; `beside`: {OTHERS} other states of {OTHER_LEN} tokens in the cache; `offloaded`:"
        " the same states parked with `offload_parked`; the three backends interleaved pass by pass",
        "",
        "| pass | alone ms | beside ms | offloaded ms | beside / alone [95 % CI]"
        " | offloaded / alone [95 % CI] |",
        "|---|---|---|---|---|---|",
    ]
    for n_tokens, rounds in sizes.items():
        t = timed(n_tokens, rounds)
        med = {c: float(np.median(t[c])) * 1e3 for c in CASES}
        row: dict = {"rounds": rounds, "ms": t, "median_ms": med}
        cells_txt = []
        for case in ("beside", "offloaded"):
            r = paired_ratio(t["alone"], t[case])
            row[f"{case}_over_alone"] = r
            cells_txt.append(f"{r['median']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]")
        result["sizes"][str(n_tokens)] = row
        name = "1-token step" if n_tokens == 1 else f"{n_tokens}-token chunk"
        lines.append(
            f"| {name} ({rounds}×) | {med['alone']:.1f} | {med['beside']:.1f} | {med['offloaded']:.1f}"
            f" | {cells_txt[0]} | {cells_txt[1]} |"
        )
        print(lines[-1], flush=True)
    write_result_files(result, args.out.parent, args.out.stem, lambda _: "\n".join(lines), None)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
