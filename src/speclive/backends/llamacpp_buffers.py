"""Whether llama.cpp's extra weight buffers are safe to use on this CPU.

llama.cpp can load quantized weights into *extra buffer types*: interleaved ("repacked")
layouts for its fast CPU kernels and, on CPUs with Intel AMX, AMX tiles. A build made on an
AMX host compiles the AMX kernels in, and on some such hosts (seen on a virtual machine whose
CPU reports ``amx_int8``) the first batch of two or more tokens kills the process with a general
protection fault in the AMX matmul (``ldtilecfg``). One-token steps run, so a crash waits for
the first prompt. llama.cpp's own server crashes the same way and runs with ``--no-repack``.

``extra_buffers_safe`` answers the question once per llama.cpp build, CPU and model: a build
without AMX kernels is taken as safe at once; otherwise a child process loads the model with the
extra buffers, decodes one 8-token batch and exits. The answer is kept in
``$SPECLIVE_HOME/llamacpp-buffers.json`` so later loads cost nothing.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
from pathlib import Path

from speclive import kept_measurements
from speclive.kept_measurements import keep_entry, read_entries
from speclive.sysinfo import cpu_detail, cpu_model

log = logging.getLogger(__name__)

#: the child's test: load with extra buffers, decode one batch of 8 tokens, exit 0
PROBE = r"""
import sys
import llama_cpp.llama_cpp as lib
lib.llama_log_set(lib.llama_log_callback(lambda *a: None), None)
lib.llama_backend_init()
mp = lib.llama_model_default_params()
mp.use_extra_bufts = True
model = lib.llama_model_load_from_file(sys.argv[1].encode(), mp)
assert model, "llama.cpp could not load the model"
cp = lib.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 64, 8, 8, 2, 2
ctx = lib.llama_init_from_model(model, cp)
assert ctx, "llama.cpp could not create a context"
tokens = (lib.llama_token * 8)(*range(1, 9))
sys.exit(lib.llama_decode(ctx, lib.llama_batch_get_one(tokens, 8)))
"""


def _system_info() -> str:
    try:
        import llama_cpp.llama_cpp as lib
    except ImportError:  # no llama.cpp: nothing to load either way
        return ""

    return lib.llama_print_system_info().decode("utf-8", "replace")


def _build_key(gguf: Path) -> str:
    """The llama.cpp build (its CPU library's path, size and time), the CPU and the model."""
    import llama_cpp

    libdir = Path(llama_cpp.__file__).parent / "lib"
    libs = sorted(p for p in libdir.glob("libggml-cpu*") if p.is_file())
    st = gguf.stat()
    parts = [f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in libs]
    return kept_measurements.key(parts + [cpu_model(), cpu_detail() or "", f"{gguf.resolve()}:{st.st_size}"])


def probe(gguf: Path, code: str = PROBE, timeout: float = 300.0) -> tuple[bool, str]:
    """Run ``code`` on ``gguf`` in a child process: (it exited 0, what happened)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(gguf)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "OMP_NUM_THREADS": "2"},
        )
    except subprocess.TimeoutExpired:
        return False, f"no answer within {timeout:.0f} s"
    if done.returncode == 0:
        return True, "decoded a batch"
    why = f"signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
    tail = done.stderr.strip().splitlines()[-1:] if done.stderr else []
    return False, why + (f" ({tail[0][:200]})" if tail else "")


def _cache_file() -> Path:
    # lazy: models.install pulls in the installer (tqdm, the registry) for one path
    from speclive.models.install import speclive_home

    return speclive_home() / "llamacpp-buffers.json"


@functools.cache
def extra_buffers_safe(gguf: Path) -> bool:
    """Whether loading ``gguf`` with llama.cpp's extra buffer types decodes batches safely
    here (module docstring): a build without AMX kernels is; otherwise ``remembered_probe``."""
    if not gguf.is_file() or "AMX_INT8 = 1" not in _system_info():
        return True  # no file: loading it fails on its own, with its own message
    return remembered_probe(gguf, _cache_file())


def remembered_probe(gguf: Path, cache: Path, code: str = PROBE) -> bool:
    """``probe`` once per build, CPU and model; the answer is kept in the JSON file ``cache``."""
    entry_key = _build_key(gguf)
    entry = read_entries(cache).get(entry_key)
    if isinstance(entry, dict) and isinstance(entry.get("safe"), bool):
        return entry["safe"]
    safe, what = probe(gguf, code)
    if not safe:
        log.warning(
            "llama.cpp's AMX weight buffers crashed on a test batch with %s (%s): loading it "
            "without repacked weights on this CPU (as llama-server --no-repack)",
            gguf.name,
            what,
        )
    keep_entry(cache, entry_key, {"safe": safe, "model": gguf.name, "probe": what})
    return safe
