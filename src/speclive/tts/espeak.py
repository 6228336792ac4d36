"""espeak-ng voices (Debian's ``espeak-ng`` program): a second, very different synthetic voice.

Formant synthesis, robotic but intelligible; used to voice benchmark questions with a voice
other than Piper's, and usable as a TTS anywhere the program is installed.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from speclive.errors import BackendUnavailableError
from speclive.tts.base import Audio, timed


class EspeakTTS:
    def __init__(self, voice: str = "en-us", words_per_minute: int = 165):
        self.exe = shutil.which("espeak-ng")
        if self.exe is None:
            raise BackendUnavailableError("espeak-ng is not installed (Debian: apt-get install espeak-ng)")
        self.voice, self.wpm = voice, int(words_per_minute)
        self.sample_rate = 22050
        self.name = f"espeak-ng:{voice}"

    def _samples(self, text: str) -> np.ndarray:
        import soundfile as sf

        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "speech.wav"
            subprocess.run(
                [self.exe, "-v", self.voice, "-s", str(self.wpm), "-w", str(out), "--", text],
                check=True,
                capture_output=True,
            )
            data, sr = sf.read(str(out), dtype="float32", always_2d=True)
        self.sample_rate = int(sr)
        return data.mean(axis=1)

    def synthesize(self, text: str) -> Audio:
        return timed(self._samples, text, self.sample_rate)
