"""Global suffix-match datastore (Talon's M_r over a corpus D; Algorithm 1).

The corpus is one int32 token array, documents separated by ``SEP`` (-1). Lookups ask: which
corpus positions end with the longest possible suffix of the current context, and what
followed them? To answer that with *one* narrowing pass (instead of trying ℓ = L, L-1, ...
as Algorithm 1 literally does), the index is a suffix array over the **reversed** corpus: the
context suffix read backwards is a prefix there, so the range of matches for ℓ + 1 tokens is a
sub-range of the range for ℓ. We narrow the range one token at a time and stop at the last
non-empty range: that is the longest matching suffix, i.e. the first ℓ of Algorithm 1 (from
``max_depth`` down) whose SEARCH is non-empty. Every position in the range yields a
continuation; ``continuations`` returns them (at most ``max_samples``, spread evenly) for the
caller to count into a frequency tree.

The suffix array is sorted on the first ``max_depth`` tokens only (prefix doubling with
``np.lexsort``), which is all a lookup of at most ``max_depth`` tokens needs.

File format (``.npz``, uncompressed): ``tokens`` (int32), ``rsa`` (int32/int64 suffix array of the
reversed corpus), ``meta`` (JSON: format version, tokenizer fingerprint, sizes, SHA-256 of the
arrays, sources). ``load`` refuses a file larger than a memory budget before reading it, a
corrupt file, a checksum mismatch and a datastore built for another tokenizer, each with a
message saying what to do.
"""

from __future__ import annotations

import hashlib
import json
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from speclive.errors import SpecliveError
from speclive.tokenizer import Tokenizer

SEP = -1
FORMAT = "speclive-suffix-datastore/1"
#: text whose token ids identify a tokenizer (with its vocabulary size)
_PROBE = "def f(x):\n    return x  # Hello, world! Grüße, 你好 ~ 12345\n"
#: default memory budget of a loaded datastore
DEFAULT_MAX_BYTES = 1 << 30


class DatastoreError(SpecliveError, ValueError):
    """A datastore cannot be built or used (corrupt, wrong tokenizer, too big, empty corpus)."""


def tokenizer_fingerprint(tok: Tokenizer) -> dict[str, Any]:
    ids = tok.encode(_PROBE)
    return {
        "vocab_size": int(tok.vocab_size),
        "probe_sha256": hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16],
    }


def _sha(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def reversed_suffix_array(tokens: np.ndarray, depth: int) -> np.ndarray:
    """Suffix array of ``tokens[::-1]`` sorted on the first ``depth`` tokens (prefix doubling)."""
    n = len(tokens)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    rev = tokens[::-1].astype(np.int64)
    # dense ranks of single tokens; SEP sorts first
    _, rank = np.unique(rev, return_inverse=True)
    rank = rank.astype(np.int64) + 1
    h = 1
    sa = np.argsort(rank, kind="stable")
    while h < depth:
        nxt = np.zeros(n, dtype=np.int64)  # rank of the suffix h further on (0 = past the end)
        nxt[: n - h] = rank[h:]
        sa = np.lexsort((nxt, rank))
        r, s = rank[sa], nxt[sa]
        change = np.empty(n, dtype=np.int64)
        change[0] = 1
        change[1:] = (r[1:] != r[:-1]) | (s[1:] != s[:-1])
        new = np.empty(n, dtype=np.int64)
        new[sa] = np.cumsum(change)
        rank = new
        if rank[sa[-1]] == n:  # all distinct: fully sorted
            break
        h *= 2
    dtype = np.int32 if n < 2**31 - 1 else np.int64
    return sa.astype(dtype)


@dataclass
class Match:
    """Result of one lookup: the longest matched suffix length and its positions' range."""

    length: int
    lo: int
    hi: int

    @property
    def count(self) -> int:
        return self.hi - self.lo


class SuffixDatastore:
    """A corpus of token ids with a reversed suffix array (module docstring)."""

    def __init__(
        self,
        tokens: np.ndarray,
        rsa: np.ndarray | None = None,
        max_depth: int = 32,
        meta: dict[str, Any] | None = None,
    ):
        self.tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        self.max_depth = int(max_depth)
        self.rsa = reversed_suffix_array(self.tokens, self.max_depth) if rsa is None else rsa
        self.meta = dict(meta or {})
        n = len(self.tokens)
        # reversed corpus padded so that rev[rsa[i] + d] never runs off the end
        self._rev = np.concatenate([self.tokens[::-1], np.full(self.max_depth + 1, -2, dtype=np.int32)])
        # range of the suffix array per first token (of the reversed corpus = last token of a match)
        first = self._rev[self.rsa] if n else np.zeros(0, dtype=np.int32)
        self._first = first
        self.n = n

    # ---- building -------------------------------------------------------------------
    @classmethod
    def from_documents(
        cls,
        docs: Iterable[Sequence[int]],
        max_depth: int = 32,
        meta: dict[str, Any] | None = None,
    ) -> SuffixDatastore:
        parts: list[np.ndarray] = []
        n_docs = 0
        for d in docs:
            if len(d) == 0:
                continue
            parts.append(np.asarray(d, dtype=np.int32))
            parts.append(np.array([SEP], dtype=np.int32))
            n_docs += 1
        if not parts:
            raise DatastoreError("empty corpus: no document has any tokens; give non-empty files")
        tokens = np.concatenate(parts)
        if (tokens[tokens != SEP] < 0).any():
            raise DatastoreError("corpus token ids must be >= 0")
        m = dict(meta or {})
        m["n_docs"] = n_docs
        return cls(tokens, None, max_depth, m)

    # ---- persistence ----------------------------------------------------------------
    def nbytes(self) -> int:
        return int(self.tokens.nbytes + self.rsa.nbytes + self._rev.nbytes + self._first.nbytes)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        meta = dict(self.meta)
        meta.update(
            format=FORMAT,
            max_depth=self.max_depth,
            n_tokens=int(self.n),
            tokens_sha256=_sha(self.tokens),
            rsa_sha256=_sha(self.rsa),
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(
                fh, tokens=self.tokens, rsa=self.rsa, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8)
            )
        tmp.replace(path)
        self.meta = meta
        return path

    @classmethod
    def load(
        cls,
        path: str | Path,
        tokenizer: Tokenizer | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> SuffixDatastore:
        path = Path(path)
        if not path.is_file():
            raise DatastoreError(f"datastore not found: {path} (build one with `speclive datastore build`)")
        size = path.stat().st_size
        # loaded, a datastore takes about twice its file size (tokens are also kept reversed)
        if 2 * size > max_bytes:
            raise DatastoreError(
                f"datastore {path} needs about {2 * size / 2**20:.0f} MiB in memory, over the budget of "
                f"{max_bytes / 2**20:.0f} MiB; raise the budget (--datastore-max-mb) or build a smaller one"
            )
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                tokens = z["tokens"]
                rsa = z["rsa"]
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError, EOFError) as e:
            raise DatastoreError(
                f"datastore {path} is corrupt or not a speclive datastore "
                f"({type(e).__name__}: {e}); rebuild it"
            ) from None
        if meta.get("format") != FORMAT:
            raise DatastoreError(f"datastore {path} has format {meta.get('format')!r}, expected {FORMAT!r}")
        if _sha(tokens) != meta.get("tokens_sha256") or _sha(rsa) != meta.get("rsa_sha256"):
            raise DatastoreError(f"datastore {path} is corrupt: checksum mismatch; rebuild it")
        if len(rsa) != len(tokens) or int(meta.get("n_tokens", -1)) != len(tokens):
            raise DatastoreError(f"datastore {path} is corrupt: array sizes disagree; rebuild it")
        if tokenizer is not None:
            want = tokenizer_fingerprint(tokenizer)
            have = meta.get("tokenizer", {})
            if {k: have.get(k) for k in want} != want:
                raise DatastoreError(
                    f"datastore {path} was built for another tokenizer (model {meta.get('model')!r}, "
                    f"vocab {have.get('vocab_size')}) than this model's (vocab {want['vocab_size']}); "
                    "rebuild it with --model set to this model"
                )
        return cls(tokens, rsa, int(meta.get("max_depth", 32)), meta)

    # ---- lookups --------------------------------------------------------------------
    def _narrow(self, lo: int, hi: int, d: int, v: int) -> tuple[int, int]:
        """Sub-range of ``[lo, hi)`` whose reversed suffixes have token ``v`` at offset ``d``."""
        rev, sa = self._rev, self.rsa
        if hi - lo <= 64:
            keys = rev[sa[lo:hi] + d]
            key = np.int32(v)
            return lo + int(np.searchsorted(keys, key, "left")), lo + int(np.searchsorted(keys, key, "right"))
        a, b = lo, hi
        while a < b:  # first index with key >= v
            mid = (a + b) // 2
            if rev[sa[mid] + d] < v:
                a = mid + 1
            else:
                b = mid
        left = a
        b = hi
        while a < b:  # first index with key > v
            mid = (a + b) // 2
            if rev[sa[mid] + d] <= v:
                a = mid + 1
            else:
                b = mid
        return left, a

    def match(self, context: Sequence[int], max_len: int | None = None) -> Match:
        """Longest suffix of ``context`` (at most ``max_len`` tokens) that occurs in the corpus."""
        if self.n == 0 or not len(context):
            return Match(0, 0, 0)
        limit = min(max_len or self.max_depth, self.max_depth, len(context))
        # an int32 key: a Python int would make NumPy cast the whole int32 array to int64
        # (a copy of the whole corpus per lookup, far slower than the search itself)
        v0 = np.int32(context[-1])
        lo = int(np.searchsorted(self._first, v0, "left"))
        hi = int(np.searchsorted(self._first, v0, "right"))
        if lo >= hi:
            return Match(0, 0, 0)
        length = 1
        while length < limit:
            v = int(context[-1 - length])
            a, b = self._narrow(lo, hi, length, v)
            if a >= b:
                break
            lo, hi, length = a, b, length + 1
        return Match(length, lo, hi)

    def continuations(self, m: Match, depth: int, max_samples: int = 256) -> np.ndarray:
        """int32[s, depth]: what followed the matched positions (``SEP`` after a document ends)."""
        if m.count == 0 or depth <= 0:
            return np.zeros((0, max(depth, 0)), dtype=np.int32)
        idx = np.arange(m.lo, m.hi)
        if len(idx) > max_samples:
            idx = idx[np.linspace(0, len(idx) - 1, max_samples).astype(np.int64)]
        # rev index i <-> corpus index n-1-i: the match ends there, the continuation starts after it
        starts = self.n - self.rsa[idx].astype(np.int64)
        cols = starts[:, None] + np.arange(depth)[None, :]
        out = np.full(cols.shape, SEP, dtype=np.int32)
        ok = cols < self.n
        out[ok] = self.tokens[cols[ok]]
        # a continuation stops at the end of its document
        stop = np.cumsum(out == SEP, axis=1) > 0
        out[stop] = SEP
        return out

    def timed_lookup(
        self, context: Sequence[int], depth: int, max_samples: int = 256
    ) -> tuple[Match, np.ndarray, float]:
        t0 = time.perf_counter()
        m = self.match(context)
        c = self.continuations(m, depth, max_samples)
        return m, c, time.perf_counter() - t0
