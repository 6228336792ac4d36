"""The straightforward sequential reference: one request at a time, batch 1, a plain growing KV
cache per sequence (cond and, with CFG, uncond run as two separate forwards).

It shares the phase rules and the sampler with the engine (``speclive.speechlm.step``) and nothing
else, so engine == reference checks the paged cache, ragged batching, scheduling, chunked prefill,
preemption and CFG pairing. It is also the sequential baseline of ``speclive bench speechlm``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from speclive.speechlm import step as steplib
from speclive.speechlm.delay import deinterleave
from speclive.speechlm.guidance import SamplingParams
from speclive.speechlm.heads import HeadLogits
from speclive.speechlm.kvcache import ContiguousAttention
from speclive.speechlm.model import SpeechModel
from speclive.speechlm.phases import PhaseState


@dataclass
class ReferenceResult:
    text_tokens: list[int]
    rows: list[list[int | None]]
    codes: torch.Tensor
    logits: list[torch.Tensor] = field(default_factory=list)
    n_forward_rows: int = 0  #: generated rows fed back (decode tokens of the main sequence)
    n_prompt: int = 0
    prefill_s: float = 0.0  #: seconds to the first sampling step
    decode_s: float = 0.0  #: seconds of the decode loop


class _Runner:
    def __init__(self, model: SpeechModel, cond: torch.Tensor | None) -> None:
        self.model, self.attn = model, ContiguousAttention(model.kv_shape[0])
        self.cond = None if cond is None else (cond[None], torch.ones(1, cond.shape[0], dtype=torch.bool))

    def feed(self, rows: list[list[int]]) -> torch.Tensor:
        x = self.model.embed(torch.tensor([rows]))
        self.attn.advance(len(rows))
        return self.model.backbone(x, self.attn, self.attn.positions, self.cond)[0, -1]


@torch.inference_mode()
def reference_generate(
    model: SpeechModel,
    prompt: list[list[int]],
    params: SamplingParams,
    cond: torch.Tensor | None = None,
    null_cond: torch.Tensor | None = None,
) -> ReferenceResult:
    params.validate()
    t0 = time.perf_counter()
    slot = steplib.Slot(
        PhaseState(steplib.phase_config(model, params)), params, torch.Generator().manual_seed(params.seed)
    )
    main = _Runner(model, cond)
    h = main.feed(prompt)
    comp, hu = None, None
    if params.guided:
        if null_cond is None and cond is not None:
            null_cond = torch.zeros_like(cond)
        comp = _Runner(model, null_cond)
        hu = comp.feed(model.null_prompt())
    res = ReferenceResult([], [], torch.zeros(model.n_streams, 0, dtype=torch.long), n_prompt=len(prompt))
    t1 = time.perf_counter()
    res.prefill_s = t1 - t0
    while True:
        lc: HeadLogits = model.heads(h[None])
        lu = model.heads(hu[None]) if comp is not None else None
        (em,) = steplib.decide(model, [slot], lc, lu, [0 if comp is not None else None])
        if em.kind == "text" and em.token != model.eos:
            res.text_tokens.append(em.token)
        elif em.kind == "audio":
            res.rows.append(em.codes)
        if em.logits is not None:
            res.logits.append(em.logits.clone())
        row = steplib.commit(model, slot, em)
        if row is None:
            break
        h = main.feed([row])
        res.n_forward_rows += 1
        if comp is not None:
            hu = comp.feed([row])
    res.decode_s = time.perf_counter() - t1
    if slot.state.done and res.rows:
        grid = torch.tensor([[-1 if c is None else c for c in r] for r in res.rows])
        res.codes = deinterleave(grid, -1)
    return res
