"""A stream's transcription passes, each drafted by the passes before it.

A streaming recognizer transcribes the same growing audio again and again (partials every step,
then a final pass when the speaker stops). ``StreamPasses`` runs those passes and hands each
pass the last hypotheses as its draft (``drafting.hypothesis``): verification is greedy, so
every pass gives exactly the transcript that plain re-decoding of its audio gives on the model
that ran it, in far fewer decoder passes. ``draft=False`` is the plain re-decoding baseline
(``--no-stream-draft``).

The partial passes may run on a smaller model (``partials``, e.g. the tiny.en that SpecASR
already loads as its draft): the encoder, which every pass runs again over the whole window,
then costs a fraction, and the final pass, on the main model, is drafted by the small model's
last hypothesis (re-tokenized through text when the vocabularies differ). Only the partials'
words come from the small model; the final transcript is the main model's.

Every pass is recorded (``PassRecord``: decoder passes, tokens, encoder and decoder
milliseconds), which is what ``speclive transcribe --stream --json`` and ``speclive bench asr
--stream`` report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from speclive.asr.audio import SAMPLE_RATE


@dataclass
class PassRecord:
    """One transcription pass of a stream."""

    #: "partial" (a streaming pass) or "final"
    kind: str
    #: the model that ran it
    model: str
    #: seconds of audio the pass transcribed
    audio_s: float
    #: tokens of the transcript
    tokens: int
    #: forward passes of the decoder (the prompt's included)
    decoder_passes: int
    encoder_ms: float
    decoder_ms: float
    #: tokens drafted / accepted (earlier hypotheses and the tail drafter together)
    drafted: int
    accepted: int
    text: str
    #: the transcript's token ids (not in ``to_json``)
    token_ids: list[int] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        del d["token_ids"]
        for k in ("audio_s", "encoder_ms", "decoder_ms"):
            d[k] = round(d[k], 3 if k == "audio_s" else 2)
        return d


@dataclass
class _Hypothesis:
    tokenizer: Any
    ids: list[int]
    #: the ids decoded as they are (the leading space kept), to re-tokenize for another model
    raw: str


class StreamPasses:
    """The passes of one stream: partials on ``partials`` (default: what ``transcriber`` picks),
    the final pass on ``transcriber`` (both ``asr.transcribe.Transcriber``)."""

    def __init__(self, transcriber: Any, draft: bool = True, keep: int = 2, partials: Any = None):
        self.transcriber = transcriber
        if partials is None:  # the transcriber's choice (``TranscribeConfig.stream_partials``)
            pick = getattr(transcriber, "partial_transcriber", None)
            partials = pick() if pick is not None else transcriber
        self.partials = partials
        self.draft = draft
        self.keep = max(1, keep)
        #: the latest hypotheses, newest first
        self.hypotheses: list[_Hypothesis] = []
        self.records: list[PassRecord] = []

    def _hints(self, tr: Any) -> list[list[int]]:
        tok = _tokenizer(tr)
        out: list[list[int]] = []
        for h in self.hypotheses:
            ids = h.ids if h.tokenizer is tok else (tok.encode(h.raw) if tok is not None and h.raw else [])
            if ids and ids not in out:
                out.append(ids)
        return out[: self.keep]

    def run(
        self,
        audio: np.ndarray,
        final: bool = False,
        expect: Sequence[str] | None = None,
        loop_fallback: bool | None = None,
    ) -> Any:
        """Transcribe ``audio`` (the stream's buffer) as a partial or the final pass; returns
        the ``Transcript``. A partial that loops gives what came before the loop (see
        ``Transcriber.transcribe``'s ``loop_fallback``). ``expect``: texts the earlier passes may
        have heard in ``audio`` when it is only the end of what they heard; they are the draft.
        ``loop_fallback``: as ``Transcriber.transcribe``'s (default: on for the final pass)."""
        tr = self.transcriber if final else self.partials
        tok = _tokenizer(tr)
        hint = None
        if self.draft and expect and tok is not None:
            hint = [ids for ids in (tok.encode(" " + t.strip()) for t in expect if t.strip()) if ids]
        elif self.draft:
            hint = self._hints(tr)
        fallback = final if loop_fallback is None else loop_fallback
        result = tr.transcribe(audio, loop_fallback=fallback, hint=hint or None)
        ids = [int(t) for t in getattr(result, "token_ids", []) or []]
        if ids and tok is not None:
            raw = tok.decode(ids, skip_special_tokens=True)
            self.hypotheses = [_Hypothesis(tok, ids, raw)] + [
                h for h in self.hypotheses if not (h.tokenizer is tok and h.ids == ids)
            ][: self.keep]
        s = getattr(result, "stats", None)
        target = getattr(tr, "target", None)
        self.records.append(
            PassRecord(
                kind="final" if final else "partial",
                model=str(target.name if target is not None else getattr(tr.cfg, "model", "?")),
                audio_s=len(audio) / SAMPLE_RATE,
                tokens=len(ids),
                decoder_passes=int(getattr(s, "decoder_passes", 0)),
                encoder_ms=float(getattr(s, "encode_ms", 0.0)),
                decoder_ms=float(getattr(s, "decode_ms", 0.0)),
                drafted=int(getattr(s, "drafted", 0)),
                accepted=int(getattr(s, "accepted", 0)),
                text=result.text,
                token_ids=ids,
            )
        )
        return result


def _tokenizer(tr: Any) -> Any:
    """The tokenizer of a transcriber's model (None for one without a speclive Whisper target,
    e.g. faster-whisper: its passes are not drafted)."""
    target = getattr(tr, "target", None)
    return getattr(target, "tokenizer", None)
