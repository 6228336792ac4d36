"""Whole-file transcription: audio -> segments -> the one decode loop -> text + stats.

Methods (``TranscribeConfig.method``):

- ``ar``: greedy autoregressive decoding on the transformers Whisper backend (the reference);
- ``sd``: plain speculative decoding with a fixed draft length (``sd_len``, no truncation);
- ``specasr``: the SpecASR drafter (``drafting.specasr``) with the techniques in ``specasr``;
- ``faster-whisper``: CTranslate2 greedy decoding (speed reference; its own runtime).

Drafts (``draft``): ``"self"`` / ``"self:N"`` = the first N decoder layers of the target with a
vocabulary-limited head (same vocabulary, shares the encoder pass); a model name or path =
another Whisper model (same vocabulary: used as-is; other vocabulary: cross-vocabulary drafting,
where SpecASR contributes its adaptive single-sequence prediction).

Segments are at most 30 s (Whisper's window); a segment whose peak level is below
``silence_peak`` is skipped (empty text, no hallucinated words on silence).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from speclive.asr.audio import SAMPLE_RATE, split_segments
from speclive.asr.whisper import WhisperBackend, load_whisper
from speclive.asr.whisper_bridge import WhisperBridge
from speclive.decoder import GenerationConfig, GenerationStats, SpeculativeDecoder
from speclive.drafting.base import Drafter
from speclive.drafting.hypothesis import HypothesisDrafter
from speclive.drafting.specasr import SpecASRConfig, SpecASRDrafter
from speclive.errors import ConfigError
from speclive.models.resolve import resolve

METHODS = ("ar", "sd", "specasr", "faster-whisper")


@dataclass
class TranscribeConfig:
    #: target model (registry name, folder or hub id)
    model: str = "whisper-base"
    #: ar | sd | specasr | faster-whisper
    method: str = "specasr"
    #: "self", "self:N" (N decoder layers of the target) or another Whisper model
    draft: str = "whisper-tiny.en"
    #: decoder layers of the default self-draft
    self_layers: int = 1
    #: LM-head vocabulary of the self-draft (most frequent BPE ids + specials); None = full
    self_vocab: int | None = 8192
    #: LM-head vocabulary of a separate draft model; None = full. With an int8 draft the full
    #: head is cheap, and the 8192 most frequent ids cut tiny.en's acceptance on the bench clips
    #: (3.3 instead of 5.2 tokens per target pass with recycling)
    draft_vocab: int | None = None
    #: quantize the draft's decoder projections and LM head to int8 (the target stays float32
    #: and verifies every token, so only acceptance can change; drafting gets several times cheaper)
    draft_int8: bool = True
    #: a separate draft model encodes only the audio plus this margin (seconds), not Whisper's
    #: full 30 s window, so its encoder and every draft step's cross-attention run over a few
    #: hundred frames instead of 1500 (whisper.cpp's ``audio_ctx``). The target always encodes
    #: the full window and verifies every token, so only acceptance can change. None: full window.
    #: Self-drafts share the target's encoder output and ignore it.
    draft_audio_margin_s: float | None = 1.0
    #: the target encodes only the audio plus this margin (seconds) too: several times faster
    #: on short audio (a live turn), and no longer identical to the full-window AR transcript.
    #: None: Whisper's full 30 s window (the reference every lossless method reproduces).
    #: A trimmed window can make Whisper loop; a segment whose text compresses too well
    #: (``loop_ratio``, faster-whisper's hallucination test) or that runs past
    #: ``loop_tokens_per_s`` is decoded again over a wider window (``loop_retry_margins_s``,
    #: in order), and over the full window when those loop too.
    target_audio_margin_s: float | None = None
    loop_ratio: float = 2.4
    loop_tokens_per_s: float = 8.0
    #: margins (seconds, each wider than ``target_audio_margin_s``) a looping segment is
    #: decoded with before the full window: a few seconds of padding stop most loops of a
    #: short turn at a fraction of the full window's encoder (docs/asr.md). Empty: straight to
    #: the full window.
    loop_retry_margins_s: tuple[float, ...] = (5.0,)
    #: draft length of plain SD
    sd_len: int = 8
    #: SpecASR switches (defaults: every technique on)
    specasr: SpecASRConfig = field(
        default_factory=lambda: SpecASRConfig(
            recycle=True, sparse_tree=True, tree_verify=True, cost_stop=True
        )
    )
    #: longest segment handed to the model (Whisper's window is 30 s)
    max_segment_s: float = 30.0
    #: segments whose absolute peak is below this are silence (no decoding)
    silence_peak: float = 1e-3
    #: torch threads (None = torch's default)
    threads: int | None = None
    #: torch device of the Whisper models ("cpu", "cuda", "cuda:1"); off the CPU drafts stay
    #: float32 (``draft_int8`` is the CPU's fbgemm kernel)
    device: str = "cpu"
    #: a pass drafted by earlier hypotheses (``transcribe(hint=...)``) drafts the words no
    #: earlier pass heard with this method's drafter too (a separate draft model then encodes
    #: the audio as well); False: the target decodes them one step at a time
    stream_tail: bool = False
    #: which model runs a stream's partial passes (``asr.passes``): "target", or "draft" (the
    #: separate draft model in float32, decoding greedily on its own: every pass re-encodes the
    #: window, and tiny.en's encoder costs a fraction of base's). The final pass always runs on
    #: the target.
    #: A self-draft (``self``/``self:N``) has no encoder of its own: "draft" then means "target"
    stream_partials: str = "target"
    #: LM-head vocabulary of the draft model's partial passes (the most frequent BPE ids plus
    #: the specials): its head is most of a small decoder's step. None: the full vocabulary
    stream_partials_vocab: int | None = 8192


@dataclass
class SegmentResult:
    start: float
    end: float
    text: str
    token_ids: list[int]


@dataclass
class TranscribeStats:
    target_forwards: int = 0
    #: target passes spent on the prompt alone (when it could not ride in the first step)
    prefill_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_forwards: int = 0
    new_tokens: int = 0
    decode_ms: float = 0.0
    encode_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    audio_s: float = 0.0
    #: segments whose trimmed-window decode looped (decoded again over a wider or the full
    #: window, or cut before the loop without ``loop_fallback``)
    loops: int = 0
    #: wider windows (``loop_retry_margins_s``) that looped too
    loop_retries: int = 0

    @property
    def mean_accepted(self) -> float:
        """Tokens committed per target forward pass (prompt pass excluded)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def decoder_passes(self) -> int:
        """Every forward pass of the target's decoder, the prompt's included."""
        return self.target_forwards + self.prefill_forwards

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mean_accepted"] = self.mean_accepted
        d["decoder_passes"] = self.decoder_passes
        return d


@dataclass
class Transcript:
    text: str
    segments: list[SegmentResult]
    stats: TranscribeStats

    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "segments": [{"start": s.start, "end": s.end, "text": s.text} for s in self.segments],
            "stats": self.stats.to_dict(),
        }


#: earlier transcripts drafting a pass: one list of token ids, or several (newest first)
Hint = Sequence[int] | Sequence[Sequence[int]] | None


def _hint_list(hint: Hint) -> list[list[int]]:
    if not hint:
        return []
    if isinstance(hint[0], int | np.integer):
        return [[int(t) for t in hint]]  # type: ignore[union-attr]
    return [[int(t) for t in h] for h in hint if h]  # type: ignore[union-attr]


def _check_stream_partials(which: str) -> str:
    if which not in ("target", "draft"):
        raise ConfigError(f"stream_partials must be 'target' or 'draft', got {which!r}")
    return which


def _repeat_start(ids: list[int], n: int = 4) -> int | None:
    """Where ``ids`` start over: the first position >= n at which its first ``n`` ids recur."""
    if len(ids) < 2 * n:
        return None
    head = ids[:n]
    for p in range(n, len(ids) - n + 1):
        if ids[p : p + n] == head:
            return p
    return None


def _compression_ratio(text: str) -> float:
    """Bytes of ``text`` over its zlib-compressed bytes (a looping transcript compresses well)."""
    import zlib

    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


class Transcriber:
    """Loads the models once; ``transcribe(audio)`` any number of times."""

    def __init__(
        self,
        config: TranscribeConfig | None = None,
        target: WhisperBackend | None = None,
        draft_backend: WhisperBackend | None = None,
    ):
        self.cfg = cfg = config or TranscribeConfig()
        if cfg.method not in METHODS:
            raise ConfigError(f"unknown method {cfg.method!r}; choose one of {', '.join(METHODS)}")
        _check_stream_partials(cfg.stream_partials)
        self._fw: Any = None
        self.target: WhisperBackend | None = None
        self.drafter: Drafter | None = None
        self.draft_backend: WhisperBackend | None = None
        if cfg.method == "faster-whisper":
            return
        self.target = target or load_whisper(
            cfg.model, threads=cfg.threads, audio_margin_s=cfg.target_audio_margin_s, device=cfg.device
        )
        if cfg.method == "ar":
            return
        self.draft_backend = draft_backend or self._load_draft(cfg.draft)
        self.drafter = self._make_drafter(self.draft_backend)
        self.decoder = SpeculativeDecoder(self.target, self.drafter)

    # ---- setup ----------------------------------------------------------------------
    def _load_draft(self, spec: str) -> WhisperBackend:
        assert self.target is not None
        int8 = self.cfg.draft_int8 and self.target.device.type == "cpu"
        if spec == "self" or spec.startswith("self:"):
            n = int(spec.split(":", 1)[1]) if ":" in spec else self.cfg.self_layers
            return self.target.shallow(n, vocab_limit=self.cfg.self_vocab, int8=int8)
        return load_whisper(
            spec,
            threads=self.cfg.threads,
            vocab_limit=self.cfg.draft_vocab,
            int8=int8,
            audio_margin_s=self.cfg.draft_audio_margin_s,
            device=str(self.target.device),
        )

    def _make_drafter(self, draft: WhisperBackend) -> Drafter:
        assert self.target is not None
        cfg = self.cfg
        bridge = None if draft.vocab_size == self.target.vocab_size else WhisperBridge(draft, self.target)
        if cfg.method == "sd":  # plain SD: a fixed-length chain, no technique
            plain = SpecASRConfig(max_len=cfg.sd_len, adaptive=False, recycle=False, sparse_tree=False)
            return SpecASRDrafter(draft, plain, bridge)
        return SpecASRDrafter(draft, cfg.specasr, bridge)

    @property
    def decoder_or_ar(self) -> SpeculativeDecoder:
        if not hasattr(self, "decoder"):
            assert self.target is not None
            self.decoder = SpeculativeDecoder(self.target)
        return self.decoder

    def _hinted_decoder(self, hints: list[list[int]]) -> SpeculativeDecoder:
        """The target drafting from earlier transcripts of (most of) the same audio
        (``HypothesisDrafter``: their rest as a chain or tree, re-aligned after a divergence,
        the new tail by this method's drafter when ``stream_tail``), verified greedily."""
        if not hasattr(self, "_hinted"):
            assert self.target is not None
            tail = self.drafter if self.cfg.stream_tail else None
            self._history = HypothesisDrafter(tail=tail)
            self._hinted = SpeculativeDecoder(self.target, self._history)
        assert self.target is not None
        self._history.set_hypotheses(hints, eos=self.target.specials.eos)
        return self._hinted

    def partial_transcriber(self, which: str | None = None) -> Transcriber:
        """The transcriber of a stream's partial passes (``which``, default ``stream_partials``):
        this one, or one decoding greedily on the separate draft model's weights (loaded once,
        shared with the drafter)."""
        which = _check_stream_partials(which or self.cfg.stream_partials)
        d = self.draft_backend
        if which == "target" or d is None or self.target is None:
            return self
        if d.context is self.target.context:
            return self  # a self-draft: no encoder to save
        if not hasattr(self, "_partials"):
            # the draft's own float32 weights: its int8 layers quantize a whole batch of rows
            # with one scale, so a verification pass would not reproduce one-token steps
            fp32 = WhisperBackend(
                d.model,
                d.tokenizer,
                d.specials,
                name=self.cfg.draft,
                vocab_limit=self.cfg.stream_partials_vocab,
                audio_margin_s=d.audio_margin_s,
            )
            cfg = replace(
                self.cfg, model=self.cfg.draft, method="ar", stream_tail=False, stream_partials="target"
            )
            self._partials = Transcriber(cfg, target=fp32)
        return self._partials

    def _backends_to_encode(self) -> list[WhisperBackend]:
        out = [self.target] if self.target is not None else []
        d = self.draft_backend
        if d is not None and self.target is not None and d.context is not self.target.context:
            out.append(d)
        return out  # type: ignore[return-value]

    # ---- transcription --------------------------------------------------------------
    def transcribe(self, audio: np.ndarray, loop_fallback: bool = True, hint: Hint = None) -> Transcript:
        """Transcribe 16 kHz mono float32 audio (see ``asr.audio.load_audio``).

        ``loop_fallback=False`` (streaming partials, where speed beats completeness): a
        trimmed-window segment that loops gives no text instead of a full-window decode.
        ``hint``: token ids of an earlier transcript of (most of) the same audio, e.g. the last
        streaming pass, or a list of such transcripts (newest first): for a single segment they
        are the draft, verified greedily (the transcript is the same as without the hint; only
        the number of passes changes).
        """
        steps = self.transcribe_steps(audio, loop_fallback, hint)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def transcribe_steps(
        self, audio: np.ndarray, loop_fallback: bool = True, hint: Hint = None
    ) -> Generator[None, None, Transcript]:
        """``transcribe`` one segment (up to ``max_segment_s``) at a time: yields after each
        decoded segment and returns the ``Transcript``, so a caller can interleave other work
        between the segments of a long file."""
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ConfigError(f"transcribe() expects mono audio, got shape {audio.shape}")
        stats = TranscribeStats(audio_s=len(audio) / SAMPLE_RATE)
        segments: list[SegmentResult] = []
        segments_in = split_segments(audio, self.cfg.max_segment_s)
        hints = _hint_list(hint) if len(segments_in) == 1 else []  # a hint is one segment's
        for seg in segments_in:
            chunk = audio[seg.start : seg.end]
            if chunk.size == 0 or float(np.max(np.abs(chunk))) < self.cfg.silence_peak:
                continue
            ids, text = self._decode_segment(chunk, stats, loop_fallback, hints)
            if text.strip():
                segments.append(SegmentResult(seg.start_s, seg.end_s, text.strip(), ids))
            yield
        return Transcript(" ".join(s.text for s in segments), segments, stats)

    def _decode_segment(
        self,
        chunk: np.ndarray,
        stats: TranscribeStats,
        loop_fallback: bool = True,
        hints: list[list[int]] | None = None,
    ) -> tuple[list[int], str]:
        if self.cfg.method == "faster-whisper":
            return self._faster_whisper(chunk, stats)
        assert self.target is not None
        margin = self.target.audio_margin_s
        if margin is None:
            return self._decode_window(chunk, stats, hints=hints)[:2]
        cap = int(len(chunk) / SAMPLE_RATE * self.cfg.loop_tokens_per_s) + 8
        ids, text, looped = self._decode_window(chunk, stats, max_tokens=cap, stop_repeat=True, hints=hints)
        if not self._loops(ids, text, looped, cap):
            return ids, text
        stats.loops += 1
        if not loop_fallback:  # a partial: what came before the loop started, or nothing
            return (ids, text) if looped else ([], "")
        # what came before the text started over is usually right: it drafts the retries
        retry_hints = ([ids] if looped and ids else []) + list(hints or [])
        try:
            # a loop: wider windows, then the full one, decide
            for wider in [m for m in self.cfg.loop_retry_margins_s if m > margin]:
                self.target.audio_margin_s = wider
                if self.target.encoder_frames(len(chunk)) >= self.target.full_frames:
                    break  # as wide as the full window already
                ids, text, looped = self._decode_window(
                    chunk, stats, max_tokens=cap, stop_repeat=True, hints=retry_hints or None
                )
                if not self._loops(ids, text, looped, cap):
                    return ids, text
                stats.loop_retries += 1
            self.target.audio_margin_s = None
            return self._decode_window(chunk, stats, hints=retry_hints or None)[:2]
        finally:
            self.target.audio_margin_s = margin

    def _loops(self, ids: list[int], text: str, looped: bool, cap: int) -> bool:
        """Whether a trimmed window's decode looped (or ran to ``cap`` tokens)."""
        return looped or len(ids) >= cap or _compression_ratio(text) > self.cfg.loop_ratio

    def _decode_window(
        self,
        chunk: np.ndarray,
        stats: TranscribeStats,
        max_tokens: int | None = None,
        stop_repeat: bool = False,
        hints: list[list[int]] | None = None,
    ) -> tuple[list[int], str, bool]:
        """Encode ``chunk`` and decode it; ``stop_repeat`` stops as soon as the text starts over
        (a trimmed window's typical loop) and drops the repeat; ``hints`` draft (see
        ``transcribe``). Returns (ids, text, looped)."""
        assert self.target is not None
        if hints:
            dec = self._hinted_decoder(hints)
            tail = self.cfg.stream_tail and self.drafter is not None
            for b in self._backends_to_encode() if tail else [self.target]:
                stats.encode_ms += 1000 * b.set_audio(chunk)
        else:
            for b in self._backends_to_encode():
                stats.encode_ms += 1000 * b.set_audio(chunk)
            dec = self.decoder_or_ar
        draft_before = self.draft_backend.forward_calls if self.draft_backend is not None else 0
        prompt = self.target.specials.prompt
        limit = self.target.n_ctx - len(prompt) - 1
        gen = GenerationConfig(max_tokens=min(limit, max_tokens or limit), max_draft_nodes=64)
        ids: list[int] = []
        looped = False
        st = GenerationStats()
        events = dec.generate(prompt, gen)
        try:
            for ev in events:
                st = ev.stats  # the generation's totals (final once it is over or closed)
                ids.extend(ev.tokens)
                cut = _repeat_start(ids) if stop_repeat else None
                if cut is not None:
                    ids, looped = ids[:cut], True
                    break
        finally:
            events.close()
        stats.target_forwards += st.target_forwards
        stats.prefill_forwards += st.prefill_forwards
        stats.drafted += st.drafted
        stats.accepted += st.accepted
        stats.new_tokens += len(ids)
        stats.decode_ms += 1000 * st.total_s
        stats.draft_ms += 1000 * st.draft_s
        stats.verify_ms += 1000 * (st.verify_s + st.prefill_s)
        if self.draft_backend is not None:
            stats.draft_forwards += self.draft_backend.forward_calls - draft_before
        return ids, self.target.tokenizer.decode(ids), looped

    def _faster_whisper(self, chunk: np.ndarray, stats: TranscribeStats) -> tuple[list[int], str]:
        if self._fw is None:
            from faster_whisper import WhisperModel

            ref = resolve(self.cfg.model)
            path = str(ref.path) if ref.path is not None else self.cfg.model
            self._fw = WhisperModel(
                path, device="cpu", compute_type="float32", cpu_threads=self.cfg.threads or 0
            )
        t0 = time.perf_counter()
        segs, _info = self._fw.transcribe(
            chunk,
            language="en",
            beam_size=1,
            temperature=0.0,
            without_timestamps=True,
            condition_on_previous_text=False,
            vad_filter=False,
        )
        ids: list[int] = []
        texts: list[str] = []
        for s in segs:
            ids.extend(s.tokens)
            texts.append(s.text)
            stats.target_forwards += len(s.tokens) + 1
        stats.new_tokens += len(ids)
        stats.decode_ms += 1000 * (time.perf_counter() - t0)  # includes CT2's encoder
        return ids, "".join(texts)

    def close(self) -> None:
        if hasattr(self, "decoder"):
            self.decoder.close()
        if hasattr(self, "_hinted"):
            self._hinted.close()
        if hasattr(self, "_partials"):
            self._partials.close()
