"""Speech-LM serving: delay-pattern multi-codebook audio, phase machine, continuous batching, CFG
pairs, codec decode (see ``docs/speechlm.md``)."""

from speclive.speechlm.codec import Codec, HFCodec, RandomRVQDecoder
from speclive.speechlm.engine import EngineCore, SpeechLMEngine, SpeechResult
from speclive.speechlm.guidance import SamplingParams
from speclive.speechlm.model import SpeechLM, SpeechLMConfig
from speclive.speechlm.scheduler import SchedulerConfig

__all__ = [
    "Codec",
    "EngineCore",
    "HFCodec",
    "RandomRVQDecoder",
    "SamplingParams",
    "SchedulerConfig",
    "SpeechLM",
    "SpeechLMConfig",
    "SpeechLMEngine",
    "SpeechResult",
]
