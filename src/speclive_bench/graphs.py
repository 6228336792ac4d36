"""``speclive bench graphs``: the transformers step eager vs on a static cache with CUDA graphs.

Both backends share one copy of the weights on the device: the eager ``HFBackend``
(transformers' forward, ``DynamicCache``) and ``StaticHFBackend`` (``hf_static``). Measured side
by side in one run, interleaved:

- the cost curve t(k) of one pass of k tokens after a 256-token prefix (median of ``repeats``;
  each repeat times every k on both backends in turn);
- greedy decoding of chat and code prompts: AR and n-gram speculation on each backend, each
  prompt through every method in a rotated order; wall time per token and whether each output
  is the eager AR output token for token (a divergence is reported with AR's top-2 logit gap
  there).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclive.backends.hf import HFBackend
from speclive.backends.hf_static import StaticHFBackend
from speclive.common_options import device_option, max_tokens_option, model_option
from speclive.decoder import GenerationConfig, SpeculativeDecoder
from speclive.drafting.ngram import NgramDrafter
from speclive.loader import load_backend
from speclive.options import option
from speclive_bench.costcurve import curve_tokens
from speclive_bench.datasets import chat_messages
from speclive_bench.harness import rotated
from speclive_bench.prompts import load_prompts
from speclive_bench.reference import greedy_reference
from speclive_bench.report import _pyplot, markdown_preamble, md_table, out_option, plot_option

METHODS = ("eager AR", "graphs AR", "eager ngram", "graphs ngram")


def backends_pair(model: str, device: str) -> tuple[Any, Any]:
    """(eager, static) backends on one copy of ``model``'s weights on ``device``."""

    base = load_backend(model, "hf", device=device)
    static = (
        base
        if isinstance(base, StaticHFBackend)
        else StaticHFBackend(base.model, base.tokenizer, name=base.name, n_ctx=4096)
    )
    eager = HFBackend(base.model, base.tokenizer, name=base.name, n_ctx=static.n_ctx)
    return eager, static


def _curve(pair: dict[str, Any], ks: list[int], repeats: int, prefix: int = 256) -> list[dict[str, Any]]:
    first = next(iter(pair.values()))
    tokens = curve_tokens(first, prefix + max(ks))
    states = {name: b.new_state() for name, b in pair.items()}
    for name, b in pair.items():
        b.extend(states[name], tokens[:prefix], last_only=True)
    samples: dict[tuple[str, int], list[float]] = {(n, k): [] for n in pair for k in ks}
    for r in range(repeats + 1):  # the first round warms up (and captures the graphs)
        for k in ks:
            for name, b in pair.items():
                t0 = time.perf_counter()
                b.extend(states[name], tokens[prefix : prefix + k])
                dt = time.perf_counter() - t0
                b.truncate(states[name], prefix)
                if r:
                    samples[(name, k)].append(dt)
    rows = []
    for k in ks:
        row: dict[str, Any] = {"k": k}
        for name in pair:
            row[f"{name}_ms"] = 1000 * statistics.median(samples[(name, k)])
        row["speedup"] = row["eager_ms"] / row["graphs_ms"]
        rows.append(row)
    for name in pair:
        t1 = rows[0][f"{name}_ms"]
        for row in rows:
            row[f"{name}_ratio"] = row[f"{name}_ms"] / t1
    return rows


@dataclass
class GraphsOptions:
    """Settings of ``bench graphs``; each field with a flag is its command-line option."""

    model: str = model_option(always=True)
    device: str = device_option("cuda", help="torch device (graphs need cuda)", always=True)
    limit: int = option(8, "--limit", parse=int, help="prompts (half MT-Bench, half code edits)", always=True)
    max_tokens: int = max_tokens_option(128, always=True)
    repeats: int = option(7, "--repeats", parse=int, help="timed repeats per pass length", always=True)
    out: Path = out_option()
    tag: str = option("", "--tag", help="results name: graphs-<tag>.* (default: model-device)", always=True)
    plot: bool = plot_option()


def run_graphs_bench(
    model: str,
    device: str = "cuda",
    limit: int = 8,
    max_tokens: int = 128,
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
    repeats: int = 7,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    eager, static = backends_pair(model, device)
    pair = {"eager": eager, "graphs": static}
    curve = _curve(pair, list(ks), repeats)
    for row in curve:
        log(f"k={row['k']:3d}  eager {row['eager_ms']:7.2f} ms  graphs {row['graphs_ms']:6.2f} ms")
    prompts = load_prompts("mtbench", limit // 2) + load_prompts("code-edit", limit - limit // 2)
    cfg = GenerationConfig(max_tokens=max_tokens)
    records = []
    for pi, p in enumerate(prompts):
        ids = eager.tokenizer.chat(chat_messages(p["text"]))
        ref, gaps = greedy_reference(eager, ids, max_tokens)
        for method in rotated(METHODS, pi):
            which, how = method.split()
            b = pair[which]
            dec = SpeculativeDecoder(b, NgramDrafter() if how == "ngram" else None)
            t0 = time.perf_counter()
            res = dec.run(ids, cfg)
            wall = time.perf_counter() - t0
            dec.close()
            out = res.token_ids
            same = out == ref
            j = next((i for i, (a, c) in enumerate(zip(out, ref, strict=False)) if a != c), None)
            records.append(
                {
                    "prompt": p["id"],
                    "method": method,
                    "tokens": len(out),
                    "wall_s": wall,
                    "identical": same,
                    "diverges_at": j,
                    "gap_there": None if same or j is None else gaps[j],
                    "target_passes": res.stats.target_forwards,
                }
            )
        log(f"prompt {pi + 1}/{len(prompts)} ({p['id']}) done")
    summary = []
    base = None
    for m in METHODS:
        rs = [r for r in records if r["method"] == m]
        toks = sum(r["tokens"] for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        row = {
            "method": m,
            "prompts": len(rs),
            "tokens": toks,
            "tok_s": toks / wall if wall else None,
            "ms_per_token": 1000 * wall / toks if toks else None,
            "identical": sum(r["identical"] for r in rs),
            "target_passes": sum(r["target_passes"] for r in rs),
        }
        base = base or row["tok_s"]
        row["speedup"] = row["tok_s"] / base if base and row["tok_s"] else None
        summary.append(row)
    return {
        "model": model,
        "device": device,
        "curve": curve,
        "summary": summary,
        "records": records,
        "captures": static.captures,
        "settings": {"limit": limit, "max_tokens": max_tokens, "repeats": repeats, "prefix": 256},
    }


def markdown(result: dict[str, Any]) -> str:
    lines = markdown_preamble(
        f"transformers step: eager vs static cache + CUDA graphs ({result['model']}, {result['device']})",
        result["header"],
    )
    lines += [
        "## One pass of k tokens after a 256-token prefix (median)",
        "",
        md_table(
            (
                ("k", "k", 0),
                ("eager_ms", "eager ms", 2),
                ("graphs_ms", "graphs ms", 2),
                ("speedup", "graphs speedup", 2),
                ("eager_ratio", "eager t(k)/t(1)", 2),
                ("graphs_ratio", "graphs t(k)/t(1)", 2),
            ),
            result["curve"],
        ),
        "",
        "## Greedy decoding (wall time; identical = token for token the eager AR output)",
        "",
        md_table(
            (
                ("method", "method", 0),
                ("prompts", "prompts", 0),
                ("tokens", "tokens", 0),
                ("tok_s", "tok/s", 1),
                ("ms_per_token", "ms/token", 2),
                ("speedup", "vs eager AR", 2),
                ("target_passes", "target passes", 0),
                ("identical", "identical", 0),
            ),
            result["summary"],
        ),
        "",
    ]
    flips = [r for r in result["records"] if not r["identical"]]
    if flips:
        lines += ["Divergences (AR's top-2 logit gap at the first differing token):", ""]
        lines += [
            f"- {r['method']} on {r['prompt']}: token {r['diverges_at']}, gap {r['gap_there']}" for r in flips
        ]
        lines.append("")
    return "\n".join(lines)


def plot(path: Path, result: dict[str, Any]) -> Path:
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ks = [r["k"] for r in result["curve"]]
    for name in ("eager", "graphs"):
        a.plot(ks, [r[f"{name}_ms"] for r in result["curve"]], marker="o", label=name)
    a.set(xscale="log", yscale="log", xlabel="tokens per pass k", ylabel="ms per pass", title="pass time")
    a.set_xticks(ks, [str(k) for k in ks])
    a.legend()
    s = result["summary"]
    b.bar([r["method"] for r in s], [r["tok_s"] or 0 for r in s], color=["#999", "#2a7", "#bbb", "#1a5"])
    b.set(ylabel="tokens/s", title="greedy decoding")
    fig.suptitle(f"{result['model']} on {result['header']['machine'].get('gpu') or result['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
