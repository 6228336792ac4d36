"""The ``speclive`` command line on the real SmolLM2-135M: output contract and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from speclive.cli import main

SMALL = "smollm2-135m-instruct"
#: SmolLM2 copies the function back: a case prompt lookup drafts well on
PROMPT = "Add a docstring to this function:\ndef area(r):\n    return 3.14159 * r * r\n"


def _generate(capsys, *extra: str, prompt: str = PROMPT) -> tuple[int, str, str]:
    rc = main(["generate", "--model", SMALL, "--max-tokens", "24", *extra, prompt])
    out, err = capsys.readouterr()
    return rc, out, err


def test_generate_json_contract_and_lossless_vs_plain(capsys):
    rc, out, _ = _generate(capsys, "--backend", "hf", "--drafter", "ngram", "--json")
    assert rc == 0
    spec = json.loads(out)
    assert set(spec) >= {"text", "token_ids", "stats"}
    for key in ("target_forwards", "mean_accepted", "acceptance_rate", "tokens_per_second"):
        assert key in spec["stats"], key
    rc, out, _ = _generate(capsys, "--backend", "hf", "--drafter", "none", "--json")
    plain = json.loads(out)
    assert rc == 0 and spec["token_ids"] == plain["token_ids"] and spec["text"] == plain["text"]
    # AR: one pass per token (+1 for the pass that produced end-of-sequence)
    assert len(plain["token_ids"]) <= plain["stats"]["target_forwards"] <= len(plain["token_ids"]) + 1
    assert spec["stats"]["target_forwards"] < plain["stats"]["target_forwards"]  # drafts were accepted


def test_generate_streams_text_and_stats_line(capsys):
    rc, out, err = _generate(capsys, "--backend", "llamacpp")
    assert rc == 0 and "def area" in out
    assert "target forwards" in err and "tau" in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--drafter", "magic"], "argument --drafter: invalid choice: magic (choose from none, ngram, model"),
        (["--backend", "tpu"], "argument --backend: invalid choice: tpu (choose from hf, llamacpp)"),
        (["--model", "no-such-model"], "smollm2-135m-instruct"),
        (["--accept", "nonsense"], "nonsense"),
    ],
)
def test_bad_options_name_the_option_and_allowed_values(capsys, args, needle):
    model = ["--model", SMALL] if "--model" not in args else []
    try:
        rc = main(["generate", "--max-tokens", "4", *model, *args, "hi"])
    except SystemExit as e:  # argparse refuses a value outside the option's choices
        rc = e.code
    err = capsys.readouterr().err.replace("'", "")
    assert rc == 2 and needle in err, err


def test_empty_prompt_is_a_clear_error(capsys):
    rc, _, err = _generate(capsys, prompt="   ")
    assert rc == 2 and "empty prompt" in err


def test_prompt_longer_than_context_is_a_clear_error(capsys):
    rc, _, err = _generate(capsys, "--n-ctx", "64", prompt="word " * 200)
    assert rc == 2 and "context window" in err, err


def test_demo_runs_side_by_side(capsys):
    # fp32 transformers: speculative output must be token-identical to plain greedy
    rc = main(["demo", "--model", SMALL, "--backend", "hf", "--max-tokens", "32", "--no-color"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "plain greedy" in out and "speculative" in out and "speedup" in out
    assert "token-identical" in out and "DIFFERS" not in out


def test_console_entry_point_runs():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "speclive.cli",
            "generate",
            "--model",
            SMALL,
            "--max-tokens",
            "8",
            "--json",
            "Hi",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["token_ids"]) <= 8
