"""The methods of the decode benchmarks: their names, and a runner for each on one backend.

A method is our loop (``SpeculativeDecoder``) with one drafter (``OurRunner``; ``ar`` is the
loop without a drafter) or a peer of ``speclive_bench.peers`` (``PeerRunner``); vLLM peers run
in their own process (``speclive_bench.peers.VllmPeer``). ``NAME#TAG`` runs ``NAME`` again with
its own drafter and learned state (``method_base``): an A/A control of timing noise. Every
runner returns the same record: output token ids, wall time, target forwards, and for our loop
the draft/accept trace.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speclive.backends.base import Backend
from speclive.decoder import GenerationConfig, GenerationStats, SpeculativeDecoder
from speclive.drafting.asyncdraft import AsyncHybridDrafter
from speclive.knowledge import KnowledgeStore
from speclive.loader import DEFAULT_CROSS_DRAFT, DEFAULT_DRAFT, load_backend, make_drafter
from speclive_bench.peers import (
    LLAMACPP_PLD,
    VLLM_METHODS,
    HFGeneratePeer,
    LlamaCppPythonPeer,
    LlamaPromptLookupPeer,
    Peer,
    PeerOutput,
)

OUR_METHODS: tuple[str, ...] = ("ar", "ngram", "model", "crossvocab")
LLAMACPP_PEERS: tuple[str, ...] = ("llama-cpp-python", *LLAMACPP_PLD)
HF_PEERS: tuple[str, ...] = ("hf-generate", "hf-assisted", "hf-assisted-crossvocab", "hf-prompt-lookup")
VLLM_PEERS: tuple[str, ...] = tuple(VLLM_METHODS)
ALL_METHODS: tuple[str, ...] = OUR_METHODS + LLAMACPP_PEERS + HF_PEERS + VLLM_PEERS
#: Talon drafters (``bench talon``; also accepted by ``bench decode --methods``)
TALON_METHODS: tuple[str, ...] = ("suffix", "hybrid", "hybrid-async")
#: the AR reference of each backend kind
BASELINE = {"llamacpp": "ar", "hf": "ar", "vllm": "vllm-ar"}


def method_base(name: str) -> str:
    """The method a benchmark entry runs: ``suffix#2`` is a second, independent ``suffix``
    (its own drafter and learned state), run side by side as an A/A control of timing noise."""
    return name.split("#", 1)[0]


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
            self.knowledge = KnowledgeStore(target, self.drafter, drafter_name, directory=knowledge_dir)
            self.knowledge.load()

    def run(self, prompt_ids: Sequence[int], max_tokens: int) -> dict[str, Any]:
        dec = SpeculativeDecoder(self.target, self.drafter)
        if self.knowledge is not None:
            dec.knowledge = self.knowledge  # loaded in __init__; saved after the generation
            dec._knowledge_loaded = True
        out: list[int] = []
        steps: list[list[int]] = []
        s = GenerationStats()
        try:
            t0 = time.perf_counter()
            for ev in dec.generate(prompt_ids, GenerationConfig(max_tokens=max_tokens)):
                s = ev.stats
                out.extend(ev.tokens)
                steps.append([ev.drafted, ev.accepted])
            wall = time.perf_counter() - t0
        finally:
            self.target.release(dec.state)
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
            if isinstance(self.drafter, AsyncHybridDrafter):
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


def local_runner(
    name: str,
    backend: str,
    target: Backend,
    ref: Any,
    max_draft: int | None = None,
    datastore: str | None = None,
    knowledge_dir: Path | None = None,
) -> Any:
    """The runner of one non-vLLM method on ``backend`` (None where the method is of another
    backend; a str says why it does not apply). ``ref``: the target's resolved model;
    ``max_draft``/``datastore``: of our drafters; ``knowledge_dir``: our drafters load and save
    their knowledge there (``--cold``)."""

    if (name in LLAMACPP_PEERS and backend != "llamacpp") or (name in HF_PEERS and backend != "hf"):
        return None
    same_draft = DEFAULT_DRAFT.get(ref.name)
    cross_ok = DEFAULT_CROSS_DRAFT != ref.name
    if name in ("model", "hf-assisted", "hybrid", "hybrid-async") and same_draft is None:
        return f"no same-vocabulary default draft for {ref.name}"
    if name in ("crossvocab", "hf-assisted-crossvocab") and not cross_ok:
        return "the cross-vocabulary draft would be the target itself"
    if name in OUR_METHODS or name in TALON_METHODS:
        return OurRunner(target, name, max_draft, datastore, knowledge_dir)
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
