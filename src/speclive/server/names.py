"""Model names a client may use, and the OpenAI names that map onto the served models.

- chat: the configured ``--model``, the loaded model's registry name, and ``default``; any other
  name (``gpt-4o`` included) is a 404 ``model_not_found``, as vLLM answers;
- transcription: the Whisper model's name plus ``whisper-1``, ``gpt-4o-transcribe``,
  ``gpt-4o-mini-transcribe`` (and ``default``);
- speech: the Piper voice's name plus ``tts-1``, ``tts-1-hd``, ``gpt-4o-mini-tts`` (and
  ``default``); the OpenAI voices (alloy, ash, ...) all speak with the Piper voice.
"""

from __future__ import annotations

import time

from speclive.server.config import ServerConfig
from speclive.server.errors import APIError, model_not_found

OPENAI_TRANSCRIPTION = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")
OPENAI_SPEECH = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse",
)  # fmt: skip
DEFAULT_ALIAS = "default"


class ModelNames:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.created = int(time.time())
        #: the chat model's registry name once it is loaded (may differ from ``config.model``)
        self.llm_name: str | None = None

    # ---- per kind -----------------------------------------------------------------------
    def chat_names(self) -> list[str]:
        names = [self.config.model]
        if self.llm_name and self.llm_name not in names:
            names.append(self.llm_name)
        return [*names, DEFAULT_ALIAS]

    def transcription_names(self) -> list[str]:
        return [self.config.asr_model, *OPENAI_TRANSCRIPTION]

    def speech_names(self) -> list[str]:
        return [self.config.tts_voice, *OPENAI_SPEECH]

    def _check(self, name: str, allowed: list[str]) -> str:
        if name in allowed or name == DEFAULT_ALIAS:
            return allowed[0]
        raise model_not_found(name, allowed)

    def chat(self, name: str) -> str:
        """The served chat model's name for ``name``, or a 404 ``APIError``."""
        return self._check(name, self.chat_names())

    def transcription(self, name: str) -> str:
        return self._check(name, self.transcription_names())

    def speech(self, name: str) -> str:
        return self._check(name, self.speech_names())

    def voice(self, name: str) -> str:
        """The Piper voice for an OpenAI voice name (or the Piper voice's own name)."""
        if name in OPENAI_VOICES or name == self.config.tts_voice or name == DEFAULT_ALIAS:
            return self.config.tts_voice
        raise APIError(
            400,
            f"Unknown voice {name!r}. Voices: {', '.join(OPENAI_VOICES)} (all spoken by "
            f"{self.config.tts_voice}) or {self.config.tts_voice}.",
            code="invalid_value",
            param="voice",
        )

    # ---- GET /v1/models -------------------------------------------------------------------
    def cards(self) -> list[dict]:
        """OpenAI model objects for every servable name (``root`` = the model behind it)."""
        out: list[dict] = []
        groups = (
            ("chat", self.chat_names()),
            ("transcription", [*self.transcription_names(), DEFAULT_ALIAS]),
            ("speech", [*self.speech_names(), DEFAULT_ALIAS]),
        )
        seen: set[str] = set()
        for kind, names in groups:
            for name in names:
                if name in seen:  # "default" is listed once, for chat
                    continue
                seen.add(name)
                out.append(
                    {
                        "id": name,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "speclive",
                        "root": names[0],
                        "speclive": {"kind": kind},
                    }
                )
        return out

    def card(self, name: str) -> dict:
        for c in self.cards():
            if c["id"] == name:
                return c
        raise model_not_found(name, [c["id"] for c in self.cards()])
