"""Dual-layout CPU linears: same numbers as ``nn.Linear`` for every row count, clean swap back."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from speclive.backends import cpu_linear  # noqa: E402


@pytest.mark.parametrize("native_rows", [{m: False for m in cpu_linear.CALIBRATE_ROWS}, None])
def test_dual_matches_stock_linear_for_every_row_count(native_rows):
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 200)
    # None: the padded ``W @ xᵀ`` kernel from 2 rows on (exercises padding and slicing)
    plan = native_rows or {m: m > 1 for m in cpu_linear.CALIBRATE_ROWS}
    dual = cpu_linear.make_dual(lin, plan)
    for m in [1, 2, 3, 5, 15, 16, 17, 33, 70]:
        x = torch.randn(1, m, 96)
        with torch.inference_mode():
            want, got = lin(x), dual(x)
        assert got.shape == want.shape == (1, m, 200)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), m


def test_install_swaps_and_stock_linears_restores(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLIVE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECLIVE_STOCK_LINEAR", raising=False)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4, bias=False))
    x = torch.randn(3, 8)
    want = model(x).detach()
    info = cpu_linear.install(model)
    assert info["installed"] and info["layers"] == 2
    assert not any(isinstance(m, torch.nn.Linear) for m in model)
    with torch.inference_mode():
        assert torch.allclose(model(x), want, atol=1e-6)
    with cpu_linear.stock_linears(model):
        assert sum(isinstance(m, torch.nn.Linear) for m in model) == 2
    assert not any(isinstance(m, torch.nn.Linear) for m in model)


def test_install_skips_what_it_cannot_speed_up(monkeypatch):
    half = torch.nn.Sequential(torch.nn.Linear(8, 8)).to(torch.bfloat16)
    assert cpu_linear.install(half) == {"installed": False, "why": "not float32 on CPU"}
    monkeypatch.setenv("SPECLIVE_STOCK_LINEAR", "1")
    assert not cpu_linear.install(torch.nn.Sequential(torch.nn.Linear(8, 8)))["installed"]


def test_install_refuses_when_memory_is_short(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLIVE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECLIVE_STOCK_LINEAR", raising=False)
    monkeypatch.setattr(cpu_linear, "_available_bytes", lambda: 1000)
    info = cpu_linear.install(torch.nn.Sequential(torch.nn.Linear(64, 64)))
    assert not info["installed"] and "GiB available" in info["why"]


def test_plan_is_cached_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLIVE_HOME", str(tmp_path))
    w = torch.randn(48, 32)
    plan, cached = cpu_linear.cached_plan(w)
    assert not cached and set(plan) == set(cpu_linear.CALIBRATE_ROWS)
    again, cached = cpu_linear.cached_plan(w)
    assert cached and again == plan
    assert (tmp_path / "linear-plans.json").is_file()
