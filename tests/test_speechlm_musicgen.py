"""transformers' MusicGen (tiny random ``MusicgenForCausalLM``) served by the engine, checked against
transformers' own ``generate(guidance_scale=w)`` and against a loop over its forward (conditioned CFG)."""

from __future__ import annotations

import pytest
import torch

from speclive.speechlm import EngineCore, SamplingParams, SchedulerConfig
from speclive.speechlm.kvcache import ContiguousAttention

mg = pytest.importorskip("speclive.speechlm.musicgen")


T = 8


@pytest.fixture(scope="module")
def hf():
    return mg.tiny_musicgen()


def _greedy(w, **kw) -> SamplingParams:
    return SamplingParams(cfg=w, audio_temperature=0.0, max_audio_frames=T, min_audio_frames=T, **kw)


def test_adapter_forward_is_musicgen_forward(hf):
    ad = mg.MusicgenAdapter(hf)
    cond = torch.randn(3, hf.config.hidden_size)
    rows = torch.randint(0, hf.config.vocab_size, (1, 5, ad.n_streams))
    with torch.no_grad():
        ref = hf(input_ids=rows[0].T.contiguous(), encoder_hidden_states=cond[None]).logits  # [S, L, V]
        attn = ContiguousAttention(ad.kv_shape[0]).advance(5)
        h = ad.backbone(
            ad.embed(rows), attn, attn.positions, (cond[None], torch.ones(1, 3, dtype=torch.bool))
        )
        got = ad.heads(h[0]).streams  # [L, S, V]
    assert torch.allclose(got, ref.transpose(0, 1), atol=1e-5)


def test_engine_equals_transformers_generate(hf):
    ad = mg.MusicgenAdapter(hf)
    core = EngineCore(ad, None, SchedulerConfig(n_blocks=64, block_size=4))
    ws = [None, 3.0, 1.5]
    for i, w in enumerate(ws):
        core.add_request(ad.bos_prompt(), _greedy(w), request_id=str(i))
    res = core.run_all()
    for i, w in enumerate(ws):
        assert torch.equal(res[str(i)].codes, mg.hf_generate(hf, T, w)), f"w={w}"
    assert core.cache.allocator.n_used == 0


def test_engine_conditioned_cfg_equals_forward_loop(hf):
    ad = mg.MusicgenAdapter(hf)
    core = EngineCore(ad, None, SchedulerConfig(n_blocks=64, block_size=4), record_logits=True)
    conds = [torch.randn(2 + i, hf.config.hidden_size) for i in range(3)]
    ws = [3.0, None, 2.0]
    for i, (c, w) in enumerate(zip(conds, ws, strict=True)):
        core.add_request(ad.bos_prompt(), _greedy(w), request_id=str(i), cond=c)
    res = core.run_all()
    for i, (c, w) in enumerate(zip(conds, ws, strict=True)):
        codes, logits = mg.hf_forward_loop(hf, T, w, c)
        got = res[str(i)]
        assert torch.equal(got.codes, codes), f"request {i}"
        rmse = max(float(((a - b) ** 2).mean().sqrt()) for a, b in zip(got.logits, logits, strict=True))
        assert rmse < 1e-4
    guided, plain = mg.hf_forward_loop(hf, T, 3.0, conds[0])[0], mg.hf_forward_loop(hf, T, None, conds[0])[0]
    assert not torch.equal(guided, plain)  # guidance matters here: the check is not vacuous
