"""Piper (VITS, ONNX) voices: ``piper-joe-medium`` from the offline bundle or any local voice."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from speclive.errors import BackendUnavailableError, ConfigError
from speclive.tts.base import Audio, timed


class PiperTTS:
    name = "piper"

    def __init__(self, voice: str = "piper-joe-medium", threads: int | None = None, arena: bool = True):
        try:
            from piper import PiperVoice
        except ImportError as e:  # pragma: no cover - depends on the install
            raise BackendUnavailableError(
                f"piper-tts is not installed ({e}); `pip install piper-tts==1.8.0` or use --no-tts"
            ) from e
        path = Path(voice)
        if not path.is_file():
            from speclive.models.install import install, installed_path
            from speclive.models.registry import get_spec

            spec = get_spec(voice)
            if spec.kind != "piper-voice":
                raise ConfigError(f"{voice!r} is a {spec.kind}, not a Piper voice")
            install(voice, progress=False)
            path = installed_path(voice)
        self.voice = PiperVoice.load(str(path))
        import onnxruntime as ort

        # The session is made again with options of our own (threads are fixed at creation).
        # ``arena``: onnxruntime's CPU arena grows by powers of two to the largest sentence
        # seen and never gives memory back (a server's resident memory steps up by ~100 MB
        # when a longer sentence comes); without it a synthesis's buffers are freed when it
        # ends, but synthesis is slower (docs/server.md, soak).
        so = ort.SessionOptions()
        so.enable_cpu_mem_arena = arena
        if threads is not None:
            so.intra_op_num_threads = int(threads)
        self.voice.session = ort.InferenceSession(
            str(path), sess_options=so, providers=["CPUExecutionProvider"]
        )
        self.sample_rate = int(self.voice.config.sample_rate)
        self.name = f"piper:{path.stem}"

    def _samples(self, text: str) -> np.ndarray:
        chunks = [c.audio_float_array for c in self.voice.synthesize(text)]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)

    def synthesize(self, text: str) -> Audio:
        return timed(self._samples, text, self.sample_rate)
