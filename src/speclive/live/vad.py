"""Streaming voice activity detection and turn taking.

``StreamingVAD`` runs the Silero VAD model (the ONNX file faster-whisper ships, through
onnxruntime) frame by frame, keeping its recurrent state between calls, so it gives exactly the
probabilities of one pass over the whole input. ``TurnDetector`` turns those probabilities
into turn events with hysteresis:

- speech starts after ``min_speech_s`` of frames at or above ``threshold``;
- a *pause* is ``pause_s`` of frames below ``threshold - 0.15`` after speech (the user may go
  on: speculative work can start), the *end of turn* is ``end_s`` of them;
- speech during a pause resumes the same turn; a turn longer than ``max_turn_s`` is ended.

Times are input times in seconds (sample ``n`` at ``n / 16000``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from speclive.asr.audio import SAMPLE_RATE
from speclive.errors import ConfigError

FRAME = 512  # samples per Silero frame at 16 kHz (32 ms)
_CONTEXT = 64


class StreamingVAD:
    """Speech probability per 32 ms frame of a 16 kHz stream."""

    def __init__(self) -> None:
        from faster_whisper.vad import get_vad_model

        self._session = get_vad_model().session
        self.reset()

    def reset(self) -> None:
        self._h = np.zeros((1, 1, 128), np.float32)
        self._c = np.zeros((1, 1, 128), np.float32)
        self._ctx = np.zeros((1, _CONTEXT), np.float32)
        self._rest = np.zeros(0, np.float32)

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """Probabilities of the complete frames now available (a partial frame waits)."""
        a = np.concatenate([self._rest, np.asarray(audio, np.float32)])
        n = len(a) // FRAME
        self._rest = a[n * FRAME :]
        out = np.empty(n, np.float32)
        for i in range(n):
            frame = a[i * FRAME : (i + 1) * FRAME][None]
            prob, self._h, self._c = self._session.run(
                None, {"input": np.concatenate([self._ctx, frame], 1), "h": self._h, "c": self._c}
            )
            self._ctx = frame[:, -_CONTEXT:]
            out[i] = float(np.ravel(prob)[0])
        return out


@dataclass
class TurnConfig:
    #: speech probability that counts as voice
    threshold: float = 0.5
    #: voice needed to start a turn (seconds)
    min_speech_s: float = 0.1
    #: silence after speech that counts as a pause (speculative final work may start)
    pause_s: float = 0.2
    #: silence after speech that ends the turn
    end_s: float = 0.5
    #: audio kept before the detected start (the VAD reacts a little late)
    preroll_s: float = 0.3
    #: longest turn; speech past it ends the turn (with a notice)
    max_turn_s: float = 30.0

    def validate(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"VAD threshold must be in (0, 1), got {self.threshold}")
        if not 0.0 < self.pause_s <= self.end_s:
            raise ConfigError(f"need 0 < pause_s <= end_s, got {self.pause_s} and {self.end_s}")
        if self.max_turn_s <= 0:
            raise ConfigError(f"max_turn_s must be > 0, got {self.max_turn_s}")


@dataclass
class TurnChange:
    """``kind``: start | pause | resume | end | capped; ``audio_t``: when the speech started
    (start) or last ended (pause, end, capped)."""

    kind: str
    audio_t: float
    #: input time of the frame that decided it
    at: float


class TurnDetector:
    """Feed per-frame probabilities; get the turn changes they decide."""

    def __init__(self, config: TurnConfig | None = None):
        self.cfg = config or TurnConfig()
        self.cfg.validate()
        self.frame_s = FRAME / SAMPLE_RATE
        self.t = 0.0  # input time at the end of the frames seen
        self.in_turn = False
        self.paused = False
        self.voiced_run = 0.0
        self.start_t = 0.0
        self.last_voice_t = 0.0

    def feed(self, probs: np.ndarray) -> list[TurnChange]:
        cfg = self.cfg
        low = cfg.threshold - 0.15
        out: list[TurnChange] = []
        for p in probs:
            self.t += self.frame_s
            voice = p >= cfg.threshold
            if not self.in_turn:
                self.voiced_run = self.voiced_run + self.frame_s if voice else 0.0
                if self.voiced_run >= cfg.min_speech_s - 1e-9:
                    self.in_turn, self.paused = True, False
                    self.start_t = self.t - self.voiced_run
                    self.last_voice_t = self.t
                    out.append(TurnChange("start", self.start_t, self.t))
                continue
            if p >= low and (voice or not self.paused):
                self.last_voice_t = self.t
                if self.paused and voice:
                    self.paused = False
                    out.append(TurnChange("resume", self.last_voice_t, self.t))
            silence = self.t - self.last_voice_t
            if self.t - self.start_t >= cfg.max_turn_s:
                out.append(TurnChange("capped", self.last_voice_t, self.t))
                self._end()
            elif silence >= cfg.end_s - 1e-9:
                out.append(TurnChange("end", self.last_voice_t, self.t))
                self._end()
            elif silence >= cfg.pause_s - 1e-9 and not self.paused:
                self.paused = True
                out.append(TurnChange("pause", self.last_voice_t, self.t))
        return out

    @property
    def silence_s(self) -> float:
        """Silence since the last voiced frame of the open turn (0 when none is open)."""
        return self.t - self.last_voice_t if self.in_turn else 0.0

    def force_end(self) -> TurnChange | None:
        """The input ended: end a turn in progress."""
        if not self.in_turn:
            return None
        ch = TurnChange("end", self.last_voice_t, self.t)
        self._end()
        return ch

    def end_now(self) -> TurnChange | None:
        """End the turn in progress now (a policy decided it is over before the silence
        timeout); None when no turn is open."""
        if not self.in_turn:
            return None
        ch = TurnChange("end", self.last_voice_t, self.t)
        self._end()
        return ch

    def _end(self) -> None:
        self.in_turn = self.paused = False
        self.voiced_run = 0.0


def last_speech_end(probs: np.ndarray, config: TurnConfig | None = None) -> float | None:
    """Input time at which the first silent frame after the last speech has arrived (the end of
    that frame), by ``TurnDetector``'s thresholds: after the last frame at or above
    ``threshold``, the first frame below ``threshold - 0.15``. None when no speech was heard or
    the input ends before such a frame."""
    cfg = config or TurnConfig()
    p = np.asarray(probs, dtype=np.float32)
    voiced = np.nonzero(p >= cfg.threshold)[0]
    if voiced.size == 0:
        return None
    quiet = np.nonzero(p[voiced[-1] + 1 :] < cfg.threshold - 0.15)[0]
    if quiet.size == 0:
        return None
    return float((voiced[-1] + 1 + quiet[0] + 1) * FRAME / SAMPLE_RATE)
