"""Start and stop local ``vllm serve`` processes (the vLLM venv of ``benchmarks/setup_vllm.sh``).

For ``speclive bench scale`` and the real-vLLM tests: ``VLLMServer`` runs vLLM's OpenAI server
(``python -m vllm.entrypoints.openai.api_server``) on 127.0.0.1 with the CPU settings that work
here (float32, prefix caching, ``HF_HUB_OFFLINE``, libiomp5 preloaded), waits for ``/health``
and stops the process (its whole process group) on ``stop``. A deployment starts vLLM its own
way (``docs/scale.md``); speclive then only needs the URLs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from speclive.errors import EngineUnavailableError
from speclive.models.convert import hf_dir_for_gguf
from speclive.models.resolve import resolve
from speclive_bench.peers import vllm_python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def model_dir(model: str) -> Path:
    """The HF folder vLLM loads for a speclive model name (GGUF models: their fp32 export)."""
    p = Path(model).expanduser()
    if p.is_dir():
        return p

    ref = resolve(model)
    if ref.gguf is not None:
        return hf_dir_for_gguf(ref.gguf, ref.name if ref.source == "registry" else None)
    if ref.path is not None:
        return Path(ref.path)
    raise EngineUnavailableError(f"no local HF folder for {model!r}: vLLM here needs one")


class VLLMServer:
    """One ``vllm serve`` process on 127.0.0.1 (a context manager)."""

    def __init__(
        self,
        model: str | Path,
        port: int | None = None,
        python: Path | None = None,
        enforce_eager: bool = False,
        max_model_len: int = 2048,
        max_logprobs: int = 20,
        kv_cache_gb: int = 2,
        block_size: int = 32,
        extra: list[str] | None = None,
        log: Path | None = None,
    ):
        py = python or vllm_python()
        if py is None:
            raise EngineUnavailableError(
                "no vLLM venv: run `bash benchmarks/setup_vllm.sh` (or set VLLM_VENV)"
            )
        self.python = Path(py)
        self.model = str(model_dir(str(model)))
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--max-model-len",
            str(max_model_len),
            "--max-logprobs",
            str(max_logprobs),
            "--enable-prefix-caching",
            # the prefix cache keeps whole blocks only: vLLM's CPU default of 128 tokens would
            # cache nothing of a ~100-token prompt (its GPU default is 16; the CPU backend
            # prefers multiples of 32)
            "--block-size",
            str(block_size),
            "--seed",
            "0",
            *(["--enforce-eager"] if enforce_eager else []),
            *(extra or []),
        ]
        self.kv_cache_gb = kv_cache_gb
        self.log_path = log or Path(tempfile.gettempdir()) / f"speclive-vllm-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        ncpu = os.cpu_count() or 1
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gb))
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{ncpu - 1}" if ncpu > 1 else "0")
        iomp = self.python.parent.parent / "lib" / "libiomp5.so"
        if iomp.is_file() and "LD_PRELOAD" not in env:
            env["LD_PRELOAD"] = str(iomp)
        return env

    def start(self, timeout_s: float = 600.0) -> VLLMServer:
        t0 = time.perf_counter()
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.cmd, env=self.env(), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        while time.perf_counter() - t0 < timeout_s:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise EngineUnavailableError(f"vllm serve exited with {self.proc.returncode}:\n{tail}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    self.startup_s = time.perf_counter() - t0
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise EngineUnavailableError(f"vllm serve did not become healthy in {timeout_s:.0f} s")

    def kill(self) -> None:
        """Kill the server at once (SIGKILL to its process group), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
