"""whisper-base (not in the bundle): cross-vocabulary SpecASR with tiny.en, identical to AR on LibriVox."""

from __future__ import annotations

import pytest

from speclive_bench.asr import librivox_clips

pytestmark = pytest.mark.slow


def test_tiny_en_drafts_for_base_identically():
    clips = librivox_clips()
    if not clips:
        pytest.skip("pocketsphinx-testdata is not installed (apt-get install pocketsphinx-testdata)")
    from speclive.asr.transcribe import TranscribeConfig, Transcriber
    from speclive.asr.whisper import load_whisper

    base = load_whisper("whisper-base")
    ar = Transcriber(TranscribeConfig(method="ar"), target=base)
    spec = Transcriber(TranscribeConfig(method="specasr", draft="whisper-tiny.en"), target=base)
    self_draft = Transcriber(TranscribeConfig(method="specasr", draft="self:1"), target=base)
    passes = {"ar": 0, "spec": 0}
    for c in clips:
        ref = ar.transcribe(c.audio)
        got = spec.transcribe(c.audio)
        assert got.token_ids == ref.token_ids, (c.name, got.text, ref.text)
        assert self_draft.transcribe(c.audio).token_ids == ref.token_ids
        passes["ar"] += ref.stats.target_forwards
        passes["spec"] += got.stats.target_forwards
    assert passes["spec"] < 0.5 * passes["ar"]
