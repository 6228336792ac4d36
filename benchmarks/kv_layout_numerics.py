"""Does a llama.cpp state's output depend on the cells other states hold, and does a chat's next
turn on its parked state (the prompt cache) give what a fresh evaluation gives? With llama.cpp's
flash attention on and off, on one GGUF.

- **layout**: one state's history (a prefill, a chain, a tree and its kept path, a rollback, a
  chain) alone in the KV buffer, then again beside another state's 300 cells: the largest
  logit difference of its last step;
- **next turns**: two-turn chats, the second turn on the first turn's parked state
  (``PromptCache``) against a *replay* (a new state making the same backend calls: 0 means the
  cache's bookkeeping is exact) and against a *fresh* prefill of the whole prompt (the
  reference's way: what differs is the chunks' batch shapes), with argmax agreement and the
  fresh top-2 gap;
- **cost**: medians of a chat prompt's prefill and of 1-, 4- and 8-token passes, the two settings
  interleaved.

    python benchmarks/kv_layout_numerics.py --model qwen2.5-coder-1.5b-instruct --threads 2

writes ``<out>/kv-layout-numerics-<model>.{json,md}``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from speclive.backends.llamacpp import LlamaCppBackend
from speclive.decoder import GenerationConfig, make_decoder
from speclive.loader import load_backend
from speclive.server.prompt_cache import PromptCache
from speclive_bench import datasets
from speclive_bench.exactness import CallRecorder
from speclive_bench.report import (
    command_line,
    load_avg,
    machine_info,
    provenance,
    provenance_line,
    refuse_dirty_results,
    write_json,
)

CHATS = [
    ("What is the capital of France?", "And why?"),
    ("Tell me about cats.", "Say more."),
    ("How do I boil an egg?", "What about dogs?"),
    ("Why is the sky blue?", "Explain it to a child."),
    ("Name three prime numbers.", "And why?"),
    ("What does a compiler do?", "Say more."),
    ("Give me a tip for sleeping well.", "What about dogs?"),
    ("What is rain?", "Explain it to a child."),
]


def backend_like(template: LlamaCppBackend, flash_attn: bool, threads: int) -> LlamaCppBackend:
    return LlamaCppBackend(
        template.gguf_path,
        template.tokenizer,
        n_ctx=2048,
        n_threads=threads,
        max_states=4,
        flash_attn=flash_attn,
    )


def history(be: LlamaCppBackend, prompt: list[int]) -> np.ndarray:
    s = be.new_state()
    be.extend(s, prompt[:-1], last_only=True)
    be.extend(s, prompt[-1:] + prompt[1:4])
    be.extend(s, prompt[4:11], [-1, 0, 1, 0, 3, 4, 0])
    be.keep(s, [0, 3, 4])
    be.truncate(s, len(prompt) + 2)
    row = be.extend(s, prompt[5:9])[-1]
    be.release(s)
    return row


def layout_diff(be: LlamaCppBackend, prompt: list[int]) -> float:
    alone = history(be, prompt)
    other = be.new_state()
    be.extend(other, list(range(100, 400)), last_only=True)
    beside = history(be, prompt)
    be.release(other)
    return float(np.abs(alone - beside).max())


def next_turns(be: LlamaCppBackend) -> list[dict[str, Any]]:
    cache, tok, rows = PromptCache(be, 2), be.tokenizer, []
    for question, follow in CHATS:
        with CallRecorder(be) as rec:
            chat = [{"role": "user", "content": question}]
            dec = make_decoder(be)
            first = dec.run(tok.chat(chat), GenerationConfig(max_tokens=24))
            cache.park(dec.state)
            dec.close(release_state=False)
            chat += [{"role": "assistant", "content": first.text}, {"role": "user", "content": follow}]
            prompt = tok.chat(chat)
            state = cache.take(prompt)
            nxt = make_decoder(be, state=state)
            nxt.run(prompt, GenerationConfig(max_tokens=1))
            nxt.close(release_state=False)
        cached, replayed = rec.last[id(state)], rec.replay(state)
        be.release(state)
        f = be.new_state()
        be.extend(f, prompt[:-1], last_only=True)
        fresh = be.extend(f, prompt[-1:])[-1]
        be.release(f)
        top2 = np.sort(fresh)[-2:]
        rows.append(
            {
                "prompt_tokens": len(prompt),
                "vs_replay": float(np.abs(cached - replayed).max()),
                "vs_fresh": float(np.abs(cached - fresh).max()),
                "same_argmax": int(cached.argmax()) == int(fresh.argmax()),
                "fresh_top2_gap": float(top2[1] - top2[0]),
            }
        )
    return rows


def costs(
    backends: dict[str, LlamaCppBackend], prompt: list[int], rounds: int
) -> dict[str, dict[str, float]]:
    t: dict[str, dict[str, list[float]]] = {
        k: {"prefill": [], "t1": [], "t4": [], "t8": []} for k in backends
    }
    for _ in range(rounds):
        for name, be in backends.items():
            s = be.new_state()
            a = time.perf_counter()
            be.extend(s, prompt, last_only=True)
            t[name]["prefill"].append(time.perf_counter() - a)
            for k in (1, 4, 8):
                for _ in range(3):
                    a = time.perf_counter()
                    be.extend(s, prompt[:k])
                    t[name][f"t{k}"].append(time.perf_counter() - a)
                    be.truncate(s, len(prompt))
            be.release(s)
    return {n: {k: 1e3 * float(np.median(v)) for k, v in d.items()} for n, d in t.items()}


def markdown(res: dict[str, Any]) -> str:
    p = res["provenance"]
    lines = [
        f"# llama.cpp numerics: KV layout and the prompt cache, flash attention on and off ({res['model']})",
        "",
        provenance_line(p, f"; load average before loading {res['load_avg_start']}"),
        f"- command: `{p['command']}`",
        "",
        "| flash attention | layout: max abs diff beside another state | next turn vs replay: max "
        "| next turn vs fresh prefill: median max abs diff | same argmax "
        "| prefill ms | t(1) ms | t(4) ms | t(8) ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in res["settings"].items():
        turns, c = r["next_turns"], r["cost_ms"]
        lines.append(
            f"| {name} | {r['layout_max_abs_diff']:.3g} | {max(x['vs_replay'] for x in turns):.3g} | "
            f"{np.median([x['vs_fresh'] for x in turns]):.3f} | "
            f"{sum(x['same_argmax'] for x in turns)}/{len(turns)} | {c['prefill']:.0f} | {c['t1']:.1f} | "
            f"{c['t4']:.1f} | {c['t8']:.1f} |"
        )
    lines += ["", f"Prefill: a {res['prefill_tokens']}-token chat prompt; t(k): a k-token pass after it."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds of the cost timings")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args(argv)
    refuse_dirty_results(args.out)
    load = load_avg()
    template = load_backend(args.model, "llamacpp", n_ctx=256, threads=1, max_states=1)
    backends = {
        "on": backend_like(template, True, args.threads),
        "off": backend_like(template, False, args.threads),
    }
    tok = template.tokenizer
    prompt = tok.chat([{"role": "user", "content": datasets.mtbench_questions(1)[0]["prompt"]}])
    command = command_line(["python", "benchmarks/kv_layout_numerics.py", *(argv or sys.argv[1:])])
    res: dict[str, Any] = {
        "provenance": provenance(command),
        "model": args.model,
        "load_avg_start": load,
        "machine": machine_info(load),
        "command": command,
        "prefill_tokens": len(prompt),
        "settings": {},
    }
    cost = costs(backends, prompt, args.rounds)
    for name, be in backends.items():
        res["settings"][name] = {
            "layout_max_abs_diff": layout_diff(be, prompt),
            "next_turns": next_turns(be),
            "cost_ms": cost[name],
        }
        print(name, res["settings"][name]["layout_max_abs_diff"], cost[name], flush=True)
    stem = f"kv-layout-numerics-{args.model}"
    write_json(args.out / f"{stem}.json", res)
    (args.out / f"{stem}.md").write_text(markdown(res) + "\n")
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
