"""One sampling step for a batch of requests: phase decisions, CFG merge, batched sampling.

Shared by the batched engine and the sequential reference so both apply the same rules; what they
differ in is everything that produces the logits (paging, batching, scheduling, pairing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speclive.speechlm import phases
from speclive.speechlm.guidance import SamplingParams, merge
from speclive.speechlm.heads import HeadLogits
from speclive.speechlm.model import SpeechModel
from speclive.speechlm.sampling import draw_uniforms, sample


@dataclass
class Slot:
    """A request's view for one sampling step."""

    state: phases.PhaseState
    params: SamplingParams
    gen: torch.Generator


@dataclass
class Emission:
    kind: str  #: "text" | "force" | "audio" | "finish"
    token: int | None = None  #: text or forced token
    codes: list[int | None] | None = None  #: audio: code per stream, None = pad
    logits: torch.Tensor | None = None  #: the logits the token(s) were drawn from


def decide(
    model: SpeechModel,
    slots: list[Slot],
    cond: HeadLogits,
    uncond: HeadLogits | None,
    uncond_rows: list[int | None],
    keep_logits: bool = True,
) -> list[Emission]:
    """Emissions for ``slots`` given their conditional logits (row b) and, for guided requests,
    the companion's logits (row ``uncond_rows[b]`` of ``uncond``). ``keep_logits``: attach the
    logits each emission was sampled from (for numerical comparisons)."""
    n_streams = model.n_streams
    regions = model.layout.argmax_regions(cond.primary) if model.has_text else [None] * len(slots)
    plans = [phases.plan(s.state, r) for s, r in zip(slots, regions, strict=True)]
    uniforms = [draw_uniforms(s.gen, n_streams) for s in slots]
    out: list[Emission | None] = [None] * len(slots)

    text_idx = [b for b, p in enumerate(plans) if p.kind == "text"]
    if text_idx:
        mask = model.layout.text_mask()
        logits = cond.primary[text_idx].masked_fill(~mask, float("-inf"))
        toks = sample(
            logits,
            torch.tensor([slots[b].params.temperature for b in text_idx]),
            torch.tensor([slots[b].params.top_k for b in text_idx]),
            torch.stack([uniforms[b][0] for b in text_idx]),
        ).tolist()
        for j, b in enumerate(text_idx):
            out[b] = Emission("text", token=toks[j], logits=logits[j] if keep_logits else None)

    audio_idx = [b for b, p in enumerate(plans) if p.kind == "audio"]
    if audio_idx:
        logits = cond.streams[audio_idx]  # [Na, S, K]
        guided = [j for j, b in enumerate(audio_idx) if uncond_rows[b] is not None]
        if guided:
            rows = [uncond_rows[audio_idx[j]] for j in guided]
            w = torch.tensor([slots[audio_idx[j]].params.cfg for j in guided])
            logits = logits.clone()
            logits[guided] = merge(logits[guided], uncond.streams[rows], w)
        flat = logits.reshape(-1, logits.shape[-1])
        rep = lambda vals: torch.tensor(vals).repeat_interleave(n_streams)  # noqa: E731
        codes = sample(
            flat,
            rep([slots[b].params.audio_temperature for b in audio_idx]),
            rep([slots[b].params.audio_top_k for b in audio_idx]),
            torch.cat([uniforms[b] for b in audio_idx]),
        ).view(len(audio_idx), n_streams)
        for j, (b, drawn) in enumerate(zip(audio_idx, codes.tolist(), strict=True)):
            row = [c if a else None for c, a in zip(drawn, plans[b].active, strict=True)]
            out[b] = Emission("audio", codes=row, logits=logits[j] if keep_logits else None)

    for b, p in enumerate(plans):
        if p.kind == "force":
            out[b] = Emission("force", token=p.token)
        elif p.kind == "finish":
            out[b] = Emission("finish")
    return out  # type: ignore[return-value]


def commit(model: SpeechModel, slot: Slot, em: Emission) -> list[int] | None:
    """Advance the phase machine; returns the input row to append (None when the request ended)."""
    st = slot.state
    if em.kind == "text":
        phases.commit_text(st, em.token)
        row = model.text_rows([em.token])[0]
    elif em.kind == "force":
        phases.commit_force(st)
        row = model.text_rows([em.token])[0]
    elif em.kind == "audio":
        phases.commit_audio(st)
        row = model.audio_row(em.codes)
    else:
        return None
    return None if st.done else row


def phase_config(model: SpeechModel, params: SamplingParams) -> phases.PhaseConfig:
    return phases.PhaseConfig(
        mode=params.mode,
        n_streams=model.n_streams,
        bridge=tuple(model.bridge),
        eos=model.eos,
        max_text_tokens=params.max_text_tokens,
        min_text_tokens=params.min_text_tokens,
        max_audio_frames=params.max_audio_frames,
        min_audio_frames=params.min_audio_frames,
        audio_only=not model.has_text,
    )


def max_rows(model: SpeechModel, params: SamplingParams) -> int:
    """Upper bound on the rows a request appends after its prompt (for the context check)."""
    n = params.max_text_tokens + 1
    if params.mode == "text_audio" or not model.has_text:
        n += len(model.bridge) + params.max_audio_frames + model.n_streams - 1
    return n
