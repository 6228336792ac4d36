"""Piper (VITS, ONNX) voices: ``piper-joe-medium`` from the offline bundle or any local voice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from speclive.errors import BackendUnavailableError, ConfigError
from speclive.models.install import install, installed_path
from speclive.models.registry import get_spec
from speclive.tts.base import Audio, timed
from speclive.tts.sentences import bounded_pieces

#: longest text one onnxruntime run synthesizes: longer sentences are split at a clause mark or
#: a space (``bounded_pieces``), which keeps the memory a voice needs bounded
MAX_RUN_CHARS = 320
RESERVE_TEXT = "Speech synthesis reserves the memory its longest sentence needs, once, at the start"


class PiperTTS:
    name = "piper"

    def __init__(self, voice: str = "piper-joe-medium", threads: int | None = None, varied: bool = True):
        """``varied=False`` turns off the voice's random variation (VITS noise scales 0): the same
        text then gives the same samples in every process, e.g. for test clips and benchmark
        audio that must be reproducible."""
        try:
            from piper import PiperConfig, PiperVoice
        except ImportError as e:  # pragma: no cover - depends on the install
            raise BackendUnavailableError(
                f"piper-tts is not installed ({e}); `pip install piper-tts==1.8.0` or use --no-tts"
            ) from e
        path = Path(voice)
        if not path.is_file():
            spec = get_spec(voice)
            if spec.kind != "piper-voice":
                raise ConfigError(f"{voice!r} is a {spec.kind}, not a Piper voice")
            install(voice, progress=False)
            path = installed_path(voice)
        # ``PiperVoice.load`` builds its own session, which has neither our thread count nor our
        # spinning setting: the voice is assembled here instead, so the model loads once. Its
        # config sits beside the model, as Piper expects (``<voice>.onnx.json``).
        # onnxruntime's CPU arena grows by powers of two to the largest input seen and never
        # gives memory back: inputs are bounded (``MAX_RUN_CHARS``) and ``reserve()`` sizes it
        # once (without the arena synthesis is about a quarter slower, docs/server.md)
        config = json.loads(Path(f"{path}.json").read_text(encoding="utf-8"))
        self.voice = PiperVoice(config=PiperConfig.from_dict(config), session=_session(path, threads))
        self.sample_rate = int(self.voice.config.sample_rate)
        self.name = f"piper:{path.stem}"
        self.varied = varied

    def _samples(self, text: str, length_scale: float | None = None) -> np.ndarray:
        syn = None
        if length_scale is not None or not self.varied:
            from piper import SynthesisConfig

            fixed = {} if self.varied else {"noise_scale": 0.0, "noise_w_scale": 0.0}
            syn = SynthesisConfig(length_scale=length_scale, **fixed)
        # one onnxruntime run per bounded piece: the arena never needs more than the largest
        chunks = [
            c.audio_float_array
            for piece in bounded_pieces(text, MAX_RUN_CHARS)
            for c in self.voice.synthesize(piece, syn)
        ]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)

    def synthesize(self, text: str, speed: float = 1.0) -> Audio:
        """Speech for ``text``; ``speed`` > 1 speaks faster (Piper's length scale 1/speed)."""
        scale = None if speed == 1.0 else 1.0 / speed
        return timed(lambda t: self._samples(t, scale), text, self.sample_rate)

    def reserve(self) -> float:
        """Synthesize one text of ``MAX_RUN_CHARS`` now, so the arena holds what the longest
        piece needs from the start (a server's memory is then known when it starts, not
        reached sentence by sentence); returns the seconds it took."""
        words = (RESERVE_TEXT + " ") * (MAX_RUN_CHARS // len(RESERVE_TEXT) + 1)
        text = words[: words.rfind(" ", 0, MAX_RUN_CHARS)] + "."
        return self.synthesize(text).synth_s


def _session(path: Path, threads: int | None) -> Any:
    """Piper's onnxruntime session: ``threads`` intra-op threads (onnxruntime's default: one per
    core) that sleep as soon as a run ends. By default they keep spinning for a while after each
    run, and Piper runs between the LLM's and Whisper's steps on the same cores: a llama.cpp
    step right after a synthesis took a quarter longer on two cores, and synthesis itself was
    no faster for the spinning (docs/live.md)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads is not None:
        so.intra_op_num_threads = int(threads)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
