"""``benchmarks/retranslate_near_ties.py``: where lossless SSBD departs from AR, and at what gap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_scripts import load_benchmark_script

from speclive_bench.report import NEAR_TIE_GAP

SOURCE = "The old lighthouse keeper climbed the stairs every evening at dusk."


@pytest.fixture(scope="module")
def nt():
    return load_benchmark_script("retranslate_near_ties")


def test_first_difference(nt):
    assert nt.first_difference([[1, 2], [1, 2, 3]], [[1, 2], [1, 2, 3]]) is None
    assert nt.first_difference([[1, 2], [1, 2, 3]], [[1, 2], [1, 5, 3]]) == (1, 1)
    assert nt.first_difference([[1, 2, 3]], [[1, 2]]) == (0, 2)  # one output is a prefix


def _result(tmp_path: Path, streams: dict[str, list[list[int]]]) -> Path:
    records = [
        {"lang": "de", "stream": 0, "method": m, "source": SOURCE, "update_ids": ids}
        for m, ids in streams.items()
    ]
    header = {"target": "smollm2-135m-instruct", "backends": "llamacpp", "settings": {"lag_k": 3}}
    path = tmp_path / "retranslate-x.json"
    path.write_text(json.dumps({"header": header, "records": records}))
    return path


def test_a_real_flip_is_measured_and_a_clear_margin_fails(nt, llama_smol, tmp_path):
    from speclive.sessions.retranslate import ReTranslator
    from speclive.sessions.simulate import lag_k_prefixes

    s = ReTranslator(llama_smol, target_lang="de", baseline=True, max_tokens=24)
    prefixes = lag_k_prefixes(SOURCE, 3)
    for p in prefixes[:-1]:
        s.update(p)
    s.finish(prefixes[-1])
    ar = [u.token_ids for u in s.updates]
    s.close()
    assert nt.main([str(_result(tmp_path, {"ar": ar, "ssbd b=0": ar}))]) == 0
    report = (tmp_path / "retranslate-x-ties.md").read_text()
    assert "0 of 1 streams differ" in report
    # change AR's most confident token of one update: a flip at that margin must be a bug
    import numpy as np

    prompt = s.prompt_ids(" ".join(prefixes[1].split()))
    state = llama_smol.new_state()
    rows = llama_smol.extend(state, prompt + ar[1])[len(prompt) - 1 : len(prompt) - 1 + len(ar[1])]
    llama_smol.release(state)
    gaps = [float(np.diff(np.sort(r)[-2:])[0]) for r in rows]
    j = int(np.argmax(gaps))
    assert gaps[j] >= NEAR_TIE_GAP
    wrong = [list(x) for x in ar]
    wrong[1][j] = (wrong[1][j] + 7) % llama_smol.vocab_size
    assert nt.main([str(_result(tmp_path, {"ar": ar, "ssbd b=0": wrong}))]) == 1
    report = (tmp_path / "retranslate-x-ties.md").read_text()
    assert "1 of 1 streams differ" in report and "1 differ at a gap at or above it" in report
    row = next(line for line in report.splitlines() if line.startswith(f"| de | 0 | 1 | {j} |"))
    assert float(row.split("|")[5]) >= NEAR_TIE_GAP  # read from its own pass: same order, not digits
