"""``speclive speechlm demo``: mixed text and CFG audio requests served concurrently; writes WAVs.

The model is a randomly initialised speech LM (no speech-LM weights exist offline), so the text is
byte noise and the audio is the random codec's rendering of random codes: the demo shows the
engine (streaming, phases, CFG pairs, codec), not a voice. ``--codec`` decodes with a real EnCodec
or DAC checkpoint instead (the model is then shaped to the codec's codebooks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from speclive.speechlm import (
    HFCodec,
    RandomRVQDecoder,
    SchedulerConfig,
    SpeechLM,
    SpeechLMConfig,
    SpeechLMEngine,
)
from speclive.speechlm.codec import write_wav
from speclive.speechlm.engine import AudioEvent, FinishEvent, TextEvent
from speclive.speechlm.vocab import decode_text

DEMO_PROMPTS = (
    ("text", None, "What is the capital of France?"),
    ("text_audio", None, "Say hello in a calm voice."),
    ("text_audio", 3.0, "Read this sentence with guidance."),
    ("text", None, "Count to five."),
    ("text_audio", 2.0, "A short jingle, guided."),
    ("text_audio", None, "Goodbye."),
)


def add_speechlm_parser(sub: Any) -> None:
    """Register ``speclive speechlm``."""
    p = sub.add_parser("speechlm", help="speech-LM serving engine (continuous batching, CFG, codec)")
    s = p.add_subparsers(dest="speechlm_command", required=True)
    d = s.add_parser("demo", help="mixed text and CFG audio requests at once; writes WAVs")
    d.add_argument("--out", type=Path, default=Path("speechlm-demo"), help="folder for WAVs + summary.json")
    d.add_argument("--preset", default="bench", help="model shape: tiny | bench | bagpiper | opuslm")
    d.add_argument("--frames", type=int, default=50, help="max audio frames per request")
    d.add_argument("--text-tokens", type=int, default=24, help="max text tokens per request")
    d.add_argument("--codec", default=None, help="EnCodec/DAC checkpoint (folder or cached hub id)")
    d.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    mcfg = SpeechLMConfig.preset(args.preset)
    if args.codec:
        codec = HFCodec.load(args.codec)
        mcfg = replace(mcfg, n_streams=codec.n_codebooks, codebook_size=codec.codebook_size)
    else:
        codec = RandomRVQDecoder(mcfg.n_streams, mcfg.codebook_size, seed=args.seed)
    model = SpeechLM(replace(mcfg, seed=args.seed))
    engine = SpeechLMEngine(model, codec, SchedulerConfig(max_num_seqs=16))
    args.out.mkdir(parents=True, exist_ok=True)

    async def one(i: int, mode: str, cfg: float | None, prompt: str) -> dict[str, Any]:
        rid = f"demo-{i}"
        t0 = time.perf_counter()
        first = None
        n_rows = 0
        async for ev in engine.stream(
            prompt,
            request_id=rid,
            mode=mode,
            cfg=cfg,
            max_text_tokens=args.text_tokens,
            min_text_tokens=args.text_tokens // 3 if mode == "text_audio" else 0,
            max_audio_frames=args.frames,
            min_audio_frames=args.frames // 2,
            seed=args.seed + i,
        ):
            if first is None and isinstance(ev, TextEvent | AudioEvent):
                first = time.perf_counter() - t0
            n_rows += isinstance(ev, AudioEvent)
            if isinstance(ev, FinishEvent):
                res = ev.result
        info = {
            "request": rid,
            "mode": mode,
            "cfg": cfg,
            "prompt": prompt,
            "text_tokens": len(res.text_tokens),
            "text": decode_text(res.text_tokens),
            "audio_frames": int(res.codes.shape[1]),
            "delayed_rows": n_rows,
            "first_event_s": round(first or 0.0, 3),
            "total_s": round(time.perf_counter() - t0, 3),
        }
        if res.waveform is not None:
            path = write_wav(args.out / f"{rid}.wav", res.waveform, res.sample_rate)
            info["wav"] = str(path)
            info["audio_s"] = round(res.waveform.numel() / res.sample_rate, 3)
        print(
            f"{rid} [{mode}{f', cfg={cfg:g}' if cfg else ''}] {info['text_tokens']} text tokens, "
            f"{info['audio_frames']} audio frames" + (f" -> {info['wav']}" if "wav" in info else ""),
            file=sys.stderr,
        )
        return info

    async def main() -> list[dict[str, Any]]:
        return await asyncio.gather(*(one(i, *p) for i, p in enumerate(DEMO_PROMPTS)))

    t0 = time.perf_counter()
    infos = asyncio.run(main())
    steps = engine.core.stats
    summary = {
        "model": f"random {args.preset}: S={mcfg.n_streams}, K={mcfg.codebook_size}, d={mcfg.d_model}",
        "codec": args.codec or "random RVQ decoder",
        "wall_s": round(time.perf_counter() - t0, 3),
        "engine_steps": len(steps),
        "max_batch": max((s.n_seqs for s in steps), default=0),
        "leaked_kv_blocks": engine.core.cache.allocator.n_used,
        "requests": infos,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "requests"}))
    return 0
