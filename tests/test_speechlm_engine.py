"""The batched speech-LM engine against the sequential reference, CFG pairs, scheduling, bad input,
and the asyncio API (tiny random model, FP32)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from speclive.errors import ConfigError, ContextOverflowError
from speclive.speechlm import (
    EngineCore,
    RandomRVQDecoder,
    SamplingParams,
    SchedulerConfig,
    SpeechLM,
    SpeechLMConfig,
    SpeechLMEngine,
)
from speclive.speechlm.engine import AudioEvent, FinishEvent, TextEvent
from speclive.speechlm.reference import reference_generate
from speclive.speechlm.vocab import encode_text


@pytest.fixture(scope="module")
def model() -> SpeechLM:
    return SpeechLM(SpeechLMConfig.preset("tiny"))


def _workload(model, n: int = 8):
    out = []
    for i in range(n):
        p = SamplingParams(
            mode="text" if i % 4 == 1 else "text_audio",
            temperature=[0.0, 0.7, 1.0][i % 3],
            top_k=[0, 5][i % 2],
            audio_temperature=[1.0, 0.0, 0.8][i % 3],
            audio_top_k=[0, 10, 50][i % 3],
            cfg=[None, 3.0, 1.5][i % 3],
            max_text_tokens=3 + i % 3,
            max_audio_frames=4 + i % 5,
            min_audio_frames=2,
            seed=100 + i,
        )
        out.append((model.text_rows(encode_text(f"prompt {i} " * (1 + i % 4))), p))
    return out


def _run(model, work, cfg: SchedulerConfig, codec=None):
    core = EngineCore(model, codec, cfg, record_logits=True)
    for i, (prompt, p) in enumerate(work):
        core.add_request(prompt, p, request_id=f"r{i}")
    return core, core.run_all()


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    fin = torch.isfinite(a) & torch.isfinite(b)
    assert torch.equal(torch.isfinite(a), torch.isfinite(b))
    return float(((a[fin] - b[fin]) ** 2).mean().sqrt())


@pytest.mark.parametrize(
    "cfg",
    [
        SchedulerConfig(max_num_seqs=64, token_budget=256, n_blocks=256, block_size=4),
        # chunked prefill + a pool small enough to force preemptions
        SchedulerConfig(max_num_seqs=6, token_budget=7, n_blocks=22, block_size=4),
    ],
    ids=["roomy", "tight"],
)
def test_engine_equals_sequential_reference(model, cfg):
    work = _workload(model)
    core, res = _run(model, work, cfg)
    assert len(res) == len(work)
    rmses = []
    for i, (prompt, p) in enumerate(work):
        ref = reference_generate(model, prompt, p)
        got = res[f"r{i}"]
        assert got.text_tokens == ref.text_tokens, f"r{i} text"
        assert got.rows == ref.rows, f"r{i} audio rows"
        assert torch.equal(got.codes, ref.codes)
        assert len(got.logits) == len(ref.logits)
        rmses += [_rmse(a, b) for a, b in zip(got.logits, ref.logits, strict=True)]
    assert max(rmses) < 1e-4
    assert core.cache.allocator.n_used == 0
    kinds = [bool(r.rows) for r in res.values()]
    assert any(kinds) and not all(kinds)  # both text-only and audio answers were produced


def test_tight_pool_actually_preempts(model):
    work = _workload(model)
    core = EngineCore(model, None, SchedulerConfig(max_num_seqs=6, token_budget=7, n_blocks=22, block_size=4))
    reqs = []
    for i, (prompt, p) in enumerate(work):
        core.add_request(prompt, p, request_id=f"r{i}")
        reqs.append(core.requests[f"r{i}"])
    max_seqs = 0
    while core.has_work():
        core.step()
        max_seqs = max(max_seqs, core.scheduler.n_running_seqs())
        assert core.cache.allocator.n_used <= 22
    assert sum(r.n_preempted for r in reqs) > 0
    assert max_seqs <= 6


def test_cfg_pair_moves_together_and_merges_only_audio(model):
    prompt = model.text_rows(encode_text("guided"))
    base = dict(mode="text_audio", max_text_tokens=4, max_audio_frames=6, min_audio_frames=6, seed=7)
    trial = EngineCore(model, None, SchedulerConfig(token_budget=8, n_blocks=64, block_size=4))
    trial.add_request(prompt, SamplingParams(cfg=3.0, **base), request_id="g")
    g = trial.requests["g"]
    # the step budget is split equally between the pair: 8 tokens -> 4 each (the null prompt needs 2)
    (work,) = trial.scheduler.schedule()
    assert work.chunks == [(g.main, 4), (g.companion, len(model.null_prompt()))] and not work.samples
    core = EngineCore(model, None, SchedulerConfig(token_budget=8, n_blocks=64, block_size=4))
    core.add_request(prompt, SamplingParams(cfg=3.0, **base), request_id="g")
    core.add_request(prompt, SamplingParams(**base), request_id="p")
    g = core.requests["g"]
    res = {}
    while core.has_work():
        for ev in core.step():
            if isinstance(ev, FinishEvent):
                res[ev.request_id] = ev.result
        if "g" not in res:  # the companion got exactly the rows the main got
            assert g.main.rows[g.main.n_prompt :] == g.companion.rows[g.companion.n_prompt :]
    # the modality switch and text use conditional logits only: same as without CFG
    assert res["g"].phases == res["p"].phases
    assert res["g"].text_tokens == res["p"].text_tokens
    assert res["g"].rows != res["p"].rows  # guidance changed the audio
    assert core.cache.allocator.n_used == 0
    assert set(res) == {"g", "p"}  # the companion never surfaces


def test_waveform_from_codec(model):
    codec = RandomRVQDecoder(n_codebooks=4, codebook_size=32)
    prompt = model.text_rows(encode_text("speak"))
    work = [(prompt, SamplingParams(max_audio_frames=5, min_audio_frames=5))]
    _, res = _run(model, work, SchedulerConfig(n_blocks=64), codec)
    r = res["r0"]
    assert r.codes.shape == (4, 5) and r.waveform.shape == (5 * codec.hop,)
    assert r.sample_rate == codec.sample_rate


def test_bad_input(model):
    core = EngineCore(model, None, SchedulerConfig(n_blocks=64, block_size=4))
    prompt = model.text_rows(encode_text("x"))
    with pytest.raises(ConfigError, match="unknown mode"):
        core.add_request(prompt, SamplingParams(mode="speech"))
    for w in (0.0, -2.0):
        with pytest.raises(ConfigError, match="> 0"):
            core.add_request(prompt, SamplingParams(cfg=w))
    with pytest.raises(ContextOverflowError, match="context"):
        core.add_request(model.text_rows([65] * model.max_positions), SamplingParams())
    with pytest.raises(ContextOverflowError, match="context"):
        core.add_request(prompt, SamplingParams(max_audio_frames=model.max_positions))
    with pytest.raises(ConfigError, match="empty"):
        core.add_request([], SamplingParams())
    assert not core.has_work()


def test_cancel_mid_generation_frees_pair(model):
    core = EngineCore(model, None, SchedulerConfig(n_blocks=64, block_size=4))
    prompt = model.text_rows(encode_text("cancel me please"))
    p = SamplingParams(cfg=2.0, max_audio_frames=30, min_audio_frames=30)
    core.add_request(prompt, p, request_id="c")
    core.add_request(prompt, SamplingParams(max_audio_frames=3, min_audio_frames=3), request_id="k")
    for _ in range(5):
        core.step()
    req = core.requests["c"]
    assert req.main.cache.blocks and req.companion.cache.blocks
    res = core.cancel("c")
    assert res.finish_reason == "cancelled" and len(res.rows) > 0
    assert not req.main.cache.blocks and not req.companion.cache.blocks
    assert core.cancel("c") is None
    out = core.run_all()
    assert set(out) == {"k"}
    assert core.cache.allocator.n_used == 0


def test_more_requests_than_capacity_are_queued(model):
    cfg = SchedulerConfig(max_num_seqs=4, token_budget=64, n_blocks=256, block_size=4)
    work = _workload(model, 10)
    core = EngineCore(model, None, cfg)
    for i, (prompt, p) in enumerate(work):
        core.add_request(prompt, p, request_id=f"r{i}")
    assert len(core.scheduler.waiting) == 10
    done = set()
    while core.has_work():
        for ev in core.step():
            if isinstance(ev, FinishEvent):
                done.add(ev.request_id)
        assert core.scheduler.n_running_seqs() <= 4
    assert done == {f"r{i}" for i in range(10)}


def test_async_streaming_mixed_requests(model):
    codec = RandomRVQDecoder(n_codebooks=4, codebook_size=32)

    async def main():
        eng = SpeechLMEngine(model, codec, SchedulerConfig(n_blocks=128, block_size=4))
        events: dict[str, list] = {"t": [], "a": []}

        async def consume(name, **kw):
            async for ev in eng.stream("hello", request_id=name, **kw):
                events[name].append(ev)

        async def cancel_early():
            n = 0
            async for ev in eng.stream("stop", cfg=2.0, max_audio_frames=40, min_audio_frames=40):
                n += isinstance(ev, AudioEvent)
                if n == 3:
                    break  # leaving the stream cancels the request and its companion
            return n

        gen = eng.generate("whole", mode="text", max_text_tokens=6, temperature=0.0)
        res, _, _, n = await asyncio.gather(
            gen,
            consume("t", mode="text", max_text_tokens=5),
            consume("a", cfg=3.0, max_audio_frames=4, min_audio_frames=4),
            cancel_early(),
        )
        return eng, events, res, n

    eng, events, res, n = asyncio.run(main())
    assert n == 3
    assert len(res.text_tokens) == 6 and res.codes.shape[1] == 0
    t_ev, a_ev = events["t"], events["a"]
    assert all(isinstance(e, TextEvent) for e in t_ev[:-1]) and isinstance(t_ev[-1], FinishEvent)
    assert [e.token for e in t_ev[:-1]] == t_ev[-1].result.text_tokens
    audio = [e for e in a_ev if isinstance(e, AudioEvent)]
    fin = a_ev[-1].result
    assert len(audio) == 4 + model.n_streams - 1 and fin.waveform is not None
    assert eng.core.cache.allocator.n_used == 0 and not eng.core.has_work()


def test_text_only_request_gets_no_companion(model):
    core = EngineCore(model, None, SchedulerConfig(n_blocks=64, block_size=4))
    prompt = model.text_rows(encode_text("hi"))
    core.add_request(prompt, SamplingParams(mode="text", cfg=3.0), request_id="t")
    core.add_request(prompt, SamplingParams(mode="text_audio", cfg=3.0), request_id="a")
    assert core.requests["t"].companion is None and core.requests["a"].companion is not None
