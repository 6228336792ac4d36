"""The speech models behind the audio endpoints: SpecASR Whisper and the Piper voice.

Both run on their own ``ModelWorker``; a whole-file transcription or a synthesis is one turn, a
streaming transcription one pass (``asr.streaming``: 1 s steps, LocalAgreement-2) per turn.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator

import numpy as np

from speclive.asr.streaming import Partial, StreamConfig, stream_file, transcriber_recognizer
from speclive.asr.transcribe import TranscribeConfig, Transcriber, Transcript
from speclive.server.config import ServerConfig
from speclive.tts.base import TTS, Audio
from speclive.tts.piper import PiperTTS

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def speakable(text: str) -> str:
    """``text`` with control characters and lone surrogates blanked (the voice cannot take
    them), trimmed; empty when nothing is left to speak."""
    return _CONTROL.sub(" ", text).strip()


class SpeechToText:
    def __init__(self, transcriber: Transcriber, name: str | None = None, stream_draft: bool = True):
        self.transcriber = transcriber
        self.name = name or transcriber.cfg.model
        self.stream_draft = stream_draft

    @classmethod
    def load(cls, config: ServerConfig) -> SpeechToText:
        cfg = TranscribeConfig(
            model=config.asr_model,
            draft=config.asr_draft,
            method=config.asr_method,
            threads=config.threads,
            stream_partials=config.stream_partials,
        )
        return cls(Transcriber(cfg), stream_draft=config.stream_draft)

    def transcribe(self, audio: np.ndarray) -> Transcript:
        return self.transcriber.transcribe(audio)

    def transcribe_steps(self, audio: np.ndarray) -> Generator[Transcript | None, None, None]:
        """``transcribe`` as a worker stream: ``None`` after each segment (up to 30 s of audio),
        then the ``Transcript``; a long file takes turns with the chat completions."""
        transcript = yield from self.transcriber.transcribe_steps(audio)
        yield transcript

    def stream(self, audio: np.ndarray, step_s: float = 1.0) -> Iterator[Partial]:
        """Partials as if ``audio`` arrived live in ``step_s`` chunks (one pass per item)."""
        recognize = transcriber_recognizer(self.transcriber, draft=self.stream_draft)
        return stream_file(audio, recognize, StreamConfig(step_s=step_s))


class TextToSpeech:
    def __init__(self, tts: TTS):
        self.tts = tts
        self.name = tts.name
        self.sample_rate = int(tts.sample_rate)

    @classmethod
    def load(cls, config: ServerConfig) -> TextToSpeech:
        tts = PiperTTS(config.tts_voice, threads=config.threads)
        tts.reserve()  # its memory is taken at start-up, not sentence by sentence
        return cls(tts)

    def synthesize(self, text: str, speed: float = 1.0) -> Audio:
        """Speech for ``text``; ``speed`` > 1 speaks faster (Piper's length scale 1/speed)."""
        if speed != 1.0 and isinstance(self.tts, PiperTTS):  # the voice that takes a speed
            return self.tts.synthesize(text, speed=speed)
        return self.tts.synthesize(text)
