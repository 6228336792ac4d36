"""``speclive bench talon``: Talon's Table 1 on this machine (speedup and τ per set and method).

Runs the decode benchmark of ``speclive_bench.decode`` (every method side by side, interleaved
per prompt, exactness against AR with the near-tie rule) on three sets (``speclive_bench.prompts``):

- ``mtbench`` — MT-Bench turn-1 questions;
- ``humaneval`` — HumanEval completions;
- ``chat-heldout`` — a held-out ShareGPT-like slice: other MT-Bench questions (shifted by one
  from the ``mtbench`` sample) asked together with their follow-up turn, as one user message.
  No ShareGPT dump is available offline; this is the closest multi-request chat data here.

Methods: AR, the model drafter, n-gram, suffix, hybrid, hybrid-async, plus peers where they
apply (transformers generate/assisted with ``--hf-peers`` on the transformers backend, vLLM's
``ngram``/``suffix``/draft-model when its venv is installed — else skipped with the reason).

Added on top of the decode result: the datastore's provenance and its overlap with the
benchmark prompts (must be empty), suffix-lookup time against one target step, the busy
time of both sides in the asynchronous mode, and the hybrid against the best single drafter
per set with bootstrap intervals over prompts (``faster``/``slower`` only when the whole
interval is above/below 1, else ``within noise``). A replica such as ``suffix#2`` (a second,
independent ``suffix`` run side by side) is an A/A control: its ratio to ``suffix`` is the
spread timing noise and diverging learned state alone produce.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from speclive.drafting.datastore import SuffixDatastore
from speclive.errors import ConfigError
from speclive.loader import load_backend, make_drafter, tokenizer_for
from speclive.models.resolve import resolve
from speclive_bench import report
from speclive_bench.decode import SUMMARY_COLUMNS, run_decode_bench
from speclive_bench.methods import method_base
from speclive_bench.prompts import CHAT_JOIN, load_prompts, question_key
from speclive_bench.stats import percentile, ratio_of_sums

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


# ------------------------------------------------------------------------------------ extras
def lookup_timing(
    records: Sequence[Mapping[str, Any]], target: Any, datastore: str | None, t1_ms: float | None
) -> dict[str, Any]:
    """Time the suffix drafter's retrieval over every decode position of the AR outputs."""

    drafter = make_drafter("suffix", target, datastore=datastore)
    times: list[float] = []
    for r in records:
        if r.get("method") != "ar" or "token_ids" not in r or r.get("backend") != target.kind:
            continue
        ctx = list(r["prompt_ids"]) + list(r["token_ids"])
        n0 = len(r["prompt_ids"])
        drafter.start(target, ctx[:n0])
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
        "p99_ms": 1000 * (percentile(times, 99, "lower") or 0.0),
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


SINGLE_DRAFTERS: tuple[str, ...] = ("model", "ngram", "suffix")


def _ratio_ci(
    recs: Mapping[str, Sequence[Mapping[str, Any]]], a: str, b: str, n_boot: int, seed: int
) -> dict[str, Any] | None:
    """Throughput of ``a`` over ``b`` (Σtokens/Σwall each) on their common prompts, with a 95 %
    percentile bootstrap interval over prompts (pairs resampled together)."""
    ra = {r["prompt_id"]: r for r in recs.get(a, ()) if r.get("wall_s")}
    rb = {r["prompt_id"]: r for r in recs.get(b, ()) if r.get("wall_s")}
    ids = sorted(set(ra) & set(rb))
    if not ids:
        return None
    ratio, lo, hi = ratio_of_sums(
        [ra[i]["new_tokens"] for i in ids],
        [ra[i]["wall_s"] for i in ids],
        [rb[i]["new_tokens"] for i in ids],
        [rb[i]["wall_s"] for i in ids],
        n=n_boot,
        seed=seed,
    )
    return {"a": a, "b": b, "prompts": len(ids), "ratio": ratio, "lo": lo, "hi": hi}


def verdict(c: Mapping[str, Any]) -> str:
    """The verdict on a throughput ratio with its interval (``{"ratio", "lo", "hi"}``):
    ``faster`` when the whole interval is above 1, ``slower`` when all of it is below 1, else
    ``within noise``, whichever side of 1 the point estimate lies."""
    if c["lo"] > 1.0:
        return "faster"
    if c["hi"] < 1.0:
        return "slower"
    return "within noise"


def hybrid_vs_best(records: Sequence[Mapping[str, Any]], n_boot: int = 4000, seed: int = 0) -> dict[str, Any]:
    """Per set: the hybrid's throughput over the best single drafter's (model, n-gram, suffix:
    the highest point estimate, a choice that favours the single drafter), and every A/A
    replica (``NAME#TAG``) over its original, each with a bootstrap interval over prompts.

    Verdict per set (``verdict``): ``faster`` or ``slower`` when the whole interval is above or
    below 1, else ``within noise``.
    """
    out: dict[str, Any] = {}
    sets = list(dict.fromkeys(r["set"] for r in records))
    for s in sets:
        by: dict[str, list[Mapping[str, Any]]] = {}
        for r in records:
            if r["set"] == s and "token_ids" in r:
                by.setdefault(r["label"], []).append(r)
        if "ar" not in by:
            continue
        singles = [m for m in SINGLE_DRAFTERS if m in by]
        vs_ar = {m: _ratio_ci(by, m, "ar", n_boot, seed) for m in [*singles, "hybrid"] if m in by}
        entry: dict[str, Any] = {"vs_ar": vs_ar}
        if "hybrid" in by and singles:
            best = max(singles, key=lambda m: vs_ar[m]["ratio"] if vs_ar[m] else 0.0)
            c = _ratio_ci(by, "hybrid", best, n_boot, seed)
            if c is not None:
                c["verdict"] = verdict(c)
            entry["best_single"] = best
            entry["hybrid_vs_best"] = c
        entry["replicas"] = [
            c
            for m in by
            if m != method_base(m) and (c := _ratio_ci(by, m, method_base(m), n_boot, seed)) is not None
        ]
        out[s] = entry
    return out


def prompts_in_datastore(
    path: str,
    prompts: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    window: int = 24,
    min_window: int = 12,
) -> list[str]:
    """Ids of the prompts whose text occurs verbatim in the datastore, whatever its metadata
    says (a corpus without ids, e.g. a chat dump that happens to contain a benchmark question).

    A prompt (each turn of a chat-slice prompt) is found when a ``window``-token stretch near
    its start or its end (the whole text if shorter, at least ``min_window`` tokens) occurs in
    the corpus; a few tokens are skipped at both ends, where tokenization depends on what
    precedes the text.
    """

    ds = SuffixDatastore.load(path, tokenizer)
    hits: list[str] = []
    for p in prompts:
        for part in str(p["text"]).split(CHAT_JOIN):
            ids = tokenizer.encode(part)[2:-2]
            w = min(window, ds.max_depth, len(ids))
            if w < min_window:
                continue  # too short to tell a quotation from a common phrase
            if any(ds.match(x, w).length >= w for x in (ids[:w], ids[-w:])):
                hits.append(str(p["id"]))
                break
    return hits


def datastore_facts(path: str | None, prompts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if not path:
        return {"path": None}
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(bytes(z["meta"]).decode())
    ids = {question_key(str(i)) for i in meta.get("corpus_prompt_ids", [])}
    overlap = sorted(str(p["id"]) for p in prompts if question_key(str(p["id"])) in ids)
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
    lines += _table1_lines(result["summary"])
    lines += _lookup_lines(result.get("lookup", {}))
    lines += _hybrid_lines(result.get("hybrid_vs_best", {}))
    lines += _async_lines(result.get("async", {}))
    lines += _datastore_lines(h.get("datastore", {}))
    if h.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(h["skipped"])]
    if result.get("notes"):
        lines += ["", *[f"- {n}" for n in result["notes"]]]
    return "\n".join(lines) + "\n"


def _table1_lines(summary: Sequence[Mapping[str, Any]]) -> list[str]:
    """Speedup and τ per set and method in Talon's Table 1 layout, then a table per set."""
    sets = list(dict.fromkeys(r["set"] for r in summary))
    methods = list(dict.fromkeys(r["label"] for r in summary))
    cell = {(r["set"], r["label"]): r for r in summary}
    lines = ["## Speedup and τ (Talon Table 1 layout; speedup = end-to-end tok/s vs AR)", ""]
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
        lines.append(report.md_table(SUMMARY_COLUMNS, [r for r in summary if r["set"] == s]))
    return lines


def _lookup_lines(lk: Mapping[str, Any]) -> list[str]:
    if not lk.get("lookups"):
        return []
    frac = lk.get("mean_fraction_of_step")
    return [
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


def _ratio_cell(c: Mapping[str, Any] | None) -> str:
    return f"{c['ratio']:.3f} [{c['lo']:.3f}, {c['hi']:.3f}]" if c else "–"


def _hybrid_lines(hv: Mapping[str, Any]) -> list[str]:
    if not any(e.get("hybrid_vs_best") for e in hv.values()):
        return []
    lines = [
        "",
        "## Hybrid against the best single drafter (throughput ratio, 95 % bootstrap over prompts)",
        "",
        "| set | best single | its speedup vs AR | hybrid vs AR | hybrid / best | verdict | A/A replicas |",
        "|---|---|---|---|---|---|---|",
    ]
    for s, e in hv.items():
        c = e.get("hybrid_vs_best")
        if not c:
            continue
        reps = "; ".join(f"{r['a']} / {r['b']} = {_ratio_cell(r)}" for r in e.get("replicas", [])) or "–"
        lines.append(
            f"| {s} | {e['best_single']} | {_ratio_cell(e['vs_ar'].get(e['best_single']))} "
            f"| {_ratio_cell(e['vs_ar'].get('hybrid'))} | {_ratio_cell(c)} | {c['verdict']} | {reps} |"
        )
    return [
        *lines,
        "",
        "The best single drafter is picked per set by its point estimate, which favours it "
        "(the largest of several noisy ratios is biased upwards). An A/A replica is the same "
        "drafter run twice side by side: its ratio shows the spread timing noise and diverging "
        "learned state alone produce.",
    ]


def _async_lines(asy: Mapping[str, Any]) -> list[str]:
    if not asy:
        return []
    lines = [
        "",
        "## Asynchronous mode (hybrid-async): how busy each side was",
        "",
        "| set | wall s | draft busy | target side | main waited for draft s | pre-verify | post-verify "
        "| reused jobs | reused tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
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
    return lines


def _datastore_lines(ds: Mapping[str, Any]) -> list[str]:
    if not ds.get("path"):
        return []
    return [
        "",
        "## Global datastore",
        "",
        f"{ds.get('tokens')} tokens, {ds.get('documents')} documents, built for {ds.get('model')} from: "
        + ", ".join(map(str, ds.get("sources") or [])),
        f"; {ds.get('corpus_prompts')} model-output documents; overlap with the benchmark prompts: "
        + (", ".join(ds["overlap_with_benchmark"]) or "none"),
    ]


def plot_talon(path: Path, result: Mapping[str, Any]) -> Path:
    h = result["header"]
    return report.plot_speedups(path, result["summary"], f"Talon methods: speedup vs AR, {h['target']}")


def run_talon(opts: Any) -> dict[str, Any]:
    """Run the decode benchmark with the Talon sets/methods and add the Talon extras
    (``opts``: ``DecodeOptions``; ``hf_peers`` adds transformers' generate and assisted)."""

    load_avg_start = report.load_avg()  # before the datastore and the models load
    if opts.hf_peers and "hf" not in opts.backends:
        opts.backends = [*opts.backends, "hf"]
    if opts.hf_peers:
        ours = [m for m in opts.methods if not m.startswith(("hf-", "vllm-"))]
        opts.methods = list(dict.fromkeys([*opts.methods, *HF_PEER_METHODS]))
        opts.backend_methods = {b: ours for b in opts.backends if b != "hf"}
        opts.backend_methods["hf"] = list(HF_PEER_METHODS)
    prompts = [p for s in opts.sets for p in load_prompts(s, opts.limit)]
    facts = datastore_facts(opts.datastore, prompts)
    if opts.datastore:
        found = prompts_in_datastore(opts.datastore, prompts, tokenizer_for(resolve(opts.target)))
        facts["prompts_in_corpus"] = found
        leaked = sorted({*facts.get("overlap_with_benchmark", []), *found})
        if leaked:
            raise ConfigError(
                f"the datastore {opts.datastore} holds benchmark prompts or the model's answers to "
                f"them ({', '.join(leaked)}): retrieval would copy them. Rebuild it with "
                f"`speclive datastore build ... --exclude-bench {opts.limit or 0}`"
            )
    result = run_decode_bench(opts, load_avg_start=load_avg_start)
    result["header"]["datastore"] = facts
    # prompt ids per record, for the lookup timing
    by_id: dict[tuple[str, str], list[int]] = {}
    for s in opts.sets:
        for p in load_prompts(s, opts.limit):
            by_id[(s, p["id"])] = p["text"]
    backend = opts.backends[0]
    target = load_backend(opts.target, backend, device=opts.device if backend == "hf" else "cpu")
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
    result["hybrid_vs_best"] = hybrid_vs_best(result["records"])
    return result
