"""Streaming ASR: LocalAgreement-2 commits, VAD gate, and a real streamed transcript driving SSBD."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest
from asr_fixtures import clips_16k, tiny

from speclive.asr.audio import SAMPLE_RATE
from speclive.asr.streaming import (
    OnlineASR,
    Partial,
    SileroGate,
    StreamConfig,
    Word,
    drive_session,
    spread_words,
    stream_file,
    transcriber_recognizer,
)
from speclive.asr.transcribe import TranscribeConfig, Transcriber
from speclive.errors import ConfigError

TEXT = "one two three four five six seven eight".split()


def _fake(audio: np.ndarray) -> list[Word]:
    """Hears one word per 0.5 s; the newest word is garbled on odd passes (it must not commit)."""
    n = min(len(TEXT), int(len(audio) / SAMPLE_RATE / 0.5))
    words = [Word(w, 0.5 * i, 0.5 * i + 0.4) for i, w in enumerate(TEXT[:n])]
    _fake.calls += 1
    if words and _fake.calls % 2:
        words[-1] = Word("garbled", words[-1].start, words[-1].end)
    return words


_fake.calls = 0


def test_local_agreement_commits_only_agreed_prefixes():
    audio = np.zeros(int(4.2 * SAMPLE_RATE), dtype=np.float32)
    parts = list(stream_file(audio, _fake, StreamConfig(step_s=0.5)))
    committed = [p.committed_text for p in parts]
    for a, b in zip(committed, committed[1:], strict=False):
        assert b.startswith(a)  # committed text only grows
    assert all("garbled" not in p.committed_text for p in parts[:-1])
    assert parts[-1].final and parts[-1].text.split()[:7] == TEXT[:7]
    assert any(p.tentative for p in parts[:-1])


def test_buffer_is_trimmed_after_committed_words():
    asr = OnlineASR(_fake, StreamConfig(step_s=0.5, buffer_s=2.0))
    for _ in range(8):
        asr.insert(np.zeros(SAMPLE_RATE // 2, dtype=np.float32))
        asr.process()
    assert len(asr.buffer) / SAMPLE_RATE < 4.0 and asr.offset > 0


def test_spread_words_covers_voiced_span():
    audio = np.zeros(SAMPLE_RATE * 3, dtype=np.float32)
    audio[SAMPLE_RATE : 2 * SAMPLE_RATE] = 0.5
    w = spread_words("a bb ccc", audio)
    assert abs(w[0].start - 1.0) < 0.05 and abs(w[-1].end - 2.0) < 0.05
    assert [x.text for x in w] == ["a", "bb", "ccc"]


def test_silero_gate():
    import llama_cpp  # noqa: F401  -- the VAD must load next to llama.cpp (a voice pipeline has both)

    gate = SileroGate()
    assert not gate.has_speech(np.zeros(SAMPLE_RATE, dtype=np.float32))
    assert gate.has_speech(clips_16k()[0][1])


class _Recorder:
    """The session protocol (update/finish) recording what it was given."""

    def __init__(self):
        self.seen: list[str] = []

    def update(self, partial: str):
        self.seen.append(partial)
        return partial

    def finish(self, final: str | None = None):
        return final


def test_real_stream_drives_ssbd_session(hf_smol):
    from speclive.sessions.retranslate import ReTranslator

    text, audio = clips_16k()[1]
    tr = Transcriber(TranscribeConfig(model="whisper-tiny.en", method="ar"), target=tiny())
    whole = tr.transcribe(audio).text
    parts = list(stream_file(audio, transcriber_recognizer(tr), StreamConfig(step_s=1.5)))
    assert isinstance(parts[-1], Partial) and parts[-1].final
    assert parts[-1].text.split()[-3:] == whole.split()[-3:]
    rec = _Recorder()
    final, updates = drive_session(rec, parts)
    assert final == parts[-1].text and len(updates) >= 1
    session = ReTranslator(hf_smol, target_lang="de", max_tokens=12, beta=0.0)
    out, ups = drive_session(session, parts)
    assert out.final and out.source == parts[-1].text and out.output.strip()
    assert [u.source for u in ups] == rec.seen


@functools.cache
def _trimmed_tiny():
    """tiny.en encoding the audio plus 1 s, as the live pipelines run their target."""
    from speclive.asr.whisper import load_whisper

    return load_whisper("whisper-tiny.en", audio_margin_s=1.0)


def _streams():
    """Six streams: each test clip and both joined by a short gap, at two step sizes each."""
    (_, a), (_, b) = clips_16k()
    gap = np.zeros(int(0.25 * SAMPLE_RATE), np.float32)
    tail = np.zeros(int(0.6 * SAMPLE_RATE), np.float32)
    turns = [np.concatenate([a, tail]), np.concatenate([b, tail]), np.concatenate([a, gap, b, tail])]
    steps = ((0.5, 1.0), (0.7, 1.3), (0.8, 1.1))
    return [(t, step) for t, pair in zip(turns, steps, strict=True) for step in pair]


def test_drafted_passes_equal_plain_redecoding_on_every_pass():
    """Differential, on the float32 Whisper backend: over six streams, every streaming and final
    pass drafted by the previous passes (chain, tree, re-alignment; with and without a tail
    drafter) gives the token ids of plain greedy re-decoding of the same audio, in fewer decoder
    passes."""
    from speclive.asr.streaming import PassRecognizer, stream_timed

    trimmed = _trimmed_tiny()
    cfg = TranscribeConfig(model="whisper-tiny.en", method="ar", target_audio_margin_s=1.0)
    plain = Transcriber(cfg, target=trimmed)
    tail = replace(cfg, method="specasr", draft="self:1", stream_tail=True)
    drafted = {
        "previous": Transcriber(cfg, target=trimmed),
        "previous+tail": Transcriber(tail, target=trimmed),
    }
    saved = {k: 0 for k in drafted}
    passes = 0
    for audio, step in _streams():
        ref = PassRecognizer(plain, draft=False, loop_fallback=False)
        want = stream_timed(audio, ref, StreamConfig(step_s=step, buffer_s=25.0))
        for name, tr in drafted.items():
            rec = PassRecognizer(tr, draft=True, loop_fallback=False)
            got = stream_timed(audio, rec, StreamConfig(step_s=step, buffer_s=25.0))
            assert got.final.text == want.final.text
            pairs = list(zip(rec.passes.records, ref.passes.records, strict=True))
            for g, r in pairs:
                assert (g.kind, g.token_ids) == (r.kind, r.token_ids), (name, step, g.text, r.text)
            saved[name] += sum(r.decoder_passes - g.decoder_passes for g, r in pairs[1:])
        passes += len(ref.passes.records)
    assert passes >= 30
    # the drafted passes need far fewer decoder passes (the first pass of a stream has no draft)
    assert all(v > passes for v in saved.values()), saved


def test_final_pass_after_silence_is_one_decoder_pass():
    """A pass over the same speech plus silence: the previous hypothesis and its end-of-text are
    accepted in one decoder pass."""
    from speclive.asr.passes import StreamPasses

    # the full window: trimmed, tiny.en starts this clip over at its end (the loop guard's case)
    tr = Transcriber(TranscribeConfig(model="whisper-tiny.en", method="ar"), target=tiny())
    _, audio = clips_16k()[0]
    passes = StreamPasses(tr)
    first = passes.run(audio)
    again = passes.run(np.concatenate([audio, np.zeros(SAMPLE_RATE // 5, np.float32)]), final=True)
    assert again.token_ids == first.token_ids
    assert passes.records[-1].decoder_passes == 1 and passes.records[-1].kind == "final"
    assert passes.records[0].decoder_passes == len(first.token_ids) + 1
    assert passes.records[-1].to_json().keys() >= {"decoder_passes", "tokens", "encoder_ms", "decoder_ms"}


def test_last_speech_end():
    from speclive.live.vad import FRAME, last_speech_end

    f = FRAME / SAMPLE_RATE
    assert last_speech_end(np.array([0.1, 0.9, 0.9, 0.2, 0.9, 0.6, 0.3, 0.1])) == 7 * f
    assert last_speech_end(np.array([0.1, 0.2])) is None
    assert last_speech_end(np.array([0.9, 0.9])) is None  # still speaking when the input ends


def test_partials_on_the_draft_model_draft_the_final_pass():
    """``stream_partials="draft"``: the partial passes run on the draft model's float32 weights
    (its own tokenizer object: hypotheses are re-tokenized through text for the target), the
    final pass on the target gives exactly the target's plain transcript of the same audio."""
    from speclive.asr.passes import StreamPasses

    cfg = TranscribeConfig(
        model="whisper-tiny.en", method="specasr", draft="whisper-tiny.en", stream_partials="draft"
    )
    tr = Transcriber(cfg, target=tiny())
    small = tr.partial_transcriber()
    assert small is not tr and small.target.tokenizer is not tr.target.tokenizer
    assert "/v8192" in small.target.name and tr.partial_transcriber("target") is tr
    _, audio = clips_16k()[1]
    passes = StreamPasses(tr)
    assert passes.partials is small
    for end in (1.5, 3.0):
        passes.run(audio[: int(end * SAMPLE_RATE)])
    final = passes.run(audio, final=True)
    plain = Transcriber(TranscribeConfig(model="whisper-tiny.en", method="ar"), target=tiny()).transcribe(
        audio
    )
    assert final.token_ids == plain.token_ids
    kinds = [(r.kind, r.model) for r in passes.records]
    assert kinds[0][1] == small.target.name and kinds[-1] == ("final", tr.target.name)
    assert passes.records[-1].accepted > 0 and passes.records[-1].decoder_passes < len(plain.token_ids)
    with pytest.raises(ConfigError):
        tr.partial_transcriber("tiny")
