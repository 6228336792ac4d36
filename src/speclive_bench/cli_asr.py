"""``speclive bench asr`` argument parsing and result files (``benchmarks/results/asr-<tag>.*``)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclive.common_options import device_option, threads_option
from speclive.options import OptionSet, option, parse_margin
from speclive_bench import asr_stream, report
from speclive_bench.asr import (
    clips_from,
    librivox_clips,
    markdown,
    piper_clips,
    plot,
    run_asr_bench,
    save_clips,
)
from speclive_bench.report import machine_info, provenance, write_result_files


def _margin(flag: str, help: str) -> Any:
    """A seconds-of-audio margin option (default 1 s; 'none' on the command line is None)."""
    return option(
        1.0, flag, parse=parse_margin, to_flag=lambda v: "none" if v is None else v, help=help, always=True
    )


@dataclass
class AsrBenchOptions:
    """Settings of ``bench asr``; each field is its command-line option (``speclive.options``)."""

    model: str = option("whisper-base", "--model", help="Whisper target", always=True)
    draft: str = option(
        "whisper-tiny.en", "--draft", help="draft model (other vocabularies are bridged)", always=True
    )
    self_draft: str = option(
        "self:2", "--self-draft", help="also run a shallow self-draft ('' = skip)", always=True
    )
    piper: int = option(5, "--piper", parse=int, help="Piper-synthesized MT-Bench sentences", always=True)
    draft_margin: float | None = _margin(
        "--draft-margin",
        "also run rows with the draft encoding only the audio plus this many seconds "
        "('none' = skip those rows)",
    )
    out: Path = report.out_option()
    tag: str | None = option(None, "--tag", help="result file stem suffix (default: <model>)", always=True)
    threads: int | None = threads_option(help="torch threads (none: all cores)")
    device: str = device_option(help="torch device of the Whisper models (cpu, cuda, cuda:1)")
    clips: Path | None = option(
        None, "--clips", parse=Path, help="run the clips that --save-clips wrote there"
    )
    save_clips: Path | None = option(
        None,
        "--save-clips",
        parse=Path,
        help="write the LibriVox and Piper clips there and stop (for a machine without Piper)",
        result=False,
    )
    plot: bool = report.plot_option()
    stream: bool = option(
        False,
        "--stream",
        help="streaming passes drafted by the previous passes against re-decoding (per pass, per "
        "final pass, per turn); writes asr-stream-<tag>.*",
    )
    turns: int = option(
        24,
        "--turns",
        parse=int,
        help="--stream: multi-sentence Piper turns besides the clip sets (sentences added up to a "
        "length drawn from 5-20 s, so a turn may run past 20 s)",
        always=True,
    )
    stream_methods: list[str] = option(
        [],
        "--stream-methods",
        parse=str,
        help="--stream: the methods to run (default: all of speclive_bench.asr_stream.METHODS; "
        "ar and the plain run a method is checked against are added)",
    )
    asr_margin: float | None = _margin(
        "--asr-margin",
        "--stream: the target encodes the audio plus this many seconds, as in the live "
        "pipelines ('none' = Whisper's full 30 s window)",
    )


OPTIONS = OptionSet(AsrBenchOptions)


def add_asr_bench_parser(sub: Any) -> None:
    a = sub.add_parser("asr", help="Whisper: AR vs plain SD vs SpecASR ablation, WER, cost curve")
    OPTIONS.add_to(a)
    a.set_defaults(func=cmd_asr_bench)


def cmd_asr_bench(args: argparse.Namespace) -> int:
    o = OPTIONS.build(args)
    if o.save_clips is not None:
        clips = librivox_clips() + piper_clips(o.piper)
        save_clips(clips, o.save_clips)
        print(f"wrote {len(clips)} clips to {o.save_clips}", file=sys.stderr)
        return 0
    o.tag = o.tag or o.model
    if o.threads:
        import torch

        torch.set_num_threads(o.threads)
    if o.stream:
        return _stream_bench(o)
    result = run_asr_bench(
        o.model,
        o.draft,
        o.self_draft or None,
        o.piper,
        draft_margin_s=o.draft_margin,
        log=lambda m: print(m, file=sys.stderr),
        device=o.device,
        clips=None if o.clips is None else clips_from(o.clips),
    )
    on_cpu = o.device == "cpu"
    result["header"] = {
        "machine": machine_info(),
        "models": {"target": o.model, "draft": o.draft, "self_draft": o.self_draft or "-"},
        "settings": {
            "precision": "fp32",
            "device": o.device,
            "torch_threads": __import__("torch").get_num_threads(),
            "decoding": "greedy, no timestamps, Whisper suppression rules",
            "specasr": "threshold 0.4, max_len 24, <=3 branches of <=3 tokens, match window +-1, "
            "cost-aware stop on the measured target cost curve (from its row on)",
            "draft": ("int8 decoder projections and LM head" if on_cpu else "float32")
            + ", full vocabulary (target float32); "
            + (
                "full 30 s audio window"
                if o.draft_margin is None
                else f"full 30 s window, or audio + {o.draft_margin:g} s where the row says so"
            ),
        },
        "skipped": [
            "transformers assistant_model: base and tiny.en have different vocabularies (51865 vs 51864)"
        ],
        "command": OPTIONS.command(["speclive", "bench", "asr"], o),
    }
    paths = write_result_files(result, o.out, f"asr-{o.tag}", markdown, plot if o.plot else None)
    for p in paths:
        print(f"wrote {p}", file=sys.stderr)
    print(markdown(result))
    return 0


def _stream_bench(o: AsrBenchOptions) -> int:
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    if o.clips is not None:
        clips = clips_from(o.clips)
    else:
        clips = librivox_clips() + piper_clips(o.piper) + asr_stream.multi_sentence_turns(o.turns)
    clips = [asr_stream.with_trailing_silence(c) for c in clips]
    log(f"{len(clips)} turns, {sum(c.seconds for c in clips):.0f} s of audio")
    command = OPTIONS.command(["speclive", "bench", "asr"], o)
    # read before the run: the tree's state then is the code that runs
    prov, machine = provenance(command), machine_info()
    transcribers = asr_stream.load_transcribers(o.model, o.draft, o.asr_margin, o.threads)
    transcribers["ar"][0].transcribe(clips[0].audio)  # warm-up: lazy set-up stays out of the figures
    result = asr_stream.run_stream_bench(
        clips, transcribers, methods=asr_stream.with_references(o.stream_methods), log=log
    )
    result["provenance"] = prov
    result["header"] = {
        "machine": machine,
        "models": {"target": o.model, "draft": o.draft},
        "settings": {
            "precision": "fp32 target, int8 draft decoder",
            "torch_threads": __import__("torch").get_num_threads(),
            "window": "full 30 s" if o.asr_margin is None else f"audio + {o.asr_margin:g} s",
            "step_s": 1.0,
            "decoding": "greedy, no timestamps; streaming passes keep the text before a loop",
        },
        "command": command,
    }
    paths = write_result_files(
        result, o.out, f"asr-stream-{o.tag}", asr_stream.markdown, asr_stream.plot if o.plot else None
    )
    for p in paths:
        print(f"wrote {p}", file=sys.stderr)
    print(asr_stream.markdown(result))
    return 0
