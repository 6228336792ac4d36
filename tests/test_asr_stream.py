"""Streaming ASR: LocalAgreement-2 commits, VAD gate, and a real streamed transcript driving SSBD."""

from __future__ import annotations

import numpy as np
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
