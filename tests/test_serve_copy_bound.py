"""``benchmarks/serve_copy_bound.py``: the bound pairs each peer request with the oracle's time."""

from __future__ import annotations

import pytest
from bench_scripts import load_benchmark_script

sb = load_benchmark_script("serve_copy_bound")


class _Tok:
    """Words as tokens; the chat template adds nothing."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.ids.setdefault(w, len(self.ids)) for w in text.split()]

    def chat(self, messages: list[dict]) -> list[int]:
        return self.encode(messages[0]["content"])


def _req(server: str, text: str, ttft: float, total: float, tokens: int) -> dict:
    return {
        "server": server,
        "prompt_set": "code-edit",
        "prompt": "a b c d e f",
        "text": text,
        "tokens": tokens,
        "ttft_s": ttft,
        "total_s": total,
        "error": "",
        "pass_index": 0,
    }


def test_a_whole_copy_costs_one_pass_after_the_peers_own_prefill():
    # the answer copies the prompt: the oracle drafts the 5 tokens after the first in one pass
    result = {
        "single": [
            _req("llama-server", "a b c d e f", 1.0, 1.5, 6),  # 0.1 s a step
            _req("llama-server-ngram", "a b c d e f", 1.0, 1.3, 6),
        ]
    }
    flat = [{"k": 1, "ms": 10.0}, {"k": 8, "ms": 10.0}]  # every pass costs one step
    res = sb.bound(result, flat, "code-edit", "llama-server-ngram", "llama-server", _Tok())
    (q,) = res["requests"]
    assert q["oracle_steps"] == 1.0 and q["plain_step_ms"] == pytest.approx(100.0)
    assert q["oracle_total_s"] == pytest.approx(1.1)
    assert res["bound"]["median"] == pytest.approx(1.3 / 1.1)
    assert res["bound_infinite_decode"]["median"] == pytest.approx(1.3)
