"""``speclive bench decode``: every method side by side on the same prompts, in one process.

``run_decode_bench`` runs every method side by side in one process: for each prompt set and
prompt, every method (our loop with each drafter, and the peers of ``speclive_bench.peers``,
see ``speclive_bench.methods``) generates greedily from the same prompt ids, in an order rotated
per prompt so that drift of the machine affects all methods alike. Per (set, method) it reports
end-to-end throughput, speedup over ``ar`` (our loop without a drafter) on the same backend, τ,
acceptance, exactness against ``ar`` (with the reference top-2 logit gap at the first divergent
token: a small gap is a near-tie flip of the quantized kernels, a large one is a bug; see
``speclive_bench.exactness``), and how close each drafter gets to what a *free* drafter could
achieve under the measured cost curve (the bounds of ``speclive_bench.costcurve``).

With ``cold`` every local method also runs cold: a fresh process and drafter per prompt
(``speclive_bench.coldrun``), without and (our drafters) with saved knowledge.
"""

from __future__ import annotations

import math
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclive.backends.base import Backend
from speclive.common_options import max_draft_option, max_tokens_option
from speclive.loader import BACKENDS, DEFAULT_CROSS_DRAFT, DEFAULT_DRAFT, load_backend
from speclive.models.convert import hf_dir_for_gguf
from speclive.models.resolve import resolve
from speclive.options import option
from speclive_bench import report
from speclive_bench.coldrun import run_cold
from speclive_bench.costcurve import (
    CURVE_COLUMNS,
    DEFAULT_CURVE_KS,
    CostCurve,
    alpha_bound,
    alpha_hat,
    measure_cost_curve,
    trace_bound,
)
from speclive_bench.exactness import ar_logit_gap, first_divergence
from speclive_bench.harness import run_interleaved
from speclive_bench.methods import (
    ALL_METHODS,
    BASELINE,
    OUR_METHODS,
    TALON_METHODS,
    VLLM_PEERS,
    Method,
    local_runner,
    method_base,
    peer_record,
)
from speclive_bench.peers import VllmPeer, vllm_python
from speclive_bench.prompts import DECODE_SETS, SETS, WARMUP_PROMPT, load_prompts
from speclive_bench.stats import paired_ratio, ratio_text

BACKENDS_BOTH = ("llamacpp", "hf")

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ decode bench
def _backends_field(value: str) -> list[str]:
    return list(BACKENDS_BOTH) if value == "both" else [value]


def _backends_flag(value: Sequence[str] | None) -> str | None:
    if value is None:
        return None
    return "both" if list(value) == list(BACKENDS_BOTH) else ",".join(value)


@dataclass
class DecodeOptions:
    """Settings of ``bench decode`` and ``bench talon``; each field with a flag is its
    command-line option (``speclive.options``)."""

    target: str = option("qwen2.5-coder-1.5b-instruct", "--target", help="target model", always=True)
    backends: Sequence[str] = option(
        ("llamacpp",),
        "--backend",
        many=False,
        choices=[*BACKENDS, "both"],
        to_field=_backends_field,
        to_flag=_backends_flag,
        always=True,
    )
    #: torch device of the hf backend (llama.cpp runs on the CPU)
    device: str = report.hf_device_option()
    sets: Sequence[str] = option(
        SETS, "--sets", help=f"comma-separated: {','.join(DECODE_SETS)}", always=True
    )
    limit: int | None = option(
        None, "--limit", parse=int, help="prompts per set (spread over the set)", always=True
    )
    max_tokens: int = max_tokens_option(128, always=True)
    methods: Sequence[str] = option(
        ALL_METHODS,
        "--methods",
        help=f"comma-separated subset of: {','.join(ALL_METHODS)} (inapplicable ones are skipped; "
        "ar is always run)",
        always=True,
    )
    max_draft: int | None = max_draft_option(help="longest draft of our drafters")
    out: Path = report.out_option()
    tag: str = option(
        "", "--tag", help="results name: <bench>-<tag>.* (default: target-backend)", always=True
    )
    #: global suffix datastore of the suffix/hybrid drafters
    datastore: str | None = option(
        None, "--datastore", help="global suffix datastore (speclive datastore build)"
    )
    curve_ks: Sequence[int] = option(
        DEFAULT_CURVE_KS,
        "--curve-ks",
        parse=int,
        help="k values of the cost curve measured after the runs (for the bounds)",
    )
    curve_repeats: int = option(3, "--curve-repeats", parse=int)
    curve_prefix: int = 256
    measure_curve: bool = option(True, "--no-curve", help="use the online cost estimate, measure nothing")
    near_tie: float = option(
        report.NEAR_TIE_GAP,
        "--near-tie",
        parse=float,
        help="top-2 gap below which a divergence is a near tie",
    )
    gap_check: bool = option(True, "--no-gap-check", help="do not re-run AR to analyse divergences")
    warmup: bool = option(True, "--no-warmup")
    progress: bool = option(True, "--no-progress", result=False)
    plot: bool = report.plot_option()
    #: also run every local method cold: a fresh process and drafter per prompt, without and
    #: (our drafters) with saved knowledge (``speclive_bench.coldrun``)
    cold: bool = option(
        False,
        "--cold",
        help="also run every local method cold: a fresh process and drafter per prompt, without "
        "and (our drafters) with saved knowledge, side by side with the warm run",
    )
    cold_timeout_s: float = 900.0
    vllm_timeout_s: float = 3600.0
    vllm_k: int | None = option(
        None, "--vllm-k", parse=int, help="num_speculative_tokens of the vLLM methods"
    )
    #: vLLM without torch.compile (fast start-up for checks; slower decoding than vLLM as shipped)
    vllm_eager: bool = option(
        False,
        "--vllm-eager",
        help="vLLM without torch.compile (quick checks; the default runs vLLM as shipped)",
    )
    #: ``bench talon``: also transformers generate / assisted generation
    hf_peers: bool = option(False, "--hf-peers", help="also transformers generate/assisted (slow)")
    #: per backend, the only methods run there (None: every method on every backend)
    backend_methods: Mapping[str, Sequence[str]] | None = None
    command: str = ""

    def resolved_tag(self) -> str:
        """The results name: ``tag``, else ``<target>-<backends>``."""
        return self.tag or f"{self.target}-{'+'.join(self.backends)}"


def _wanted(opts: DecodeOptions) -> list[str]:
    """The methods asked for, checked, with ``ar`` (and ``vllm-ar`` beside vLLM peers)."""
    wanted = list(dict.fromkeys(opts.methods))
    unknown = [m for m in wanted if method_base(m) not in ALL_METHODS + TALON_METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; known: {', '.join(ALL_METHODS)}")
    if any(m in VLLM_PEERS for m in wanted) and "vllm-ar" not in wanted:
        wanted.append("vllm-ar")
    if "ar" not in wanted:
        wanted.insert(0, "ar")
    return wanted


def _build_methods(
    opts: DecodeOptions, targets: Mapping[str, Backend], log: Log
) -> tuple[list[Method], list[str], dict[str, Any]]:
    """Instantiate every applicable method; returns (methods, skipped reasons, model facts)."""

    wanted = _wanted(opts)
    methods: list[Method] = []
    skipped: list[str] = []
    ref = resolve(opts.target)
    same_draft = DEFAULT_DRAFT.get(ref.name)
    drafts = {
        "model": same_draft,
        "hf-assisted": same_draft,
        "vllm-draft": same_draft,
        "crossvocab": DEFAULT_CROSS_DRAFT,
        "hybrid": same_draft,
        "hybrid-async": same_draft,
        "hf-assisted-crossvocab": DEFAULT_CROSS_DRAFT,
    }
    models: dict[str, Any] = {
        b: {"target": t.name, "gguf": str(ref.gguf) if ref.gguf else None} for b, t in targets.items()
    }
    for b, t in targets.items():
        if t.linear_info is not None:
            models[b]["linear"] = t.linear_info

    def skip(what: str, why: str) -> None:
        skipped.append(f"{what}: {why}")
        if why.startswith("failed"):
            log(f"warning: {skipped[-1]}")

    for backend, target in targets.items():
        for m in wanted:
            base = method_base(m)
            if base in VLLM_PEERS:
                continue
            if opts.backend_methods is not None and m not in opts.backend_methods.get(backend, ()):
                continue
            kind = "ours" if base in OUR_METHODS + TALON_METHODS else "peer"
            try:
                runner = local_runner(base, backend, target, ref, opts.max_draft, opts.datastore)
            except Exception as e:  # noqa: BLE001 - one broken method must not stop the benchmark
                runner = f"failed to set up: {type(e).__name__}: {e}"
            if isinstance(runner, str):
                skip(f"{m}[{backend}]", runner)
            elif runner is not None:
                methods.append(Method(m, backend, kind, runner, {"draft": drafts.get(base)}))

    vllm_wanted = [m for m in wanted if method_base(m) in VLLM_PEERS]
    if any(m != method_base(m) for m in vllm_wanted):
        raise ValueError("replicas (NAME#TAG) are for local methods, not vLLM peers")
    if vllm_wanted:
        methods += _vllm_methods(vllm_wanted, opts, targets, ref, drafts, models, skip)
    models["drafts"] = {m.key: m.info["draft"] for m in methods if m.info.get("draft")}
    return methods, skipped, models


def _vllm_methods(
    wanted: Sequence[str],
    opts: DecodeOptions,
    targets: Mapping[str, Backend],
    ref: Any,
    drafts: Mapping[str, str | None],
    models: dict[str, Any],
    skip: Callable[[str, str], None],
) -> list[Method]:
    """The vLLM peers asked for (``skip`` says why one cannot run); the HF folders they load
    are noted in ``models``."""
    py = vllm_python()
    if py is None:
        skip("vllm-*", "no vLLM venv at .venv-vllm (run benchmarks/setup_vllm.sh)")
        return []
    if ref.gguf is None:
        skip("vllm-*", "the target has no GGUF to convert to an HF folder")
        return []

    def hf_dir(name: str) -> Path:
        r = resolve(name)
        return hf_dir_for_gguf(r.gguf, r.name if r.source == "registry" else None)

    same_draft = DEFAULT_DRAFT.get(ref.name)
    eos = next(iter(targets.values())).tokenizer.eos_ids
    try:
        model_dir = hf_dir(opts.target)
        draft_dir = hf_dir(same_draft) if same_draft and "vllm-draft" in wanted else None
    except Exception as e:  # noqa: BLE001
        skip("vllm-*", f"failed to prepare HF folders: {type(e).__name__}: {e}")
        return []
    models["vllm"] = {"target": ref.name, "hf_dir": str(model_dir)}
    out: list[Method] = []
    for m in wanted:
        if m == "vllm-draft" and draft_dir is None:
            skip(m, f"no same-vocabulary default draft for {ref.name}")
            continue
        peer = VllmPeer(
            m,
            py,
            model_dir,
            draft_dir if m == "vllm-draft" else None,
            eos,
            timeout_s=opts.vllm_timeout_s,
            num_speculative_tokens=opts.vllm_k,
            enforce_eager=opts.vllm_eager,
        )
        out.append(Method(m, "vllm", "vllm", peer, {"draft": drafts.get(m)}))
    return out


def _label(m: Method, multi_backend: bool) -> str:
    if m.kind == "cold":
        return f"{m.name} [cold]"
    return f"{m.name} [{m.backend}]" if multi_backend and m.kind != "vllm" else m.name


def run_decode_bench(
    opts: DecodeOptions, log: Log = _stderr, load_avg_start: list[float] | None = None
) -> dict[str, Any]:
    """Run the decode benchmark described by ``opts``; returns the full result (see module doc).
    ``load_avg_start``: the machine's load average read before the caller loaded anything (by
    default it is read here, before the models load)."""

    if load_avg_start is None:
        load_avg_start = report.load_avg()
    if not opts.backends:
        raise ValueError("no backend to benchmark")
    targets = {
        b: load_backend(opts.target, b, device=opts.device if b == "hf" else "cpu") for b in opts.backends
    }
    methods, skipped, models = _build_methods(opts, targets, log)
    ours_peers = [m for m in methods if m.kind != "vllm"]
    vllm_methods = [m for m in methods if m.kind == "vllm"]
    cold_methods = _cold_methods(ours_peers) if opts.cold else []
    knowledge_root = Path(tempfile.mkdtemp(prefix="speclive-knowledge-")) if cold_methods else None
    prompts = _load_prompt_sets(opts, targets)
    # ``skipped`` is the header's list: what fails later (warm-up, vLLM) is added to it
    header = _decode_header(opts, load_avg_start, models, prompts, [*methods, *cold_methods], skipped)
    for line in report.header_lines(header):
        log(line)
    if opts.warmup:
        ours_peers = _warm_up(ours_peers, cold_methods, targets, opts, knowledge_root, skipped, log)
    records, divergences = _run_local(ours_peers, cold_methods, prompts, targets, opts, knowledge_root, log)
    notes: list[str] = []
    if vllm_methods:
        notes.append(
            "vLLM methods run after the others, one engine start per method (not interleaved per prompt)"
        )
        records_v, header["vllm"] = _run_vllm(vllm_methods, prompts, targets, opts, log)
        records += records_v
        skipped += _vllm_failures(header["vllm"])
        divergences += _check_vllm_exactness(records_v)
    _close_runners(methods)
    curves = {b: _cost_curve(b, target, opts, log) for b, target in targets.items()}
    if knowledge_root is not None:
        shutil.rmtree(knowledge_root, ignore_errors=True)
    return _decode_result(header, records, divergences, curves, notes, bool(cold_methods), opts)


def _load_prompt_sets(opts: DecodeOptions, targets: Mapping[str, Backend]) -> dict[str, list[dict[str, Any]]]:
    """The prompts of every set, each with its chat-formatted ids per backend (``ids``)."""
    prompts: dict[str, list[dict[str, Any]]] = {}
    for s in opts.sets:
        rows = load_prompts(s, opts.limit)
        for r in rows:
            r["ids"] = {
                b: t.tokenizer.chat([{"role": "user", "content": r["text"]}]) for b, t in targets.items()
            }
        prompts[s] = rows
    return prompts


def _decode_header(
    opts: DecodeOptions,
    load_avg_start: list[float] | None,
    models: dict[str, Any],
    prompts: Mapping[str, Sequence[Any]],
    methods: Sequence[Method],
    skipped: list[str],
) -> dict[str, Any]:
    """The run header: machine, models, prompt sets, settings, methods, skipped ones, command."""
    return {
        "tag": opts.resolved_tag(),
        "machine": report.machine_info(load_avg_start),
        "target": opts.target,
        "backends": list(opts.backends),
        "models": models,
        "sets": {s: len(v) for s, v in prompts.items()},
        "settings": {
            "max_tokens": opts.max_tokens,
            "limit": opts.limit,
            "max_draft": opts.max_draft,
            "greedy": True,
            "near_tie_gap": opts.near_tie,
            "warmup": opts.warmup,
            "order": "methods interleaved per prompt, rotated by prompt index",
        },
        "methods": [m.key for m in methods],
        "skipped": skipped,
        "command": opts.command,
    }


def _warm_up(
    local: list[Method],
    cold_methods: Sequence[Method],
    targets: Mapping[str, Backend],
    opts: DecodeOptions,
    knowledge_root: Path | None,
    skipped: list[str],
    log: Log,
) -> list[Method]:
    """Run every local method once on the warm-up prompt; returns those that did not fail (a
    failure is added to ``skipped``). The cold runs with knowledge start from what one warm-up
    process saved, as the warm run's drafters start from their warm-up."""
    log("warm-up ...")
    for m in local:
        ids = targets[m.backend].tokenizer.chat([{"role": "user", "content": WARMUP_PROMPT}])
        try:
            m.runner.run(ids, min(16, opts.max_tokens))
        except Exception as e:  # noqa: BLE001 - reported, the method is then dropped
            skipped.append(f"{m.key}: failed in warm-up: {type(e).__name__}: {e}")
            log(f"warning: {skipped[-1]}")
    dead = {s.split(":")[0] for s in skipped}
    for m in cold_methods:
        if m.info.get("knowledge"):
            ids = targets[m.info["backend"]].tokenizer.chat([{"role": "user", "content": WARMUP_PROMPT}])
            try:
                _cold_record(m, ids, min(16, opts.max_tokens), opts, knowledge_root)
            except Exception as e:  # noqa: BLE001 - the measured runs will report it
                log(f"warning: {m.key} failed in warm-up: {e}")
    return [m for m in local if m.key not in dead]


def _run_local(
    local: Sequence[Method],
    cold_methods: Sequence[Method],
    prompts: Mapping[str, Sequence[dict[str, Any]]],
    targets: Mapping[str, Backend],
    opts: DecodeOptions,
    knowledge_root: Path | None,
    log: Log,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every prompt through the local methods interleaved, then through each cold method (one
    process each), both rotated by prompt index; returns (records, divergences from AR)."""
    multi = len(opts.backends) > 1
    divergences: list[dict[str, Any]] = []
    samples = [(set_name, row) for set_name, rows in prompts.items() for row in rows]

    def run_one(m: Method, sample: tuple[str, dict[str, Any]]) -> dict[str, Any]:
        ids = sample[1]["ids"][m.info.get("backend", m.backend)]
        if m.kind == "cold":
            return _cold_record(m, ids, opts.max_tokens, opts, knowledge_root)
        return m.runner.run(ids, opts.max_tokens)

    def after_sample(sample: tuple[str, dict[str, Any]], done: list[tuple[Method, dict[str, Any]]]) -> None:
        set_name, row = sample
        by_key: dict[str, dict[str, Any]] = {}
        for m, rec in done:
            backend = m.info.get("backend", m.backend)
            by_key[m.key] = _finish_record(rec, m, set_name, row, targets[backend], multi)
        divergences.extend(_check_exactness(by_key, row, targets, opts))

    records = run_interleaved(
        samples,
        local,
        run_one,
        then=cold_methods,
        desc="decode",
        progress=opts.progress,
        postfix=lambda m, sample: f"{sample[0]} {sample[1]['id']} {m.key}",
        on_error=lambda m, sample, err: log(f"warning: {m.key} failed on {sample[1]['id']}: {err}"),
        after_sample=after_sample,
    )
    return records, divergences


def _finish_record(
    rec: dict[str, Any], m: Method, set_name: str, row: Mapping[str, Any], target: Backend, multi: bool
) -> dict[str, Any]:
    """Add to a run's record where it ran (set, prompt, method, backend, label) and, for an
    output, its length, end-to-end throughput and text."""
    ids = row["ids"][m.info.get("backend", m.backend)]
    rec.update(
        set=set_name,
        prompt_id=row["id"],
        method=m.name,
        backend=m.backend,
        key=m.key,
        label=_label(m, multi),
        prompt_tokens=len(ids),
    )
    if "token_ids" in rec:
        rec["new_tokens"] = len(rec["token_ids"])
        rec["e2e_tps"] = rec["new_tokens"] / rec["wall_s"] if rec["wall_s"] > 0 else None
        rec["text"] = target.tokenizer.decode(rec["token_ids"])
    return rec


def _vllm_failures(facts: Mapping[str, Any]) -> list[str]:
    """``skipped`` lines of the vLLM methods that failed (the last line of their error)."""
    out = []
    for name, f in facts.items():
        if "error" in f:
            err = f["error"].strip().splitlines()
            out.append(f"{name}: failed: {err[-1] if err else '?'}")
    return out


def _close_runners(methods: Sequence[Method]) -> None:
    for m in methods:
        close = getattr(m.runner, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001
                pass


def _cost_curve(backend: str, target: Backend, opts: DecodeOptions, log: Log) -> dict[str, Any]:
    """The target's cost curve on ``backend``, measured after the runs (or the online estimate
    with ``--no-curve``)."""
    if opts.measure_curve:
        log(f"measuring the cost curve of {target.name} on {backend} ...")
        curve = measure_cost_curve(
            target, opts.curve_ks, opts.curve_repeats, opts.curve_prefix, progress=opts.progress
        )
        curve["source"] = "measured after the decode runs"
        return curve
    ratios = target.cost.curve(list(opts.curve_ks))
    return {
        "model": target.name,
        "backend": backend,
        "prefix": None,
        "source": "online estimate (backend.cost) after the decode runs",
        "ratios": ratios,
        "rows": [{"k": k, "ms": None, "ratio": v, "per_token_ms": None} for k, v in ratios.items()],
    }


def _decode_result(
    header: dict[str, Any],
    records: list[dict[str, Any]],
    divergences: list[dict[str, Any]],
    curves: dict[str, Any],
    notes: list[str],
    cold: bool,
    opts: DecodeOptions,
) -> dict[str, Any]:
    """The result: summary rows, ceilings, divergences, bugs (said loudly), curves, records."""
    summary, ceilings = summarize(records, curves)
    bugs = [d for d in divergences if d.get("verdict") == "bug"]
    for row in summary:  # labels for plots
        row.setdefault("label", row["method"])
    result = {
        "header": header,
        "summary": summary,
        "ceilings": ceilings,
        "divergences": divergences,
        "bugs": bugs,
        "cost_curves": curves,
        "records": records,
        "notes": notes,
    }
    if cold:
        result["cold_vs_warm"] = cold_vs_warm(summary)
        notes.append(
            "cold: a fresh process and drafter per (method, prompt), timed from the generation call "
            "(model loading excluded); speedups of cold methods are over `ar` run cold the same way; "
            "+knowledge runs load and save the drafter's knowledge in a directory private to this "
            "benchmark, seeded by one warm-up process"
        )
    if bugs:
        report.loud(
            [f"{len(bugs)} divergence(s) from AR at a clear logit gap (>= {opts.near_tie}): BUG"]
            + [
                f"{b['set']}/{b['prompt_id']} {b['method']}[{b['backend']}] at token {b['position']}: "
                f"gap {b['gap_top2']:.3f}"
                for b in bugs[:20]
            ]
        )
    return result


def _check_exactness(
    by_key: Mapping[str, dict[str, Any]],
    row: Mapping[str, Any],
    targets: Mapping[str, Backend],
    opts: DecodeOptions,
) -> list[dict[str, Any]]:
    """Compare every output with ``ar`` of its backend; analyse the first divergent token."""
    found: list[dict[str, Any]] = []
    for rec in by_key.values():
        base = by_key.get(f"{BASELINE.get(rec['backend'], 'ar')}@{rec['backend']}")
        if rec.get("method") == BASELINE.get(rec["backend"]) or "token_ids" not in rec:
            continue
        if base is None or "token_ids" not in base:
            continue
        ref, out = base["token_ids"], rec["token_ids"]
        pos = first_divergence(ref, out)
        rec["identical"] = pos is None
        if pos is None:
            continue
        rec["first_divergence"] = pos
        d: dict[str, Any] = {
            "set": rec["set"],
            "prompt_id": rec["prompt_id"],
            "method": rec["method"],
            "backend": rec["backend"],
            "position": pos,
            "ref_token": ref[pos] if pos < len(ref) else None,
            "method_token": out[pos] if pos < len(out) else None,
        }
        real = base_backend(rec["backend"])
        if opts.gap_check and real in targets:
            try:
                g = ar_logit_gap(targets[real], row["ids"][real], ref, pos, d["method_token"])
                d.update(g)
                d["verdict"] = "near-tie" if g["gap_top2"] < opts.near_tie else "bug"
                if d["verdict"] == "bug":
                    report.loud(
                        [
                            f"BUG: {rec['key']} diverges from AR on {rec['set']}/{rec['prompt_id']} at token "
                            f"{pos} where the AR top-2 logit gap is {g['gap_top2']:.3f} "
                            f"(ar token {d['ref_token']}, method token {d['method_token']})"
                        ]
                    )
            except Exception as e:  # noqa: BLE001
                d["verdict"] = "unknown"
                d["error"] = f"{type(e).__name__}: {e}"
        else:
            d["verdict"] = "unknown"
        rec["divergence"] = {k: v for k, v in d.items() if k not in ("set", "prompt_id", "method", "backend")}
        found.append(d)
    return found


def _run_vllm(
    methods: Sequence[Method],
    prompts: Mapping[str, list[dict[str, Any]]],
    targets: Mapping[str, Backend],
    opts: DecodeOptions,
    log: Log,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    backend0 = next(iter(targets))
    items = [(f"{s}\t{r['id']}", r["ids"][backend0]) for s, rows in prompts.items() for r in rows]
    # the warm-up prompt of the other methods, not a benchmark prompt (see VllmPeer.run_all)
    warm = []
    if opts.warmup:
        warm.append(targets[backend0].tokenizer.chat([{"role": "user", "content": WARMUP_PROMPT}]))
    meta = {f"{s}\t{r['id']}": (s, r) for s, rows in prompts.items() for r in rows}
    records: list[dict[str, Any]] = []
    facts: dict[str, Any] = {}
    for m in methods:
        log(f"running {m.name} (vLLM subprocess; engine start takes minutes) ...")
        try:
            outs, facts[m.name] = m.runner.run_all(
                items, opts.max_tokens, log, warmup=warm, warmup_tokens=min(16, opts.max_tokens)
            )
        except Exception as e:  # noqa: BLE001
            facts[m.name] = {"error": f"{type(e).__name__}: {e}"}
            log(f"warning: {m.name} failed: {facts[m.name]['error'][-800:]}")
            continue
        for key, (s, r) in meta.items():
            o = outs.get(key)
            rec: dict[str, Any] = peer_record(o) if o is not None else {"error": "no output"}
            rec.update(
                set=s,
                prompt_id=r["id"],
                method=m.name,
                backend="vllm",
                key=m.key,
                label=m.name,
                prompt_tokens=len(r["ids"][backend0]),
            )
            if "token_ids" in rec:
                rec["new_tokens"] = len(rec["token_ids"])
                rec["e2e_tps"] = rec["new_tokens"] / rec["wall_s"] if rec["wall_s"] > 0 else None
            records.append(rec)
    return records, facts


def _check_vllm_exactness(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    base = {(r["set"], r["prompt_id"]): r for r in records if r["method"] == "vllm-ar" and "token_ids" in r}
    found = []
    for r in records:
        b = base.get((r["set"], r["prompt_id"]))
        if r["method"] == "vllm-ar" or b is None or "token_ids" not in r:
            continue
        pos = first_divergence(b["token_ids"], r["token_ids"])
        r["identical"] = pos is None
        if pos is not None:
            r["first_divergence"] = pos
            found.append(
                {
                    "set": r["set"],
                    "prompt_id": r["prompt_id"],
                    "method": r["method"],
                    "backend": "vllm",
                    "position": pos,
                    "verdict": "unknown",
                }
            )
    return found


# ------------------------------------------------------------------------------------ cold runs
#: suffix of a cold method that loads and saves saved knowledge
COLD_KNOWLEDGE = "+knowledge"
#: suffix of the backend label of cold runs
COLD_BACKEND = "/cold"


def base_backend(backend: str) -> str:
    """The backend a (possibly cold) record ran on: ``llamacpp/cold`` -> ``llamacpp``."""
    return backend.split("/", 1)[0]


def _cold_methods(local: Sequence[Method]) -> list[Method]:
    """Every local method once more cold (backend ``<b>/cold``, its own ``ar`` the baseline), and
    our drafters a third time cold with saved knowledge (``<name>+knowledge``)."""
    out: list[Method] = []
    for m in local:
        info = {**m.info, "backend": m.backend, "base": m.name, "knowledge": False}
        out.append(Method(m.name, m.backend + COLD_BACKEND, "cold", None, info))
        if m.kind == "ours" and method_base(m.name) != "ar":
            info = {**info, "knowledge": True}
            out.append(Method(m.name + COLD_KNOWLEDGE, m.backend + COLD_BACKEND, "cold", None, info))
    return out


def _cold_record(
    m: Method, ids: Sequence[int], max_tokens: int, opts: DecodeOptions, knowledge_root: Path | None
) -> dict[str, Any]:
    job: dict[str, Any] = {
        "target": opts.target,
        "backend": m.info["backend"],
        "method": method_base(m.info["base"]),
        "prompt_ids": [int(t) for t in ids],
        "max_tokens": max_tokens,
        "max_draft": opts.max_draft,
        "datastore": opts.datastore,
    }
    if m.info.get("knowledge") and knowledge_root is not None:
        job["knowledge_dir"] = str(knowledge_root / m.info["base"].replace("#", "_"))
    return run_cold(job, opts.cold_timeout_s)


def cold_vs_warm(summary: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per set and method: the warm speedup and the cold ones (decode speedup where known,
    else end-to-end), and the cold/warm ratio of the speedups."""
    warm = {(r["set"], r["method"], r["backend"]): r for r in summary if COLD_BACKEND not in r["backend"]}
    rows = []
    for r in summary:
        if COLD_BACKEND not in r["backend"] or r["method"] == "ar":
            continue
        base = r["method"].split(COLD_KNOWLEDGE)[0]
        w = warm.get((r["set"], base, base_backend(r["backend"])))
        if w is None:
            continue
        col = "decode_speedup" if r.get("decode_speedup") and w.get("decode_speedup") else "speedup"
        ws, cs = w.get(col), r.get(col)
        rows.append(
            {
                "set": r["set"],
                "method": base,
                "knowledge": r["method"].endswith(COLD_KNOWLEDGE),
                "measure": col,
                "warm": ws,
                "cold": cs,
                "cold_of_warm": cs / ws if ws and cs else None,
                "cold_gain_of_warm_gain": (cs - 1) / (ws - 1) if ws and cs and ws > 1.0 else None,
            }
        )
    return rows


# ------------------------------------------------------------------------------------ summary
def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 and num > 0 else None


def summarize(
    records: Sequence[Mapping[str, Any]], curves: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per (set, method) rows of the decode benchmark, and the α = 1 ceiling per backend."""
    curve_fns = {b: CostCurve(c["ratios"]) for b, c in curves.items() if c.get("ratios")}
    for r in records:  # cold runs of a backend are bounded by its curve
        if base_backend(r["backend"]) in curve_fns:
            curve_fns.setdefault(r["backend"], curve_fns[base_backend(r["backend"])])
    ceilings = {}
    for b, c in curves.items():
        if b in curve_fns and c.get("ratios"):
            max_k = max(int(k) for k in c["ratios"]) - 1
            s, k = alpha_bound(1.0, curve_fns[b], max(1, max_k))
            ceilings[b] = {"speedup": s, "k": k}
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["set"], r["key"]), []).append(r)
    index = {(r["set"], r["key"], r["prompt_id"]): r for r in records}
    rows = [_summary_row(recs, index, curve_fns) for recs in groups.values()]
    order = {m: i for i, m in enumerate(OUR_METHODS + TALON_METHODS + ALL_METHODS[len(OUR_METHODS) :])}
    backends_order = {"llamacpp": 0, "hf": 1, "vllm": 2}
    rows.sort(
        key=lambda r: (
            list(dict.fromkeys(x["set"] for x in records)).index(r["set"]),
            backends_order.get(r["backend"], 9),
            r["backend"],
            order.get(r["method"].split(COLD_KNOWLEDGE)[0], 99),
            r["method"],
        )
    )
    for r in rows:
        for k, v in list(r.items()):
            if isinstance(v, float) and not math.isfinite(v):
                r[k] = None
    return rows, ceilings


def _summary_row(
    recs: Sequence[Mapping[str, Any]],
    index: Mapping[tuple[str, str, str], Mapping[str, Any]],
    curve_fns: Mapping[str, CostCurve],
) -> dict[str, Any]:
    """The summary row of one (set, method)'s records: throughput, speedups over the baseline,
    τ, acceptance, the cost-curve bounds and exactness."""
    first = recs[0]
    set_name, backend = first["set"], first["backend"]
    ok = [r for r in recs if "token_ids" in r]
    row: dict[str, Any] = {
        "set": set_name,
        "method": first["method"],
        "backend": backend,
        "key": first["key"],
        "label": first.get("label", first["method"]),
        "prompts": len(ok),
        "errors": len(recs) - len(ok),
    }
    tokens = sum(r["new_tokens"] for r in ok)
    wall = sum(r["wall_s"] for r in ok)
    row["new_tokens"] = tokens
    row["wall_s"] = wall
    row["e2e_tps"] = _ratio(tokens, wall)
    # speedup over the baseline on the prompts both completed
    base_key = f"{BASELINE.get(backend, 'ar')}@{backend}"
    pairs = [(r, index.get((set_name, base_key, r["prompt_id"]))) for r in ok]
    _speedups(row, [(r, b) for r, b in pairs if b is not None and "token_ids" in b])
    fw = [r.get("target_forwards") for r in ok]
    if ok and all(f for f in fw):
        row["tau"] = tokens / sum(fw)  # type: ignore[arg-type]
    drafted = sum(r.get("drafted") or 0 for r in ok)
    if drafted:
        row["acceptance_rate"] = sum(r.get("accepted") or 0 for r in ok) / drafted
    elif any("num_draft_tokens" in r for r in ok):
        nd = sum(r.get("num_draft_tokens") or 0 for r in ok)
        row["acceptance_rate"] = sum(r.get("num_accepted_tokens") or 0 for r in ok) / nd if nd else None
    steps = [s for r in ok for s in r.get("steps", [])]
    if steps:
        row["alpha"] = alpha_hat(steps)
        _bounds(row, steps, curve_fns.get(backend))
    _exactness_counts(row, [r for r in ok if "identical" in r])
    return row


def _speedups(row: dict[str, Any], pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> None:
    """End-to-end (and, where both timed it, decode-only) throughput of the method over the
    baseline's, summed over the (method, baseline) record pairs."""
    if not pairs:
        return
    tps_m = _ratio(sum(r["new_tokens"] for r, _ in pairs), sum(r["wall_s"] for r, _ in pairs))
    tps_b = _ratio(sum(b["new_tokens"] for _, b in pairs), sum(b["wall_s"] for _, b in pairs))
    row["speedup"] = tps_m / tps_b if tps_m and tps_b else None
    # the house ratio: per prompt, the method's tok/s over the baseline's
    row["speedup_paired"] = paired_ratio(
        [_ratio(b["new_tokens"], b["wall_s"]) or 0.0 for _, b in pairs],
        [_ratio(r["new_tokens"], r["wall_s"]) or 0.0 for r, _ in pairs],
        p90=True,
    )
    if all("decode_s" in r for r, _ in pairs) and all("decode_s" in b for _, b in pairs):
        dm = _ratio(sum(r["new_tokens"] for r, _ in pairs), sum(r["decode_s"] for r, _ in pairs))
        db = _ratio(sum(b["new_tokens"] for _, b in pairs), sum(b["decode_s"] for _, b in pairs))
        row["decode_speedup"] = dm / db if dm and db else None
        row["decode_speedup_paired"] = paired_ratio(
            [_ratio(b["new_tokens"], b["decode_s"]) or 0.0 for _, b in pairs],
            [_ratio(r["new_tokens"], r["decode_s"]) or 0.0 for r, _ in pairs],
            p90=True,
        )


def _bounds(row: dict[str, Any], steps: Sequence[Any], fn: CostCurve | None) -> None:
    """The free-draft bound of the draft/accept trace and the α-bound under the cost curve."""
    if fn is None:
        return
    row["bound_trace"] = trace_bound(steps, fn)
    if row["alpha"] is not None:
        max_k = max((d for d, _ in steps), default=1)
        row["bound_alpha"], row["bound_alpha_k"] = alpha_bound(row["alpha"], fn, max(1, max_k, 32))
    if row.get("decode_speedup") and row.get("bound_trace"):
        row["efficiency"] = row["decode_speedup"] / row["bound_trace"]


def _exactness_counts(row: dict[str, Any], compared: Sequence[Mapping[str, Any]]) -> None:
    """Outputs compared with the baseline's: identical ones, near-tie flips, bugs, unknown."""
    if not compared:
        return
    row["compared"] = len(compared)
    row["identical"] = sum(1 for r in compared if r["identical"])
    divs = [r.get("divergence", {}) for r in compared if not r["identical"]]
    row["near_tie"] = sum(1 for d in divs if d.get("verdict") == "near-tie")
    row["bugs"] = sum(1 for d in divs if d.get("verdict") == "bug")
    row["unknown_divergences"] = sum(1 for d in divs if d.get("verdict") not in ("near-tie", "bug"))
    pos = [r["first_divergence"] for r in compared if "first_divergence" in r]
    if pos:
        row["first_divergence_median"] = statistics.median(pos)


def write_decode_outputs(
    result: Mapping[str, Any], out: Path, tag: str, plot: bool = True
) -> dict[str, Path]:
    """Write ``decode-<tag>.json``, ``.md`` and (with ``plot``) ``.png`` into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": report.write_json(out / f"decode-{tag}.json", result),
    }
    md = out / f"decode-{tag}.md"
    md.write_text(decode_markdown(result))
    paths["md"] = md
    if plot and result["summary"]:
        paths["png"] = report.plot_speedups(
            out / f"decode-{tag}.png",
            result["summary"],
            f"speedup vs AR: {result['header']['target']} ({', '.join(result['header']['backends'])})",
        )
    return paths


# ------------------------------------------------------------------------------------ report
SUMMARY_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("method", "method", 0),
    ("backend", "backend", 0),
    ("prompts", "prompts", 0),
    ("new_tokens", "tokens", 0),
    ("e2e_tps", "e2e tok/s", 1),
    ("speedup", "speedup vs ar", 2),
    ("decode_speedup", "decode speedup", 2),
    ("paired_cell", "per prompt: median [95 % CI] (gm)", 0),
    ("tau", "τ", 2),
    ("acceptance_rate", "accept", 2),
    ("alpha", "α̂", 2),
    ("bound_trace", "free-draft bound", 2),
    ("efficiency", "of bound", 2),
    ("bound_alpha", "α-bound", 2),
    ("bound_alpha_k", "k*", 0),
    ("identical", "identical", 0),
    ("near_tie", "near-tie flips", 0),
    ("bugs", "BUGS", 0),
)


def _identical_cell(row: Mapping[str, Any]) -> str:
    if row.get("identical") is None:
        return "–"
    return f"{row['identical']}/{row['compared']}"


def peer_comparison(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line: our fastest method's e2e tok/s over each peer's, within one set of one run.

    Peers of every backend count (llama-cpp-python, transformers, vLLM): the rows of one run saw
    the same prompts, so single-stream throughputs compare directly across engines.
    """
    ours_names = set(OUR_METHODS) | set(TALON_METHODS)
    rows = [r for r in rows if "/cold" not in r["backend"]]  # cold runs have their own table
    ours = [r for r in rows if r["method"] in ours_names and r.get("e2e_tps")]
    peers = [r for r in rows if r["method"] not in ours_names and r.get("e2e_tps")]
    if not ours or not peers:
        return ""
    best = max(ours, key=lambda r: r["e2e_tps"])

    def name(r: Mapping[str, Any]) -> str:
        return f"`{r['method']}` [{r['backend']}]"

    parts = []
    for r in sorted(peers, key=lambda r: -r["e2e_tps"]):
        note = f", {r['prompts']} of {best['prompts']} prompts" if r["prompts"] != best["prompts"] else ""
        parts.append(f"{name(r)} {r['e2e_tps']:.2f} ({best['e2e_tps'] / r['e2e_tps']:.2f}×{note})")
    return (
        f"Single-stream e2e tok/s, our fastest {name(best)} {best['e2e_tps']:.2f} over each peer: "
        + "; ".join(parts)
        + "."
    )


def decode_markdown(result: Mapping[str, Any]) -> str:
    """The Markdown report of a decode benchmark (header, command, one table per set)."""
    lines = report.markdown_preamble(
        f"speclive decode benchmark: {result['header'].get('tag')}", result["header"]
    )
    lines += [
        "Columns: *e2e tok/s* = new tokens / wall time of the whole call (prefill included, same for "
        "every method and peer); *speedup* = e2e throughput over `ar` of the same backend on the same "
        "prompts (the ratio of summed times when the outputs have equal length); *decode speedup* "
        "excludes prefill (our loop only); *τ* = tokens per target forward; *α̂* = per-token "
        "acceptance estimate; *free-draft bound* = speedup the same draft/accept trace would give if "
        "drafting were free and verification cost followed the measured cost curve; *of bound* = "
        "decode speedup / that bound; *α-bound* = best speedup of a free chain drafter with "
        "acceptance α̂ at the optimal fixed length k*; *identical* = prompts whose output is "
        "token-identical to `ar`; *per prompt* = the method's tok/s over `ar`'s on each prompt (decode "
        "tok/s where both timed decoding, else e2e): the median of those ratios, its 95 % bootstrap "
        "interval and geometric mean (the speedup columns are ratios of summed throughput); "
        f"a divergence at a reference top-2 logit gap < {report.NEAR_TIE_GAP} is a "
        "near-tie flip, larger gaps are BUGS.",
        "",
    ]
    bounds = result.get("ceilings", {})
    if bounds:
        lines.append(
            "Ceiling (perfect acceptance, free drafting, measured cost curve): "
            + ", ".join(f"{b}: {c['speedup']:.2f}× at k={c['k']}" for b, c in bounds.items())
        )
        lines.append("")
    by_set: dict[str, list[dict]] = {}
    for row in result["summary"]:
        by_set.setdefault(row["set"], []).append(dict(row))
    for name, rows in by_set.items():
        for r in rows:
            r["identical"] = _identical_cell(r)
            r["paired_cell"] = ratio_text(r.get("decode_speedup_paired") or r.get("speedup_paired"))
        lines += [f"## {name}", "", report.md_table(SUMMARY_COLUMNS, rows), ""]
        versus = peer_comparison(rows)
        if versus:
            lines += [versus, ""]
    lines += _cold_vs_warm_lines(result.get("cold_vs_warm"))
    lines += _bug_lines(result.get("bugs", []))
    lines += _curve_lines(result.get("cost_curves", {}))
    if result.get("notes"):
        lines += ["## notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(lines)


COLD_VS_WARM_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("set", "set", 0),
    ("method", "method", 0),
    ("knowledge", "saved knowledge", 0),
    ("measure", "measure", 0),
    ("warm", "warm", 2),
    ("cold", "cold", 2),
    ("cold_of_warm", "cold/warm", 2),
    ("cold_gain_of_warm_gain", "gain kept", 2),
)


def _cold_vs_warm_lines(cvw: Sequence[Mapping[str, Any]] | None) -> list[str]:
    if not cvw:
        return []
    return [
        "## cold vs warm",
        "",
        "*warm*: one drafter per method across the prompt set (the tables above); *cold*: a fresh "
        "process and drafter per prompt, its speedup over `ar` run the same way; *+knowledge*: "
        "cold, loading what earlier cold processes saved (`speclive knowledge`); *cold/warm*: "
        "ratio of the speedups; *gain kept*: (cold − 1) / (warm − 1). Decode speedups where "
        "measured, end-to-end ones for peers.",
        "",
        report.md_table(
            COLD_VS_WARM_COLUMNS, [{**r, "knowledge": "yes" if r["knowledge"] else "no"} for r in cvw]
        ),
        "",
    ]


def _bug_lines(bugs: Sequence[Mapping[str, Any]]) -> list[str]:
    if not bugs:
        return []
    lines = ["## BUGS: divergences from AR at a clear logit gap", ""]
    for b in bugs:
        lines.append(
            f"- {b['set']}/{b['prompt_id']} {b['method']}[{b['backend']}]: first divergence at token "
            f"{b['position']}, reference gap {b['gap_top2']:.3f} (ar token {b['ref_token']}, "
            f"method token {b['method_token']})"
        )
    return [*lines, ""]


def _curve_lines(curves: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    for backend, curve in curves.items():
        rows = curve.get("rows", [])
        if rows:
            lines += [
                f"## cost curve: {curve.get('model')} on {backend} (prefix {curve.get('prefix')})",
                "",
                report.md_table(CURVE_COLUMNS, rows),
                "",
            ]
    return lines
