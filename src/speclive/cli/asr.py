"""``speclive transcribe``: a WAV file -> text (plain, JSON, or streamed partials)."""

from __future__ import annotations

import argparse
import json
import sys

from speclive.asr.transcribe import METHODS
from speclive.cli.flags import parse_margin


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
    p.add_argument("--stream", action="store_true", help="stream 1 s chunks with LocalAgreement-2")
    p.add_argument("--step", type=float, default=1.0, help="seconds per streaming step")
    p.add_argument("--vad", action="store_true", help="skip streaming passes without speech (Silero VAD)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads")
    p.add_argument("--device", default="cpu", help="torch device of the Whisper models (cpu, cuda, cuda:1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("file", help="audio file (WAV/FLAC/OGG; any rate, mono or stereo)")
    p.set_defaults(func=cmd_transcribe)


def cmd_transcribe(args: argparse.Namespace) -> int:
    from speclive.asr.audio import load_audio
    from speclive.asr.streaming import StreamConfig, stream_file, transcriber_recognizer
    from speclive.asr.transcribe import TranscribeConfig, Transcriber

    audio = load_audio(args.file)  # fail on bad input before loading any model
    cfg = TranscribeConfig(
        model=args.model,
        method=args.method,
        draft=args.draft,
        sd_len=args.sd_len,
        threads=args.threads,
        draft_audio_margin_s=args.draft_margin,
        device=args.device,
    )
    tr = Transcriber(cfg)
    if args.stream:
        scfg = StreamConfig(step_s=args.step, vad=args.vad)
        final = None
        for part in stream_file(audio, transcriber_recognizer(tr), scfg):
            final = part
            if args.json:
                print(json.dumps(part.to_json()), flush=True)
            else:
                tent = " ".join(w.text for w in part.tentative)
                print(f"[{part.audio_s:6.1f}s] {part.committed_text} | {tent}", flush=True)
        if final is not None and not args.json:
            print(final.text)
        return 0
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
