"""Options declared once (``speclive.options``): parser, options object and reproducing
command agree, for a toy options class and for every ``bench`` command built on them."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from collections.abc import Sequence
from pathlib import Path

import pytest

from speclive.options import OptionSet, option


@dataclasses.dataclass
class Toy:
    model: str = option("m0", "--model", always=True)
    sizes: Sequence[int] = option((1, 2), "--sizes", parse=int)
    rate: float = option(0.5, "--rate", parse=float)
    warm: bool = option(True, "--no-warm")
    cold: bool = option(False, "--cold")
    pick: str = option("a", "--pick", choices=("a", "b"))
    limit: int | None = option(None, "--limit", parse=int, always=True)
    out: Path = option(Path("o"), "--out", parse=Path, result=False)
    kinds: Sequence[str] = option(
        ("x",), "--kind", many=False, to_field=lambda v: [v, v], to_flag=lambda v: v and v[0]
    )
    note: str = ""  # no flag: not an option


def _parse(options: OptionSet, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    options.add_to(p)
    return p.parse_args(argv)


def test_defaults_build_the_dataclass_defaults() -> None:
    opts = OptionSet(Toy).build(_parse(OptionSet(Toy), []))
    assert opts == Toy(sizes=[1, 2], kinds=["x", "x"])
    assert OptionSet(Toy).command(["prog"], opts) == "prog --model m0"


def test_flags_map_onto_fields() -> None:
    s = OptionSet(Toy)
    args = _parse(s, ["--sizes", "3,4", "--rate", "0.25", "--no-warm", "--cold", "--pick", "b"])
    opts = s.build(args, note="n")
    assert (opts.sizes, opts.rate, opts.warm, opts.cold, opts.pick, opts.note) == (
        [3, 4],
        0.25,
        False,
        True,
        "b",
        "n",
    )
    assert s.command(["prog"], opts) == "prog --model m0 --sizes 3,4 --rate 0.25 --no-warm --cold --pick b"


def test_command_round_trip_and_result_free_options() -> None:
    s = OptionSet(Toy)
    opts = s.build(_parse(s, ["--model", "two words", "--limit", "3", "--out", "/x", "--kind", "y"]))
    assert opts.kinds == ["y", "y"] and opts.out == Path("/x")
    cmd = s.command(["prog"], opts)
    assert "--out" not in cmd  # cannot change a result
    again = s.build(_parse(s, shlex.split(cmd)[1:]))
    assert dataclasses.replace(again, out=opts.out) == opts


def test_bad_values_and_declarations_fail_clearly() -> None:
    s = OptionSet(Toy)
    with pytest.raises(SystemExit):
        _parse(s, ["--sizes", "1,x"])
    with pytest.raises(SystemExit):
        _parse(s, ["--pick", "c"])
    with pytest.raises(TypeError, match="declares no option"):
        OptionSet(Toy, only=["note"])

    @dataclasses.dataclass
    class Wrong:
        on: bool = option(True, "--on")

    with pytest.raises(TypeError, match="switch needs default True"):
        OptionSet(Wrong).add_to(argparse.ArgumentParser())


def test_preset_and_command_defaults() -> None:
    s = OptionSet(Toy, only=["model", "sizes", "limit"], defaults={"limit": 7})
    opts = s.preset(sizes=[9])
    assert (opts.model, opts.sizes, opts.limit) == ("m0", [9], 7)
    assert s.command(["p"], opts) == "p --model m0 --sizes 9 --limit 7"
    assert _parse(s, []).limit == 7


BENCH_ARGV = [
    ["costcurve", "--ks", "1,8", "--backend", "hf", "--compare-stock-linear"],
    ["decode", "--backend", "both", "--sets", "mtbench", "--limit", "2", "--no-curve", "--near-tie", "0.25"],
    ["decode", "--methods", "ar,ngram", "--curve-ks", "1,2", "--cold", "--vllm-k", "3"],
    ["talon", "--datastore", "/d.npz", "--hf-peers", "--methods", "ar,suffix"],
    ["retranslate", "--betas", "0,0.2", "--langs", "de", "--mask-ks", "3", "--device", "cuda"],
    ["graphs", "--limit", "4", "--device", "cuda:1"],
    ["predgen", "--methods", "baseline,topk:3@fits", "--turns", "1", "--no-tts", "--cpm", "450"],
    ["live", "--pipeline", "translate", "--methods", "ssbd,ar", "--beta", "0", "--end-silence", "0.7"],
    ["live", "--first-clause", "0", "--voices", "piper"],
    ["speechlm", "--concurrency", "1,4", "--cfg-scale", "1.5", "--no-plot"],
    ["asr", "--draft-margin", "none", "--self-draft", "", "--threads", "2", "--clips", "/c"],
    ["asr", "--draft-margin", "0.5", "--device", "cuda"],
    ["serve", "--model", "m.gguf", "--sets", "none", "--voice-sessions", "2,3", "--max-sessions", "5"],
    ["scale", "--sessions", "1,2", "--betas", "0", "--workloads", "chat", "--enforce-eager", "--cpm", "450"],
    ["fuzz", "--asr-model", "w", "--requests", "20", "--events", "30", "--seed", "1", "--tag", "t"],
    ["soak", "--minutes", "0.5", "--warmup-minutes", "0.1", "--sample-s", "2", "--chat-clients", "0"],
    ["longconv", "--sessions", "3", "--turns", "31", "--n-ctx", "1024", "--burst", "1", "--tag", "t"],
]


@pytest.mark.parametrize("argv", BENCH_ARGV, ids=lambda a: a[0])
def test_bench_commands_reproduce_their_options(argv: list[str]) -> None:
    """The command written into a result re-parses to the options that produced it."""
    from speclive_bench import cli as bench
    from speclive_bench import cli_asr as bench_asr
    from speclive_bench import longconv, reliability, scale, serve, soak
    from speclive_bench.speechlm import SpeechLMBenchOptions

    special = {
        "decode": bench.decode_options,
        "talon": bench.talon_options,
        "speechlm": lambda: OptionSet(SpeechLMBenchOptions),
        "asr": lambda: bench_asr.OPTIONS,
        "serve": lambda: serve.OPTIONS,
        "scale": lambda: scale.OPTIONS,
        "fuzz": lambda: reliability.OPTIONS,
        "soak": lambda: soak.OPTIONS,
        "longconv": lambda: longconv.OPTIONS,
    }
    options = special.get(argv[0], lambda: bench._options(argv[0]))()
    p = argparse.ArgumentParser(prog="speclive")
    bench.add_bench_parser(p.add_subparsers(dest="command", required=True))
    opts = options.build(p.parse_args(["bench", *argv]))
    cmd = options.command(["speclive", "bench", argv[0]], opts)
    words = shlex.split(cmd)
    assert words[:3] == ["speclive", "bench", argv[0]]
    again = options.build(p.parse_args(words[1:]))
    # options that cannot change a result (output folder, plots) are not written: keep them
    keep = {f.name: getattr(opts, f.name) for f in options.fields if not options.spec(f).result}
    assert dataclasses.replace(again, **keep) == opts
    for flag in argv[1:]:
        if flag.startswith("--") and flag not in ("--no-plot",):
            assert flag in words, f"{flag} missing from {cmd}"
