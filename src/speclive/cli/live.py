"""``speclive live chat|translate|transcribe INPUT.wav``: a live pipeline over a recording.

The file is played into the pipeline in 100 ms chunks, on an honest simulated clock by default
(every second of compute is charged; idle time is skipped) or at 1x real time (``--realtime``).
Human output is a timeline of what was heard, speculated and made ready when; ``--json``
prints one object with ``turns`` (transcript, answer or translation, latency and the other
per-turn figures).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from speclive.asr.audio import load_audio
from speclive.common_options import REMOTE, SESSION_LLM, SPEECH, VOICE, RemoteOptions
from speclive.errors import ConfigError
from speclive.live.build import LiveModelsConfig, load_live_models, make_pipeline
from speclive.live.clock import VirtualClock, WallClock, play
from speclive.live.turnpolicy import TurnPolicyConfig
from speclive.live.vad import TurnConfig
from speclive.live.voicechat import voice_predgen
from speclive.options import OptionSet, parse_margin
from speclive.sessions.predictive import _parse_verifier
from speclive.sessions.retranslate import RetranslateConfig
from speclive.tts.base import Audio, write_wav

#: the LLM, where it runs and the speech models (the voice is chat's own)
LIVE_LLM = OptionSet(SESSION_LLM.cls, only=("model", "backend", "device", "threads"))
LIVE_SPEECH = OptionSet(SPEECH.cls, skip=("voice",))
CHAT_CAP = OptionSet(SESSION_LLM.cls, only=("max_tokens",), defaults={"max_tokens": None})


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="audio file (WAV/FLAC/OGG; any rate, mono or stereo)")
    LIVE_LLM.add_to(p)
    REMOTE.add_to(p)
    LIVE_SPEECH.add_to(p)
    p.add_argument(
        "--asr-margin",
        type=parse_margin,
        default=1.0,
        help="seconds of audio context beyond the speech the "
        "target encodes ('none' = Whisper's full 30 s window)",
    )
    p.add_argument("--end-silence", type=float, default=0.5, help="silence (s) that ends a turn")
    p.add_argument(
        "--pause", type=float, default=0.2, help="silence (s) after which speculative final work starts"
    )
    p.add_argument(
        "--max-turn", type=float, default=30.0, help="longest turn (s); longer speech ends the turn"
    )
    p.add_argument(
        "--realtime", action="store_true", help="play the file at 1x real time (default: simulated clock)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_live_parser(sub: argparse._SubParsersAction) -> None:
    live = sub.add_parser("live", help="live speech pipelines: voice chat, live translation, transcription")
    lsub = live.add_subparsers(dest="live_command", required=True)

    c = lsub.add_parser("chat", help="spoken question in, spoken answer out (PredGen while you speak)")
    _common(c)
    c.add_argument(
        "--baseline",
        default=None,
        choices=("cascade", "prefill", "preemptive"),
        help="a non-speculative baseline instead of PredGen",
    )
    c.add_argument("--verifier", default="greedy", help="PredGen verifier: greedy | topk:K | reflection")
    CHAT_CAP.add_to(c)  # default: the voice sessions' cap
    c.add_argument(
        "--turn-detection",
        default="server_vad",
        choices=("server_vad", "semantic"),
        help="server_vad: --end-silence of silence ends a turn; semantic: the end-of-turn policy "
        "(audio model + the LM's end-of-message probability) ends it at the first short pause",
    )
    c.add_argument(
        "--eagerness",
        default="auto",
        choices=("low", "medium", "high", "auto"),
        help="semantic: how readily a pause ends the turn (low waits longer, high cuts sooner)",
    )
    c.add_argument(
        "--turn-policy",
        default="fused",
        choices=("audio", "text", "fused"),
        help="semantic: the signals read (Smart Turn, the LM, or both)",
    )
    VOICE.add_to(c)
    c.add_argument("--no-tts", action="store_true", help="text answers only")
    c.add_argument("--out", default=None, help="write the spoken answers to this WAV file")
    c.set_defaults(func=cmd_live, kind="chat")

    t = lsub.add_parser("translate", help="speech in, live translation out (SSBD re-translation)")
    _common(t)
    t.add_argument("--target-lang", default="de", help="de, zh, ja, fr, es, it, pt, ru, ko")
    t.add_argument(
        "--baseline",
        default=None,
        choices=("ar", "cascade"),
        help="ar: re-translation with plain decoding; cascade: translate each turn once at its end",
    )
    t.add_argument("--beta", type=float, default=0.2, help="SSBD bias towards the previous translation")
    t.add_argument("--mask-k", type=int, default=3, help="tokens hidden at the end of a live update")
    t.set_defaults(func=cmd_live, kind="translate", no_tts=True, voice=None, out=None)

    s = lsub.add_parser("transcribe", help="speech in, partial and final transcripts out")
    _common(s)
    s.set_defaults(func=cmd_live, kind="transcribe", no_tts=True, voice=None, out=None, baseline=None)


def _line(ev: Any) -> str | None:
    """One timeline line for a human, or None for events not worth a line."""
    t = f"[{ev.t:7.2f}s]"
    k = ev.type
    if k == "speech_started":
        return f"{t} speech started (at {ev.audio_t:.2f}s of the input)"
    if k == "speech_stopped":
        what = "end of turn" if ev.end_of_turn else "pause"
        return f"{t} {what} (speech ended at {ev.audio_t:.2f}s)"
    if k == "transcript_partial":
        return f"{t} heard: {ev.stable}" + (f" [{ev.tentative}]" if ev.tentative else "")
    if k == "transcript_final":
        return f"{t} transcript: {ev.text}"
    if k == "turn_prediction":
        p = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        verdict = "end of turn" if ev.end else "wait"
        return (
            f"{t} turn over? audio {p(ev.audio_p)}, text {p(ev.text_p)} -> {p(ev.score)} "
            f"vs {ev.bar:.2f} after {ev.silence_s:.2f}s of silence: {verdict}"
        )
    if k == "speculation":
        ready = ", audio ready" if ev.presynthesized else ""
        return f"{t} speculated ({ev.accepted}/{ev.drafted} kept{ready}): {ev.first_sentence}"
    if k == "audio":
        return f"{t} audio #{ev.sentence} ready ({ev.duration_s:.1f}s, plays at {ev.play_at:.2f}s): {ev.text}"
    if k == "translation":
        tag = "final" if ev.final else "live"
        return f"{t} {tag}: {ev.stable}" + (f" [{ev.tentative}]" if ev.tentative else "")
    if k == "interrupted":
        return f"{t} interrupted; played: {ev.played}"
    if k == "notice":
        return f"{t} {ev.code}: {ev.message}"
    if k == "turn_metrics":
        if ev.latency_s is not None and ev.answer:
            return (
                f"{t} turn {ev.turn}: voice-to-voice {ev.latency_s:.2f}s (end of turn detected after "
                f"{ev.eot_delay_s:.2f}s) | ASR {ev.asr_s:.2f}s LLM {ev.llm_s:.2f}s TTS {ev.tts_s:.2f}s | "
                f"{ev.accepted}/{ev.drafted} speculated tokens kept"
            )
        return f"{t} turn {ev.turn} done (ASR {ev.asr_s:.2f}s, {ev.asr_passes} passes)"
    return None


def _turn_json(ev: Any) -> dict[str, Any]:
    """A turn's metrics, with its timeline on the input's clock at the top level: the VAD's end
    of speech, when the turn was decided over, when its first answer audio started."""
    out = ev.to_json()
    extra = out.get("extra", {})
    for k in ("decided_t", "audio_start_t"):
        v = extra.get(k)
        out[k] = None if v is None else round(v, 4)
    return out


def _pipeline(args: argparse.Namespace, remote: RemoteOptions) -> Any:
    """The pipeline the options describe, its models loaded and warmed up (every setting is
    checked before anything loads)."""
    turn = TurnConfig(pause_s=args.pause, end_s=args.end_silence, max_turn_s=args.max_turn)
    turn.validate()
    semantic = getattr(args, "turn_detection", "server_vad") == "semantic"
    policy = TurnPolicyConfig(kind=args.turn_policy, eagerness=args.eagerness) if semantic else None
    if policy is not None:
        policy.resolved()
    predgen = retranslate = None
    if args.kind == "chat":
        _parse_verifier(args.verifier)
        caps = {} if args.max_tokens is None else {"max_tokens": args.max_tokens}
        predgen = voice_predgen(verifier=args.verifier, **caps)
    elif args.kind == "translate":
        retranslate = RetranslateConfig(target_lang=args.target_lang, beta=args.beta, mask_k=args.mask_k)
        retranslate.validate()
    models = load_live_models(
        LiveModelsConfig(
            model=args.model,
            backend=args.backend,
            vllm_urls=remote.vllm_urls,
            vllm_top_k=remote.vllm_top_k,
            device=args.device,
            threads=args.threads,
            asr_model=args.asr_model,
            asr_draft=args.asr_draft,
            asr_margin_s=args.asr_margin,
            stream_draft=args.stream_draft,
            stream_partials=args.stream_partials,
            voice=None if args.no_tts else args.voice,
            need_llm=args.kind != "transcribe",
        )
    )
    models.warm_up()
    return make_pipeline(
        args.kind,
        models,
        mode=args.baseline,
        clock=WallClock() if args.realtime else VirtualClock(),
        turn=turn,
        predgen=predgen,
        retranslate=retranslate,
        turn_detection="semantic" if semantic else "server_vad",
        policy=policy,
    )


def _write_answers(path: str, events: list[Any]) -> bool:
    """The spoken answers, 0.3 s apart, as one WAV file; False when there were none."""
    chunks = [ev for ev in events if ev.type == "audio"]
    if not chunks:
        return False
    sr = chunks[0].sample_rate
    gap = np.zeros(int(0.3 * sr), np.float32)
    parts = [x for ev in chunks for x in (ev.samples, gap)]
    write_wav(path, Audio(np.concatenate(parts), sr, 0.0))
    return True


def cmd_live(args: argparse.Namespace) -> int:
    remote = REMOTE.build(args)  # options that do not fit together fail before anything loads
    audio = load_audio(args.input)  # bad input fails before any model loads
    if audio.size == 0:
        raise ConfigError(f"{args.input} holds no audio samples")
    pipe = _pipeline(args, remote)

    def show(ev: Any) -> None:
        if not args.json:
            line = _line(ev)
            if line:
                print(line, flush=True)

    res = play(pipe, audio, on_event=show)
    turns = [_turn_json(ev) for ev in res.events if ev.type == "turn_metrics"]
    if args.out and not _write_answers(args.out, res.events) and not args.json:
        print("no answer audio to write", file=sys.stderr)
    if args.json:
        mode = args.baseline or {"chat": "predgen", "translate": "ssbd", "transcribe": "streaming"}[args.kind]
        semantic = getattr(args, "turn_detection", "server_vad") == "semantic"
        print(
            json.dumps(
                {
                    "pipeline": args.kind,
                    "mode": mode,
                    "input_s": round(res.input_s, 3),
                    "max_lag_s": round(res.max_lag_s, 3),
                    "turn_detection": "semantic" if semantic else "server_vad",
                    "turns": turns,
                    "playbacks": [
                        {k: p[k] for k in ("turn", "start_t", "end_t", "cut")}
                        for p in getattr(pipe, "playbacks", [])
                    ],
                    "notices": [ev.to_json() for ev in res.events if ev.type == "notice"],
                },
                ensure_ascii=False,
            )
        )
    elif not turns:
        print("no speech heard", file=sys.stderr)
    return 0
