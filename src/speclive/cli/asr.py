"""``speclive transcribe``: a WAV file -> text (plain, JSON, or streamed partials)."""

from __future__ import annotations

import argparse
import json
import sys

from speclive.asr.audio import load_audio
from speclive.asr.streaming import StreamConfig, stream_timed, transcriber_recognizer
from speclive.asr.transcribe import METHODS, TranscribeConfig, Transcriber
from speclive.common_options import STREAMING
from speclive.live.vad import StreamingVAD, last_speech_end
from speclive.options import parse_margin


def add_transcribe_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("transcribe", help="speech to text with Whisper (AR, SD or SpecASR)")
    p.add_argument("--model", default="whisper-base", help="Whisper target: registry name, folder or hub id")
    p.add_argument(
        "--draft",
        default="whisper-tiny.en",
        help="draft: another Whisper model (other vocabularies are bridged) or self / self:N "
        "(the first N decoder layers of the target)",
    )
    p.add_argument("--method", default="specasr", choices=METHODS, help="decoding method")
    p.add_argument("--sd-len", type=int, default=8, help="draft length of plain SD (--method sd)")
    p.add_argument(
        "--draft-margin",
        type=parse_margin,
        default=1.0,
        help="a separate draft model encodes only the audio plus this many seconds "
        "('none' = Whisper's full 30 s window; the target always encodes the full window)",
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="play the file at real time in 1 s steps (LocalAgreement-2 partials); the final pass "
        "runs at the first silent frame after the speech",
    )
    STREAMING.add_to(p)
    p.add_argument("--step", type=float, default=1.0, help="seconds per streaming step")
    p.add_argument("--vad", action="store_true", help="skip streaming passes without speech (Silero VAD)")
    p.add_argument(
        "--final-tail",
        type=int,
        default=None,
        metavar="N",
        help="--stream: the final pass hears only the audio from the last N committed words on "
        "(faster; the words before stay as the partials committed them: lossy, see docs/asr.md)",
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads")
    p.add_argument("--device", default="cpu", help="torch device of the Whisper models (cpu, cuda, cuda:1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("file", help="audio file (WAV/FLAC/OGG; any rate, mono or stereo)")
    p.set_defaults(func=cmd_transcribe)


def cmd_transcribe(args: argparse.Namespace) -> int:
    audio = load_audio(args.file)  # fail on bad input before loading any model
    cfg = TranscribeConfig(
        model=args.model,
        method=args.method,
        draft=args.draft,
        sd_len=args.sd_len,
        threads=args.threads,
        draft_audio_margin_s=args.draft_margin,
        device=args.device,
        stream_partials=args.stream_partials,
    )
    tr = Transcriber(cfg)
    if args.stream:
        return _stream(args, audio, tr)
    res = tr.transcribe(audio)
    if args.json:
        print(json.dumps(res.to_json()))
    else:
        print(res.text)
        s = res.stats
        print(
            f"[{args.method}] {s.new_tokens} tokens, {s.audio_s:.1f}s audio | decode {s.decode_ms:.0f} ms "
            f"(encode {s.encode_ms:.0f} ms) | target forwards {s.target_forwards} | draft forwards "
            f"{s.draft_forwards} | tau {s.mean_accepted:.2f}",
            file=sys.stderr,
        )
    return 0


def _stream(args: argparse.Namespace, audio, tr) -> int:
    """``--stream``: partials as the audio arrives, then one JSON object (``--json``) with the
    text, every pass and the final pass's latency."""

    silence_t = last_speech_end(StreamingVAD()(audio))
    recognize = transcriber_recognizer(tr, draft=args.stream_draft)

    def show(part) -> None:
        if args.json:
            print(json.dumps(part.to_json()), flush=True)
        else:
            tent = " ".join(w.text for w in part.tentative)
            print(f"[{part.audio_s:6.1f}s] {part.committed_text} | {tent}", flush=True)

    run = stream_timed(
        audio,
        recognize,
        StreamConfig(step_s=args.step, vad=args.vad, final_tail_words=args.final_tail),
        silence_t,
        show,
    )
    records = recognize.passes.records
    if args.json:
        out = {
            "text": run.final.text,
            "passes": [r.to_json() for r in records],
            "final_latency_s": round(run.final_latency_s, 4),
            "silence_t": None if run.silence_t is None else round(run.silence_t, 3),
            "stream_draft": bool(args.stream_draft),
        }
        print(json.dumps(out), flush=True)
    else:
        print(run.final.text)
        passes = sum(r.decoder_passes for r in records)
        print(
            f"[stream{'' if args.stream_draft else ', no draft'}] {len(records)} passes, {passes} decoder "
            f"passes | final transcript {1000 * run.final_latency_s:.0f} ms after the first silent frame",
            file=sys.stderr,
        )
    return 0
