"""Speech-LM building blocks on hand-built inputs: delay grids, phase machine, sampling, paged cache,
vocabulary regions, shared-head codebook heads, codec."""

from __future__ import annotations

import pytest
import torch

from speclive.speechlm import phases
from speclive.speechlm.codec import RandomRVQDecoder, write_wav
from speclive.speechlm.delay import deinterleave, interleave, n_steps
from speclive.speechlm.kvcache import ContiguousAttention, OutOfBlocksError, PagedKVCache, SeqCache
from speclive.speechlm.model import SpeechLM, SpeechLMConfig
from speclive.speechlm.phases import Phase, PhaseConfig, PhaseState, Region
from speclive.speechlm.sampling import sample
from speclive.speechlm.vocab import EOS, VocabLayout

P = 99  # pad code in the hand-built grids


def test_interleave_hand_built_grid():
    codes = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])  # S=3, T=3
    rows = interleave(codes, P)
    expect = torch.tensor([[1, P, P], [2, 4, P], [3, 5, 7], [P, 6, 8], [P, P, 9]])
    assert torch.equal(rows, expect)
    assert n_steps(3, 3) == 5
    assert torch.equal(deinterleave(rows, P), codes)


def test_deinterleave_rejects_broken_or_undrained_grids():
    rows = interleave(torch.arange(8).view(4, 2), P)
    bad = rows.clone()
    bad[0, 1] = 3  # a code where stream 1 must still be padded
    with pytest.raises(ValueError, match="step 0, stream 1"):
        deinterleave(bad, P)
    with pytest.raises(ValueError, match="drain"):
        deinterleave(rows[:2], P)  # S=4 needs at least 4 rows


def test_per_stream_pads_roundtrip():
    codes = torch.randint(0, 10, (4, 7))
    pads = torch.tensor([10, 11, 12, 13])
    assert torch.equal(deinterleave(interleave(codes, pads), pads), codes)


def _drive(st: PhaseState, regions: list[Region | None], tokens: dict[int, int] | None = None):
    """Run the machine on a scripted region sequence; text steps emit token 1 (or tokens[i])."""
    out = []
    for i, r in enumerate(regions):
        p = phases.plan(st, r)
        out.append(p)
        if p.kind == "text":
            phases.commit_text(st, (tokens or {}).get(i, 1))
        elif p.kind == "force":
            phases.commit_force(st)
        elif p.kind == "audio":
            phases.commit_audio(st)
        if st.done or p.kind == "finish":
            break
    return out


def test_phase_machine_text_transition_audio_drain():
    cfg = PhaseConfig(mode="text_audio", n_streams=3, bridge=(500, 501), max_audio_frames=10)
    st = PhaseState(cfg)
    T, A = Region.TEXT, Region.AUDIO
    # 2 text steps, the model switches to audio, 4 frames, the model switches back to text
    plans = _drive(st, [T, T, A, A, A, A, A, A, T, T, T, T])
    kinds = [p.kind for p in plans]
    assert kinds == ["text", "text", "force", "force", "audio", "audio", "audio", "audio", "audio", "audio"]
    assert [p.token for p in plans[2:4]] == [500, 501]
    act = [p.active for p in plans[4:]]
    # delay start: stream i joins at audio step i; drain after T=4 frames: streams leave in order
    assert act[:4] == [(True, False, False), (True, True, False), (True, True, True), (True, True, True)]
    assert act[4:] == [(False, True, True), (False, False, True)]
    assert st.done and st.n_frames == 4
    assert st.log.count(Phase.DRAIN) == 2  # S - 1 drain steps


def test_modality_comes_from_regions_not_positions():
    cfg = PhaseConfig(mode="text_audio", n_streams=2, max_text_tokens=100, max_audio_frames=100)
    a, b = PhaseState(cfg), PhaseState(cfg)
    _drive(a, [Region.TEXT] * 5 + [Region.AUDIO] * 3)
    _drive(b, [Region.AUDIO] * 3)
    assert a.n_text == 5 and b.n_text == 0
    assert a.audio_step == 3 and b.audio_step == 3


def test_min_text_tokens_holds_the_switch():
    cfg = PhaseConfig(mode="text_audio", n_streams=2, min_text_tokens=3, max_text_tokens=10)
    st = PhaseState(cfg)
    plans = _drive(st, [Region.AUDIO] * 5)
    assert [p.kind for p in plans] == ["text"] * 3 + ["audio"] * 2


def test_text_mode_never_switches_and_eos_or_limit_ends():
    st = PhaseState(PhaseConfig(mode="text", n_streams=2, eos=EOS, max_text_tokens=3))
    plans = _drive(st, [Region.AUDIO] * 10)
    assert [p.kind for p in plans] == ["text"] * 3 and st.done
    st = PhaseState(PhaseConfig(mode="text", n_streams=2, eos=EOS, max_text_tokens=9))
    _drive(st, [Region.TEXT] * 10, tokens={1: EOS})
    assert st.done and st.n_text == 1


def test_min_and_max_audio_frames_and_single_stream():
    st = PhaseState(PhaseConfig(n_streams=2, max_audio_frames=3, min_audio_frames=2, audio_only=True))
    plans = _drive(st, [Region.TEXT] * 10)  # model wants to stop at once: held for 2 frames
    assert st.n_frames == 2 and [p.kind for p in plans].count("audio") == 3
    st = PhaseState(PhaseConfig(n_streams=1, max_audio_frames=3, audio_only=True))
    plans = _drive(st, [Region.AUDIO] * 10)
    assert st.n_frames == 3 and [p.kind for p in plans] == ["audio"] * 3 + ["finish"]


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown mode"):
        PhaseState(PhaseConfig(mode="video"))


def test_sampling_greedy_topk_and_inverse_cdf():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]] * 3)
    greedy = sample(logits, torch.zeros(3), torch.zeros(3, dtype=torch.long), torch.rand(3))
    assert greedy.tolist() == [1, 1, 1]
    u = torch.tensor([0.0, 0.5, 0.999999])
    top1 = sample(logits, torch.ones(3), torch.ones(3, dtype=torch.long), u)
    assert top1.tolist() == [1, 1, 1]
    top2 = sample(logits, torch.ones(3), torch.full((3,), 2), u)
    p1 = torch.softmax(torch.tensor([3.0, 2.0]), 0)[0]
    assert top2.tolist() == [1, 1 if 0.5 < p1 else 3, 3]


def test_vocab_regions_are_disjoint_and_argmax_decides():
    lay = VocabLayout(n_streams=3, codebook_size=5, text_size=10)
    assert lay.size == 10 + 3 * 6
    ids = {lay.audio_id(i, c) for i in range(3) for c in range(5)} | {lay.pad_id(i) for i in range(3)}
    assert len(ids) == 18 and min(ids) == 10
    logits = torch.zeros(2, lay.size)
    logits[0, 3] = 5.0  # text wins
    logits[1, lay.audio_id(2, 4)] = 5.0  # a stream-2 code wins
    logits[0, lay.pad_id(1)] = 9.0  # pads never count
    assert lay.argmax_regions(logits) == [Region.TEXT, Region.AUDIO]


def test_codebook_heads_share_the_projection():
    m = SpeechLM(SpeechLMConfig.preset("tiny"))
    h = torch.randn(3, m.cfg.d_model)
    out = m.heads(h)
    lay = m.layout
    for i in range(m.n_streams):  # l(i) = W_H (h + e_i), restricted to stream i's codes
        full = m.head.proj(h + m.head.stream_emb[i])
        assert torch.allclose(out.streams[:, i], lay.audio_view(full)[:, i], atol=1e-5)
    assert torch.allclose(out.primary, m.head.proj(h + m.head.stream_emb[0]))


def test_input_row_sums_the_emitted_embeddings():
    m = SpeechLM(SpeechLMConfig.preset("tiny"))
    row = m.audio_row([3, None, 7, 1])
    x = m.embed(torch.tensor([[row]]))[0, 0]
    assert torch.allclose(x, m.embedding.weight[row].sum(0), atol=1e-6)
    text = m.embed(torch.tensor([m.text_rows([65])]))[0, 0]
    assert torch.allclose(text, m.embedding.weight[65])


def test_paged_attention_matches_contiguous():
    torch.manual_seed(0)
    cache = PagedKVCache(n_layers=1, n_heads=2, head_dim=4, n_blocks=16, block_size=3)
    seqs = [SeqCache(), SeqCache()]
    ref = [ContiguousAttention(1), ContiguousAttention(1)]
    for n_new in ([5, 2], [1, 4], [1, 1]):
        for s, n in zip(seqs, n_new, strict=True):
            cache.reserve(s, s.length + n)
        attn = cache.batch(seqs, n_new)
        qmax = max(n_new)
        q, k, v = (torch.randn(2, qmax, 2, 4) for _ in range(3))
        out = attn(0, q, k, v)
        for b, n in enumerate(n_new):
            r = ref[b].advance(n)(0, q[b : b + 1, :n], k[b : b + 1, :n], v[b : b + 1, :n])
            assert torch.allclose(out[b, :n], r[0], atol=1e-6)
    assert seqs[0].length == 7 and len(seqs[0].blocks) == 3
    for s in seqs:
        cache.release(s)
    assert cache.allocator.n_used == 0


def test_allocator_refuses_past_the_pool():
    cache = PagedKVCache(1, 1, 2, n_blocks=2, block_size=2)
    s = SeqCache()
    cache.reserve(s, 4)
    with pytest.raises(OutOfBlocksError):
        cache.reserve(s, 5)


def test_random_rvq_codec_and_wav(tmp_path):
    codec = RandomRVQDecoder(n_codebooks=4, codebook_size=32)
    codes = torch.randint(0, 32, (4, 10))
    wave = codec.decode(codes)
    assert wave.shape == (10 * codec.hop,) and wave.abs().max() <= 1.0 and wave.std() > 0
    assert not torch.equal(wave, codec.decode(torch.randint(0, 32, (4, 10))))
    with pytest.raises(ValueError):
        codec.decode(codes[:3])
    path = write_wav(tmp_path / "a.wav", wave, codec.sample_rate)
    assert path.stat().st_size == 44 + 2 * wave.numel()


def test_hf_codecs_load_and_decode(tmp_path):
    """EnCodec and DAC through ``HFCodec.load`` (tiny random configs saved like real checkpoints)."""
    tf = pytest.importorskip("transformers")
    from speclive.speechlm.codec import HFCodec

    enc = tf.EncodecConfig(
        num_filters=4,
        hidden_size=16,
        codebook_size=32,
        codebook_dim=16,
        upsampling_ratios=[4, 2],
        target_bandwidths=[40.0],
        sampling_rate=8000,
        num_lstm_layers=1,
    )
    dac = tf.DacConfig(
        encoder_hidden_size=8,
        downsampling_ratios=[2, 4],
        decoder_hidden_size=16,
        n_codebooks=3,
        codebook_size=32,
        codebook_dim=4,
        hidden_size=16,
        sampling_rate=8000,
    )
    for name, model in (("enc", tf.EncodecModel(enc)), ("dac", tf.DacModel(dac))):
        model.save_pretrained(tmp_path / name)
        codec = HFCodec.load(tmp_path / name)
        assert codec.sample_rate == 8000 and codec.codebook_size == 32 and codec.n_codebooks > 0
        wave = codec.decode(torch.randint(0, 32, (codec.n_codebooks, 10)))
        assert wave.dim() == 1 and wave.numel() == 80
