"""Live speech pipelines: PCM audio in, typed events out (see ``pipeline``, ``voicechat``,
``translator``, ``transcriber``); ``clock.play`` drives one in real or simulated time."""

from speclive.live.clock import PlayResult, VirtualClock, WallClock, play
from speclive.live.pipeline import LiveConfig, LivePipeline
from speclive.live.transcriber import LiveTranscriber
from speclive.live.translator import LiveTranslator
from speclive.live.vad import TurnConfig
from speclive.live.voicechat import VoiceChat

__all__ = [
    "LiveConfig",
    "LivePipeline",
    "LiveTranscriber",
    "LiveTranslator",
    "PlayResult",
    "TurnConfig",
    "VirtualClock",
    "VoiceChat",
    "WallClock",
    "play",
]
