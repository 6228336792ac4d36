"""Bounded synthesis pieces (``tts.sentences.bounded_pieces``) and Piper's use of them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speclive.tts.sentences import bounded_phonemes, bounded_pieces


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
    texts: list[str] = []
    real = tts.voice.phonemize

    def spy(text):
        texts.append(text)
        return real(text)

    monkeypatch.setattr(piper_mod, "MAX_RUN_CHARS", 60)
    monkeypatch.setattr(tts.voice, "phonemize", spy)
    text = "a long sentence without a full stop that goes on and on " * 3
    audio = tts.synthesize(text)
    assert len(texts) >= 3 and all(len(r) <= 60 for r in texts)
    assert " ".join(texts).split() == text.split()
    assert audio.duration_s > 2.0
    faster = tts.synthesize("Hello there.", speed=2.0)
    assert 0 < faster.duration_s < tts.synthesize("Hello there.").duration_s


def test_piper_runs_are_bounded_by_phonemes_and_a_short_sentence_is_piper_s_own(monkeypatch):
    """Digits are spoken as many more sounds than they have characters: a run takes at most
    ``MAX_RUN_PHONEMES`` phonemes (fewer for slow speech), so no text of ``MAX_RUN_CHARS``
    makes the model's memory grow past what ``reserve()`` gave it. A sentence within the bound
    is synthesized exactly as Piper's own ``synthesize`` does."""
    pytest.importorskip("piper")
    from speclive.tts import piper as piper_mod

    tts = piper_mod.PiperTTS("piper-joe-medium", threads=1, varied=False)
    runs: list[int] = []
    real = tts.voice.phonemes_to_ids

    def spy(phonemes):
        runs.append(len(phonemes))
        return real(phonemes)

    monkeypatch.setattr(tts.voice, "phonemes_to_ids", spy)
    monkeypatch.setattr(piper_mod, "MAX_RUN_PHONEMES", 40)  # a small bound: short audio
    digits = "In 1984 we paid 123456 dollars."
    total = sum(len(p) for p in tts.voice.phonemize(digits))
    assert total > 2 * 40 and len(digits) < 40  # far more sounds than characters
    tts.synthesize(digits)
    assert len(runs) >= 3 and max(runs) <= 40
    runs.clear()
    tts.synthesize(digits, speed=0.5)  # twice as slow: half as many phonemes a run
    assert max(runs) <= 20
    monkeypatch.setattr(tts.voice, "phonemes_to_ids", real)
    from piper import SynthesisConfig

    own = next(
        iter(
            tts.voice.synthesize("Hello there, friend.", SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0))
        )
    )
    assert np.array_equal(tts.synthesize("Hello there, friend.").samples, own.audio_float_array)


def test_phoneme_pieces_split_at_word_ends():
    ph = list("ab cd ef gh")
    assert bounded_phonemes(ph, 5) == [list("ab cd"), list("ef gh")]
    assert bounded_phonemes(ph, 100) == [ph]
    assert bounded_phonemes(list("abcdefg hi"), 3) == [list("abcdefg"), list("hi")]  # one long word
    with pytest.raises(ValueError):
        bounded_phonemes(ph, 0)


@given(st.lists(st.sampled_from(["a", "b", " ", "ˈ", ","]), max_size=80), st.integers(1, 20))
def test_phoneme_pieces_are_bounded_and_keep_every_phoneme(phonemes, limit):
    pieces = bounded_phonemes(phonemes, limit)
    joined = [p for i, piece in enumerate(pieces) for p in ([" "] if i else []) + piece]
    assert joined == phonemes[: len(joined)] and all(p == " " for p in phonemes[len(joined) :])
    for piece in pieces:
        assert len(piece) <= limit or " " not in piece[1:]


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


def test_after_reserve_no_text_grows_the_voices_memory():
    """``reserve()`` takes what any later run needs: a text of ``MAX_RUN_CHARS`` digits, spoken
    as long numbers (66 s of speech), leaves malloc's mapped blocks, where onnxruntime's arena
    lives, where ``reserve()`` left them. Bounded by characters alone, it took 3 GiB more."""
    pytest.importorskip("piper")
    from speclive.server.memory import heap_bytes
    from speclive.tts import piper as piper_mod

    if not heap_bytes():
        pytest.skip("no glibc mallinfo2 on this platform")
    tts = piper_mod.PiperTTS("piper-joe-medium", threads=1)
    tts.reserve()
    reserved = heap_bytes()["mapped"]
    n = piper_mod.MAX_RUN_CHARS
    tts.synthesize(("In 1984 there were 123456789 people and 987654321 dollars, " * 8)[:n])
    assert heap_bytes()["mapped"] <= reserved + 16 * 2**20


def test_new_piece_lengths_keep_no_memory(monkeypatch):
    """onnxruntime would keep a memory plan for every input shape it meets, and nearly every
    sentence is a new number of phonemes: twenty new lengths keep (almost) nothing in use."""
    pytest.importorskip("piper")
    import ctypes

    from speclive.server.memory import heap_bytes
    from speclive.tts import piper as piper_mod

    if not heap_bytes():
        pytest.skip("no glibc mallinfo2 on this platform")
    trim = ctypes.CDLL("libc.so.6").malloc_trim
    tts = piper_mod.PiperTTS("piper-joe-medium", threads=1, varied=False)
    assert tts.voice.session.get_session_options().enable_mem_pattern is False
    tts.reserve()
    tts.synthesize("Warm up.")
    trim(0)
    before = heap_bytes()["in_use"]
    for n in range(1, 21):
        tts.synthesize(" ".join(["go"] * n) + ".")
    trim(0)
    assert heap_bytes()["in_use"] - before < 0.25 * 2**20


def test_piper_selects_its_espeak_voice_once(monkeypatch):
    """espeak-ng allocates a voice on every selection and never frees the previous one, and
    Piper selects its voice before each text it phonemizes: a voice already selected is not
    selected again, and each text's phonemes are those it gets right after a selection."""
    pytest.importorskip("piper")
    from piper import espeakbridge

    from speclive.tts.piper import PiperTTS

    selected: list[str] = []
    before = espeakbridge.set_voice

    def counting(voice: str) -> None:
        selected.append(voice)
        before(voice)

    monkeypatch.setattr(espeakbridge, "set_voice", counting)
    tts = PiperTTS("piper-joe-medium", threads=1)
    texts = ["Hello there, how are you?", "The café in Zürich serves crème brûlée.", "3.5 km at 10:30 p.m."]
    got = [tts.voice.phonemize(t) for t in texts * 3]
    voice = tts.voice.config.espeak_voice
    assert selected == [voice]
    select = before
    while hasattr(select, "selects"):  # espeak-ng's own selection, under an earlier voice's wrapper
        select = select.selects
    for text, phonemes in zip(texts * 3, got, strict=True):
        select(voice)
        assert tts.voice.phonemize(text) == phonemes
