"""The final pass over the buffer's end only (``StreamConfig.final_tail_words``): where it cuts,
what it drafts, that the words committed before it stay, and its fall-back to the whole buffer."""

from __future__ import annotations

import numpy as np
from asr_fixtures import clips_16k

from speclive.asr.audio import SAMPLE_RATE
from speclive.asr.streaming import OnlineASR, StreamConfig, Word, quiet_point, stream_timed

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet".split()
#: word i is spoken over [0.5 i, 0.5 i + 0.4) s at level (i + 1) / 20; the gaps are silent
SPAN, LEN = 0.5, 0.4


def _speech(n_words: int, silence_s: float = 0.6) -> np.ndarray:
    audio = np.zeros(int((n_words * SPAN + silence_s) * SAMPLE_RATE), np.float32)
    for i in range(n_words):
        a, b = int(i * SPAN * SAMPLE_RATE), int((i * SPAN + LEN) * SAMPLE_RATE)
        audio[a:b] = (i + 1) / 20
    return audio


def _hear(audio: np.ndarray) -> list[Word]:
    """The words whose whole span lies in ``audio`` (read from their levels), timed in it; a word
    cut at the window's start is heard as a fragment."""
    frame = SAMPLE_RATE // 100
    levels = np.round(audio[: len(audio) // frame * frame].reshape(-1, frame).max(axis=1) * 20).astype(int)
    out: list[Word] = []
    i = 0
    while i < len(levels):
        if levels[i] == 0:
            i += 1
            continue
        j = i
        while j < len(levels) and levels[j] == levels[i]:
            j += 1
        whole = (j - i) >= LEN * 100 - 1
        out.append(Word(WORDS[levels[i] - 1] if whole else "uh", i / 100, j / 100))
        i = j
    return out


class _Recognizer:
    """Hears ``_hear``; records every final pass's audio length and drafts."""

    def __init__(self, loops: bool = False):
        self.finals: list[tuple[float, list[str] | None]] = []
        self.loops = loops

    def __call__(self, audio: np.ndarray) -> list[Word]:
        return _hear(audio)

    def final_pass(self, audio: np.ndarray, expect: list[str] | None = None) -> list[Word] | None:
        self.finals.append((len(audio) / SAMPLE_RATE, expect))
        if expect is not None and self.loops:
            return None  # the short window looped: the whole buffer must be decoded instead
        return _hear(audio)


def test_quiet_point_finds_the_gap_between_words():
    audio = _speech(4)
    t = quiet_point(audio, 1.0 - 0.12)  # an estimate a little early: the gap is [0.9, 1.0)
    assert 0.9 <= t <= 1.0


def test_final_pass_hears_the_end_and_keeps_the_committed_words():
    audio = _speech(10)
    rec = _Recognizer()
    run = stream_timed(audio, rec, StreamConfig(step_s=1.0, buffer_s=25.0, final_tail_words=2))
    assert run.final.text.split() == WORDS  # every word once, none lost at the cut
    ((heard_s, expect),) = rec.finals
    assert heard_s < len(audio) / SAMPLE_RATE - 2.0  # the end only
    # the drafts: the partials' words from one before the cut, at it, one after
    assert expect is not None and len(expect) == 3
    assert [e.split()[0] for e in expect] == [w for w in WORDS if w in " ".join(expect).split()][:3]


def test_a_looping_end_falls_back_to_the_whole_buffer():
    audio = _speech(10)
    rec = _Recognizer(loops=True)
    run = stream_timed(audio, rec, StreamConfig(step_s=1.0, buffer_s=25.0, final_tail_words=2))
    assert run.final.text.split() == WORDS
    assert [e is None for _, e in rec.finals] == [False, True]
    assert rec.finals[1][0] == len(audio) / SAMPLE_RATE


def test_partials_of_a_smaller_model_keep_the_whole_final_pass():
    """When the final pass re-decides the words the partials committed, it must hear them all."""
    audio = _speech(10)
    rec = _Recognizer()
    rec.redecides_final = True  # type: ignore[attr-defined]
    run = stream_timed(audio, rec, StreamConfig(step_s=1.0, buffer_s=25.0, final_tail_words=2))
    assert run.final.text.split() == WORDS
    assert rec.finals == [(len(audio) / SAMPLE_RATE, None)]


def test_short_turns_and_the_default_decode_the_whole_buffer():
    for words, cfg in (
        (10, StreamConfig(buffer_s=25.0)),
        (3, StreamConfig(buffer_s=25.0, final_tail_words=2)),
    ):
        audio = _speech(words)
        rec = _Recognizer()
        stream_timed(audio, rec, cfg)
        assert rec.finals == [(len(audio) / SAMPLE_RATE, None)]


def test_a_fragment_before_the_repeated_words_is_dropped():
    asr = OnlineASR(_hear, StreamConfig())
    asr.state.committed = [Word(w, i * SPAN, i * SPAN + LEN) for i, w in enumerate(WORDS[:5])]
    new = asr._new_words(
        [Word("uh", 1.4, 1.5), Word("delta", 1.5, 1.9), Word("echo", 2.0, 2.4), Word("golf", 3.0, 3.4)]
    )
    assert [w.text for w in new] == ["golf"]


def test_tail_final_on_whisper_equals_plain_decoding_of_its_window():
    """Real tiny.en, float32: the final pass over the buffer's end, drafted by the partials'
    words, gives the token ids of plain greedy decoding of that same window."""
    from test_asr_stream import _trimmed_tiny

    from speclive.asr.streaming import PassRecognizer
    from speclive.asr.transcribe import TranscribeConfig, Transcriber

    (_, a), (_, b) = clips_16k()[:2]
    audio = np.concatenate(
        [a, np.zeros(SAMPLE_RATE // 4, np.float32), b, np.zeros(SAMPLE_RATE // 2, np.float32)]
    )
    cfg = TranscribeConfig(model="whisper-tiny.en", method="ar", target_audio_margin_s=1.0)
    trimmed = _trimmed_tiny()
    rec = PassRecognizer(Transcriber(cfg, target=trimmed), draft=True, loop_fallback=False)
    windows: list[np.ndarray] = []
    final_pass = rec.final_pass

    def keep(audio: np.ndarray, expect: list[str] | None = None) -> list[Word] | None:
        windows.append(audio)
        return final_pass(audio, expect=expect)

    rec.final_pass = keep  # type: ignore[method-assign]
    stream_timed(audio, rec, StreamConfig(step_s=1.0, buffer_s=25.0, final_tail_words=2))
    assert len(windows[0]) < len(audio)  # the end only
    plain = Transcriber(cfg, target=trimmed).transcribe(windows[-1], loop_fallback=True)
    assert rec.passes.records[-1].kind == "final"
    assert rec.passes.records[-1].token_ids == [int(t) for t in plain.token_ids]


def test_bad_settings_are_refused():
    import pytest

    from speclive.errors import ConfigError

    for bad in ({"final_tail_words": 0}, {"step_s": 0.0}, {"buffer_s": -1.0}):
        with pytest.raises(ConfigError):
            StreamConfig(**bad)
