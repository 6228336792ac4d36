"""Sentence boundaries for sentence-wise TTS: a sentence ends at ``.``, ``?`` or ``!``.

During generation a period is only a sentence end once the next character is known: "3.14"
and "e.g." are not, so the end is confirmed by following whitespace (or by the end of the
response). Lists ("1. Apples") are not broken after the number.

A voice answer's *first* unit may be shorter than a sentence (``clause_words``): a clause
ending at ``,`` ``;`` or ``:`` after enough words is spoken on its own, so its audio is ready
sooner; the rest of the sentence follows as the next unit. ``max_words`` bounds it further: a
first unit with no sentence or clause end within that many words ends after them, at a word
that does not leave the fragment hanging on an article, preposition or conjunction.
"""

from __future__ import annotations

import re

_END = re.compile(r"(?<!\b\d)(?<!\b[A-Za-z])[.?!]+[\"')\]]*(?=\s)")
_CLAUSE = re.compile(r"[,;:](?=\s)")
_WORD = re.compile(r"\S+(?=\s)")
#: words a spoken fragment should not end on (it would hang: "Octopuses have three hearts and")
_HANGING = frozenset(
    "a an the and or but nor so to of in on at by for with from into about as than that which who "
    "whose whom is are was were be been being has have had do does did will would can could "
    "should may might must my your his her its our their this these those very not".split()
)
#: how many words past ``max_words`` a fragment may grow while its last word would hang
_HANG_SLACK = 3


def first_sentence_end(
    text: str, complete: bool = False, line_breaks: bool = False, clause_words: int = 0, max_words: int = 0
) -> int:
    """Character index just past the first sentence, or -1 if it is not finished yet.

    ``complete``: the text is the whole response, so its end also ends a sentence.
    ``line_breaks``: a line break after some text ends a sentence too (a list's lead-in
    "... are:" and each item are spoken as sentences of their own).
    ``clause_words``: if > 0, a clause of at least that many words ending at ``,`` ``;`` or
    ``:`` (before the sentence's end) ends the unit too.
    ``max_words``: if > 0, a unit that would run past that many words ends after the first
    word from there on that does not hang (``_HANGING``; at most ``_HANG_SLACK`` words more),
    once the word after it has begun.
    """
    end = _sentence_end(text, complete, line_breaks)
    if clause_words > 0:
        for m in _CLAUSE.finditer(text):
            if end >= 0 and m.end() >= end:
                break
            if len(text[: m.start()].split()) >= clause_words:
                end = m.end()
                break
    if max_words > 0:
        cut = _word_cut(text, max_words)
        if cut >= 0 and (end < 0 or cut < end):
            return cut
    return end


def _word_cut(text: str, max_words: int) -> int:
    """Index just past the word that ends a ``max_words`` fragment (-1: not there yet)."""
    for n, m in enumerate(_WORD.finditer(text), 1):
        if n < max_words:
            continue
        word = m.group().strip("\"'()[]").lower()
        if n >= max_words + _HANG_SLACK or word not in _HANGING:
            # the cut needs the next word begun: a space alone may still precede punctuation
            rest = text[m.end() :]
            return m.end() if rest.strip() else -1
    return -1


def _sentence_end(text: str, complete: bool, line_breaks: bool) -> int:
    start = len(text) - len(text.lstrip())
    if line_breaks:
        nl = text.find("\n", start)
        if nl > start:
            m = _END.search(text, start)
            if m is None or m.end() > nl:
                return nl
    for m in _END.finditer(text):
        if m.end() > start and text[start : m.end()].strip():
            return m.end()
    if complete and text.strip():
        return len(text.rstrip())
    return -1


def split_sentences(text: str, line_breaks: bool = False) -> list[str]:
    """All sentences of a complete response, in order."""
    out = []
    rest = text
    while rest.strip():
        end = first_sentence_end(rest, complete=True, line_breaks=line_breaks)
        out.append(rest[:end].strip())
        rest = rest[end:]
    return out


def bounded_pieces(text: str, max_chars: int) -> list[str]:
    """``text`` in consecutive pieces of at most ``max_chars`` characters, for a synthesizer
    whose memory grows with the longest input it is given.

    Pieces end at sentence ends where they can (a text of short sentences is split between
    them, as a synthesizer would speak them anyway), else after a clause mark (``,`` ``;``
    ``:``), else at a space; a single word longer than ``max_chars`` stays whole. Joined with
    spaces, the pieces give back the text's words in order.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    text = text.strip()
    pieces: list[str] = []
    while len(text) > max_chars:
        head = text[: max_chars + 1]
        cut = -1
        for pattern in (_END, _CLAUSE):
            ends = [m.end() for m in pattern.finditer(head) if m.end() <= max_chars]
            if ends:
                cut = ends[-1]
                break
        if cut <= 0:
            cut = head.rfind(" ")
        if cut <= 0:  # one long word: up to the next space
            cut = text.find(" ", max_chars)
            if cut < 0:
                break
        pieces.append(text[:cut].strip())
        text = text[cut:].strip()
    if text:
        pieces.append(text)
    return [p for p in pieces if p]


def bounded_phonemes(phonemes: list[str], limit: int) -> list[list[str]]:
    """``phonemes`` (one sentence, as Piper's ``phonemize`` gives it) in consecutive pieces of at
    most ``limit``, split where a word ends (the space phoneme, dropped at the cut); a single
    word longer than ``limit`` stays whole. Joined with spaces, the pieces give back the
    phonemes."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    pieces: list[list[str]] = []
    rest = list(phonemes)
    while len(rest) > limit:
        spaces = [i for i, p in enumerate(rest[: limit + 1]) if p == " " and i > 0]
        cut = spaces[-1] if spaces else next((i for i, p in enumerate(rest) if p == " " and i > 0), len(rest))
        pieces.append(rest[:cut])
        rest = rest[cut + 1 :]
    if rest:
        pieces.append(rest)
    return pieces
