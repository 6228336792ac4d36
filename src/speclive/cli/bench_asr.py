"""``speclive bench asr`` argument parsing and result files (``benchmarks/results/asr-<tag>.*``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from speclive.cli.asr import parse_margin


def add_asr_bench_parser(sub: Any) -> None:
    a = sub.add_parser("asr", help="Whisper: AR vs plain SD vs SpecASR ablation, WER, cost curve")
    a.add_argument("--model", default="whisper-base", help="Whisper target")
    a.add_argument("--draft", default="whisper-tiny.en", help="draft model (other vocabularies are bridged)")
    a.add_argument("--self-draft", default="self:2", help="also run a shallow self-draft ('' = skip)")
    a.add_argument("--piper", type=int, default=5, help="Piper-synthesized MT-Bench sentences")
    a.add_argument(
        "--draft-margin",
        type=parse_margin,
        default=1.0,
        help="also run rows with the draft encoding only the audio plus this many seconds "
        "('none' = skip those rows)",
    )
    a.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    a.add_argument("--tag", default=None, help="result file stem suffix (default: <model>)")
    a.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    a.add_argument("--device", default="cpu", help="torch device of the Whisper models (cpu, cuda, cuda:1)")
    a.add_argument("--clips", type=Path, default=None, help="run the clips that --save-clips wrote there")
    a.add_argument(
        "--save-clips",
        type=Path,
        default=None,
        help="write the LibriVox and Piper clips there and stop (for a machine without Piper)",
    )
    a.add_argument("--no-plot", action="store_true")
    a.set_defaults(func=cmd_asr_bench)


def cmd_asr_bench(args: argparse.Namespace) -> int:
    from speclive.bench.asr import (
        clips_from,
        librivox_clips,
        markdown,
        piper_clips,
        plot,
        run_asr_bench,
        save_clips,
    )
    from speclive.bench.report import machine_info, write_result_files

    if args.save_clips is not None:
        clips = librivox_clips() + piper_clips(args.piper)
        save_clips(clips, args.save_clips)
        print(f"wrote {len(clips)} clips to {args.save_clips}", file=sys.stderr)
        return 0
    tag = args.tag or args.model
    command = (
        f"flock /tmp/speclive-cpu.lock speclive bench asr --model {args.model} --draft {args.draft} "
        f"--self-draft '{args.self_draft}' --piper {args.piper} "
        f"--draft-margin {'none' if args.draft_margin is None else f'{args.draft_margin:g}'} --tag {tag}"
    )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
        command += f" --threads {args.threads}"
    if args.device != "cpu":
        command += f" --device {args.device}"
    if args.clips is not None:
        command += f" --clips {args.clips}"
    result = run_asr_bench(
        args.model,
        args.draft,
        args.self_draft or None,
        args.piper,
        draft_margin_s=args.draft_margin,
        log=lambda m: print(m, file=sys.stderr),
        device=args.device,
        clips=None if args.clips is None else clips_from(args.clips),
    )
    on_cpu = args.device == "cpu"
    result["header"] = {
        "machine": machine_info(),
        "models": {"target": args.model, "draft": args.draft, "self_draft": args.self_draft or "-"},
        "settings": {
            "precision": "fp32",
            "device": args.device,
            "torch_threads": __import__("torch").get_num_threads(),
            "decoding": "greedy, no timestamps, Whisper suppression rules",
            "specasr": "threshold 0.4, max_len 24, <=3 branches of <=3 tokens, match window +-1, "
            "cost-aware stop on the measured target cost curve (from its row on)",
            "draft": ("int8 decoder projections and LM head" if on_cpu else "float32")
            + ", full vocabulary (target float32); "
            + (
                "full 30 s audio window"
                if args.draft_margin is None
                else f"full 30 s window, or audio + {args.draft_margin:g} s where the row says so"
            ),
        },
        "skipped": [
            "transformers assistant_model: base and tiny.en have different vocabularies (51865 vs 51864)"
        ],
        "command": command,
    }
    paths = write_result_files(result, args.out, f"asr-{tag}", markdown, None if args.no_plot else plot)
    for p in paths:
        print(f"wrote {p}", file=sys.stderr)
    print(markdown(result))
    return 0
