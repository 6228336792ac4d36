"""A development set of spoken user turns for end-of-turn prediction (``turnset-v1``).

What it is: 94 short user turns of a voice assistant conversation, written for this set (no
dataset), grouped into 32 conversations of 2-5 turns in which later turns follow up on earlier
ones ("And how long would it take to drive there?"). About 40 % are complete questions or
requests, a few are short acknowledgements or statements, and about 40 % carry a mid-turn
pause of 0.3-1.5 s where people really pause: after "um"/"uh"/"so", at a comma, between
clauses, inside a phrase ("So I was thinking about | getting a dog."), and, the hard cases,
after a sentence that is complete on its own ("I have a question. | How far away is the
moon?"). An end-of-turn predictor must wait through the pauses and answer soon after the end.

Every conversation is spoken by one of three very different synthetic voices (Piper's joe,
espeak-ng, flite's slt), rotated, and every turn at one of five speaking rates (0.85-1.15x,
rotated per voice); every fourth turn has background noise (white, pink or babble-like,
10-25 dB SNR against the speech, from a seeded RNG). Conversations alternate between the splits
``dev`` (calibrate thresholds there) and ``test`` (report there).

How the ground truth is made: a turn's text is cut at its pause marks (`` | ``) and at
sentence ends into pieces; each piece is synthesized on its own, resampled to 16 kHz and
trimmed of its leading and trailing silence (20 ms frames under 1 % of the piece's peak). The
WAV is then assembled from known parts: ``lead_s`` (0.5 s) of silence, the pieces with exact
silences between them (a marked pause, or a short 0.18 s gap between sentences), and ``tail_s``
(3 s) of silence; noise, when added, covers the whole WAV. So ``speech_start_t`` (the first
piece's start), ``speech_end_t`` (the last piece's end) and the ``pauses`` (``[start, end]`` of
every silence between pieces of 0.25 s or more, plus any silence of 0.25 s or more that a voice
put inside a piece itself, found on the same 20 ms frames) are exact on the WAV's clock, not
estimated. ``kind`` is ``paused`` when a turn has a pause, else ``complete``.

``build_turnset()`` writes the WAVs and ``manifest.json`` into ``$SPECLIVE_HOME/turnset-v1``
(once: a manifest of the same version and script whose files all exist is reused);
``load_turnset()`` returns it, ``turns(manifest, split)`` lists the turns with absolute paths.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
import time
import wave
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from speclive.asr.audio import to_mono_16k
from speclive.errors import BackendUnavailableError
from speclive.models.install import speclive_home
from speclive.tts.espeak import EspeakTTS
from speclive.tts.piper import PiperTTS

VERSION = 1
SAMPLE_RATE = 16_000
NAME = "turnset-v1"
#: a voice: ``(text, rate) -> (float32 mono samples in [-1, 1], sample rate)``; rate > 1 is faster
Synth = Callable[[str, float], tuple[np.ndarray, int]]

VOICES: dict[str, str] = {
    "piper": "Piper VITS, en_US joe medium (speclive.tts.piper.PiperTTS, deterministic)",
    "espeak": "espeak-ng en-us formant voice (speclive.tts.espeak.EspeakTTS)",
    "flite": "CMU flite 2.2, slt voice (Debian's flite program)",
}
RATES = (0.85, 1.0, 1.15, 0.92, 1.08)
NOISE_KINDS = ("white", "pink", "babble")
NOISE_SNRS_DB = (10.0, 15.0, 20.0, 25.0)
PAUSE_MARK = "|"
PAUSE_RANGE_S = (0.3, 1.5)
SENTENCE_GAP_S = 0.18  # between sentences of one piece of speech: shorter than any pause
MIN_PAUSE_S = 0.25  # silences this long between (or inside) pieces are recorded as pauses
LEAD_S = 0.5
TAIL_S = 3.0
PEAK = 0.5  # each turn's clean speech is scaled to this peak before noise is added
TRIM_LEVEL = 0.01
FRAME = 320  # 20 ms at 16 kHz
SEED = 20_240_533

#: the conversations: one list of turns each; `` | `` marks a mid-turn pause
CONVERSATIONS: list[list[str]] = [
    [
        "What's a good way to fall asleep faster?",
        "Um, | does reading before bed actually help?",
        "And how long does it take for a new routine to work?",
    ],
    [
        "Tell me a fun fact about octopuses.",
        "Wait, | they really have three hearts?",
        "That's amazing. | Do they feel pain like we do?",
    ],
    [
        "I want to learn a new language, | which one is easiest for English speakers?",
        "How long would it take to get conversational in Spanish?",
        "Okay.",
        "Can you recommend an app for practicing every day?",
    ],
    [
        "So I was thinking about | getting a dog.",
        "We live in a small apartment, | and we both work during the day.",
        "Which breeds would be happy in a place like that?",
    ],
    [
        "I have a question. | How far away is the moon?",
        "And how long would it take to drive there?",
    ],
    [
        "Set a timer for twelve minutes.",
        "Actually, | make that fifteen.",
        "Thanks.",
    ],
    [
        "What can I cook with chicken, rice and spinach?",
        "Uh, | I don't have any garlic though.",
        "Is there something I can use instead?",
    ],
    [
        "I'm going to Lisbon next week. | What should I pack?",
        "Is it usually rainy there in March?",
        "Okay, good to know.",
    ],
    [
        "How many push-ups should a beginner do a day?",
        "So | if I do them every morning, | when will I see results?",
    ],
    [
        "What's fifteen percent of eighty?",
        "And what about | twenty percent?",
    ],
    [
        "My basil plant keeps wilting, | even though I water it every day.",
        "Could I be watering it too much?",
        "How often should I water it then?",
    ],
    [
        "Who built the pyramids of Giza?",
        "How did they move such heavy stones?",
        "That's interesting. | How long did one pyramid take to build?",
    ],
    [
        "Play something relaxing.",
        "Something without lyrics, | maybe piano.",
        "Turn it up a little.",
        "Perfect, thank you.",
    ],
    [
        "Is it bad to drink coffee on an empty stomach?",
        "Um, | I usually have two cups before breakfast.",
        "Should I cut back?",
    ],
    [
        "My car makes a squeaking noise when I brake.",
        "It started last week, | and it's getting louder.",
        "Is it safe to keep driving it?",
    ],
    [
        "I need a gift idea for my sister. | She loves hiking and photography.",
        "Something under fifty dollars.",
        "Oh, | and she already has a good camera.",
    ],
    [
        "Why is the sky blue?",
        "Then why are sunsets | orange and red?",
    ],
    [
        "How do I start making a monthly budget?",
        "I get paid every two weeks, | so should I plan by paycheck instead?",
        "Okay, | what about saving for emergencies?",
    ],
    [
        "Can you recommend a movie for tonight?",
        "Something funny, | but not too silly.",
        "Have you got anything from the nineties?",
        "Great, I'll watch that one.",
    ],
    [
        "Remind me to call my mom tomorrow at six.",
        "Make it six thirty.",
        "And also | remind me to buy flowers on the way home.",
    ],
    [
        "I've had a headache since this morning.",
        "I already drank some water. | What else can I try?",
        "When should I see a doctor about it?",
    ],
    [
        "So, | what's the best programming language for a complete beginner?",
        "Why Python and not JavaScript?",
        "How many hours a week should I practice?",
    ],
    [
        "When does the next train to Boston leave?",
        "Uh, | from South Station.",
    ],
    [
        "How do you say good morning in Japanese?",
        "And how would I say | thank you very much?",
        "Say it slower, please.",
    ],
    [
        "Can you explain how vaccines work, | in simple terms?",
        "So they teach the body | what the virus looks like?",
        "That's clear now. Thanks!",
    ],
    [
        "Add milk and eggs to my shopping list.",
        "Oh, | and bread.",
        "What's on the list now?",
    ],
    [
        "I want to run a marathon next year. | Where do I even start?",
        "I can run about five kilometers right now.",
        "Is a year enough time to train?",
    ],
    [
        "What's the tallest mountain in the world?",
        "How tall is it | in feet?",
        "Has anyone climbed it without oxygen?",
    ],
    [
        "Help me write a short email to my landlord.",
        "The heating is broken, | and it's been cold for three days.",
        "Make it polite | but firm.",
        "That's good. | Can you make it a bit shorter?",
    ],
    [
        "My son is scared of the dark. | How can I help him?",
        "He's five years old.",
        "Would a night light help, | or does it make it worse?",
    ],
    [
        "Why didn't my bread rise?",
        "I used yeast from the fridge, | um, | it might be old.",
        "How can I test if yeast is still good?",
    ],
    [
        "What's the closest star to Earth, | apart from the sun?",
        "How long would it take to get there with today's rockets?",
    ],
]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


# ---- the script -------------------------------------------------------------------------------
def script(voice_names: list[str] | None = None) -> list[dict[str, Any]]:
    """The set's plan, without audio: per conversation its id, split, voice and turns, each turn
    with its pieces, the silence after each piece (the last one's is 0), rate and noise.

    Deterministic: voices rotate over conversations, rates over each voice's turns, the splits
    alternate, every fourth turn is noisy (kinds and SNRs rotate), and pause lengths come from
    an RNG seeded per turn."""
    names = list(voice_names or VOICES)
    per_voice = dict.fromkeys(names, 0)
    out, n = [], 0
    for c, texts in enumerate(CONVERSATIONS):
        voice = names[c % len(names)]
        conv = {"id": f"c{c:02d}", "split": "dev" if c % 2 == 0 else "test", "voice": voice, "turns": []}
        for t, marked in enumerate(texts):
            rng = np.random.default_rng([SEED, n])
            pieces: list[str] = []
            gaps: list[float] = []
            for k, part in enumerate(p.strip() for p in marked.split(PAUSE_MARK)):
                if k:
                    gaps.append(round(float(rng.uniform(*PAUSE_RANGE_S)), 2))
                sents = _SENTENCE_END.split(part)
                for j, s in enumerate(sents):
                    if j:
                        gaps.append(SENTENCE_GAP_S)
                    pieces.append(s)
            noisy = n % 4 == 2
            conv["turns"].append(
                {
                    "id": f"{conv['id']}t{t}",
                    "conversation": conv["id"],
                    "index": t,
                    "voice": voice,
                    "rate": RATES[per_voice[voice] % len(RATES)],
                    "noise": NOISE_KINDS[(n // 4) % len(NOISE_KINDS)] if noisy else None,
                    "noise_snr_db": NOISE_SNRS_DB[(n // 4) % len(NOISE_SNRS_DB)] if noisy else None,
                    "text": " ".join(" ".join(p.strip() for p in marked.split(PAUSE_MARK)).split()),
                    "pieces": pieces,
                    "gaps": [*gaps, 0.0],
                }
            )
            per_voice[voice] += 1
            n += 1
        out.append(conv)
    return out


def fingerprint(plan: list[dict[str, Any]]) -> str:
    """A hash of the plan and the assembly settings: a cached set is rebuilt when either changes."""
    settings = [VERSION, SAMPLE_RATE, LEAD_S, TAIL_S, PEAK, TRIM_LEVEL, FRAME, MIN_PAUSE_S, SEED]
    blob = json.dumps([settings, plan], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# ---- voices -----------------------------------------------------------------------------------
def _piper() -> Synth:
    tts = PiperTTS(varied=False)

    def synth(text: str, rate: float) -> tuple[np.ndarray, int]:
        a = tts.synthesize(text, speed=rate)
        return a.samples, a.sample_rate

    return synth


def _espeak() -> Synth:
    voices: dict[int, EspeakTTS] = {}

    def synth(text: str, rate: float) -> tuple[np.ndarray, int]:
        wpm = round(165 * rate)  # EspeakTTS's default speed is 165 words per minute
        tts = voices.setdefault(wpm, EspeakTTS(words_per_minute=wpm))
        a = tts.synthesize(text)
        return a.samples, a.sample_rate

    return synth


def _flite(voice: str = "slt") -> Synth:
    exe = shutil.which("flite")
    if exe is None:
        raise BackendUnavailableError("flite is not installed (Debian: apt-get install flite)")

    def synth(text: str, rate: float) -> tuple[np.ndarray, int]:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "speech.wav"
            cmd = [exe, "-voice", voice, "--setf", f"duration_stretch={1.0 / rate:.4f}"]
            subprocess.run([*cmd, "-t", text, "-o", str(out)], check=True, capture_output=True)
            return _read_wav(out)

    return synth


def default_voices() -> dict[str, Synth]:
    """The three real voices (each loaded here, once)."""
    return {"piper": _piper(), "espeak": _espeak(), "flite": _flite()}


# ---- audio ------------------------------------------------------------------------------------
def _read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A PCM-16 WAV as mono float32 in [-1, 1] and its sample rate."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16-bit PCM, got {8 * w.getsampwidth()}-bit")
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
        return data.reshape(-1, w.getnchannels()).mean(axis=1), w.getframerate()


def _write_wav(path: Path, audio: np.ndarray) -> None:
    pcm = np.round(np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())


def _envelope(audio: np.ndarray, frame: int = FRAME) -> np.ndarray:
    k = len(audio) // frame
    return np.abs(audio[: k * frame]).reshape(k, frame).max(axis=1) if k else np.zeros(0)


def _trim(audio: np.ndarray, level: float = TRIM_LEVEL, frame: int = FRAME) -> np.ndarray:
    """``audio`` without its leading and trailing silence (frames under ``level`` x peak)."""
    env = _envelope(audio, frame)
    if env.size == 0:
        return audio
    loud = np.nonzero(env >= level * max(float(env.max()), 1e-9))[0]
    if loud.size == 0:
        return audio[:0]
    return audio[loud[0] * frame : (loud[-1] + 1) * frame]


def _inner_silences(audio: np.ndarray, min_s: float = MIN_PAUSE_S) -> list[tuple[int, int]]:
    """Silences of at least ``min_s`` inside a trimmed piece, as sample ``(start, end)`` pairs."""
    env = _envelope(audio)
    if env.size == 0:
        return []
    quiet = env < TRIM_LEVEL * max(float(env.max()), 1e-9)
    out, start = [], None
    for i, q in enumerate([*quiet, False]):
        if q and start is None:
            start = i
        elif not q and start is not None:
            if (i - start) * FRAME >= min_s * SAMPLE_RATE:
                out.append((start * FRAME, i * FRAME))
            start = None
    return out


def _to_16k(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    return to_mono_16k(np.asarray(samples, dtype=np.float32), sample_rate)


def make_noise(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples of unit-RMS noise at 16 kHz: ``white``, ``pink`` (1/f power) or ``babble``
    (six 'talkers': speech-band noise, each switched on and off at a syllable rate, summed)."""
    if kind == "white":
        x = rng.standard_normal(n)
    elif kind in ("pink", "babble"):
        spec = np.fft.rfft(rng.standard_normal(n))
        f = np.fft.rfftfreq(n, 1.0 / SAMPLE_RATE)
        spec[1:] /= np.sqrt(f[1:])
        spec[0] = 0.0
        if kind == "pink":
            x = np.fft.irfft(spec, n)
        else:
            # speech band (about 150-4000 Hz, rolling off above 1 kHz) per talker
            shape = (f > 150) * (1.0 / (1.0 + (f / 1000.0) ** 2))
            x = np.zeros(n)
            for _ in range(6):
                sp = np.fft.rfft(rng.standard_normal(n)) * shape / np.sqrt(np.maximum(f, 1.0))
                talker = np.fft.irfft(sp, n)
                # syllables: a new random level every 0.12-0.3 s, smoothly joined, often near 0
                knots = np.cumsum(rng.uniform(0.12, 0.3, size=int(n / SAMPLE_RATE / 0.12) + 2))
                levels = np.maximum(rng.normal(0.4, 0.5, size=knots.size), 0.0)
                env = np.interp(np.arange(n) / SAMPLE_RATE, knots - knots[0], levels)
                x += talker / (np.sqrt(np.mean(talker**2)) + 1e-12) * env
    else:
        raise ValueError(f"unknown noise {kind!r}; known: {', '.join(NOISE_KINDS)}")
    return (x / (np.sqrt(np.mean(x**2)) + 1e-12)).astype(np.float32)


def assemble(turn: dict[str, Any], synth: Synth, seed: int) -> tuple[np.ndarray, dict[str, Any]]:
    """One turn's 16 kHz audio and its ground truth (times in seconds on the audio's clock)."""
    sr = SAMPLE_RATE
    spans: list[list[float]] = []
    pauses: list[list[float]] = []
    parts: list[np.ndarray] = [np.zeros(round(LEAD_S * sr), np.float32)]
    pos = len(parts[0])
    for piece, gap in zip(turn["pieces"], turn["gaps"], strict=True):
        samples, rate = synth(piece, turn["rate"])
        a = _trim(_to_16k(samples, rate))
        if a.size == 0:
            raise RuntimeError(f"{turn['id']}: the voice gave no audible speech for {piece!r}")
        pauses += [[(pos + s) / sr, (pos + e) / sr] for s, e in _inner_silences(a)]
        spans.append([pos / sr, (pos + len(a)) / sr])
        parts.append(a)
        pos += len(a)
        if gap > 0:
            g = round(gap * sr)
            if gap >= MIN_PAUSE_S:
                pauses.append([pos / sr, (pos + g) / sr])
            parts.append(np.zeros(g, np.float32))
            pos += g
    parts.append(np.zeros(round(TAIL_S * sr), np.float32))
    audio = np.concatenate(parts)
    audio *= PEAK / max(float(np.abs(audio).max()), 1e-9)  # the silences are exact zeros
    if turn.get("noise"):
        speech = np.concatenate([audio[round(s * sr) : round(e * sr)] for s, e in spans])
        rms = float(np.sqrt(np.mean(speech**2)))
        noise = make_noise(turn["noise"], len(audio), np.random.default_rng([SEED, seed]))
        audio = audio + noise * rms / 10 ** (turn["noise_snr_db"] / 20)
        audio /= max(1.0, float(np.abs(audio).max()) / 0.99)
    pauses.sort()
    truth = {
        "duration_s": round(len(audio) / sr, 4),
        "speech_start_t": round(spans[0][0], 4),
        "speech_end_t": round(spans[-1][1], 4),
        "pauses": [[round(s, 4), round(e, 4)] for s, e in pauses],
        "kind": "paused" if pauses else "complete",
        "piece_spans": [[round(s, 4), round(e, 4)] for s, e in spans],
    }
    return audio.astype(np.float32), truth


# ---- the set ----------------------------------------------------------------------------------
def default_root() -> Path:
    return speclive_home() / NAME


def _cached(root: Path, fp: str, voice_names: list[str]) -> dict[str, Any] | None:
    path = root / "manifest.json"
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        manifest.get("version") != VERSION
        or manifest.get("fingerprint") != fp
        or [v["name"] for v in manifest.get("voices", [])] != voice_names
    ):
        return None
    if not all((root / t["wav"]).is_file() for c in manifest["conversations"] for t in c["turns"]):
        return None
    return {**manifest, "root": str(root.resolve())}


def build_turnset(
    root: Path | None = None,
    log: Callable[[str], Any] = print,
    voices: Mapping[str, Synth] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Synthesize the set into ``root`` (default ``$SPECLIVE_HOME/turnset-v1``) and return its
    manifest; a manifest already there of the same version and script, whose WAVs all exist, is
    returned as it is. ``voices`` maps each voice name to a ``(text, rate) -> (samples, sample
    rate)`` function (default: the real Piper, espeak-ng and flite voices)."""
    from tqdm import tqdm

    root = Path(root) if root is not None else default_root()
    names = list(voices) if voices is not None else list(VOICES)
    plan = script(names)
    fp = fingerprint(plan)
    cached = _cached(root, fp, names)
    if cached is not None:
        return cached
    if voices is None:
        log("turnset: loading the voices (piper, espeak-ng, flite)")
        voices = default_voices()
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    n_turns = sum(len(c["turns"]) for c in plan)
    bar = tqdm(total=n_turns, desc="turnset", unit="turn", disable=not progress)
    conversations, n = [], 0
    try:
        for conv in plan:
            turns = []
            for turn in conv["turns"]:
                audio, truth = assemble(turn, voices[turn["voice"]], n)
                wav = f"{turn['id']}.wav"
                _write_wav(root / wav, audio)
                turns.append(
                    {
                        **{k: turn[k] for k in ("id", "conversation", "index", "voice", "rate")},
                        "noise_snr_db": turn["noise_snr_db"],
                        "noise": turn["noise"],
                        "text": turn["text"],
                        "pieces": turn["pieces"],
                        "wav": wav,
                        **truth,
                    }
                )
                n += 1
                bar.update(1)
            conversations.append({"id": conv["id"], "split": conv["split"], "turns": turns})
    finally:
        bar.close()
    manifest = {
        "version": VERSION,
        "name": NAME,
        "fingerprint": fp,
        "sample_rate": SAMPLE_RATE,
        "lead_s": LEAD_S,
        "tail_s": TAIL_S,
        "voices": [{"name": v, "detail": VOICES.get(v, "injected voice")} for v in names],
        "conversations": conversations,
    }
    tmp = root / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    tmp.replace(root / "manifest.json")
    manifest["root"] = str(root.resolve())  # where it was read from; not stored in the file
    secs = sum(t["duration_s"] for c in conversations for t in c["turns"])
    log(f"turnset: {n} turns, {secs:.0f} s of audio in {root} ({time.perf_counter() - t0:.0f} s to build)")
    return manifest


def load_turnset(root: Path | None = None, **kwargs: Any) -> dict[str, Any]:
    """The set's manifest, built first if it is missing or stale (``kwargs``: ``build_turnset``'s)."""
    return build_turnset(root, **kwargs)


def turns(
    manifest: dict[str, Any], split: str | None = None, root: Path | None = None
) -> list[dict[str, Any]]:
    """All turns in order (only ``split``'s when given), each with ``split`` and ``path``: the
    WAV's absolute path, under ``root`` (default: the folder the manifest was built in or
    loaded from, the ``root`` that ``build_turnset`` adds; else the default root)."""
    base = Path(root) if root is not None else Path(manifest.get("root") or default_root())
    return [
        {**t, "split": c["split"], "path": str((base / t["wav"]).resolve())}
        for c in manifest["conversations"]
        if split is None or c["split"] == split
        for t in c["turns"]
    ]
