"""Pipecat 1.14 voice pipeline for the turn-taking benchmark; runs INSIDE the Pipecat venv.

Usage (``speclive_bench.pipecat_peer.run_pipecat`` does all of this)::

    <pipecat venv>/bin/python benchmarks/pipecat_peer/runner.py JOB.json OUT.json

``JOB.json``: ``{"conversations": [{"id", "turns": [{"id", "wav", "duration_s"}]}],
"llm_base_url", "llm_model", "whisper_dir", "piper_voice", "system_prompt", "max_tokens",
"answer_timeout_s" (optional)}``; the WAVs are 16 kHz mono int16.

The pipeline is the one Pipecat's docs build for a local voice agent with Smart Turn::

    input -> WhisperSTTService -> user aggregator (Silero VAD, stop_secs=0.2; turn stop:
    TurnAnalyzerUserTurnStopStrategy(LocalSmartTurnAnalyzerV3)) -> OpenAILLMService
    -> PiperTTSService -> output -> assistant aggregator

run by a ``PipelineWorker`` under a ``WorkerRunner``. The transports are the benchmark's own
(``BaseInputTransport`` / ``BaseOutputTransport`` subclasses, like Pipecat's local audio
transport): the input plays each conversation's turns at 1x in 20 ms chunks, one after the
other, feeding silence after a turn until the bot's answer has been played (or a timeout);
the output is a sound card that plays at 1x, and records when each non-silent chunk plays.
Each conversation gets a fresh pipeline (and a fresh context).

``OUT.json``: ``{"conversations": [{"id", "turns": [{"id", "transcripts": [[t, text]],
"answers": [text], "bot_audio": [[start, end]], "user_stopped": [t], "vad_stopped": [t],
"first_audio_t": t or null, "timed_out": bool}]}], "settings": {...}}``; every time is in
seconds on the turn WAV's clock (0 = the first sample of that turn's WAV fed). A turn's
events are those between the start of its WAV and the start of the next turn's.

Everything above the Pipecat section uses the standard library only, so speclive's tests
import it without Pipecat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import wave
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, Python puts this folder first on sys.path; keep it from shadowing anything.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [x for x in sys.path if str(Path(x or ".").resolve()) != _HERE]

SAMPLE_RATE = 16000
CHUNK_S = 0.02
CHUNK_BYTES = int(SAMPLE_RATE * CHUNK_S) * 2
#: silence fed before the first turn, while the pipeline settles
LEAD_IN_S = 1.0
#: an answer is over once the bot has been silent this long after the LLM's last response
SETTLE_S = 1.0
#: bot-audio chunks closer than this are one span
SPAN_GAP_S = 1e-3


# ------------------------------------------------------------------------------------ pure logic


def read_pcm(path: str | Path) -> bytes:
    """The int16 samples of a 16 kHz mono 16-bit WAV (anything else: ValueError)."""
    with wave.open(str(path), "rb") as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (SAMPLE_RATE, 1, 2):
            raise ValueError(f"{path}: need a 16 kHz mono int16 WAV")
        return w.readframes(w.getnframes())


def split_chunks(pcm: bytes, size: int = CHUNK_BYTES) -> list[bytes]:
    """``pcm`` in ``size``-byte chunks, the last one padded with silence."""
    out = [pcm[i : i + size] for i in range(0, len(pcm), size)]
    if out and len(out[-1]) < size:
        out[-1] = out[-1] + bytes(size - len(out[-1]))
    return out


@dataclass
class Event:
    """One thing the pipeline did, at monotonic time ``t`` (seconds)."""

    kind: str  # transcript, user_stopped, vad_stopped, llm_start, llm_text, llm_end, audio
    t: float
    value: Any = None


@dataclass
class Timeline:
    """Every event of one conversation, in the order they were recorded."""

    events: list[Event] = field(default_factory=list)

    def add(self, kind: str, t: float, value: Any = None) -> None:
        self.events.append(Event(kind, t, value))

    def answered(self, since: float, now: float, settle_s: float = SETTLE_S) -> bool:
        """Whether the answer to the turn started at ``since`` is over at ``now``.

        Over: an LLM response ended after ``since`` and none is running, bot audio played
        after ``since`` and the bot has been silent for ``settle_s``.
        """
        llm_running = False
        llm_ended = False
        heard = False
        last_audio_end = -float("inf")
        for ev in self.events:
            if ev.t < since:
                continue
            if ev.kind == "llm_start":
                llm_running = True
            elif ev.kind == "llm_end":
                llm_running = False
                llm_ended = True
            elif ev.kind == "audio":
                heard = True
                last_audio_end = max(last_audio_end, ev.value)
        return llm_ended and not llm_running and heard and now - last_audio_end >= settle_s


def merge_spans(spans: Iterable[Sequence[float]], gap: float = SPAN_GAP_S) -> list[list[float]]:
    """Sorted spans with those that touch (closer than ``gap``) merged."""
    out: list[list[float]] = []
    for a, b in sorted((float(a), float(b)) for a, b in spans):
        if out and a <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def llm_responses(events: Iterable[Event]) -> list[tuple[float, str]]:
    """(start time, text) of every LLM response: its text frames between start and end."""
    out: list[tuple[float, str]] = []
    current: list[str] | None = None
    started = 0.0
    for ev in events:
        if ev.kind == "llm_start":
            if current is not None:
                out.append((started, "".join(current)))
            current, started = [], ev.t
        elif ev.kind == "llm_text":
            if current is None:
                current, started = [], ev.t
            current.append(str(ev.value))
        elif ev.kind == "llm_end" and current is not None:
            out.append((started, "".join(current)))
            current = None
    if current is not None:
        out.append((started, "".join(current)))
    return out


def turn_records(
    turns: Sequence[tuple[str, float]], timeline: Timeline, timed_out: Sequence[bool] = ()
) -> list[dict[str, Any]]:
    """Per-turn records from a conversation's events.

    ``turns``: (id, monotonic time its WAV's first sample was fed), in order. A turn owns the
    events from its start to the next turn's start (the last one: to the end); times become
    seconds since its start. Answers and bot-audio spans belong to the turn they start in.
    """
    starts = [t for _, t in turns]

    def owner(t: float) -> int | None:
        idx = None
        for i, s in enumerate(starts):
            if t >= s:
                idx = i
        return idx

    recs: list[dict[str, Any]] = [
        {
            "id": tid,
            "transcripts": [],
            "answers": [],
            "bot_audio": [],
            "user_stopped": [],
            "vad_stopped": [],
            "first_audio_t": None,
            "timed_out": bool(timed_out[i]) if i < len(timed_out) else False,
        }
        for i, (tid, _) in enumerate(turns)
    ]
    for ev in timeline.events:
        i = owner(ev.t)
        if i is None:
            continue
        rel = round(ev.t - starts[i], 4)
        if ev.kind == "transcript":
            recs[i]["transcripts"].append([rel, str(ev.value).strip()])
        elif ev.kind in ("user_stopped", "vad_stopped"):
            recs[i][ev.kind].append(rel)
    for t, text in llm_responses(timeline.events):
        i = owner(t)
        if i is not None:
            recs[i]["answers"].append(text.strip())
    spans = merge_spans((ev.t, ev.value) for ev in timeline.events if ev.kind == "audio")
    for a, b in spans:
        i = owner(a)
        if i is not None:
            recs[i]["bot_audio"].append([round(a - starts[i], 4), round(b - starts[i], 4)])
    for rec in recs:
        if rec["bot_audio"]:
            rec["first_audio_t"] = rec["bot_audio"][0][0]
    return recs


# ------------------------------------------------------------------------------------ Pipecat


def _log(msg: str) -> None:
    print(msg, flush=True)


def _pipecat_parts() -> dict[str, Any]:
    """The benchmark's transports and recorder, built on Pipecat's classes (imported here)."""
    from pipecat.frames.frames import (
        InputAudioRawFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        OutputAudioRawFrame,
        StartFrame,
        TranscriptionFrame,
        UserStoppedSpeakingFrame,
        VADUserStoppedSpeakingFrame,
    )
    from pipecat.observers.base_observer import BaseObserver, FramePushed
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup
    from pipecat.transports.base_input import BaseInputTransport
    from pipecat.transports.base_output import BaseOutputTransport
    from pipecat.transports.base_transport import BaseTransport, TransportParams

    class FeedInputTransport(BaseInputTransport):
        """A microphone that plays what ``feed`` is given (20 ms chunks, paced by the caller)."""

        def __init__(self, params: TransportParams):
            super().__init__(params)
            self.ready = asyncio.Event()
            self.clock: Any = None

        async def setup(self, setup: FrameProcessorSetup) -> None:
            await super().setup(setup)
            self.clock = setup.clock

        async def start(self, frame: StartFrame) -> None:
            await super().start(frame)
            await self.set_transport_ready(frame)
            self.ready.set()

        async def feed(self, pcm: bytes) -> None:
            await self.push_audio_frame(
                InputAudioRawFrame(audio=pcm, sample_rate=SAMPLE_RATE, num_channels=1)
            )

    class SpeakerOutputTransport(BaseOutputTransport):
        """A sound card: plays each chunk at 1x after the previous one, one chunk buffered.

        Non-silent chunks go into the timeline as ``audio`` events (their play start, and
        their play end as the value).
        """

        def __init__(self, params: TransportParams, timeline: Timeline):
            super().__init__(params)
            self.timeline = timeline
            self._play_end = 0.0

        async def start(self, frame: StartFrame) -> None:
            await super().start(frame)
            await self.set_transport_ready(frame)

        async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
            now = time.monotonic()
            dur = len(frame.audio) / (2 * frame.sample_rate * frame.num_channels)
            start = max(now, self._play_end)
            self._play_end = start + dur
            if frame.audio.strip(b"\x00"):
                self.timeline.add("audio", start, start + dur)
            # a blocking write returns once the chunk before this one has played
            delay = start - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            return True

    class BenchTransport(BaseTransport):
        """The feed input and the speaker output as one transport."""

        def __init__(self, params: TransportParams, timeline: Timeline):
            super().__init__()
            self._in = FeedInputTransport(params)
            self._out = SpeakerOutputTransport(params, timeline)

        def input(self) -> FeedInputTransport:
            return self._in

        def output(self) -> SpeakerOutputTransport:
            return self._out

    class TimelineObserver(BaseObserver):
        """Records transcripts, turn ends and LLM output from the frames pushed downstream.

        Only the frames their producer pushes count (the STT's transcripts, the user
        aggregator's turn and VAD frames, the LLM's text), whatever else passes them along.
        Observers run off the frame path, so times come from the frame's push timestamp on
        the pipeline clock, turned into monotonic time with ``clock_zero`` (set once the
        clock runs).
        """

        def __init__(self, timeline: Timeline, stt: Any, user_aggregator: Any, llm: Any):
            super().__init__()
            self.timeline = timeline
            self.stt, self.user_aggregator, self.llm = stt, user_aggregator, llm
            self.clock_zero: float | None = None

        def _t(self, data: FramePushed) -> float:
            if self.clock_zero is None:
                return time.monotonic()
            return self.clock_zero + data.timestamp / 1e9

        async def on_push_frame(self, data: FramePushed) -> None:
            if data.direction != FrameDirection.DOWNSTREAM:
                return
            f, src = data.frame, data.source
            if src is self.stt and isinstance(f, TranscriptionFrame):
                self.timeline.add("transcript", self._t(data), f.text)
            elif src is self.user_aggregator and isinstance(f, UserStoppedSpeakingFrame):
                self.timeline.add("user_stopped", self._t(data))
            elif src is self.user_aggregator and isinstance(f, VADUserStoppedSpeakingFrame):
                self.timeline.add("vad_stopped", self._t(data))
            elif src is self.llm:
                if isinstance(f, LLMFullResponseStartFrame):
                    self.timeline.add("llm_start", self._t(data))
                elif isinstance(f, LLMFullResponseEndFrame):
                    self.timeline.add("llm_end", self._t(data))
                elif isinstance(f, LLMTextFrame):
                    self.timeline.add("llm_text", self._t(data), f.text)

    return {
        "BenchTransport": BenchTransport,
        "TimelineObserver": TimelineObserver,
        "TransportParams": TransportParams,
    }


def build_services(job: dict[str, Any]) -> dict[str, Any]:
    """STT, LLM and TTS services, configured as Pipecat's docs configure a local voice agent."""
    from pipecat.services.openai.llm import OpenAILLMService
    from pipecat.services.piper.tts import PiperTTSService
    from pipecat.services.whisper.stt import WhisperSTTService
    from pipecat.transcriptions.language import Language

    stt = WhisperSTTService(
        # faster-whisper's WhisperModel takes a local CTranslate2 folder as the model name
        settings=WhisperSTTService.Settings(model=job["whisper_dir"], language=Language.EN),
        device="cpu",
    )
    llm = OpenAILLMService(
        api_key="not-needed",  # llama-cpp-python's server checks no key
        base_url=job["llm_base_url"],
        settings=OpenAILLMService.Settings(
            model=job["llm_model"],
            system_instruction=job["system_prompt"],
            temperature=0.0,
            max_tokens=int(job["max_tokens"]),
        ),
    )
    # llama-cpp-python's server rejects the "developer" role Pipecat uses for the messages it
    # adds itself (e.g. after an empty user turn); this is the switch Pipecat's services for
    # OpenAI-compatible servers without that role (Ollama, Together, ...) set.
    llm.supports_developer_role = False
    voice = Path(job["piper_voice"])
    tts = PiperTTSService(
        settings=PiperTTSService.Settings(voice=voice.name.removesuffix(".onnx")),
        download_dir=voice.parent,  # the voice is there already: nothing is downloaded
    )
    return {"stt": stt, "llm": llm, "tts": tts}


def warm_up(services: dict[str, Any], job: dict[str, Any]) -> None:
    """One tiny run of each model, as a long-running deployment would have had.

    The LLM server gets the system prompt and "Hi" (its prompt cache then holds the system
    prompt); Whisper transcribes a second of tone; Piper speaks a word. Nothing here touches a
    pipeline or its context.
    """
    import math
    import urllib.request

    body = json.dumps(
        {
            "model": job["llm_model"],
            "messages": [
                {"role": "system", "content": job["system_prompt"]},
                {"role": "user", "content": "Hi"},
            ],
            "max_tokens": 1,
            "temperature": 0.0,
        }
    ).encode()
    req = urllib.request.Request(
        job["llm_base_url"].rstrip("/") + "/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()
    model = getattr(services["stt"], "_model", None)
    if model is not None:
        import numpy as np

        tone = np.array([0.1 * math.sin(i * 0.05) for i in range(SAMPLE_RATE)], dtype=np.float32)
        segments, _ = model.transcribe(tone, language="en")
        list(segments)
    voice = getattr(services["tts"], "_voice", None)
    if voice is not None:
        list(voice.synthesize("Ready."))


async def run_conversation(conv: dict[str, Any], job: dict[str, Any]) -> list[dict[str, Any]]:
    """One conversation through a fresh pipeline, in real time; its per-turn records."""
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.audio.vad.vad_analyzer import VADParams
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import (
        LLMContextAggregatorPair,
        LLMUserAggregatorParams,
    )
    from pipecat.turns.user_stop import TurnAnalyzerUserTurnStopStrategy
    from pipecat.turns.user_turn_strategies import UserTurnStrategies
    from pipecat.workers.runner import WorkerRunner

    parts = _pipecat_parts()
    timeline = Timeline()
    transport = parts["BenchTransport"](
        parts["TransportParams"](audio_in_enabled=True, audio_out_enabled=True), timeline
    )
    t = time.monotonic()
    services = build_services(job)
    warm_up(services, job)
    _log(f"  models loaded and warmed up in {time.monotonic() - t:.1f} s")

    context = LLMContext()
    user_aggregator, assistant_aggregator = LLMContextAggregatorPair(
        context,
        user_params=LLMUserAggregatorParams(
            vad_analyzer=SileroVADAnalyzer(params=VADParams(stop_secs=0.2)),
            user_turn_strategies=UserTurnStrategies(
                stop=[TurnAnalyzerUserTurnStopStrategy(turn_analyzer=LocalSmartTurnAnalyzerV3())]
            ),
        ),
    )
    pipeline = Pipeline(
        [
            transport.input(),
            services["stt"],
            user_aggregator,
            services["llm"],
            services["tts"],
            transport.output(),
            assistant_aggregator,
        ]
    )
    observer = parts["TimelineObserver"](timeline, services["stt"], user_aggregator, services["llm"])
    worker = PipelineWorker(
        pipeline,
        params=PipelineParams(enable_metrics=True),
        observers=[observer],
        idle_timeout_secs=None,
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run_task = asyncio.create_task(runner.run())

    mic = transport.input()
    await asyncio.wait_for(mic.ready.wait(), timeout=60)
    if mic.clock is not None and mic.clock.get_time() > 0:
        observer.clock_zero = time.monotonic() - mic.clock.get_time() / 1e9

    timeout_s = float(job.get("answer_timeout_s", 60.0))
    turn_chunks = [split_chunks(read_pcm(turn["wav"])) for turn in conv["turns"]]
    silence = bytes(CHUNK_BYTES)
    t0 = time.monotonic()
    fed = 0  # chunks fed so far; chunk k is due at t0 + k * CHUNK_S

    async def feed(chunk: bytes) -> None:
        nonlocal fed
        delay = t0 + fed * CHUNK_S - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if run_task.done():
            raise RuntimeError(f"the pipeline stopped early: {run_task.exception()!r}")
        await mic.feed(chunk)
        fed += 1

    for _ in range(round(LEAD_IN_S / CHUNK_S)):
        await feed(silence)
    starts: list[tuple[str, float]] = []
    timed_out: list[bool] = []
    for turn, chunks in zip(conv["turns"], turn_chunks, strict=True):
        start = t0 + fed * CHUNK_S
        starts.append((turn["id"], start))
        for chunk in chunks:
            await feed(chunk)
        end = t0 + fed * CHUNK_S
        while True:
            await feed(silence)
            now = t0 + fed * CHUNK_S
            if timeline.answered(start, now):
                timed_out.append(False)
                break
            if now - end >= timeout_s:
                timed_out.append(True)
                break
        recs = turn_records(starts, timeline, timed_out)
        rec = recs[-1]
        first = rec["first_audio_t"]
        end_s = float(turn.get("speech_end_s", turn["duration_s"]))
        lat = "no answer" if first is None else f"first audio {first - end_s:+.3f} s"
        said = rec["transcripts"][0][1] if rec["transcripts"] else ""
        answer = " | ".join(rec["answers"])
        _log(f"  {conv['id']}/{turn['id']}: {lat} after the end of speech; heard {said!r}")
        _log(f"    answer: {answer[:160]!r}{' (timed out)' if rec['timed_out'] else ''}")

    await worker.cancel(reason="conversation done")
    try:
        await asyncio.wait_for(run_task, timeout=30)
    except TimeoutError:
        run_task.cancel()
    return turn_records(starts, timeline, timed_out)


async def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Every conversation of the job, each in a fresh pipeline."""
    out: list[dict[str, Any]] = []
    for conv in job["conversations"]:
        _log(f"pipecat: conversation {conv['id']} ({len(conv['turns'])} turns)")
        out.append({"id": conv["id"], "turns": await run_conversation(conv, job)})
    return {"conversations": out, "settings": settings_summary(job)}


def settings_summary(job: dict[str, Any]) -> dict[str, Any]:
    """What the runner configured, for the result header."""
    return {
        "vad": "SileroVADAnalyzer(VADParams(stop_secs=0.2))",
        "turn_stop": "TurnAnalyzerUserTurnStopStrategy(LocalSmartTurnAnalyzerV3())",
        "stt": f"WhisperSTTService(model={Path(job['whisper_dir']).name}, device=cpu, language=en)",
        "llm": f"OpenAILLMService(base_url=llama_cpp.server, temperature=0, max_tokens={job['max_tokens']})",
        "tts": f"PiperTTSService(voice={Path(job['piper_voice']).name.removesuffix('.onnx')})",
        "feed": f"{CHUNK_S * 1000:.0f} ms chunks at 1x, {LEAD_IN_S} s lead-in",
        "answer_settle_s": SETTLE_S,
        "answer_timeout_s": float(job.get("answer_timeout_s", 60.0)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("job", help="the job JSON")
    p.add_argument("out", help="where the per-turn records go (JSON)")
    p.add_argument("--log-level", default="WARNING", help="Pipecat's (loguru) log level")
    args = p.parse_args(argv)

    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level=args.log_level)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    job = json.loads(Path(args.job).read_text())
    result = asyncio.run(run_job(job))
    Path(args.out).write_text(json.dumps(result, indent=1))
    _log(f"pipecat: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
