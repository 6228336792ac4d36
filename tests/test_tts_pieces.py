"""Bounded synthesis pieces (``tts.sentences.bounded_pieces``) and Piper's use of them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speclive.tts.sentences import bounded_pieces


def test_short_text_is_one_piece():
    assert bounded_pieces("  Hello there. How are you?  ", 100) == ["Hello there. How are you?"]


def test_cuts_prefer_sentence_ends_then_clauses_then_spaces():
    text = "One two three. Four five six seven, eight nine ten eleven twelve."
    assert bounded_pieces(text, 40) == [
        "One two three.",
        "Four five six seven,",
        "eight nine ten eleven twelve.",
    ]
    assert bounded_pieces("aaaa bbbb cccc dddd", 10) == ["aaaa bbbb", "cccc dddd"]
    # a single word longer than the bound stays whole
    assert bounded_pieces("x" * 30 + " tail", 10) == ["x" * 30, "tail"]


@given(
    st.lists(st.text(alphabet="abcdefgh.,;: ", min_size=1, max_size=12), min_size=1, max_size=40),
    st.integers(5, 60),
)
def test_pieces_are_bounded_and_keep_every_word(parts, bound):
    text = " ".join(parts)
    pieces = bounded_pieces(text, bound)
    assert " ".join(pieces).split() == text.split()
    for p in pieces:
        assert p == p.strip() and p
        assert len(p) <= bound or " " not in p  # only an unsplittable word may exceed it


def test_bad_bound():
    with pytest.raises(ValueError):
        bounded_pieces("text", 0)


def test_piper_synthesizes_a_long_sentence_in_bounded_runs(monkeypatch):
    pytest.importorskip("piper")
    from speclive.tts import piper as piper_mod

    tts = piper_mod.PiperTTS("piper-joe-medium", threads=1)
    runs: list[str] = []
    real = tts.voice.synthesize

    def spy(text, syn=None):
        runs.append(text)
        return real(text, syn)

    monkeypatch.setattr(piper_mod, "MAX_RUN_CHARS", 60)
    monkeypatch.setattr(tts.voice, "synthesize", spy)
    text = "a long sentence without a full stop that goes on and on " * 3
    audio = tts.synthesize(text)
    assert len(runs) >= 3 and all(len(r) <= 60 for r in runs)
    assert " ".join(runs).split() == text.split()
    assert audio.duration_s > 2.0
    faster = tts.synthesize("Hello there.", speed=2.0)
    assert 0 < faster.duration_s < tts.synthesize("Hello there.").duration_s


@pytest.mark.parametrize("threads", [None, 2])
def test_piper_threads_sleep_after_a_run(threads):
    """Piper runs between the LLM's steps on the same cores: its intra-op threads must not
    keep spinning after a synthesis (onnxruntime's default)."""
    pytest.importorskip("piper")
    from speclive.tts.piper import PiperTTS

    session = PiperTTS("piper-joe-medium", threads=threads).voice.session
    options = session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.intra_op_num_threads == (threads or 0)  # 0: onnxruntime's default
