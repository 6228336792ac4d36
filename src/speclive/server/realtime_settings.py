"""A realtime session's settings: what ``session.update`` may change, how its payload is read
(the GA shape, the beta shape and speclive's own ``speclive`` object) and the live pipeline the
settings ask for, on a ``SessionClock``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speclive.errors import ConfigError
from speclive.live.build import KINDS, LiveModels, make_pipeline
from speclive.live.clock import WallClock
from speclive.live.pipeline import LivePipeline
from speclive.live.turnpolicy import EAGERNESS, TurnPolicyConfig
from speclive.live.vad import TurnConfig
from speclive.live.voicechat import VOICE_MAX_TOKENS, voice_predgen
from speclive.server.realtime_protocol import ProtocolError
from speclive.sessions.predictive import USER_ROOM
from speclive.sessions.retranslate import RetranslateConfig

RATES = (16_000, 24_000)


class SessionClock(WallClock):
    """A realtime session's pipeline clock: wall time until the session ends. ``expire()``
    (the client is gone) moves it past every deadline: a pipeline unit in progress checks its
    deadline after each piece of work (the answer: after each decoder step), so it returns
    after the piece in progress instead of computing on until its deadline for nobody."""

    #: how far ``expire()`` moves the clock: past any deadline a unit can have been given
    JUMP_S = 1e6

    def __init__(self) -> None:
        super().__init__()
        self._jump = 0.0

    def __call__(self) -> float:
        return super().__call__() + self._jump

    def to_perf(self, t: float) -> float:
        return super().to_perf(t - self._jump)

    def expire(self) -> None:
        """Move past every deadline (thread-safe: one float written once)."""
        self._jump = self.JUMP_S

    @property
    def expired(self) -> bool:
        return self._jump > 0


@dataclass
class SessionSettings:
    mode: str = "chat"
    method: str | None = None
    verifier: str = "greedy"
    target_lang: str = "de"
    input_rate: int = 24_000
    output_rate: int = 24_000
    voice: str = "alloy"
    server_vad: bool = True
    #: silence that ends a turn (OpenAI's ``turn_detection.silence_duration_ms``)
    end_s: float = 0.5
    #: ``semantic_vad``: the end-of-turn policy ends a turn, as readily as ``eagerness`` says
    semantic: bool = False
    eagerness: str = "auto"
    speak: bool = True
    instructions: str = ""

    def describe(self, session_id: str, model: str) -> dict[str, Any]:
        """The session object of ``session.created`` / ``session.updated`` (OpenAI's shape)."""
        return {
            "id": session_id,
            "object": "realtime.session",
            "model": model,
            "modalities": ["text", "audio"] if self.speak else ["text"],
            "instructions": self.instructions,
            "voice": self.voice,
            "input_audio_format": "pcm16",
            "output_audio_format": "pcm16",
            "input_audio_transcription": {"model": "whisper-1"},
            "turn_detection": self.turn_detection(),
            "speclive": {
                "mode": self.mode,
                "method": self.method,
                "verifier": self.verifier,
                "target_lang": self.target_lang,
                "sample_rate": self.input_rate,
            },
        }

    def turn_detection(self) -> dict[str, Any] | None:
        if not self.server_vad:
            return None
        if self.semantic:
            return {"type": "semantic_vad", "eagerness": self.eagerness}
        return {"type": "server_vad", "silence_duration_ms": int(self.end_s * 1000)}

    def turn_key(self) -> tuple[Any, ...]:
        """What a pipeline is built for: a change needs a new one."""
        return (
            self.mode,
            self.method,
            self.verifier,
            self.target_lang,
            self.speak,
            self.end_s,
            self.semantic,
            self.eagerness,
        )


def apply_update(s: SessionSettings, session: Any) -> SessionSettings:
    """A new ``SessionSettings`` from a ``session.update`` payload (unknown fields ignored)."""
    if not isinstance(session, dict):
        raise ProtocolError("invalid_value", "session must be an object", "session")
    new = SessionSettings(**s.__dict__)
    _beta_fields(new, session)
    _ga_fields(new, session)
    own = session.get("speclive") or {}
    if not isinstance(own, dict):
        raise ProtocolError("invalid_type", "speclive must be an object", "session.speclive")
    _speclive_fields(new, own)
    return new


def _beta_fields(new: SessionSettings, session: dict) -> None:
    """The beta shape: ``input_audio_format`` / ``output_audio_format``, ``voice``,
    ``modalities``, ``instructions`` and ``turn_detection``."""
    for key in ("input_audio_format", "output_audio_format"):
        fmt = session.get(key)
        if fmt is not None and fmt != "pcm16":
            raise ProtocolError("invalid_value", f"{key} {fmt!r} is not supported; use 'pcm16'", key)
    if "voice" in session:
        if not isinstance(session["voice"], str):
            raise ProtocolError("invalid_type", "voice must be a string", "voice")
        new.voice = session["voice"]
    if "modalities" in session:
        mods = session["modalities"]
        if not isinstance(mods, list) or not all(m in ("text", "audio") for m in mods):
            raise ProtocolError(
                "invalid_value", "modalities must be a list of 'text' and 'audio'", "modalities"
            )
        new.speak = "audio" in mods
    if "instructions" in session and isinstance(session["instructions"], str):
        new.instructions = session["instructions"]
    if "turn_detection" in session:
        _turn_detection(new, session["turn_detection"], "turn_detection")


def _ga_fields(new: SessionSettings, session: dict) -> None:
    """The GA shape: ``session.audio.{input,output}`` and ``output_modalities``."""
    audio = session.get("audio")
    if isinstance(audio, dict):
        inp, outp = audio.get("input") or {}, audio.get("output") or {}
        if isinstance(inp, dict):
            fmt = inp.get("format")
            if isinstance(fmt, dict):
                if fmt.get("type") not in (None, "audio/pcm"):
                    raise ProtocolError(
                        "invalid_value", "only audio/pcm input is supported", "session.audio.input"
                    )
                if "rate" in fmt:
                    if fmt["rate"] not in RATES:
                        raise ProtocolError(
                            "invalid_value", "rate must be 16000 or 24000", "session.audio.input"
                        )
                    new.input_rate = new.output_rate = int(fmt["rate"])
            if "turn_detection" in inp:
                _turn_detection(new, inp["turn_detection"], "session.audio.input.turn_detection")
        if isinstance(outp, dict) and isinstance(outp.get("voice"), str):
            new.voice = outp["voice"]
    if isinstance(session.get("output_modalities"), list):
        new.speak = "audio" in session["output_modalities"]


def _speclive_fields(new: SessionSettings, own: dict) -> None:
    """speclive's own ``speclive`` object: ``mode``, ``method``, ``verifier``, ``target_lang``
    and ``sample_rate``."""
    if "mode" in own:
        if own["mode"] not in KINDS:
            raise ProtocolError(
                "invalid_value", f"mode must be one of {', '.join(KINDS)}", "session.speclive.mode"
            )
        if own["mode"] != new.mode:
            new.method = None
        new.mode = own["mode"]
    if "method" in own:
        new.method = own["method"]
    if "verifier" in own:
        new.verifier = str(own["verifier"])
    if "target_lang" in own:
        new.target_lang = str(own["target_lang"])
    if "sample_rate" in own:
        if own["sample_rate"] not in RATES:
            raise ProtocolError(
                "invalid_value", "sample_rate must be 16000 or 24000", "session.speclive.sample_rate"
            )
        new.input_rate = new.output_rate = int(own["sample_rate"])


def _turn_detection(new: SessionSettings, td: Any, param: str) -> None:
    """``turn_detection`` (``server_vad``, ``semantic_vad`` or null) into ``new``."""
    if td is not None and not (isinstance(td, dict) and td.get("type") in ("server_vad", "semantic_vad")):
        raise ProtocolError(
            "invalid_value", "turn_detection must be {'type': 'server_vad' | 'semantic_vad'} or null", param
        )
    new.server_vad = td is not None
    new.semantic = isinstance(td, dict) and td.get("type") == "semantic_vad"
    if new.semantic:
        eager = td.get("eagerness", "auto")
        if eager not in EAGERNESS:
            raise ProtocolError("invalid_value", f"eagerness must be one of {', '.join(EAGERNESS)}", param)
        new.eagerness = eager
    if isinstance(td, dict) and "silence_duration_ms" in td:
        ms = td["silence_duration_ms"]
        if not isinstance(ms, int | float) or isinstance(ms, bool) or not 200 <= ms <= 5000:
            msg = "silence_duration_ms must be a number from 200 to 5000"
            raise ProtocolError("invalid_value", msg, param)
        new.end_s = ms / 1000


#: the smallest window a voice conversation gets: a message, an answer and a few turns before
LEAST_WINDOW = 2 * (VOICE_MAX_TOKENS + USER_ROOM)


def conversation_window(llm: Any) -> int | None:
    """A voice conversation's share of the KV cells the server's sessions share: the cells over
    the states the backend holds at once (llama.cpp; None where the backend has no such limit),
    at least ``LEAST_WINDOW``. A conversation kept within it leaves out its oldest turns instead
    of evicting another session's cache, whose restore would evaluate that whole conversation
    again while every session waits."""
    cells, states = getattr(llm, "n_cells", None), getattr(llm, "max_states", None)
    if not cells or not states:
        return None
    return max(LEAST_WINDOW, int(cells) // int(states))


def pipeline_for(s: SessionSettings, models: LiveModels, turn: TurnConfig) -> LivePipeline:
    """The live pipeline the settings ask for; settings it cannot be built with are a
    ``ProtocolError``."""
    semantic = {
        "turn_detection": "semantic" if s.semantic and s.server_vad else "server_vad",
        "policy": TurnPolicyConfig(eagerness=s.eagerness),
    }
    try:
        if s.mode == "chat":
            return make_pipeline(
                "chat",
                models,
                mode=s.method,
                clock=SessionClock(),
                turn=turn,
                # the voice prompt, VOICE_MAX_TOKENS, and the conversation's share of the cache
                predgen=voice_predgen(verifier=s.verifier, context_tokens=conversation_window(models.llm)),
                speak=s.speak,
                **semantic,
            )
        if s.mode == "translate":
            return make_pipeline(
                "translate",
                models,
                mode=s.method,
                clock=SessionClock(),
                turn=turn,
                retranslate=RetranslateConfig(target_lang=s.target_lang),
                speak=False,
                **semantic,
            )
        return make_pipeline("transcribe", models, clock=SessionClock(), turn=turn, **semantic)
    except (ConfigError, TypeError, ValueError) as e:
        raise ProtocolError(
            "invalid_value", f"cannot start a {s.mode} session: {e}", "session.speclive"
        ) from e
