"""``speclive bench talon``: Talon's Table 1 on this machine (speedup and τ per set and method).

Runs the decode benchmark of ``speclive.bench.suites`` (every method side by side, interleaved
per prompt, exactness against AR with the near-tie rule) on three sets:

- ``mtbench`` — MT-Bench turn-1 questions;
- ``humaneval`` — HumanEval completions;
- ``chat-heldout`` — a held-out ShareGPT-like slice: other MT-Bench questions (shifted by one
  from the ``mtbench`` sample) asked together with their follow-up turn, as one user message.
  No ShareGPT dump is available offline; this is the closest multi-request chat data here.

Methods: AR, the model drafter, n-gram, suffix, hybrid, hybrid-async, plus peers where they
apply (transformers generate/assisted with ``--hf-peers`` on the transformers backend, vLLM's
``ngram``/``suffix``/draft-model when its venv is installed — else skipped with the reason).

Added on top of the decode result: the datastore's provenance and its overlap with the
benchmark prompts (must be empty), suffix-lookup time against one target step, and the busy
time of both sides in the asynchronous mode.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from speclive.bench import report

TALON_SETS: tuple[str, ...] = ("mtbench", "humaneval", "chat-heldout")
TALON_DEFAULT_METHODS: tuple[str, ...] = (
    "ar",
    "model",
    "ngram",
    "suffix",
    "hybrid",
    "hybrid-async",
    "vllm-ngram",
    "vllm-suffix",
    "vllm-draft",
)
HF_PEER_METHODS: tuple[str, ...] = ("ar", "hf-generate", "hf-assisted")


def _spread(n: int, limit: int | None) -> list[int]:
    if limit is None or limit >= n:
        return list(range(n))
    return [i * n // limit for i in range(max(0, limit))]


def _chat_indices(n: int, limit: int | None) -> list[int]:
    return sorted({(i + 1) % n for i in _spread(n, limit)})


def chat_heldout_prompts(limit: int | None = None) -> list[dict[str, str]]:
    """The held-out chat slice (module docstring) as ``{"id", "text"}``."""
    from speclive.bench.datasets import mtbench_questions

    t1 = mtbench_questions(1)
    t2 = mtbench_questions(2)
    rows = []
    for i in _chat_indices(len(t1), limit):
        q, f = t1[i], t2[i]
        rows.append(
            {"id": f"chat-{q['id']}-{q['category']}", "text": f"{q['prompt']}\n\nThen: {f['prompt']}"}
        )
    return rows


def bench_prompt_texts(limit: int | None) -> list[str]:
    """User texts of every prompt a ``bench talon --limit LIMIT`` run evaluates."""
    from speclive.bench.suites import load_prompts

    return [r["text"] for s in TALON_SETS for r in load_prompts(s, limit)]


def held_out_prompts(sets: Sequence[str], per_set: int, bench_limit: int | None) -> list[dict[str, str]]:
    """Prompts of ``sets`` that a ``bench talon --limit bench_limit`` run does not use (nor their
    MT-Bench questions in the chat slice), ``per_set`` of each, spread over what is left."""
    from speclive.bench.datasets import humaneval_problems, mtbench_questions
    from speclive.bench.suites import HUMANEVAL_TEMPLATE

    out: list[dict[str, str]] = []
    for s in sets:
        if s == "mtbench":
            qs = mtbench_questions(1)
            used = set(_spread(len(qs), bench_limit)) | set(_chat_indices(len(qs), bench_limit))
            free = [i for i in range(len(qs)) if i not in used]
            rows = [
                {"id": f"mtbench-{qs[i]['id']}-{qs[i]['category']}", "text": qs[i]["prompt"]} for i in free
            ]
        elif s == "humaneval":
            ps = humaneval_problems()
            used = set(_spread(len(ps), bench_limit))
            rows = [
                {"id": ps[i]["task_id"], "text": HUMANEVAL_TEMPLATE.format(prompt=ps[i]["prompt"])}
                for i in range(len(ps))
                if i not in used
            ]
        else:
            raise ValueError(f"held-out prompts exist for mtbench and humaneval, not {s!r}")
        for j in _spread(len(rows), per_set):
            out.append({"set": s, **rows[j]})
    return out


# ------------------------------------------------------------------------------------ extras
def lookup_timing(
    records: Sequence[Mapping[str, Any]], target: Any, datastore: str | None, t1_ms: float | None
) -> dict[str, Any]:
    """Time the suffix drafter's retrieval over every decode position of the AR outputs."""
    from speclive.loader import make_drafter

    drafter = make_drafter("suffix", target, datastore=datastore)
    drafter.bind(target)
    times: list[float] = []
    for r in records:
        if r.get("method") != "ar" or "token_ids" not in r or r.get("backend") != target.kind:
            continue
        ctx = list(r["prompt_ids"]) + list(r["token_ids"])
        n0 = len(r["prompt_ids"])
        drafter.begin(ctx[:n0])
        for end in range(n0, len(ctx) + 1):
            t0 = time.perf_counter()
            drafter.retrieve(ctx[:end])
            times.append(time.perf_counter() - t0)
    drafter.close()
    if not times:
        return {"lookups": 0}
    times.sort()
    mean_ms = 1000 * statistics.fmean(times)
    out: dict[str, Any] = {
        "lookups": len(times),
        "mean_ms": mean_ms,
        "p99_ms": 1000 * times[int(0.99 * (len(times) - 1))],
        "max_ms": 1000 * times[-1],
        "t1_ms": t1_ms,
    }
    if t1_ms:
        out["mean_fraction_of_step"] = mean_ms / t1_ms
    return out


def async_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Busy time of both sides and reuse counts of the asynchronous drafter, per set."""
    out: dict[str, Any] = {}
    for r in records:
        a = r.get("async")
        if not a:
            continue
        agg = out.setdefault(r["set"], {k: 0.0 for k in a if isinstance(a[k], int | float)})
        for k, v in a.items():
            if isinstance(v, int | float) and k in agg:
                agg[k] += v
    for agg in out.values():
        wall = agg.get("wall_s") or 0.0
        agg["draft_utilisation"] = agg.get("draft_busy_s", 0.0) / wall if wall else None
        agg["target_utilisation"] = agg.get("target_side_s", 0.0) / wall if wall else None
        steps = agg.get("steps") or 0
        agg["reuse_rate"] = agg.get("jobs_reused", 0.0) / steps if steps else None
    return out


def datastore_facts(path: str | None, prompts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if not path:
        return {"path": None}
    import json

    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(bytes(z["meta"]).decode())
    ids = set(meta.get("corpus_prompt_ids", []))
    overlap = sorted(ids & {str(p["id"]) for p in prompts})
    return {
        "path": str(path),
        "model": meta.get("model"),
        "tokens": meta.get("n_tokens"),
        "documents": meta.get("n_docs"),
        "sources": meta.get("sources"),
        "corpus_prompts": len(ids),
        "overlap_with_benchmark": overlap,
    }


# ------------------------------------------------------------------------------------ report
def talon_markdown(result: Mapping[str, Any]) -> str:
    h = result["header"]
    lines = report.markdown_preamble(f"Talon benchmark: {h['target']} ({', '.join(h['backends'])})", h)
    sets = list(dict.fromkeys(r["set"] for r in result["summary"]))
    methods = list(dict.fromkeys(r["label"] for r in result["summary"]))
    cell = {(r["set"], r["label"]): r for r in result["summary"]}
    lines.append("## Speedup and τ (Talon Table 1 layout; speedup = end-to-end tok/s vs AR)")
    lines.append("")
    head = (
        "| method | " + " | ".join(f"{s} speedup | {s} τ" for s in sets) + " | identical / near-tie / bug |"
    )
    lines += [head, "|" + "---|" * (2 * len(sets) + 2)]
    for m in methods:
        cells, ident, near, bugs, comp = [], 0, 0, 0, 0
        for s in sets:
            r = cell.get((s, m), {})
            sp, tau = r.get("speedup"), r.get("tau")
            cells.append(f"{sp:.2f}x" if sp else "–")
            cells.append(f"{tau:.2f}" if tau else "–")
            comp += r.get("compared", 0) or 0
            ident += r.get("identical", 0) or 0
            near += r.get("near_tie", 0) or 0
            bugs += r.get("bugs", 0) or 0
        exact = f"{ident}/{comp} · {near} · {bugs}" if comp else "reference"
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {exact} |")
    lines.append("")
    for s in sets:
        lines += ["", f"## {s}: acceptance, tokens/s, bounds", ""]
        lines.append(report.md_table(report.SUMMARY_COLUMNS, [r for r in result["summary"] if r["set"] == s]))
    lk = result.get("lookup", {})
    if lk.get("lookups"):
        frac = lk.get("mean_fraction_of_step")
        lines += [
            "",
            "## Suffix lookups",
            "",
            f"{lk['lookups']} retrievals (per-request + global store, tree building included) over the AR "
            f"outputs: mean {lk['mean_ms']:.3f} ms, p99 {lk['p99_ms']:.3f} ms, max {lk['max_ms']:.3f} ms"
            + (
                f"; one target step t(1) = {lk['t1_ms']:.1f} ms, so a lookup costs {100 * frac:.2f}%."
                if frac
                else "."
            ),
        ]
    asy = result.get("async", {})
    if asy:
        lines += ["", "## Asynchronous mode (hybrid-async): how busy each side was", ""]
        lines.append(
            "| set | wall s | draft busy | target side | main waited for draft s | pre-verify | post-verify "
            "| reused jobs | reused tokens |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for s, a in asy.items():
            du, tu = a.get("draft_utilisation"), a.get("target_utilisation")
            if du is None or tu is None:
                lines.append(f"| {s} |" + " – |" * 8)
                continue
            counts = " | ".join(
                str(int(a.get(k, 0))) for k in ("pre_verify", "post_verify", "jobs_reused", "tokens_reused")
            )
            lines.append(
                f"| {s} | {a.get('wall_s', 0):.1f} | {100 * du:.0f}% | {100 * tu:.0f}% "
                f"| {a.get('wait_s', 0):.2f} | {counts} |"
            )
    ds = h.get("datastore", {})
    if ds.get("path"):
        lines += [
            "",
            "## Global datastore",
            "",
            f"{ds.get('tokens')} tokens, {ds.get('documents')} documents, built for {ds.get('model')} from: "
            + ", ".join(map(str, ds.get("sources") or [])),
            f"; {ds.get('corpus_prompts')} model-output documents; overlap with the benchmark prompts: "
            + (", ".join(ds["overlap_with_benchmark"]) or "none"),
        ]
    if h.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(h["skipped"])]
    if result.get("notes"):
        lines += ["", *[f"- {n}" for n in result["notes"]]]
    return "\n".join(lines) + "\n"


def plot_talon(path: Path, result: Mapping[str, Any]) -> Path:
    h = result["header"]
    return report.plot_speedups(path, result["summary"], f"Talon methods: speedup vs AR, {h['target']}")


def run_talon(opts: Any, hf_peers: bool = False) -> dict[str, Any]:
    """Run the decode benchmark with the Talon sets/methods and add the Talon extras."""
    from speclive.bench.suites import load_prompts, run_decode_bench
    from speclive.loader import load_backend

    if hf_peers and "hf" not in opts.backends:
        opts.backends = [*opts.backends, "hf"]
    if hf_peers:
        ours = [m for m in opts.methods if not m.startswith(("hf-", "vllm-"))]
        opts.methods = list(dict.fromkeys([*opts.methods, *HF_PEER_METHODS]))
        opts.backend_methods = {b: ours for b in opts.backends if b != "hf"}
        opts.backend_methods["hf"] = list(HF_PEER_METHODS)
    result = run_decode_bench(opts)
    prompts = [p for s in opts.sets for p in load_prompts(s, opts.limit)]
    result["header"]["datastore"] = datastore_facts(opts.datastore, prompts)
    # prompt ids per record, for the lookup timing
    by_id: dict[tuple[str, str], list[int]] = {}
    for s in opts.sets:
        for p in load_prompts(s, opts.limit):
            by_id[(s, p["id"])] = p["text"]
    backend = opts.backends[0]
    target = load_backend(opts.target, backend)
    recs = []
    for r in result["records"]:
        if r.get("method") == "ar" and r.get("backend") == backend and "token_ids" in r:
            text = by_id.get((r["set"], r["prompt_id"]))
            if text is not None:
                recs.append({**r, "prompt_ids": target.tokenizer.chat([{"role": "user", "content": text}])})
    curve = result.get("cost_curves", {}).get(backend, {})
    t1 = curve.get("t1_ms")
    result["lookup"] = lookup_timing(recs, target, opts.datastore, t1)
    result["async"] = async_summary(result["records"])
    return result
