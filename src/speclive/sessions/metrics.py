"""Streaming-output metrics: erasure and normalized erasure (flicker), text units per language.

SSBD eqs. 3-4: the erasure of update i is how many units of the previous displayed output
must be deleted to reach the new one, ``E(i) = |Y_{i-1}| - |LCP(Y_{i-1}, Y_i)|``; the
normalized erasure of a stream is ``NE = sum_i E(i) / |Y_final|``. Units are words for
languages written with spaces and characters for Chinese and Japanese (the paper used the
Flores-101 sentencepiece model there, which is not available offline; characters are the
closest tokenizer-free unit and are documented as such in every report).
"""

from __future__ import annotations

from collections.abc import Sequence

CHARACTER_LANGS = frozenset({"zh", "ja", "ko", "th"})


def units(text: str, lang: str) -> list[str]:
    """Split ``text`` into the units erasure is counted in for language ``lang``."""
    if lang in CHARACTER_LANGS:
        return [c for c in text if not c.isspace()]
    return text.split()


def common_prefix(a: Sequence, b: Sequence) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def erasure(prev: Sequence, new: Sequence) -> int:
    """Units of ``prev`` deleted from its end to turn it into a prefix of ``new``."""
    return len(prev) - common_prefix(prev, new)


def normalized_erasure(displays: Sequence[str], lang: str) -> float:
    """NE of a stream of displayed outputs (the last one is the final output)."""
    seqs = [units(d, lang) for d in displays]
    if not seqs:
        return 0.0
    total = sum(erasure(a, b) for a, b in zip(seqs, seqs[1:], strict=False))
    final = len(seqs[-1])
    return total / final if final else float(total > 0)
