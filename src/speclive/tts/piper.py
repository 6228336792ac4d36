"""Piper (VITS, ONNX) voices: ``piper-joe-medium`` from the offline bundle or any local voice."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from speclive.errors import BackendUnavailableError, ConfigError
from speclive.models.install import install, installed_path
from speclive.models.registry import get_spec
from speclive.tts.base import Audio, timed
from speclive.tts.sentences import bounded_phonemes, bounded_pieces

#: longest text one onnxruntime run synthesizes: longer sentences are split at a clause mark or
#: a space (``bounded_pieces``), which keeps the memory a voice needs bounded
MAX_RUN_CHARS = 320
#: most phonemes one onnxruntime run takes at the voice's own speed (slower speech: fewer). The
#: model's memory grows with the audio a run makes, and that follows the phonemes, not the
#: characters: numbers and abbreviations are spoken as many more sounds than they have letters
MAX_RUN_PHONEMES = 256
#: ``reserve()`` speaks its text this much slower than the voice's own speed: headroom for
#: phonemes that last longer than those of the reserve text
RESERVE_SLOWDOWN = 1.25
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
        # gives memory back: inputs are bounded (``MAX_RUN_CHARS``, ``MAX_RUN_PHONEMES``) and
        # ``reserve()`` sizes it once (without the arena synthesis is about a quarter slower,
        # docs/server.md)
        config = json.loads(Path(f"{path}.json").read_text(encoding="utf-8"))
        _select_espeak_voice_once()
        self.voice = PiperVoice(config=PiperConfig.from_dict(config), session=_session(path, threads))
        self.sample_rate = int(self.voice.config.sample_rate)
        self.name = f"piper:{path.stem}"
        self.varied = varied

    def _samples(self, text: str, length_scale: float | None = None) -> np.ndarray:
        syn = self._config(length_scale)
        # one onnxruntime run per bounded piece: at most MAX_RUN_CHARS characters, and at most
        # MAX_RUN_PHONEMES phonemes at the voice's own speed (fewer when it speaks slower), so
        # the arena never needs more than reserve() gave it
        slower = (length_scale or self.voice.config.length_scale) / self.voice.config.length_scale
        limit = max(16, int(MAX_RUN_PHONEMES / max(1.0, slower)))
        chunks = [
            self._run(piece, syn)
            for text_piece in bounded_pieces(text, MAX_RUN_CHARS)
            for phonemes in self.voice.phonemize(text_piece)
            for piece in bounded_phonemes(phonemes, limit)
        ]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)

    def _config(self, length_scale: float | None) -> Any:
        """Piper's synthesis settings: ``length_scale`` (None: the voice's), and without the
        voice's random variation unless ``varied``."""
        from piper import SynthesisConfig

        fixed = {} if self.varied else {"noise_scale": 0.0, "noise_w_scale": 0.0}
        return SynthesisConfig(length_scale=length_scale, **fixed)

    def _run(self, phonemes: list[str], syn: Any) -> np.ndarray:
        """One onnxruntime run, its audio scaled as ``PiperVoice.synthesize`` scales a sentence's."""
        audio = self.voice.phoneme_ids_to_audio(self.voice.phonemes_to_ids(phonemes), syn)
        if syn.normalize_audio:
            peak = float(np.max(np.abs(audio))) if audio.size else 0.0
            audio = np.zeros_like(audio) if peak < 1e-8 else audio / peak
        if syn.volume != 1.0:
            audio = audio * syn.volume
        return np.clip(audio, -1.0, 1.0).astype(np.float32)

    def synthesize(self, text: str, speed: float = 1.0) -> Audio:
        """Speech for ``text``; ``speed`` > 1 speaks faster (Piper's length scale 1/speed)."""
        scale = None if speed == 1.0 else 1.0 / speed
        return timed(lambda t: self._samples(t, scale), text, self.sample_rate)

    def reserve(self) -> float:
        """Synthesize the longest piece one run takes now (``MAX_RUN_PHONEMES`` phonemes, spoken
        ``RESERVE_SLOWDOWN`` slower than the voice's speed), then a piece half as long and the
        longest again, so the arena holds what any later run needs from the start: the second
        long run needs a second region of the arena, since the first is split up by the shorter
        run's tensors. A server's memory is then known when it starts, not reached sentence by
        sentence. Returns the seconds it took."""
        words = (RESERVE_TEXT + ", ") * 8
        phonemes = [p for sentence in self.voice.phonemize(words) for p in sentence]
        syn = self._config(self.voice.config.length_scale * RESERVE_SLOWDOWN)
        t0 = time.perf_counter()
        for size in (MAX_RUN_PHONEMES, MAX_RUN_PHONEMES // 2, MAX_RUN_PHONEMES):
            cut = max(i for i, p in enumerate(phonemes[: size + 1]) if p == " ")
            self._run(phonemes[:cut], syn)
        return time.perf_counter() - t0


def _select_espeak_voice_once() -> None:
    """Make Piper select its espeak-ng voice only when it changes.

    Piper selects the voice (``espeakbridge.set_voice``) before every text it phonemizes, and
    espeak-ng allocates the voice anew each time without freeing the one before: about 1.3 kB a
    call, so a server that speaks all day grows by megabytes (docs/server.md, the soak's memory).
    Selecting the voice it already has changes nothing in the phonemes. Piper calls it while it
    holds its phonemizer lock, so ``last`` needs no lock of its own."""
    from piper import espeakbridge

    if hasattr(espeakbridge.set_voice, "selects"):  # installed already
        return
    select = espeakbridge.set_voice
    last: list[str] = []

    def set_voice(voice: str) -> None:
        if last != [voice]:
            select(voice)
            last[:] = [voice]

    set_voice.selects = select  # type: ignore[attr-defined]
    espeakbridge.set_voice = set_voice


def _session(path: Path, threads: int | None) -> Any:
    """Piper's onnxruntime session: ``threads`` intra-op threads (onnxruntime's default: one per
    core) that sleep as soon as a run ends. By default they keep spinning for a while after each
    run, and Piper runs between the LLM's and Whisper's steps on the same cores: a llama.cpp
    step right after a synthesis took a quarter longer on two cores, and synthesis itself was
    no faster for the spinning (docs/live.md).

    Without memory patterns: onnxruntime records the memory plan of every input shape it
    meets and keeps it for later runs of that shape. Piper's input is the phonemes of one
    piece, so nearly every sentence is a new shape and the plans pile up in the heap (bounded
    only by the number of piece lengths); they save nothing when the shape rarely comes back
    (docs/server.md)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.enable_mem_pattern = False
    if threads is not None:
        so.intra_op_num_threads = int(threads)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
