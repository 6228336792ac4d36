"""The speech-LM serving engine: continuous batching over a paged KV cache, primary-auxiliary
multi-stream sampling, the phase machine, CFG pairs, codec decode; sync core + asyncio front end.

``EngineCore.step()`` is one iteration: schedule, one batched forward for every scheduled
sequence (ragged via padding and masks), sample the requests whose members are fully cached,
append the emitted row to main and companion, retire finished requests (de-interleave + codec).
To the scheduler each request advances one row per step (the primary token); the S-1 auxiliary
codes ride along in the same row, buffered per request.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import torch

from speclive.errors import ConfigError, ContextOverflowError
from speclive.speechlm import step as steplib
from speclive.speechlm.codec import Codec
from speclive.speechlm.delay import deinterleave
from speclive.speechlm.guidance import SamplingParams
from speclive.speechlm.heads import HeadLogits
from speclive.speechlm.kvcache import PagedKVCache
from speclive.speechlm.model import SpeechModel
from speclive.speechlm.phases import Phase, PhaseState
from speclive.speechlm.scheduler import Request, Scheduler, SchedulerConfig, Sequence, Work
from speclive.speechlm.vocab import encode_text


@dataclass
class SpeechResult:
    request_id: str
    text_tokens: list[int]
    codes: torch.Tensor  #: [S, T] de-interleaved audio codes (T = 0 without audio)
    rows: list[list[int | None]]  #: delayed rows as emitted (None = pad)
    waveform: torch.Tensor | None  #: codec output, [n_samples]
    sample_rate: int | None
    phases: list[Phase]  #: the phase of every emitted step
    finish_reason: str  #: "done" | "cancelled"
    logits: list[torch.Tensor] = field(default_factory=list)  #: with ``record_logits``


@dataclass
class TextEvent:
    request_id: str
    token: int


@dataclass
class AudioEvent:
    request_id: str
    codes: list[int | None]  #: one delayed row; None = pad


@dataclass
class FinishEvent:
    request_id: str
    result: SpeechResult


Event = TextEvent | AudioEvent | FinishEvent


@dataclass
class StepStats:
    seconds: float
    n_seqs: int  #: sequences in the forward
    prefill_tokens: int  #: prompt rows computed (including recompute after preemption)
    decode_tokens: int  #: generated rows computed (one per decoding sequence)
    main_decode_tokens: int  #: of which main (user-visible) sequences


def _prompt_part(s: Sequence, n: int) -> int:
    """How many of the ``n`` rows ``s`` just computed belong to its prompt."""
    return max(0, min(s.n_prompt, s.cache.length) - (s.cache.length - n))


class EngineCore:
    """Synchronous engine: ``add_request`` / ``cancel`` / ``step``."""

    def __init__(
        self,
        model: SpeechModel,
        codec: Codec | None = None,
        config: SchedulerConfig | None = None,
        record_logits: bool = False,
    ) -> None:
        self.model, self.codec = model, codec
        self.config = config or SchedulerConfig()
        n_layers, n_heads, head_dim = model.kv_shape
        self.cache = PagedKVCache(n_layers, n_heads, head_dim, self.config.n_blocks, self.config.block_size)
        self.scheduler = Scheduler(self.config, self.cache)
        self.requests: dict[str, Request] = {}
        self.record_logits = record_logits
        self.stats: list[StepStats] = []
        self._ids = itertools.count()

    # ---------------------------------------------------------------- requests
    def add_request(
        self,
        prompt: list[list[int]],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        cond: torch.Tensor | None = None,
        null_cond: torch.Tensor | None = None,
    ) -> str:
        """Queue a request (prompt as input rows); returns its id. Never drops: it waits for room."""
        params = params or SamplingParams()
        params.validate()
        if not prompt:
            raise ConfigError("empty prompt")
        if params.mode == "text" and not self.model.has_text:
            raise ConfigError("this model has no text vocabulary: use mode='text_audio'")
        rid = request_id or f"req-{next(self._ids)}"
        if rid in self.requests:
            raise ConfigError(f"request id {rid!r} is already in use")
        extra = steplib.max_rows(self.model, params)
        null = self.model.null_prompt() if params.guided else []
        longest = max(len(prompt), len(null)) + extra
        if longest > self.model.max_positions:
            raise ContextOverflowError(
                f"prompt of {len(prompt)} rows + up to {extra} generated rows exceeds the context of "
                f"{self.model.max_positions}; shorten the prompt or lower max_text_tokens/max_audio_frames"
            )
        bs = self.config.block_size
        blocks = -(-(len(prompt) + extra) // bs) + (-(-(len(null) + extra) // bs) if null else 0)
        if blocks > self.config.n_blocks:
            raise ContextOverflowError(
                f"request needs up to {blocks} KV blocks, the pool has {self.config.n_blocks}"
            )
        slot = steplib.Slot(
            PhaseState(steplib.phase_config(self.model, params)),
            params,
            torch.Generator().manual_seed(params.seed),
        )
        main = Sequence([list(r) for r in prompt], len(prompt), cond)
        comp = None
        if params.guided:
            if null_cond is None and cond is not None:
                null_cond = torch.zeros_like(cond)
            comp = Sequence(null, len(null), null_cond)
        req = Request(rid, params, slot, main, comp)
        self.requests[rid] = req
        self.scheduler.add(req)
        return rid

    def cancel(self, request_id: str) -> SpeechResult | None:
        """Stop a request now: main and companion leave the batch and their blocks are freed."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.remove(req)
        return self._result(req, "cancelled", decode=False)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ---------------------------------------------------------------- one iteration
    def step(self) -> list[Event]:
        t0 = time.perf_counter()
        work = self.scheduler.schedule()
        if not work:
            return []
        seqs = [(s, n) for w in work for s, n in w.chunks]
        hidden = self._forward(seqs)
        for b, (s, _) in enumerate(seqs):
            s.last_hidden = hidden[b]
        events = self._sample(work)
        prefill = sum(_prompt_part(s, n) for s, n in seqs)
        total = sum(n for _, n in seqs)
        main_ids = {id(w.request.main) for w in work}
        main_dec = sum(n - _prompt_part(s, n) for s, n in seqs if id(s) in main_ids)
        self.stats.append(StepStats(time.perf_counter() - t0, len(seqs), prefill, total - prefill, main_dec))
        return events

    def _forward(self, seqs: list[tuple[Sequence, int]]) -> torch.Tensor:
        """One batched forward; returns each sequence's last new hidden state ``[B, d]``."""
        n_new = [n for _, n in seqs]
        q_max, s_width = max(n_new), self.model.n_streams
        empty = [-1] * s_width
        rows = torch.tensor(
            [s.rows[s.cache.length : s.cache.length + n] + [empty] * (q_max - n) for s, n in seqs],
            dtype=torch.long,
        )
        cond = self._batch_cond([s for s, _ in seqs])
        attn = self.cache.batch([s.cache for s, _ in seqs], n_new)
        with torch.inference_mode():
            h = self.model.backbone(self.model.embed(rows), attn, attn.positions, cond)
        return h[torch.arange(len(seqs)), torch.tensor(n_new) - 1]

    def _batch_cond(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor] | None:
        conds = [s.cond for s in seqs]
        if all(c is None for c in conds):
            return None
        d = next(c for c in conds if c is not None).shape[-1]
        n = max(0 if c is None else c.shape[0] for c in conds)
        states, mask = torch.zeros(len(seqs), n, d), torch.zeros(len(seqs), n, dtype=torch.bool)
        for b, c in enumerate(conds):
            if c is not None:
                states[b, : c.shape[0]], mask[b, : c.shape[0]] = c, True
        return states, mask

    def _sample(self, work: list[Work]) -> list[Event]:
        ready = [w.request for w in work if w.samples]
        if not ready:
            return []
        with torch.inference_mode():
            cond = self.model.heads(torch.stack([r.main.last_hidden for r in ready]))
            guided = [r for r in ready if r.companion is not None]
            uncond: HeadLogits | None = None
            if guided:
                uncond = self.model.heads(torch.stack([r.companion.last_hidden for r in guided]))
            pos = {id(r): j for j, r in enumerate(guided)}
            ems = steplib.decide(
                self.model,
                [r.slot for r in ready],
                cond,
                uncond,
                [pos.get(id(r)) for r in ready],
                keep_logits=self.record_logits,
            )
        events: list[Event] = []
        for req, em in zip(ready, ems, strict=True):
            if em.kind == "text":
                if em.token != self.model.eos:
                    req.text.append(em.token)
                    events.append(TextEvent(req.request_id, em.token))
            elif em.kind == "audio":
                req.audio_rows.append(em.codes)
                events.append(AudioEvent(req.request_id, em.codes))
            if self.record_logits and em.logits is not None:
                req.logits.append(em.logits.clone())
            row = steplib.commit(self.model, req.slot, em)
            if row is None:
                self.requests.pop(req.request_id, None)
                self.scheduler.remove(req)
                events.append(FinishEvent(req.request_id, self._result(req, "done")))
                continue
            for s in req.members:  # the sampled row goes to both members of a CFG pair
                s.rows.append(row)
        return events

    def _result(self, req: Request, reason: str, decode: bool = True) -> SpeechResult:
        s = self.model.n_streams
        codes = torch.zeros((s, 0), dtype=torch.long)
        wave = None
        complete = req.slot.state.done and req.audio_rows
        if complete:
            grid = torch.tensor([[-1 if c is None else c for c in row] for row in req.audio_rows])
            codes = deinterleave(grid, -1)
            if decode and self.codec is not None and codes.shape[1] > 0:
                wave = self.codec.decode(codes)
        return SpeechResult(
            req.request_id,
            list(req.text),
            codes,
            list(req.audio_rows),
            wave,
            self.codec.sample_rate if (self.codec is not None and wave is not None) else None,
            list(req.slot.state.log),
            reason,
            list(req.logits),
        )

    def run_all(self) -> dict[str, SpeechResult]:
        """Step until every queued request finished; returns results by id."""
        out: dict[str, SpeechResult] = {}
        while self.has_work():
            for ev in self.step():
                if isinstance(ev, FinishEvent):
                    out[ev.request_id] = ev.result
        return out


class SpeechLMEngine:
    """Asyncio front end: ``stream()`` yields a request's events as the shared loop produces them."""

    def __init__(
        self, model: SpeechModel, codec: Codec | None = None, config: SchedulerConfig | None = None
    ) -> None:
        self.core = EngineCore(model, codec, config)
        self.model = model
        self._queues: dict[str, asyncio.Queue[Event]] = {}
        self._driver: asyncio.Task | None = None

    def _prompt_rows(self, prompt: str | list[int] | list[list[int]]) -> list[list[int]]:
        if isinstance(prompt, str):
            return self.model.text_rows(encode_text(prompt))
        if prompt and isinstance(prompt[0], list):
            return prompt  # type: ignore[return-value]
        return self.model.text_rows(list(prompt))  # type: ignore[arg-type]

    def submit(
        self, prompt: str | list[int] | list[list[int]], request_id: str | None = None, **params
    ) -> str:
        """Queue a request (text, token ids or input rows); ``params`` are ``SamplingParams`` fields."""
        rid = self.core.add_request(
            self._prompt_rows(prompt), SamplingParams(**params), request_id=request_id
        )
        self._queues[rid] = asyncio.Queue()
        self._ensure_driver()
        return rid

    def _ensure_driver(self) -> None:
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())

    async def _drive(self) -> None:
        while self.core.has_work():
            for ev in self.core.step():
                q = self._queues.get(ev.request_id)
                if q is not None:
                    q.put_nowait(ev)
            await asyncio.sleep(0)  # let consumers and new submissions in between steps

    async def stream(self, prompt: str | list[int] | list[list[int]], **params) -> AsyncIterator[Event]:
        """Submit and yield ``TextEvent``/``AudioEvent``s, then one ``FinishEvent``.
        Leaving the loop early cancels the request (companion included)."""
        rid = self.submit(prompt, **params)
        q = self._queues[rid]
        try:
            while True:
                ev = await q.get()
                yield ev
                if isinstance(ev, FinishEvent):
                    return
        finally:
            self._queues.pop(rid, None)
            self.core.cancel(rid)  # no-op when finished

    async def generate(self, prompt: str | list[int] | list[list[int]], **params) -> SpeechResult:
        async for ev in self.stream(prompt, **params):
            if isinstance(ev, FinishEvent):
                return ev.result
        raise RuntimeError("stream ended without a result")

    def cancel(self, request_id: str) -> None:
        """Cancel from outside the stream: its consumer receives a cancelled ``FinishEvent``."""
        res = self.core.cancel(request_id)
        q = self._queues.get(request_id)
        if q is not None and res is not None:
            q.put_nowait(FinishEvent(request_id, res))
