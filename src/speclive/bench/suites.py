"""The measurements behind ``speclive bench``: verification cost curves and decode comparisons.

``measure_cost_curve`` times one ``extend`` of k new tokens after a fixed prefix (the shape of a
verification pass), truncating back after each, and reports the median t(k) and t(k)/t(1).

``run_decode_bench`` runs every method side by side in one process: for each prompt set and
prompt, every method (our loop with each drafter, and the peers of ``speclive.bench.peers``)
generates greedily from the same prompt ids, in an order rotated per prompt so that drift of
the machine affects all methods alike. Per (set, method) it reports end-to-end throughput,
speedup over ``ar`` (our loop without a drafter) on the same backend, τ, acceptance, exactness
against ``ar`` (with the reference top-2 logit gap at the first divergent token: a small gap is
a near-tie flip of the quantized kernels, a large one is a bug), and how close each drafter
gets to what a *free* drafter could achieve under the measured cost curve.

Bounds (decode only, prefill excluded), with r(k) = t(k)/t(1) the measured cost curve:

- *free-draft bound* of a run: the same draft/accept trace with drafting free,
  ``Σ(accepted_i + 1) / Σ r(drafted_i + 1)`` over its verification steps;
- *α-bound*: the best speedup of a free chain drafter whose tokens are accepted independently
  with probability α̂ (estimated from the trace), ``max_k (1 - α^(k+1)) / (1 - α) / r(k + 1)``;
- *ceiling*: the α-bound at α = 1 (every draft accepted).
"""

from __future__ import annotations

import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from speclive.backends.base import Backend, common_prefix_len
from speclive.bench import report
from speclive.bench.peers import (
    LLAMACPP_PLD,
    VLLM_METHODS,
    HFGeneratePeer,
    LlamaCppPythonPeer,
    LlamaPromptLookupPeer,
    Peer,
    PeerOutput,
    VllmPeer,
    vllm_python,
)

SETS: tuple[str, ...] = ("code-edit", "humaneval", "mtbench")
OUR_METHODS: tuple[str, ...] = ("ar", "ngram", "model", "crossvocab")
LLAMACPP_PEERS: tuple[str, ...] = ("llama-cpp-python", *LLAMACPP_PLD)
HF_PEERS: tuple[str, ...] = ("hf-generate", "hf-assisted", "hf-assisted-crossvocab", "hf-prompt-lookup")
VLLM_PEERS: tuple[str, ...] = tuple(VLLM_METHODS)
ALL_METHODS: tuple[str, ...] = OUR_METHODS + LLAMACPP_PEERS + HF_PEERS + VLLM_PEERS
#: Talon drafters (``bench talon``; also accepted by ``bench decode --methods``)
TALON_METHODS: tuple[str, ...] = ("suffix", "hybrid", "hybrid-async")
#: the AR reference of each backend kind
BASELINE = {"llamacpp": "ar", "hf": "ar", "vllm": "vllm-ar"}

DEFAULT_CURVE_KS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)
WARMUP_PROMPT = "Write a Python function that returns the sum of two numbers."

HUMANEVAL_TEMPLATE = (
    "Complete the following Python function. Reply with the complete function in a single "
    "```python code block.\n\n```python\n{prompt}```"
)

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ prompts
def _spread(n: int, limit: int | None) -> list[int]:
    """``limit`` indices spread evenly over ``range(n)`` (all of them without a limit)."""
    if limit is None or limit >= n:
        return list(range(n))
    return [i * n // limit for i in range(max(0, limit))]


def load_prompts(name: str, limit: int | None = None) -> list[dict[str, str]]:
    """Prompts of one set as ``{"id", "text"}`` (user message text), spread over the set."""
    from speclive.bench import datasets

    if name == "code-edit":
        rows = [{"id": r["id"], "text": r["prompt"]} for r in datasets.code_edit_prompts(30)]
    elif name == "humaneval":
        rows = [
            {"id": r["task_id"], "text": HUMANEVAL_TEMPLATE.format(prompt=r["prompt"])}
            for r in datasets.humaneval_problems()
        ]
    elif name == "mtbench":
        rows = [
            {"id": f"mtbench-{r['id']}-{r['category']}", "text": r["prompt"]}
            for r in datasets.mtbench_questions()
        ]
    elif name == "chat-heldout":
        from speclive.bench.talon import chat_heldout_prompts

        return chat_heldout_prompts(limit)
    else:
        raise ValueError(f"unknown prompt set {name!r}; known: {', '.join(SETS)}")
    return [rows[i] for i in _spread(len(rows), limit)]


# ------------------------------------------------------------------------------------ cost curve
def curve_tokens(backend: Backend, n: int) -> list[int]:
    """``n`` deterministic token ids of ordinary code text for timing (content barely matters)."""
    lines = [f"def f{i}(x, y):\n    return x * {i} + y - {i * i}  # step {i}\n" for i in range(4 * n)]
    ids = backend.tokenizer.encode("".join(lines))
    if len(ids) < n:
        raise ValueError(f"could not build {n} timing tokens")
    return ids[:n]


def measure_cost_curve(
    backend: Backend,
    ks: Sequence[int] = DEFAULT_CURVE_KS,
    repeats: int = 5,
    prefix: int = 256,
    warmup: int = 1,
    progress: bool = False,
) -> dict[str, Any]:
    """Median time of one ``extend`` of k tokens after ``prefix`` tokens, for every k in ``ks``.

    Repeats are interleaved over k (k loop inside the repeat loop) so slow drift of the machine
    spreads over all k. Returns ``{"rows": [{"k", "ms", "ratio", "per_token_ms", "samples_ms"}],
    "ratios": {k: t(k)/t(1)}, ...}``.
    """
    ks = sorted({int(k) for k in ks} | {1})
    if ks[0] < 1:
        raise ValueError("k must be >= 1")
    if prefix + ks[-1] > backend.n_ctx:
        raise ValueError(f"prefix {prefix} + k {ks[-1]} exceeds the context of {backend.n_ctx} tokens")
    tokens = curve_tokens(backend, prefix + ks[-1])
    state = backend.new_state()
    samples: dict[int, list[float]] = {k: [] for k in ks}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=(warmup + repeats) * len(ks), desc=f"cost curve {backend.name}", file=sys.stderr)
    try:
        if prefix:
            backend.extend(state, tokens[:prefix], last_only=True)
        for r in range(warmup + repeats):
            for k in ks:
                t0 = time.perf_counter()
                backend.extend(state, tokens[prefix : prefix + k])
                dt = time.perf_counter() - t0
                backend.truncate(state, prefix)
                if r >= warmup:
                    samples[k].append(dt)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        backend.release(state)
    med = {k: statistics.median(v) for k, v in samples.items()}
    rows = [
        {
            "k": k,
            "ms": 1000 * med[k],
            "ratio": med[k] / med[1],
            "per_token_ms": 1000 * med[k] / k,
            "samples_ms": [1000 * s for s in samples[k]],
        }
        for k in ks
    ]
    return {
        "model": backend.name,
        "backend": backend.kind,
        "prefix": prefix,
        "repeats": repeats,
        "rows": rows,
        "ratios": {k: med[k] / med[1] for k in ks},
        "t1_ms": 1000 * med[1],
    }


class CostCurve:
    """r(k) = t(k)/t(1) from measured points: linear interpolation, linear extrapolation beyond."""

    def __init__(self, ratios: Mapping[int, float]):
        pts = sorted((int(k), float(v)) for k, v in ratios.items())
        if not pts:
            raise ValueError("an empty cost curve")
        self.ks = [k for k, _ in pts]
        self.rs = [v for _, v in pts]

    def __call__(self, k: float) -> float:
        ks, rs = self.ks, self.rs
        if k <= ks[0]:
            return rs[0]
        if k >= ks[-1]:
            if len(ks) == 1:
                return rs[0] * k / ks[0]
            slope = (rs[-1] - rs[-2]) / (ks[-1] - ks[-2])
            return rs[-1] + max(slope, 0.0) * (k - ks[-1])
        return float(np.interp(k, ks, rs))


def alpha_bound(alpha: float, r: Callable[[float], float], max_k: int) -> tuple[float, int]:
    """Best (speedup, k) of a free chain drafter with i.i.d. per-token acceptance ``alpha``."""
    best, best_k = 1.0 / r(1), 0
    a = min(max(alpha, 0.0), 1.0)
    for k in range(1, max_k + 1):
        tokens = (k + 1) if a >= 1.0 else (1 - a ** (k + 1)) / (1 - a)
        s = tokens / r(k + 1)
        if s > best:
            best, best_k = s, k
    return best, best_k


def trace_bound(steps: Sequence[Sequence[int]], r: Callable[[float], float]) -> float | None:
    """Speedup of a draft/accept trace ``[(drafted, accepted), ...]`` if drafting were free."""
    if not steps:
        return None
    cost = sum(r(d + 1) for d, _ in steps)
    return sum(a + 1 for _, a in steps) / cost if cost > 0 else None


def alpha_hat(steps: Sequence[Sequence[int]]) -> float | None:
    """Per-token acceptance estimate: accepted / (accepted + steps that rejected a draft)."""
    hits = sum(a for d, a in steps if d > 0)
    misses = sum(1 for d, a in steps if d > 0 and a < d)
    return hits / (hits + misses) if hits + misses else None


# ------------------------------------------------------------------------------------ methods
@dataclass
class Method:
    """One method in a decode benchmark: our loop with a drafter, or a peer."""

    name: str
    backend: str
    kind: str  # "ours" | "peer" | "vllm"
    runner: Any = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.name}@{self.backend}"


class OurRunner:
    """speclive's ``SpeculativeDecoder`` with one drafter (kept across prompts, like a server)."""

    def __init__(
        self,
        target: Backend,
        drafter_name: str,
        max_draft: int | None = None,
        datastore: str | None = None,
        knowledge_dir: Path | None = None,
    ):
        from speclive.loader import make_drafter

        self.target = target
        self.drafter_name = drafter_name
        self.drafter = (
            None
            if drafter_name == "ar"
            else make_drafter(drafter_name, target, max_len=max_draft, datastore=datastore)
        )
        #: saved knowledge (``speclive.knowledge``) in this directory: loaded once, saved per run
        self.knowledge = None
        if knowledge_dir is not None and self.drafter is not None:
            from speclive.knowledge import KnowledgeStore

            self.knowledge = KnowledgeStore(target, self.drafter, drafter_name, directory=knowledge_dir)
            self.knowledge.load()

    def run(self, prompt_ids: Sequence[int], max_tokens: int) -> dict[str, Any]:
        from speclive.decoder import GenerationConfig, SpeculativeDecoder

        dec = SpeculativeDecoder(self.target, self.drafter)
        if self.knowledge is not None:
            dec.knowledge = self.knowledge  # loaded in __init__; saved after the generation
            dec._knowledge_loaded = True
        out: list[int] = []
        steps: list[list[int]] = []
        try:
            t0 = time.perf_counter()
            for ev in dec.generate(prompt_ids, GenerationConfig(max_tokens=max_tokens)):
                out.extend(ev.tokens)
                steps.append([ev.drafted, ev.accepted])
            wall = time.perf_counter() - t0
        finally:
            self.target.release(dec.state)
        s = dec.last_stats
        rec: dict[str, Any] = {
            "token_ids": out,
            "wall_s": wall,
            "prefill_s": s.prefill_s,
            "decode_s": max(wall - s.prefill_s, 1e-9),
            "target_forwards": s.target_forwards,
            "tau": s.mean_accepted,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance_rate": s.acceptance_rate if s.drafted else None,
            "draft_s": s.draft_s,
            "verify_s": s.verify_s,
            "finish_reason": s.finish_reason,
        }
        if self.drafter is not None:
            rec["steps"] = steps
            rec["accepted_by_source"] = dict(s.accepted_by_source)
            rec["drafted_by_source"] = dict(s.drafted_by_source)
            if hasattr(self.drafter, "async_stats"):
                rec["async"] = self.drafter.async_stats.to_dict()
        return rec

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()


class PeerRunner:
    """Adapts a ``Peer`` to the record format of ``OurRunner``."""

    def __init__(self, peer: Peer):
        self.peer = peer

    def run(self, prompt_ids: Sequence[int], max_tokens: int) -> dict[str, Any]:
        return peer_record(self.peer.generate(prompt_ids, max_tokens))

    def close(self) -> None:
        self.peer.close()


def peer_record(o: PeerOutput) -> dict[str, Any]:
    n = len(o.token_ids)
    fw = o.target_forwards
    rec: dict[str, Any] = {
        "token_ids": list(o.token_ids),
        "wall_s": o.wall_s,
        "target_forwards": fw,
        "tau": (n / fw) if fw else None,
        "finish_reason": o.finish_reason,
    }
    if o.extra:
        rec.update(o.extra)
        nd, na = o.extra.get("num_draft_tokens"), o.extra.get("num_accepted_tokens")
        if nd:
            rec["acceptance_rate"] = na / nd if na is not None else None
    return rec


# ------------------------------------------------------------------------------------ exactness
def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (a length difference counts), None if identical."""
    n = common_prefix_len(a, b)
    return None if n == len(a) == len(b) else n


def ar_logit_gap(
    backend: Backend, prompt: Sequence[int], ref: Sequence[int], position: int, other: int | None
) -> dict[str, Any]:
    """Re-run AR exactly as our loop does and read the logits that chose ``ref[position]``.

    Returns the top-2 gap there, the gap between the reference token (or the argmax when the
    reference ended) and ``other`` (the divergent token, if any), and whether the re-run still
    picks the reference token (AR reproducibility).
    """
    prompt = [int(t) for t in prompt]
    state = backend.new_state()
    try:
        if len(prompt) > 1:
            backend.extend(state, prompt[:-1], last_only=True)
        row = None
        for t in [prompt[-1], *ref[:position]]:
            row = backend.extend(state, [int(t)])[-1]
    finally:
        backend.release(state)
    assert row is not None
    order = np.argsort(row)[::-1]
    top1, top2 = int(order[0]), int(order[1])
    ref_tok = int(ref[position]) if position < len(ref) else None
    chosen = ref_tok if ref_tok is not None else top1
    out: dict[str, Any] = {
        "gap_top2": float(row[top1] - row[top2]),
        "argmax": top1,
        "second": top2,
        "ref_token": ref_tok,
        "method_token": other,
        "rerun_matches_ref": ref_tok is None or ref_tok == top1,
    }
    if other is not None and 0 <= other < len(row):
        out["gap_pair"] = float(row[chosen] - row[other])
    return out


# ------------------------------------------------------------------------------------ decode bench
@dataclass
class DecodeOptions:
    target: str = "qwen2.5-coder-1.5b-instruct"
    backends: Sequence[str] = ("llamacpp",)
    sets: Sequence[str] = SETS
    limit: int | None = None
    max_tokens: int = 128
    methods: Sequence[str] = ALL_METHODS
    out: Path = Path("benchmarks/results")
    tag: str = ""
    max_draft: int | None = None
    curve_ks: Sequence[int] = DEFAULT_CURVE_KS
    curve_repeats: int = 3
    curve_prefix: int = 256
    measure_curve: bool = True
    near_tie: float = report.NEAR_TIE_GAP
    warmup: bool = True
    gap_check: bool = True
    progress: bool = True
    plot: bool = True
    vllm_timeout_s: float = 3600.0
    vllm_k: int | None = None
    #: vLLM without torch.compile (fast start-up for checks; slower decoding than vLLM as shipped)
    vllm_eager: bool = False
    command: str = ""
    #: global suffix datastore of the suffix/hybrid drafters
    datastore: str | None = None
    #: per backend, the only methods run there (None: every method on every backend)
    backend_methods: Mapping[str, Sequence[str]] | None = None
    #: also run every local method cold: a fresh process and drafter per prompt, without and
    #: (our drafters) with saved knowledge (``speclive.bench.coldrun``)
    cold: bool = False
    cold_timeout_s: float = 900.0


def _local_runner(
    name: str, backend: str, target: Backend, ref: Any, opts: DecodeOptions, knowledge_dir: Path | None = None
) -> Any:
    """The runner of one non-vLLM method on ``backend``; a str says why it does not apply.
    ``knowledge_dir``: our drafters load and save their knowledge there (``--cold``)."""
    from speclive.loader import DEFAULT_CROSS_DRAFT, DEFAULT_DRAFT, load_backend

    if (name in LLAMACPP_PEERS and backend != "llamacpp") or (name in HF_PEERS and backend != "hf"):
        return None
    same_draft = DEFAULT_DRAFT.get(ref.name)
    cross_ok = DEFAULT_CROSS_DRAFT != ref.name
    if name in ("model", "hf-assisted", "hybrid", "hybrid-async") and same_draft is None:
        return f"no same-vocabulary default draft for {ref.name}"
    if name in ("crossvocab", "hf-assisted-crossvocab") and not cross_ok:
        return "the cross-vocabulary draft would be the target itself"
    if name in OUR_METHODS or name in TALON_METHODS:
        return OurRunner(target, name, opts.max_draft, opts.datastore, knowledge_dir)
    if name in LLAMACPP_PEERS:
        if ref.gguf is None:
            return "the target has no GGUF file"
        eos = target.tokenizer.eos_ids
        if name in LLAMACPP_PLD:
            return PeerRunner(
                LlamaPromptLookupPeer(
                    ref.gguf, eos, n_ctx=target.n_ctx, num_pred_tokens=LLAMACPP_PLD[name], name=name
                )
            )
        return PeerRunner(LlamaCppPythonPeer(ref.gguf, eos, n_ctx=target.n_ctx))
    if name in HF_PEERS:
        tok = target.tokenizer
        model = target.model  # type: ignore[attr-defined]
        kw: dict[str, Any] = {}
        if name == "hf-prompt-lookup":
            kw["prompt_lookup_num_tokens"] = 10
        elif name == "hf-assisted":
            # the same cached backend our ``model`` drafter loads (same load_backend arguments)
            kw["assistant_model"] = load_backend(same_draft, "hf", n_ctx=target.n_ctx).model
        elif name == "hf-assisted-crossvocab":
            draft = load_backend(DEFAULT_CROSS_DRAFT, "hf", n_ctx=max(target.n_ctx, 2048))
            kw.update(assistant_model=draft.model, tokenizer=tok.hf, assistant_tokenizer=draft.tokenizer.hf)
        return PeerRunner(HFGeneratePeer(name, model, tok.eos_ids, tok.hf.pad_token_id, **kw))
    return None


def _build_methods(
    opts: DecodeOptions, targets: Mapping[str, Backend], log: Log
) -> tuple[list[Method], list[str], dict[str, Any]]:
    """Instantiate every applicable method; returns (methods, skipped reasons, model facts)."""
    from speclive.loader import DEFAULT_CROSS_DRAFT, DEFAULT_DRAFT
    from speclive.models.resolve import resolve

    wanted = list(dict.fromkeys(opts.methods))
    unknown = [m for m in wanted if method_base(m) not in ALL_METHODS + TALON_METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; known: {', '.join(ALL_METHODS)}")
    if any(m in VLLM_PEERS for m in wanted) and "vllm-ar" not in wanted:
        wanted.append("vllm-ar")
    if "ar" not in wanted:
        wanted.insert(0, "ar")
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
        if getattr(t, "linear_info", None) is not None:
            models[b]["linear"] = t.linear_info  # type: ignore[attr-defined]

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
                runner = _local_runner(base, backend, target, ref, opts)
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
        py = vllm_python()
        if py is None:
            skip("vllm-*", "no vLLM venv at .venv-vllm (run benchmarks/setup_vllm.sh)")
        elif ref.gguf is None:
            skip("vllm-*", "the target has no GGUF to convert to an HF folder")
        else:
            from speclive.models.convert import hf_dir_for_gguf

            def hf_dir(name: str) -> Path:
                r = resolve(name)
                return hf_dir_for_gguf(r.gguf, r.name if r.source == "registry" else None)

            eos = next(iter(targets.values())).tokenizer.eos_ids
            try:
                model_dir = hf_dir(opts.target)
                draft_dir = hf_dir(same_draft) if same_draft and "vllm-draft" in vllm_wanted else None
            except Exception as e:  # noqa: BLE001
                skip("vllm-*", f"failed to prepare HF folders: {type(e).__name__}: {e}")
                vllm_wanted = []
            else:
                models["vllm"] = {"target": ref.name, "hf_dir": str(model_dir)}
            for m in vllm_wanted:
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
                methods.append(Method(m, "vllm", "vllm", peer, {"draft": drafts.get(m)}))
    models["drafts"] = {m.key: m.info["draft"] for m in methods if m.info.get("draft")}
    return methods, skipped, models


def method_base(name: str) -> str:
    """The method a benchmark entry runs: ``suffix#2`` is a second, independent ``suffix``
    (its own drafter and learned state), run side by side as an A/A control of timing noise."""
    return name.split("#", 1)[0]


def _rotate(items: Sequence[Method], i: int) -> list[Method]:
    if not items:
        return []
    j = i % len(items)
    return list(items[j:]) + list(items[:j])


def _label(m: Method, multi_backend: bool) -> str:
    if m.kind == "cold":
        return f"{m.name} [cold]"
    return f"{m.name} [{m.backend}]" if multi_backend and m.kind != "vllm" else m.name


def run_decode_bench(opts: DecodeOptions, log: Log = _stderr) -> dict[str, Any]:
    """Run the decode benchmark described by ``opts``; returns the full result (see module doc)."""
    from speclive.loader import load_backend

    if not opts.backends:
        raise ValueError("no backend to benchmark")
    tag = opts.tag or f"{opts.target}-{'+'.join(opts.backends)}"
    targets = {b: load_backend(opts.target, b) for b in opts.backends}
    methods, skipped, models = _build_methods(opts, targets, log)
    ours_peers = [m for m in methods if m.kind != "vllm"]
    vllm_methods = [m for m in methods if m.kind == "vllm"]
    multi = len(opts.backends) > 1
    cold_methods = _cold_methods(ours_peers) if opts.cold else []
    knowledge_root = Path(tempfile.mkdtemp(prefix="speclive-knowledge-")) if cold_methods else None

    prompts: dict[str, list[dict[str, Any]]] = {}
    for s in opts.sets:
        rows = load_prompts(s, opts.limit)
        for r in rows:
            r["ids"] = {
                b: t.tokenizer.chat([{"role": "user", "content": r["text"]}]) for b, t in targets.items()
            }
        prompts[s] = rows

    header: dict[str, Any] = {
        "tag": tag,
        "machine": report.machine_info(),
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
        "methods": [m.key for m in methods] + [m.key for m in cold_methods],
        "skipped": skipped,
        "command": opts.command,
    }
    for line in report.header_lines(header):
        log(line)

    if opts.warmup:
        log("warm-up ...")
        for m in ours_peers:
            ids = targets[m.backend].tokenizer.chat([{"role": "user", "content": WARMUP_PROMPT}])
            try:
                m.runner.run(ids, min(16, opts.max_tokens))
            except Exception as e:  # noqa: BLE001 - reported, the method is then dropped
                skipped.append(f"{m.key}: failed in warm-up: {type(e).__name__}: {e}")
                log(f"warning: {skipped[-1]}")
        dead = {s.split(":")[0] for s in skipped}
        ours_peers = [m for m in ours_peers if m.key not in dead]
        # the cold runs with knowledge start from what one warm-up process saved, as the warm
        # run's drafters start from their warm-up
        for m in cold_methods:
            if m.info.get("knowledge"):
                ids = targets[m.info["backend"]].tokenizer.chat([{"role": "user", "content": WARMUP_PROMPT}])
                try:
                    _cold_record(m, ids, min(16, opts.max_tokens), opts, knowledge_root)
                except Exception as e:  # noqa: BLE001 - the measured runs will report it
                    log(f"warning: {m.key} failed in warm-up: {e}")

    records: list[dict[str, Any]] = []
    divergences: list[dict[str, Any]] = []
    bar = None
    if opts.progress:
        from tqdm import tqdm

        total = sum(len(v) for v in prompts.values()) * (len(ours_peers) + len(cold_methods))
        bar = tqdm(total=total, desc="decode", file=sys.stderr, dynamic_ncols=True)
    i_prompt = 0
    try:
        for set_name, rows in prompts.items():
            for row in rows:
                by_key: dict[str, dict[str, Any]] = {}
                # the warm methods interleaved as always, then each cold method (one process each)
                for m in _rotate(ours_peers, i_prompt) + _rotate(cold_methods, i_prompt):
                    if bar is not None:
                        bar.set_postfix_str(f"{set_name} {row['id']} {m.key}")
                    ids = row["ids"][m.info.get("backend", m.backend)]
                    try:
                        if m.kind == "cold":
                            rec = _cold_record(m, ids, opts.max_tokens, opts, knowledge_root)
                        else:
                            rec = m.runner.run(ids, opts.max_tokens)
                    except Exception as e:  # noqa: BLE001 - recorded and counted as an error
                        rec = {"error": f"{type(e).__name__}: {e}"}
                        log(f"warning: {m.key} failed on {row['id']}: {rec['error']}")
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
                        tok = targets[m.info.get("backend", m.backend)].tokenizer
                        rec["text"] = tok.decode(rec["token_ids"])
                    by_key[m.key] = rec
                    records.append(rec)
                    if bar is not None:
                        bar.update(1)
                divergences += _check_exactness(by_key, row, targets, opts)
                i_prompt += 1
    finally:
        if bar is not None:
            bar.close()

    notes: list[str] = []
    if vllm_methods:
        notes.append(
            "vLLM methods run after the others, one engine start per method (not interleaved per prompt)"
        )
        records_v, facts = _run_vllm(vllm_methods, prompts, targets, opts, log)
        records += records_v
        header["vllm"] = facts
        for name, f in facts.items():
            if "error" in f:
                err = f["error"].strip().splitlines()
                skipped.append(f"{name}: failed: {err[-1] if err else '?'}")
        divergences += _check_vllm_exactness(records_v)

    for m in methods:
        close = getattr(m.runner, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001
                pass

    curves: dict[str, Any] = {}
    for b, target in targets.items():
        if opts.measure_curve:
            log(f"measuring the cost curve of {target.name} on {b} ...")
            curves[b] = measure_cost_curve(
                target, opts.curve_ks, opts.curve_repeats, opts.curve_prefix, progress=opts.progress
            )
            curves[b]["source"] = "measured after the decode runs"
        else:
            ratios = target.cost.curve(list(opts.curve_ks))
            curves[b] = {
                "model": target.name,
                "backend": b,
                "prefix": None,
                "source": "online estimate (backend.cost) after the decode runs",
                "ratios": ratios,
                "rows": [{"k": k, "ms": None, "ratio": v, "per_token_ms": None} for k, v in ratios.items()],
            }

    if knowledge_root is not None:
        shutil.rmtree(knowledge_root, ignore_errors=True)
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
    if cold_methods:
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
    from speclive.bench.coldrun import run_cold

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
    rows: list[dict[str, Any]] = []
    for (set_name, key), recs in groups.items():
        first = recs[0]
        backend = first["backend"]
        ok = [r for r in recs if "token_ids" in r]
        base_key = f"{BASELINE.get(backend, 'ar')}@{backend}"
        row: dict[str, Any] = {
            "set": set_name,
            "method": first["method"],
            "backend": backend,
            "key": key,
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
        pairs = [(r, index.get((set_name, base_key, r["prompt_id"]))) for r in ok]
        pairs = [(r, b) for r, b in pairs if b is not None and "token_ids" in b]
        if pairs:
            tps_m = _ratio(sum(r["new_tokens"] for r, _ in pairs), sum(r["wall_s"] for r, _ in pairs))
            tps_b = _ratio(sum(b["new_tokens"] for _, b in pairs), sum(b["wall_s"] for _, b in pairs))
            row["speedup"] = tps_m / tps_b if tps_m and tps_b else None
            if all("decode_s" in r for r, _ in pairs) and all("decode_s" in b for _, b in pairs):
                dm = _ratio(sum(r["new_tokens"] for r, _ in pairs), sum(r["decode_s"] for r, _ in pairs))
                db = _ratio(sum(b["new_tokens"] for _, b in pairs), sum(b["decode_s"] for _, b in pairs))
                row["decode_speedup"] = dm / db if dm and db else None
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
            fn = curve_fns.get(backend)
            if fn is not None:
                row["bound_trace"] = trace_bound(steps, fn)
                if row["alpha"] is not None:
                    max_k = max((d for d, _ in steps), default=1)
                    row["bound_alpha"], row["bound_alpha_k"] = alpha_bound(
                        row["alpha"], fn, max(1, max_k, 32)
                    )
                if row.get("decode_speedup") and row.get("bound_trace"):
                    row["efficiency"] = row["decode_speedup"] / row["bound_trace"]
        compared = [r for r in ok if "identical" in r]
        if compared:
            row["compared"] = len(compared)
            row["identical"] = sum(1 for r in compared if r["identical"])
            divs = [r.get("divergence", {}) for r in compared if not r["identical"]]
            row["near_tie"] = sum(1 for d in divs if d.get("verdict") == "near-tie")
            row["bugs"] = sum(1 for d in divs if d.get("verdict") == "bug")
            row["unknown_divergences"] = sum(1 for d in divs if d.get("verdict") not in ("near-tie", "bug"))
            pos = [r["first_divergence"] for r in compared if "first_divergence" in r]
            if pos:
                row["first_divergence_median"] = statistics.median(pos)
        rows.append(row)
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
    md.write_text(report.decode_markdown(result))
    paths["md"] = md
    if plot and result["summary"]:
        paths["png"] = report.plot_speedups(
            out / f"decode-{tag}.png",
            result["summary"],
            f"speedup vs AR: {result['header']['target']} ({', '.join(result['header']['backends'])})",
        )
    return paths


def write_costcurve_outputs(result: Mapping[str, Any], out: Path, plot: bool = True) -> dict[str, Path]:
    """Write ``costcurve-<model>-<backend>[-<device>].{json,md,png}`` into ``out`` (the device
    is named when it is not the CPU)."""
    out = Path(out)
    device = result.get("header", {}).get("settings", {}).get("device", "cpu")
    stem = f"costcurve-{result['model']}-{result['backend']}" + ("" if device == "cpu" else f"-{device}")
    paths = {"json": report.write_json(out / f"{stem}.json", result)}
    md = out / f"{stem}.md"
    md.write_text(report.costcurve_markdown(result))
    paths["md"] = md
    if plot:
        paths["png"] = report.plot_costcurve(
            out / f"{stem}.png", result["rows"], f"verification cost: {result['model']} ({result['backend']})"
        )
    return paths
