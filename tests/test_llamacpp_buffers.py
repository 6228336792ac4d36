"""The probe that decides whether llama.cpp's extra weight buffers are safe on this CPU."""

from __future__ import annotations

import json
from pathlib import Path

from speclive.backends import llamacpp_buffers as lb

CRASH = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
FINE = "import sys; sys.exit(0)"


def _model(tmp_path: Path) -> Path:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    return gguf


def test_a_child_that_crashes_is_unsafe_and_says_how(tmp_path: Path) -> None:
    safe, what = lb.probe(_model(tmp_path), CRASH)
    assert not safe
    assert what == "signal 11"
    assert lb.probe(_model(tmp_path), FINE) == (True, "decoded a batch")


def test_the_answer_is_kept_and_read_back_without_probing_again(tmp_path: Path) -> None:
    gguf, cache = _model(tmp_path), tmp_path / "home" / "buffers.json"
    assert lb.remembered_probe(gguf, cache, CRASH) is False
    entry = next(iter(json.loads(cache.read_text()).values()))
    assert entry == {"safe": False, "model": "model.gguf", "probe": "signal 11"}
    # the kept answer wins over a code that would now pass: nothing runs again
    assert lb.remembered_probe(gguf, cache, FINE) is False
    # another model (its size is part of the key) is probed on its own
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + bytes(10))
    assert lb.remembered_probe(other, cache, FINE) is True
    assert len(json.loads(cache.read_text())) == 2


def test_a_broken_cache_file_is_probed_over(tmp_path: Path) -> None:
    gguf, cache = _model(tmp_path), tmp_path / "buffers.json"
    cache.write_text("[not json")
    assert lb.remembered_probe(gguf, cache, FINE) is True
    assert next(iter(json.loads(cache.read_text()).values()))["safe"] is True
