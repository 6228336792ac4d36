"""Sentence boundaries for sentence-wise TTS: a sentence ends at ``.``, ``?`` or ``!``.

During generation a period is only a sentence end once the next character is known: "3.14"
and "e.g." are not, so the end is confirmed by following whitespace (or by the end of the
response). Lists ("1. Apples") are not broken after the number.

A voice answer's *first* unit may be shorter than a sentence (``clause_words``): a clause
ending at ``,`` ``;`` or ``:`` after enough words is spoken on its own, so its audio is ready
sooner; the rest of the sentence follows as the next unit.
"""

from __future__ import annotations

import re

_END = re.compile(r"(?<!\b\d)(?<!\b[A-Za-z])[.?!]+[\"')\]]*(?=\s)")
_CLAUSE = re.compile(r"[,;:](?=\s)")


def first_sentence_end(
    text: str, complete: bool = False, line_breaks: bool = False, clause_words: int = 0
) -> int:
    """Character index just past the first sentence, or -1 if it is not finished yet.

    ``complete``: the text is the whole response, so its end also ends a sentence.
    ``line_breaks``: a line break after some text ends a sentence too (a list's lead-in
    "... are:" and each item are spoken as sentences of their own).
    ``clause_words``: if > 0, a clause of at least that many words ending at ``,`` ``;`` or
    ``:`` (before the sentence's end) ends the unit too.
    """
    end = _sentence_end(text, complete, line_breaks)
    if clause_words > 0:
        for m in _CLAUSE.finditer(text):
            if end >= 0 and m.end() >= end:
                break
            if len(text[: m.start()].split()) >= clause_words:
                return m.end()
    return end


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
