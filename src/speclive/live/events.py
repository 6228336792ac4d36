"""Typed events the live pipelines emit (speech, transcripts, speculation, answer, audio, metrics).

Every event carries ``t``: the pipeline's clock when it happened, in seconds on the input's own
timeline (sample ``n`` of the input arrives at ``n / 16000``), so an event's time minus an
audio time is a latency the user feels. ``to_json()`` gives a plain dict with a ``type`` field
(audio samples are summarized, not serialized); transports (CLI, server) only map these.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np


@dataclass
class Event:
    t: float
    type: ClassVar[str] = "event"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, np.ndarray):
                continue
            out[f.name] = round(v, 4) if isinstance(v, float) else v
        return out


@dataclass
class SpeechStarted(Event):
    """The VAD heard speech starting at ``audio_t`` (input time)."""

    audio_t: float = 0.0
    type: ClassVar[str] = "speech_started"


@dataclass
class SpeechStopped(Event):
    """The VAD heard a pause: the last speech ended at ``audio_t``. ``end_of_turn`` tells a
    pause (the user may go on) from the end of the turn (silence long enough)."""

    audio_t: float = 0.0
    end_of_turn: bool = False
    type: ClassVar[str] = "speech_stopped"


@dataclass
class TurnPrediction(Event):
    """The end-of-turn policy at a pause: the audio model's and the LM's probability that the
    turn is over (None: not read), the policy's fused ``score``, the bar it had to clear after
    ``silence_s`` of silence, and whether it ended the turn (``end``)."""

    audio_p: float | None = None
    text_p: float | None = None
    score: float | None = None
    bar: float = 0.0
    silence_s: float = 0.0
    end: bool = False
    type: ClassVar[str] = "turn_prediction"


@dataclass
class TranscriptPartial(Event):
    """Streaming transcript of the turn so far: ``stable`` words never change, ``tentative``
    ones may; ``audio_t`` is how much input the pass had heard."""

    stable: str = ""
    tentative: str = ""
    audio_t: float = 0.0
    type: ClassVar[str] = "transcript_partial"

    @property
    def text(self) -> str:
        return " ".join(s for s in (self.stable, self.tentative) if s)


@dataclass
class TranscriptFinal(Event):
    """The whole turn transcribed (the text the answer or translation is final for)."""

    text: str = ""
    type: ClassVar[str] = "transcript_final"


@dataclass
class Speculation(Event):
    """An answer speculated while the user speaks: ``partial`` is the transcript it answers,
    ``first_sentence`` the part pre-synthesized; ``drafted``/``accepted`` count the previous
    candidate's tokens offered to and kept by the verifier."""

    partial: str = ""
    candidate: str = ""
    first_sentence: str = ""
    drafted: int = 0
    accepted: int = 0
    presynthesized: bool = False
    type: ClassVar[str] = "speculation"


@dataclass
class AnswerDelta(Event):
    """New answer text (after the end of the turn)."""

    text: str = ""
    type: ClassVar[str] = "answer_delta"


@dataclass
class AudioChunk(Event):
    """A sentence of answer audio, ready at ``t``; it plays from ``play_at`` (after the end of
    the turn and after the previous sentence)."""

    samples: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32), repr=False)
    sample_rate: int = 0
    sentence: int = 0
    text: str = ""
    play_at: float = 0.0
    duration_s: float = 0.0
    type: ClassVar[str] = "audio"


@dataclass
class TranslationUpdate(Event):
    """Live translation: ``stable`` is final (finished utterances), ``tentative`` the
    utterance in progress as displayed; ``source`` the transcript it translates."""

    stable: str = ""
    tentative: str = ""
    source: str = ""
    final: bool = False
    #: input time of the newest audio the source came from (display latency = t - audio_t)
    audio_t: float = 0.0
    type: ClassVar[str] = "translation"


@dataclass
class Interrupted(Event):
    """Barge-in: the user spoke during the answer; it stopped. ``played`` is what was heard
    (and what the conversation history keeps)."""

    played: str = ""
    type: ClassVar[str] = "interrupted"


@dataclass
class Notice(Event):
    """Something the user should know: ``no_speech`` (a turn or input without words),
    ``max_speech`` (the turn reached the configured cap and was ended), ``lagging``."""

    code: str = ""
    message: str = ""
    type: ClassVar[str] = "notice"


@dataclass
class TurnMetrics(Event):
    """What one turn cost and what the user felt (seconds)."""

    turn: int = 0
    transcript: str = ""
    answer: str = ""
    translation: str = ""
    #: end of the user's speech (input time) -> first answer audio can play
    latency_s: float | None = None
    #: end of speech -> first answer audio ready (may be before the end of turn is known)
    audio_ready_s: float | None = None
    #: end of speech -> end of turn detected
    eot_delay_s: float = 0.0
    speech_end_t: float = 0.0
    #: the first sentence's audio was ready when the end of turn was detected
    audio_ready_at_eot: bool = False
    asr_s: float = 0.0
    llm_s: float = 0.0
    tts_s: float = 0.0
    asr_passes: int = 0
    target_forwards: int = 0
    speculations: int = 0
    drafted: int = 0
    accepted: int = 0
    #: longest time input audio waited to be processed during the turn
    max_lag_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    type: ClassVar[str] = "turn_metrics"
