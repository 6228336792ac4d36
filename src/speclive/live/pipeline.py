"""The live pipeline's common half: PCM chunks in, turns and streaming transcripts out.

``LivePipeline`` is transport-free. ``push(chunk)`` takes input audio (any sample rate and
channel count, float or int16; cheap: it buffers and runs the VAD), ``step(deadline)`` does ONE
unit of compute (an ASR pass, a speculation, a decoder step, a sentence's synthesis) and returns
its events, or ``None`` when there is nothing to do, ``close()`` ends the input and finishes
the work in progress, and ``abort()`` (the listener is gone) drops it and frees what it holds.
``background`` says whether the unit ``step`` would run now is optional work that only makes a
later answer faster, so a shared server can run it after the work its users wait for.
``clock.play`` drives it in real or simulated time; a server calls
``push`` from its socket and ``step`` from its worker.

Scheduling on a shared CPU: the transcript comes first, then what the subclass speculates in
the gaps (``_work``). Each unit is charged to its clock, so a turn's figures count everything
that ran while the user spoke. Subclasses (voice chat, live translation, transcription) hook
into the turn: ``_on_turn_start``, ``_on_partial`` (a new streaming transcript),
``_on_pause`` (the user paused: the transcript of the turn so far is final unless they go on),
``_on_resume``, ``_on_end`` (end of turn: the final transcript), and ``_work`` (their own units).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from speclive.asr.audio import SAMPLE_RATE, to_mono_16k
from speclive.asr.passes import StreamPasses
from speclive.asr.streaming import OnlineASR, StreamConfig, Word, spread_words
from speclive.errors import ConfigError
from speclive.live.clock import Clock, WallClock
from speclive.live.events import (
    Event,
    Notice,
    SpeechStarted,
    SpeechStopped,
    TranscriptFinal,
    TranscriptPartial,
)
from speclive.live.vad import StreamingVAD, TurnChange, TurnConfig, TurnDetector


@dataclass
class LiveConfig:
    turn: TurnConfig = field(default_factory=TurnConfig)
    #: seconds of new speech between streaming transcription passes
    asr_step_s: float = 1.0
    #: streaming partial transcripts (off: only the final transcript at the end of turn)
    partials: bool = True
    #: compute the turn's final transcript at a pause, before the end of turn is certain
    early_final: bool = True
    #: draft every transcription pass of a turn with the hypotheses of the passes before it
    #: (off: each pass decodes from scratch; the transcripts are the same)
    stream_draft: bool = True
    #: the model of the streaming partial passes, "target" or "draft" (None: the transcriber's
    #: own ``stream_partials``)
    stream_partials: str | None = None


def as_mono_16k(chunk: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Float32 mono 16 kHz from float or int16 PCM, ``[n]`` or ``[n, channels]``."""
    a = np.asarray(chunk)
    if a.dtype == np.int16:
        a = a.astype(np.float32) / 32768.0
    elif a.dtype.kind == "i":
        raise ConfigError(f"PCM samples must be int16 or float, got {a.dtype}")
    return to_mono_16k(a.astype(np.float32, copy=False), sample_rate)


@dataclass
class _Turn:
    index: int
    start_t: float  # input time the speech started
    audio_start_t: float = 0.0  # input time of the turn audio's first sample (pre-roll included)
    audio: list[np.ndarray] = field(default_factory=list)
    asr: OnlineASR | None = None
    fed_s: float = 0.0  # audio handed to the streaming ASR (seconds of the turn)
    passes: StreamPasses | None = None  # the turn's transcription passes (drafted by each other)
    partial: str = ""
    final: str | None = None  # the final transcript (set at a pause or at the end)
    final_audio_s: float = 0.0  # turn audio the final transcript covers
    speech_end_t: float | None = None
    eot_t: float | None = None
    ended: bool = False
    end_done: bool = False
    capped: bool = False
    compute: dict[str, float] = field(default_factory=lambda: {"asr": 0.0, "llm": 0.0, "tts": 0.0})
    asr_passes: int = 0
    max_lag_s: float = 0.0

    def samples(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)


class LivePipeline:
    """See the module docstring. ``transcriber`` is an ``asr.transcribe.Transcriber``."""

    def __init__(
        self,
        transcriber,
        config: LiveConfig | None = None,
        clock: Clock | None = None,
        sample_rate: int = SAMPLE_RATE,
    ):
        self.cfg = config or LiveConfig()
        self.cfg.turn.validate()
        if self.cfg.asr_step_s <= 0:
            raise ConfigError(f"asr_step_s must be > 0, got {self.cfg.asr_step_s}")
        self.transcriber = transcriber
        self.clock: Clock = clock or WallClock()
        self.sample_rate = int(sample_rate)
        self.vad = StreamingVAD()
        self.turns = TurnDetector(self.cfg.turn)
        self.received = 0  # 16 kHz samples received
        self.recent: list[np.ndarray] = []  # audio kept for the pre-roll while no turn is open
        self.turn: _Turn | None = None
        self.n_turns = 0
        self.closed = False
        self.heard_speech = False

    # ---- input ---------------------------------------------------------------------------
    def push(self, chunk: np.ndarray) -> list[Event]:
        """Input audio (at the pipeline's ``sample_rate``); returns the VAD's events."""
        if self.closed:
            raise ConfigError("push() after close(): this live pipeline is closed")
        a = as_mono_16k(chunk, self.sample_rate)
        if a.size == 0:
            return []
        lag = self.clock() - (self.received + len(a)) / SAMPLE_RATE
        start = self.received
        self.received += len(a)
        probs = self.vad(a)
        changes = self.turns.feed(probs)
        events: list[Event] = []
        turn = self.turn
        # an ended turn keeps its audio while the user could still take it up again
        if turn is not None and (not turn.ended or self._mergeable(turn)):
            turn.audio.append(a)
            turn.max_lag_s = max(turn.max_lag_s, lag)
        self.recent.append(a)  # the pre-roll of a new turn
        keep = int(self.cfg.turn.preroll_s * SAMPLE_RATE) + int(self.cfg.turn.min_speech_s * SAMPLE_RATE)
        while sum(len(x) for x in self.recent) - len(self.recent[0]) > keep + len(a):
            self.recent.pop(0)
        for ch in changes:
            events += self._turn_change(ch, start)
        return events

    def _turn_change(self, ch: TurnChange, chunk_start: int) -> list[Event]:
        now = self.clock()
        if ch.kind == "start":
            self.heard_speech = True
            prev = self.turn
            if prev is not None and prev.ended and self._mergeable(prev):
                # speech again before the answer was heard: the same turn goes on (nothing of
                # it is dropped; what was prepared for its first end is discarded)
                prev.ended = prev.end_done = prev.capped = False
                prev.final = prev.eot_t = prev.speech_end_t = None
                self.recent = []
                return [SpeechStarted(now, audio_t=ch.audio_t), *self._on_reopen(prev)]
            events = self._interrupt(now)
            self.n_turns += 1
            turn = _Turn(self.n_turns, ch.audio_t)
            # the turn's audio starts a pre-roll before the detected start
            begin = max(0, int((ch.audio_t - self.cfg.turn.preroll_s) * SAMPLE_RATE))
            held = np.concatenate(self.recent) if self.recent else np.zeros(0, np.float32)
            held_start = self.received - len(held)
            skip = max(0, begin - held_start)
            turn.audio.append(held[skip:])
            turn.audio_start_t = (held_start + skip) / SAMPLE_RATE
            self.recent = []
            partials = None
            if self.cfg.stream_partials is not None:
                partials = self.transcriber.partial_transcriber(self.cfg.stream_partials)
            turn.passes = StreamPasses(self.transcriber, draft=self.cfg.stream_draft, partials=partials)
            if self.cfg.partials:
                turn.asr = OnlineASR(self._recognizer(turn), StreamConfig(buffer_s=25.0))
            self.turn = turn
            events.append(SpeechStarted(now, audio_t=ch.audio_t))
            return events + self._on_turn_start(turn)
        turn = self.turn
        if turn is None:
            return []
        if ch.kind == "resume":
            turn.speech_end_t = None
            turn.final = None  # the user went on: a transcript made at the pause was not final
            return self._on_resume(turn)
        turn.speech_end_t = ch.audio_t
        if ch.kind == "pause":
            return [SpeechStopped(now, audio_t=ch.audio_t, end_of_turn=False)]
        # end or capped
        turn.ended, turn.eot_t, turn.capped = True, now, ch.kind == "capped"
        events = [SpeechStopped(now, audio_t=ch.audio_t, end_of_turn=True)]
        if turn.capped:
            events.append(
                Notice(now, "max_speech", f"the turn reached {self.cfg.turn.max_turn_s:g} s and was ended")
            )
        return events

    # ---- compute -------------------------------------------------------------------------
    def step(self, deadline: float | None = None) -> list[Event] | None:
        """One unit of compute; ``None`` when there is nothing to do. ``deadline`` (clock time)
        is when the caller will have new input: long units yield around then."""
        turn = self.turn
        if turn is not None:
            if turn.ended and not turn.end_done:
                if turn.final is None:
                    self._final_transcript(turn)
                turn.end_done = True
                return [TranscriptFinal(self.clock(), text=turn.final or ""), *self._on_end(turn)]
            if not turn.ended and turn.asr is not None and self._asr_due(turn):
                return self._partial_pass(turn)
            if (
                not turn.ended
                and self.cfg.early_final
                and turn.speech_end_t is not None
                and turn.final is None
            ):
                return self._final_transcript(turn)
        return self._work(deadline)

    def _recognizer(self, turn: _Turn):
        """Streaming passes: each drafted by the hypotheses of the passes before it (the same
        audio and a little more: most of it is accepted in one decoder pass), and a pass that
        loops is skipped rather than decoded again over Whisper's full window."""

        def recognize(audio: np.ndarray) -> list[Word]:
            assert turn.passes is not None
            return spread_words(turn.passes.run(audio).text, audio)

        return recognize

    def _asr_due(self, turn: _Turn) -> bool:
        have = sum(len(x) for x in turn.audio) / SAMPLE_RATE
        return turn.speech_end_t is None and have - turn.fed_s >= self.cfg.asr_step_s

    def _charge(self, turn: _Turn | None, kind: str, seconds: float) -> None:
        if turn is not None:
            turn.compute[kind] += seconds

    def _partial_pass(self, turn: _Turn) -> list[Event]:
        assert turn.asr is not None
        t0 = time.perf_counter()
        audio = turn.samples()
        new = audio[int(turn.fed_s * SAMPLE_RATE) :]
        turn.asr.insert(new)
        turn.fed_s = len(audio) / SAMPLE_RATE
        p = turn.asr.process()
        self._charge(turn, "asr", time.perf_counter() - t0)
        turn.asr_passes += 1
        ev = TranscriptPartial(
            self.clock(),
            stable=p.committed_text,
            tentative=" ".join(w.text for w in p.tentative),
            audio_t=turn.audio_start_t + p.audio_s,
        )
        events: list[Event] = [ev]
        if ev.text and ev.text != turn.partial:
            turn.partial = ev.text
            events += self._on_partial(turn, ev)
        return events

    def _final_transcript(self, turn: _Turn) -> list[Event]:
        """The turn's audio up to a pause after its last speech, in one transcription: the text
        every method answers. The cut is decided by the VAD alone (speech end + ``pause_s``),
        so it is the same whenever it runs and however the input was chunked."""
        assert turn.speech_end_t is not None
        t0 = time.perf_counter()
        cut = turn.speech_end_t + self.cfg.turn.pause_s
        audio = turn.samples()[: max(0, int(round((cut - turn.audio_start_t) * SAMPLE_RATE)))]
        assert turn.passes is not None  # the streaming passes heard nearly the same audio
        text = turn.passes.run(audio, final=True).text.strip() if audio.size else ""
        self._charge(turn, "asr", time.perf_counter() - t0)
        turn.asr_passes += 1
        turn.final, turn.final_audio_s = " ".join(text.split()), len(audio) / SAMPLE_RATE
        return [] if turn.ended else self._on_pause(turn)

    @property
    def working(self) -> bool:
        """A turn is open, or what answers it is still being produced."""
        t = self.turn
        return t is not None and not (t.ended and t.end_done)

    @property
    def background(self) -> bool:
        """Whether ``step``'s next unit only speculates (nobody waits for its events yet)."""
        return False

    def abort(self) -> None:
        """Stop at once: nothing pending is computed, the models' state is released."""
        if self.closed:
            return
        self.closed = True
        self.turn = None
        self._release()

    def close(self) -> list[Event]:
        """End of input: end a turn in progress and finish all pending work."""
        if self.closed:
            return []
        events: list[Event] = []
        ch = self.turns.force_end()
        if ch is not None:
            events += self._turn_change(ch, self.received)
        self.closed = True
        while True:
            evs = self.step()
            if evs is None:
                break
            events += evs
        if not self.heard_speech:
            events.append(Notice(self.clock(), "no_speech", "no speech was heard in the input"))
        self._release()
        return events

    # ---- hooks -----------------------------------------------------------------------------
    def _on_turn_start(self, turn: _Turn) -> list[Event]:
        return []

    def _on_partial(self, turn: _Turn, partial: TranscriptPartial) -> list[Event]:
        return []

    def _on_pause(self, turn: _Turn) -> list[Event]:
        return []

    def _on_resume(self, turn: _Turn) -> list[Event]:
        return []

    def _mergeable(self, turn: _Turn) -> bool:
        """Whether speech starting now continues this ended turn (nothing answered it yet)."""
        return not turn.end_done

    def _on_reopen(self, turn: _Turn) -> list[Event]:
        """An ended turn goes on (see ``_mergeable``): drop what was prepared for its end."""
        return []

    def _on_end(self, turn: _Turn) -> list[Event]:
        """End of turn; ``turn.final`` is the final transcript (a TranscriptFinal was sent)."""
        return []

    def _interrupt(self, now: float) -> list[Event]:
        """Speech started: stop what answers the previous turn (barge-in)."""
        return []

    def _work(self, deadline: float | None) -> list[Event] | None:
        return None

    def _release(self) -> None:
        """Free what the pipeline holds in the models (KV states); called once, at the end."""
