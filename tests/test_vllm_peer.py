"""The vLLM peer of ``speclive bench decode`` without vLLM: command lines, venv lookup, and the
``vllm_peer.py`` script driven against a fake ``vllm`` module (real vLLM runs are benchmarks)."""

from __future__ import annotations

import json
import stat
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from speclive_bench import vllm_peer
from speclive_bench.peers import VLLM_METHODS, VllmPeer, vllm_forwards, vllm_python


def test_speculative_config_per_method() -> None:
    assert vllm_peer.speculative_config("none", None, None) is None
    ng = vllm_peer.speculative_config("ngram", None, None)
    assert ng is not None and ng["method"] == "ngram" and ng["num_speculative_tokens"] == 8
    assert ng["prompt_lookup_min"] <= ng["prompt_lookup_max"]
    assert vllm_peer.speculative_config("suffix", None, 5) == {
        "method": "suffix",
        "num_speculative_tokens": 5,
    }
    dm = vllm_peer.speculative_config("draft", "/d", None)
    assert dm == {"method": "draft_model", "model": "/d", "num_speculative_tokens": 4}
    with pytest.raises(SystemExit):
        vllm_peer.speculative_config("draft", None, None)
    with pytest.raises(SystemExit):
        vllm_peer.speculative_config("eagle", None, None)


def test_script_does_not_shadow_top_level_modules() -> None:
    # run as a script, its folder (with our datasets.py, report.py, ...) must not be on sys.path
    here = Path(vllm_peer.__file__).resolve().parent
    assert all(Path(p or ".").resolve() != here for p in sys.path)


def test_command_line(tmp_path: Path) -> None:
    py = tmp_path / "bin" / "python"
    peer = VllmPeer(
        "vllm-draft", py, tmp_path / "t", tmp_path / "d", eos_ids=[7, 3], num_speculative_tokens=3
    )
    cmd = peer.command(tmp_path / "p.json", tmp_path / "o.json", 64)
    assert cmd[0] == str(py) and cmd[1].endswith("vllm_peer.py")
    args = cmd[2:]

    def value(flag: str) -> str:
        return args[args.index(flag) + 1]

    assert value("--method") == "draft" and value("--draft") == str(tmp_path / "d")
    assert value("--stop-ids") == "3,7" and value("--max-tokens") == "64"
    assert value("--num-speculative-tokens") == "3"
    assert "--enforce-eager" not in args  # vLLM as shipped unless asked
    eager = VllmPeer("vllm-ar", py, tmp_path / "t", enforce_eager=True)
    args = eager.command(tmp_path / "p.json", tmp_path / "o.json", 8)
    assert "--enforce-eager" in args and "--draft" not in args and "--num-speculative-tokens" not in args
    assert args[args.index("--method") + 1] == "none"
    assert set(VLLM_METHODS) == {"vllm-ar", "vllm-ngram", "vllm-suffix", "vllm-draft"}
    with pytest.raises(ValueError):
        VllmPeer("vllm-eagle", py, tmp_path)


def test_env_preloads_libiomp5(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    env = VllmPeer("vllm-ar", tmp_path / "bin" / "python", tmp_path).env()
    assert env["LD_PRELOAD"] == str(tmp_path / "lib" / "libiomp5.so")
    assert env["HF_HUB_OFFLINE"] == "1" and "VLLM_CPU_OMP_THREADS_BIND" in env


def test_vllm_python_honours_vllm_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = tmp_path / "shared-venv"
    monkeypatch.setenv("VLLM_VENV", str(venv))
    assert vllm_python() is None  # named but not there: not silently another venv
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    assert vllm_python() == venv / "bin" / "python"
    monkeypatch.delenv("VLLM_VENV")
    root = tmp_path / "repo"
    (root / ".venv-vllm" / "bin").mkdir(parents=True)
    (root / ".venv-vllm" / "bin" / "python").write_text("")
    assert vllm_python(root) == root / ".venv-vllm" / "bin" / "python"


# --------------------------------------------------------------- the script against a fake vLLM
class _FakeLLM:
    instances: list[_FakeLLM] = []

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        self.calls: list[tuple[list[int], int]] = []
        self.accepted = 0.0
        _FakeLLM.instances.append(self)

    def generate(self, prompts: list[dict[str, Any]], params: Any, use_tqdm: bool = True) -> list[Any]:
        ids = prompts[0]["prompt_token_ids"]
        self.calls.append((ids, params.max_tokens))
        self.accepted += 2
        out = SimpleNamespace(token_ids=[100 + i for i in range(params.max_tokens)], finish_reason="length")
        return [SimpleNamespace(outputs=[out])]

    def get_metrics(self) -> list[Any]:
        return [
            SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", value=self.accepted),
            SimpleNamespace(name="vllm:other", value=1.0),
        ]


def _fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("vllm")
    mod.LLM = _FakeLLM  # type: ignore[attr-defined]
    mod.SamplingParams = lambda **kw: SimpleNamespace(**kw)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", mod)
    _FakeLLM.instances.clear()


def test_script_warmup_and_per_prompt_max_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_vllm(monkeypatch)
    prompts = [
        {"id": "warmup\t0", "prompt_ids": [9, 9], "max_tokens": 2},
        {"id": "code-edit\ta", "prompt_ids": [1, 2, 3]},
        {"id": "code-edit\tb", "prompt_ids": [4]},
    ]
    pj = tmp_path / "p.json"
    pj.write_text(json.dumps(prompts))
    out = tmp_path / "o.json"
    argv = ["--model", "/m", "--method", "ngram", "--prompts-json", str(pj), "--max-tokens", "5"]
    assert vllm_peer.main([*argv, "--out", str(out), "--stop-ids", "7"]) == 0
    llm = _FakeLLM.instances[0]
    assert llm.kwargs["enforce_eager"] is False and llm.kwargs["dtype"] == "float32"
    assert llm.kwargs["speculative_config"]["method"] == "ngram"
    assert llm.calls == [([9, 9], 2), ([1, 2, 3], 5), ([4], 5)]
    data = json.loads(out.read_text())
    assert [r["id"] for r in data["results"]] == ["code-edit\ta", "code-edit\tb"]  # warm-up not reported
    assert all(len(r["token_ids"]) == 5 and r["num_accepted_tokens"] == 2.0 for r in data["results"])
    assert data["enforce_eager"] is False

    assert vllm_peer.main([*argv, "--out", str(out), "--enforce-eager"]) == 0
    assert _FakeLLM.instances[-1].kwargs["enforce_eager"] is True


def test_run_all_round_trip_with_a_fake_interpreter(tmp_path: Path) -> None:
    """``VllmPeer.run_all`` writes the prompts (warm-up first), runs the command, reads results."""
    seen = tmp_path / "seen.json"
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        "a = sys.argv[2:]\n"
        "items = json.load(open(a[a.index('--prompts-json') + 1]))\n"
        f"json.dump({{'argv': a, 'items': items}}, open({str(seen)!r}, 'w'))\n"
        "res = [{'id': it['id'], 'token_ids': [5, 6, 2, 8], 'wall_s': 0.5, 'num_accepted_tokens': 1.0}\n"
        "       for it in items if not it['id'].startswith('warmup')]\n"
        "json.dump({'startup_s': 1.0, 'results': res}, open(a[a.index('--out') + 1], 'w'))\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    peer = VllmPeer("vllm-ngram", fake, tmp_path / "model", eos_ids=[2])
    outs, facts = peer.run_all([("s\tp", [1, 2, 3])], 8, warmup=[[4, 4]], warmup_tokens=3)
    items = json.loads(seen.read_text())["items"]
    assert items[0] == {"id": "warmup\t0", "prompt_ids": [4, 4], "max_tokens": 3}
    assert items[1] == {"id": "s\tp", "prompt_ids": [1, 2, 3]}
    o = outs["s\tp"]
    assert o.token_ids == [5, 6] and o.finish_reason == "eos"  # cut at the EOS id 2
    assert o.target_forwards == 1 and o.extra == {"num_accepted_tokens": 1.0}
    assert facts["startup_s"] == 1.0 and "subprocess_s" in facts


def test_peer_comparison_line() -> None:
    from speclive_bench.decode import peer_comparison

    rows = [
        {"method": "ar", "backend": "llamacpp", "e2e_tps": 20.0, "prompts": 2},
        {"method": "ngram", "backend": "llamacpp", "e2e_tps": 30.0, "prompts": 2},
        {"method": "llama-cpp-python", "backend": "llamacpp", "e2e_tps": 20.0, "prompts": 2},
        {"method": "vllm-ar", "backend": "vllm", "e2e_tps": 4.0, "prompts": 2},
        {"method": "vllm-suffix", "backend": "vllm", "e2e_tps": None, "prompts": 0},
        {"method": "vllm-ngram", "backend": "vllm", "e2e_tps": 7.5, "prompts": 1},
    ]
    line = peer_comparison(rows)
    assert line.startswith("Single-stream e2e tok/s, our fastest `ngram` [llamacpp] 30.00")
    assert "`llama-cpp-python` [llamacpp] 20.00 (1.50×)" in line
    assert "`vllm-ar` [vllm] 4.00 (7.50×)" in line
    assert "`vllm-ngram` [vllm] 7.50 (4.00×, 1 of 2 prompts)" in line
    assert "vllm-suffix" not in line  # no throughput: nothing to compare
    assert line.index("llama-cpp-python") < line.index("vllm-ngram") < line.index("vllm-ar")
    assert peer_comparison(rows[:2]) == ""


def test_vllm_forwards_estimate() -> None:
    assert vllm_forwards(128, None, None) == 128  # plain decoding: prefill + 127 steps
    assert vllm_forwards(128, 20, 111) == 21  # 20 verifications + prefill (17 undercounts)
    assert vllm_forwards(128, 26, 104) == 27  # k=4, all accepted, the last step cut at max_tokens
    assert vllm_forwards(100, 10, 40) == 60  # steps without a draft count too
    assert vllm_forwards(0, 0, 0) is None
