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
from dataclasses import dataclass, field, replace

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
    TurnPrediction,
)
from speclive.live.turnpolicy import TurnPolicy, TurnPolicyConfig, TurnSignals
from speclive.live.vad import StreamingVAD, TurnChange, TurnConfig, TurnDetector

TURN_DETECTION = ("server_vad", "semantic")


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
    #: "server_vad": a turn ends after ``turn.end_s`` of silence; "semantic": ``policy`` ends
    #: it at a pause, from the audio model's and the LM's end-of-turn probabilities
    turn_detection: str = "server_vad"
    #: the end-of-turn policy of ``semantic`` turn detection (live/turnpolicy.py)
    policy: TurnPolicyConfig = field(default_factory=TurnPolicyConfig)


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
    #: semantic turn detection: the signals read at the current pause, whether the policy
    #: ended the turn (rather than the silence timeout), and when (clock time)
    signals: TurnSignals = field(default_factory=TurnSignals)
    text_tried: bool = False
    predicted: bool = False
    decided_t: float | None = None
    compute: dict[str, float] = field(
        default_factory=lambda: {"asr": 0.0, "llm": 0.0, "tts": 0.0, "turn": 0.0}
    )
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
        turn_model=None,
    ):
        self.cfg = config or LiveConfig()
        if self.cfg.turn_detection not in TURN_DETECTION:
            allowed = ", ".join(TURN_DETECTION)
            got = self.cfg.turn_detection
            raise ConfigError(f"invalid turn_detection {got!r}; allowed values: {allowed}")
        #: the end-of-turn policy (semantic turn detection) and its audio model (``predict(audio)
        #: -> P(turn complete)``, e.g. ``live.smartturn.SmartTurn``)
        self.policy: TurnPolicy | None = None
        self.turn_model = turn_model
        if self.cfg.turn_detection == "semantic":
            policy = TurnPolicy(self.cfg.policy)
            # the VAD's pause is the policy's first check, its end of turn the policy's fallback
            self.cfg.turn = replace(self.cfg.turn, pause_s=policy.min_silence_s, end_s=policy.max_silence_s)
            if policy.cfg.kind != "silence":
                self.policy = policy
            if self.policy is not None and self.policy.needs_audio and turn_model is None:
                raise ConfigError(f"the {policy.cfg.kind!r} turn policy needs an audio turn model")
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
        return events + self._decide_turn()

    def _turn_change(self, ch: TurnChange, chunk_start: int) -> list[Event]:
        now = self.clock()
        if ch.kind == "start":
            self.heard_speech = True
            prev = self.turn
            if prev is not None and prev.ended and self._mergeable(prev, ch.audio_t):
                # speech again before the answer was heard, or soon after a predicted end of
                # turn: the same turn goes on (nothing of it is dropped; what was prepared for
                # its first end is discarded, what was played of it stops)
                events = [SpeechStarted(now, audio_t=ch.audio_t), *self._on_reopen(prev)]
                prev.ended = prev.end_done = prev.capped = prev.predicted = False
                prev.final = prev.eot_t = prev.speech_end_t = prev.decided_t = None
                prev.signals, prev.text_tried = TurnSignals(), False
                self.recent = []
                return events
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
                turn.asr = OnlineASR(self._recognizer(turn.passes), StreamConfig(buffer_s=25.0))
            self.turn = turn
            events.append(SpeechStarted(now, audio_t=ch.audio_t))
            return events + self._on_turn_start(turn)
        turn = self.turn
        if turn is None:
            return []
        if ch.kind == "resume":
            turn.speech_end_t = None
            turn.final = None  # the user went on: a transcript made at the pause was not final
            turn.signals, turn.text_tried = TurnSignals(), False
            return self._on_resume(turn)
        turn.speech_end_t = ch.audio_t
        if ch.kind == "pause":
            return [SpeechStopped(now, audio_t=ch.audio_t, end_of_turn=False)]
        # end or capped
        turn.ended, turn.eot_t, turn.capped = True, now, ch.kind == "capped"
        if turn.decided_t is None:
            turn.decided_t = now
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
                and (self.cfg.early_final or self.policy is not None)
                and turn.speech_end_t is not None
                and turn.final is None
            ):
                return self._final_transcript(turn)
            if self.policy is not None and self._paused_with_final(turn):
                events = self._turn_signals(turn)
                if events is not None:
                    return events
        events = self._work(deadline)
        decided = self._decide_turn()
        if decided:
            return (events or []) + decided
        return events

    # ---- semantic turn detection ----------------------------------------------------------
    @staticmethod
    def _paused_with_final(turn: _Turn) -> bool:
        return not turn.ended and turn.speech_end_t is not None and turn.final is not None

    def _cut_samples(self, turn: _Turn) -> np.ndarray:
        """The turn's audio up to its speech end + the pause (the final transcript's audio)."""
        assert turn.speech_end_t is not None
        cut = turn.speech_end_t + self.cfg.turn.pause_s
        return turn.samples()[: max(0, int(round((cut - turn.audio_start_t) * SAMPLE_RATE)))]

    def _turn_signals(self, turn: _Turn) -> list[Event] | None:
        """One unit of the policy's reading at this pause: the audio model's probability, then
        the LM's (where it does not come with the subclass's own work). None: nothing to read."""
        assert self.policy is not None
        sig = turn.signals
        if self.policy.needs_audio and sig.audio is None:
            t0 = time.perf_counter()
            audio = self._cut_samples(turn)
            sig.audio = float(self.turn_model.predict(audio)) if audio.size else 0.0  # type: ignore[union-attr]
            self._charge(turn, "turn", time.perf_counter() - t0)
            return self._decide_turn(force_event=True)
        if self.policy.needs_text and sig.text is None and not turn.text_tried:
            sig.text = self._text_signal(turn, compute=False)
            if sig.text is None and not self._text_comes_with_work(turn):
                t0 = time.perf_counter()
                sig.text = self._text_signal(turn, compute=True)
                self._charge(turn, "llm", time.perf_counter() - t0)
                turn.text_tried = True
                return self._decide_turn(force_event=True)
        return None

    def _decide_turn(self, force_event: bool = False) -> list[Event]:
        """Whether the policy ends the paused turn now; ``TurnPrediction`` when it does (or
        when ``force_event``: new signals were read)."""
        turn = self.turn
        policy = self.policy
        if policy is None or turn is None or not self._paused_with_final(turn):
            return []
        sig = turn.signals
        if policy.needs_text and sig.text is None and not turn.text_tried:
            sig.text = self._text_signal(turn, compute=False)
            if sig.text is not None:
                force_event = True  # read by the speculation's pass: a new signal
            elif self._text_comes_with_work(turn):
                return []  # the LM's reading is on its way: no decision without it
        if not policy.ready(sig):
            return []
        assert turn.speech_end_t is not None
        silence = max(0.0, self.turns.t - turn.speech_end_t)
        end = policy.decide(sig, silence)
        if not (end or force_event):
            return []
        now = self.clock()
        pred = TurnPrediction(
            now,
            audio_p=sig.audio,
            text_p=sig.text,
            score=policy.score(sig),
            bar=min(1.0, policy.bar(silence)),
            silence_s=silence,
            end=end,
        )
        if not end:
            return [pred]
        ch = self.turns.end_now()
        if ch is None:  # pragma: no cover - a paused turn is open in the detector
            return [pred]
        turn.predicted, turn.decided_t = True, now
        return [pred, *self._turn_change(ch, self.received)]

    def _text_signal(self, turn: _Turn, compute: bool) -> float | None:
        """The LM's P(the user's message ends here) for ``turn.final`` (None: none). Without
        ``compute`` only what was read already."""
        return None

    def _text_comes_with_work(self, turn: _Turn) -> bool:
        """Whether the subclass's next ``_work`` reads the text signal anyway."""
        return False

    @staticmethod
    def _recognizer(passes: StreamPasses):
        """Streaming passes: each drafted by the hypotheses of the passes before it (the same
        audio and a little more: most of it is accepted in one decoder pass), and a pass that
        loops is skipped rather than decoded again over Whisper's full window. The function
        holds the turn's passes, not the turn: the turn holds it (``turn.asr``), and a cycle
        would keep the turn's audio until Python's cycle collector runs, minutes later."""

        def recognize(audio: np.ndarray) -> list[Word]:
            return spread_words(passes.run(audio).text, audio)

        return recognize

    def _asr_due(self, turn: _Turn) -> bool:
        have = sum(len(x) for x in turn.audio) / SAMPLE_RATE
        if turn.speech_end_t is not None or have - turn.fed_s < self.cfg.asr_step_s:
            return False
        # The VAD hears silence: within ``pause_s`` either the voice goes on or a pause starts
        # the final pass, which hears the same words. A partial pass started now would hold
        # that pass back by its own length, so it waits.
        return not 0.0 < self.turns.silence_s < self.cfg.turn.pause_s - 1e-9

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
        t0 = time.perf_counter()
        audio = self._cut_samples(turn)
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

    def _mergeable(self, turn: _Turn, at: float | None = None) -> bool:
        """Whether speech starting now (input time ``at``; None: now) continues
        this ended turn: nothing answered it yet, or the policy ended it and the speaker went
        on sooner than the silence timeout would have ended it."""
        return not turn.end_done or self._within_predicted(turn, at)

    def _within_predicted(self, turn: _Turn, at: float | None = None) -> bool:
        if not turn.predicted or turn.speech_end_t is None or self.policy is None:
            return False
        if at is None:  # now: the newest input, or the clock where input stopped coming
            at = max(self.received / SAMPLE_RATE, self.clock())
        return at - turn.speech_end_t < self.policy.max_silence_s

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
