"""This machine's verification-cost curve: measured once on a scratch state, kept, read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from context_lm import ContextLM

from speclive.backends import cost_calibration as cc

#: the fake machine: a pass over k tokens costs this many steps
TRUE = {1: 1.0, 2: 1.3, 4: 1.8, 8: 2.9, 16: 4.6, 17: 6.1, 32: 7.7, 33: 8.9, 64: 14.2}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class TimedLM(ContextLM):
    """A ContextLM whose passes take TRUE[k] steps of 0.1 s on ``clock``; the first pass of each
    length once takes longer (a load spike the fastest of the repeats must not keep)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock, self.passes, self.spiked = clock, 0, set()

    def _extend(self, state, tokens, parents, last_only=False):
        k = len(tokens)
        if not last_only:
            self.clock.now += 0.1 * TRUE.get(k, k) * (3.0 if k not in self.spiked else 1.0)
            self.spiked.add(k)
            self.passes += 1
        return super()._extend(state, tokens, parents, last_only)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(cc, "time", c)
    return c


def test_the_measured_curve_is_the_machines_and_leaves_the_backend_as_it_was(clock: Clock) -> None:
    lm = TimedLM(clock)
    cost, calls = lm.cost, lm.forward_calls
    curve = cc.measure(lm)
    assert curve == pytest.approx(TRUE)  # the fastest of the repeats: the spikes are gone
    assert lm.cost is cost and not cost.state() and lm.forward_calls == calls
    assert lm.passes == len(cc.KS) * cc.REPEATS


def test_calibrate_keeps_the_curve_and_a_later_load_reads_it_back(clock: Clock, tmp_path: Path) -> None:
    model, cache = tmp_path / "m.gguf", tmp_path / "home" / "cost-curves.json"
    model.write_bytes(b"GGUF" + bytes(32))
    settings = {"threads": 2, "repacked": False}
    first = TimedLM(clock)
    assert first.cost.ratio(8) != pytest.approx(2.9)  # the generic prior before
    assert cc.calibrate(first, model, settings, cache) == pytest.approx(TRUE)
    assert first.cost.ratio(8) == pytest.approx(2.9) and first.cost.ratio(6) == pytest.approx(2.35)
    entry = next(iter(json.loads(cache.read_text()).values()))
    assert entry["model"] == "m.gguf" and entry["settings"] == settings
    # a new process on the same machine: read back, nothing measured
    later = TimedLM(clock)
    assert cc.calibrate(later, model, settings, cache) == pytest.approx(TRUE)
    assert later.passes == 0 and later.cost.ratio(16) == pytest.approx(4.6)
    # other settings (other kernels): measured on their own
    other = TimedLM(clock)
    cc.calibrate(other, model, {**settings, "threads": 1}, cache)
    assert other.passes == len(cc.KS) * cc.REPEATS and len(json.loads(cache.read_text())) == 2


def test_a_curve_kept_by_another_protocol_is_measured_again(
    clock: Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timed behind another prefix or at other lengths, a kept curve is another measurement."""
    model, cache = tmp_path / "m.gguf", tmp_path / "c.json"
    model.write_bytes(b"GGUF")
    cc.calibrate(TimedLM(clock), model, {}, cache)
    monkeypatch.setattr(cc, "PREFIX", cc.PREFIX // 4)
    again = TimedLM(clock)
    cc.calibrate(again, model, {}, cache)
    assert again.passes == len(cc.KS) * cc.REPEATS and len(json.loads(cache.read_text())) == 2


def test_a_measurement_replaces_the_calibrated_prior_where_it_exists(clock: Clock, tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    lm = TimedLM(clock)
    cc.calibrate(lm, model, {}, tmp_path / "c.json")
    lm.cost.observe(1, 0.1)
    lm.cost.observe(4, 0.25)
    assert lm.cost.ratio(4) == pytest.approx(2.5) and lm.cost.ratio(8) == pytest.approx(2.9)


def test_a_broken_cache_or_a_missing_model(clock: Clock, tmp_path: Path) -> None:
    cache = tmp_path / "c.json"
    cache.write_text("{oops")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert cc.calibrate(TimedLM(clock), model, {}, cache) == pytest.approx(TRUE)
    assert cc.calibrate(TimedLM(clock), tmp_path / "gone.gguf", {}, cache) is None


def test_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cc.ENV, "0")
    assert not cc.enabled()
    monkeypatch.delenv(cc.ENV)
    assert cc.enabled()
