"""WhisperBackend: CTranslate2 conversion and the cache protocol vs fresh transformers forwards."""

from __future__ import annotations

import numpy as np
import pytest
from asr_fixtures import clips_16k, tiny

from speclive.drafting.tree import DraftTree


def _logp(x: np.ndarray) -> np.ndarray:
    m = np.where(np.isfinite(x), x, -1e30).max(-1, keepdims=True)
    e = np.where(np.isfinite(x), np.exp(x - m), 0.0)
    return np.where(np.isfinite(x), x - m - np.log(e.sum(-1, keepdims=True)), -1e30)


def _close(a: np.ndarray, b: np.ndarray, tol: float = 2e-3) -> None:
    assert a.shape == b.shape
    assert (np.isfinite(a) == np.isfinite(b)).all()
    d = np.abs(_logp(a) - _logp(b))
    assert d.max() < tol, d.max()


@pytest.fixture(scope="module")
def wb():
    b = tiny()
    b.set_audio(clips_16k()[0][1])
    return b


@pytest.fixture(scope="module")
def prefix(wb) -> list[int]:
    return wb.specials.prompt + wb.tokenizer.encode(" The quick brown fox")


def _fresh(b, tokens):
    s = b.new_state()
    return b.extend(s, tokens)


def test_ct2_conversion_matches_transformers_forward(wb, prefix):
    """The static-KV decoder over converted weights equals transformers' own Whisper forward."""
    _close(_fresh(wb, prefix), wb.reference_logits(prefix), tol=1e-3)
    cfg = wb.model.config
    assert (cfg.d_model, cfg.decoder_layers, cfg.vocab_size) == (384, 4, 51864)


def test_chain_extend_in_pieces_equals_fresh(wb, prefix):
    s = wb.new_state()
    a = wb.extend(s, prefix[:3])
    b = wb.extend(s, prefix[3:])
    _close(np.concatenate([a, b]), _fresh(wb, prefix))


def test_tree_extend_and_keep_equal_fresh(wb, prefix):
    s = wb.new_state()
    wb.extend(s, prefix)
    t = DraftTree()
    a = t.add(wb.tokenizer.encode(" jumps")[0], -1)
    t.add(wb.tokenizer.encode(" over")[0], a)
    b = t.add(wb.tokenizer.encode(" runs")[0], -1)
    t.add(wb.tokenizer.encode(" away")[0], b)
    logits = wb.extend(s, t.tokens, t.parents)
    for path in t.paths():
        _close(logits[path], _fresh(wb, prefix + [t.tokens[i] for i in path])[len(prefix) :])
    wb.keep(s, [2, 3])
    assert s.tokens == prefix + [t.tokens[2], t.tokens[3]]
    nxt = wb.extend(s, [wb.tokenizer.encode(".")[0]])
    _close(nxt, _fresh(wb, s.tokens)[-1:])


def test_truncate_fork_and_wrong_tree(wb, prefix):
    s = wb.new_state()
    wb.extend(s, prefix + [11, 12, 13])
    f = wb.fork(s)
    wb.truncate(s, len(prefix))
    got = wb.extend(s, [14])
    _close(got, _fresh(wb, prefix + [14])[-1:])
    _close(wb.extend(f, [15]), _fresh(wb, prefix + [11, 12, 13, 15])[-1:])
    # a node hung under the wrong parent sees other tokens: logits must differ clearly
    s2 = wb.new_state()
    wb.extend(s2, prefix)
    wrong = wb.extend(s2, [11, 12], [-1, -1])[1]
    right = _fresh(wb, prefix + [11, 12])[-1]
    assert np.abs(_logp(wrong[None]) - _logp(right[None])).max() > 0.05


def test_set_audio_invalidates_states_and_shallow_shares_context(wb, prefix):
    shallow = wb.shallow(1, vocab_limit=1000)
    s, d = wb.new_state(), shallow.new_state()
    wb.extend(s, prefix)
    shallow.extend(d, prefix)
    before = _fresh(wb, prefix)
    wb.set_audio(clips_16k()[1][1])
    assert s.tokens == [] and d.tokens == []
    after = _fresh(wb, prefix)
    assert np.abs(_logp(after) - _logp(before)).max() > 0.1  # other audio, other logits
    row = shallow.extend(d, prefix)[-1]
    assert np.isfinite(row).sum() <= 1000 + (wb.vocab_size - wb.specials.eos)
    assert shallow.vocab_size == wb.vocab_size and shallow.n_layers == 1
    wb.set_audio(clips_16k()[0][1])


def test_suppression_rules_applied(wb):
    s = wb.new_state()
    row = wb.extend(s, wb.specials.prompt)[-1]
    sp = wb.specials
    assert np.isneginf(row[sp.suppress]).all()
    assert np.isneginf(row[sp.suppress_begin]).all()  # first generated position
    assert np.isneginf(row[sp.no_timestamps + 1 :]).all()
    nxt = wb.extend(s, [wb.tokenizer.encode(" The")[0]])[-1]
    assert np.isfinite(nxt[sp.eos])  # begin rules only at the first position


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_linear_layouts_agree_with_f_linear(rows):
    """Both GEMM layouts of ``DualLinear`` (x @ W.T stored, W @ x.T) compute F.linear."""
    import torch

    from speclive.backends.cpu_linear import DualLinear, split_plan

    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 32, generator=g), torch.randn(96, generator=g)
    x = torch.randn(rows, 32, generator=g)
    want = torch.nn.functional.linear(x, w, b)
    for split in (1, rows, rows + 1):
        for bias in (b, None):
            got = DualLinear(w, bias, split_plan(split), pad_block=None)(x)
            assert got.shape == (rows, 96) and got.is_contiguous()
            ref = want if bias is not None else want - b
            assert torch.allclose(got, ref, atol=1e-4), (split, bias is None)


def test_int8_draft_tracks_float32(wb, prefix):
    """An int8 copy of the decoder is close to float32 (same greedy token almost everywhere)
    but not equal (the weights really are quantized); a shallow int8 draft shares the context."""
    from speclive.asr.whisper import WhisperBackend, int8_available

    if not int8_available():
        pytest.skip("no x86/fbgemm quantized engine")
    q = WhisperBackend(wb.model, wb.tokenizer, wb.specials, context=wb.context, int8=True)
    got, want = _fresh(q, prefix), _fresh(wb, prefix)
    d = np.abs(_logp(got) - _logp(want))
    assert d.max() > 1e-4  # really quantized
    # close where it matters: the float32 model's 10 likeliest tokens per row (the maximum over
    # the whole vocabulary is set by very unlikely tokens and varied 1.4-2.1 between runs/machines)
    top = np.argsort(-want, axis=-1)[:, :10]
    near = np.take_along_axis(d, top, -1)
    assert near.mean() < 0.6, near.mean()
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.8
    assert q.name.endswith("/int8")
    shallow = wb.shallow(2, int8=True)
    assert len(shallow.layers) == 2 and shallow.head is not wb.head
    row = shallow.extend(shallow.new_state(), prefix)[-1]
    assert np.isfinite(row).any()


def test_encode_window_equals_transformers_encoder_over_the_full_window(wb):
    """The trimmed-window encoder is transformers' encoder: over all 1500 frames it gives the
    same output (so a trimmed draft differs only by the frames it drops)."""
    import torch

    audio = clips_16k()[0][1]
    feats = wb.feature_extractor(audio, sampling_rate=16_000, return_tensors="pt").input_features
    with torch.inference_mode():
        want = wb.model.model.encoder(feats).last_hidden_state[0]
        got = wb.encode_window(feats, 1500)
        part = wb.encode_window(feats, 200)
    assert got.shape == want.shape == (1500, 384)
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    assert part.shape == (200, 384)


def test_trimmed_draft_encodes_only_the_audio(wb, prefix):
    """``audio_margin_s``: the encoder and the cross-attention span the audio plus the margin;
    a target-shaped backend never trims; a negative margin is refused."""
    from speclive.asr.whisper import WhisperBackend
    from speclive.errors import ConfigError

    audio = clips_16k()[0][1]
    trimmed = WhisperBackend(wb.model, wb.tokenizer, wb.specials, audio_margin_s=0.5)
    frames = int(np.ceil((len(audio) + 8000) / 320))
    assert trimmed.encoder_frames(len(audio)) == frames < 1500
    assert trimmed.encoder_frames(40 * 16_000) == 1500  # capped at the window
    assert wb.encoder_frames(len(audio)) == 1500
    trimmed.set_audio(audio)
    assert trimmed.context is not wb.context
    assert trimmed.context.cross_k[0].shape[-1] == frames
    assert "/ctx+0.5s" in trimmed.name
    # a good draft still: the trimmed model's greedy next tokens mostly agree with the full one's
    got, want = _fresh(trimmed, prefix), _fresh(wb, prefix)
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.7
    with pytest.raises(ConfigError):
        WhisperBackend(wb.model, wb.tokenizer, wb.specials, audio_margin_s=-1.0)


def test_new_encoder_lengths_keep_no_memory_and_leave_onednn_as_it_was(wb):
    """A live server encodes a new length at nearly every pass. With torch's oneDNN each new
    length kept its kernels (about 70 KB a length, growing until oneDNN's cache of 1,024 was
    full); the encoder runs without it, so new lengths keep nothing."""
    import torch

    from speclive.asr.whisper import WhisperBackend
    from speclive.server.memory import heap_bytes

    if not heap_bytes():
        pytest.skip("needs glibc's malloc figures")
    trimmed = WhisperBackend(wb.model, wb.tokenizer, wb.specials, audio_margin_s=0.0)
    feats = torch.randn(1, 80, 3000) * 0.1
    assert torch.backends.mkldnn.enabled
    with torch.inference_mode():
        for n in range(30):  # the first lengths warm up what every length shares
            trimmed._encode(feats, 16_000 + 320 * n)
        before = heap_bytes()["in_use"]
        for n in range(30, 90):
            trimmed._encode(feats, 16_000 + 320 * n)
        grown = heap_bytes()["in_use"] - before
    assert grown < 1.5 * 2**20, f"{grown / 2**20:.1f} MiB kept by 60 new encoder lengths"
    assert torch.backends.mkldnn.enabled  # switched off only while encoding
