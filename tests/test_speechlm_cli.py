"""``speclive speechlm demo`` and ``speclive bench speechlm`` end to end on the tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from speclive.cli import main


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_demo_writes_wavs(tmp_path, capsys):
    assert main(["speechlm", "demo", "--preset", "tiny", "--frames", "6", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    reqs = summary["requests"]
    assert summary["leaked_kv_blocks"] == 0 and summary["max_batch"] >= 2
    audio = [r for r in reqs if r["mode"] == "text_audio"]
    assert all(r["audio_frames"] >= 3 and (tmp_path / f"{r['request']}.wav").exists() for r in audio)
    assert any(r["cfg"] for r in audio) and all(r["audio_frames"] == 0 for r in reqs if r["mode"] == "text")


def test_bench_speechlm_tiny(tmp_path, capsys):
    args = ["bench", "speechlm", "--preset", "tiny", "--concurrency", "1,4", "--audio-frames", "4"]
    args += ["--repeats", "1", "--cfg-workload", "6", "--out", str(tmp_path), "--no-plot"]
    assert main(args) == 0
    res = json.loads((tmp_path / "speechlm-tiny.json").read_text())
    assert [r["concurrency"] for r in res["scaling"]] == [1, 4]
    assert [r["sequences"] for r in res["cfg"]] == [6, 6, 6]
    assert [r["guided"] for r in res["cfg"]] == [0, 2, 3]
    assert all(r["identical"] == r["requests"] for r in res["exactness"])
    md = (tmp_path / "speechlm-tiny.md").read_text()
    assert "Reproduce with" in md and "speclive bench speechlm --preset tiny" in md


def test_bench_rejects_bad_workload(capsys):
    assert main(["bench", "speechlm", "--cfg-workload", "7"]) == 2
