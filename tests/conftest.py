"""Shared fixtures: the real SmolLM2-135M model on both backends (installed on first use).

Loading goes through ``speclive.loader.load_backend``, the same path as the CLI, so the
offline bundle, the hash check and the GGUF -> safetensors conversion are exercised too.
"""

from __future__ import annotations

import os

import pytest

# Idle OpenMP threads (torch, llama.cpp's ggml) sleep instead of spinning. On a 2-core machine
# shared with other processes, spinning threads wait for a descheduled sibling and a forward
# of the tiny test models gets 10-40x slower. Read when the OpenMP runtime loads, so it is set
# here, before anything imports torch or llama_cpp; subprocesses of the tests inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SMALL = "smollm2-135m-instruct"


def pytest_configure(config):
    # tests do not read or write the saved cold-start knowledge of the user's speclive home
    # (tests of that feature set their own home and turn it back on)
    os.environ.setdefault("SPECLIVE_NO_KNOWLEDGE", "1")


@pytest.fixture(scope="session")
def gpu_model() -> str:
    """The model of the CUDA tests: the default one, or ``SPECLIVE_GPU_TEST_MODEL`` (a smaller
    one travels to a lent GPU machine faster)."""
    from speclive.loader import DEFAULT_MODEL

    return os.environ.get("SPECLIVE_GPU_TEST_MODEL", DEFAULT_MODEL)


@pytest.fixture(scope="session")
def hf_smol():
    from speclive.loader import load_backend

    return load_backend(SMALL, "hf")


@pytest.fixture(scope="session")
def llama_smol():
    pytest.importorskip("llama_cpp")
    from speclive.loader import load_backend

    return load_backend(SMALL, "llamacpp", n_ctx=2048)


@pytest.fixture(scope="session")
def cheap_draft(hf_smol):
    """The draft model of the fp32 exactness tests' model drafters: SmolLM2 on llama.cpp (same
    vocabulary, several times cheaper per step on a CPU than fp32 transformers), or the
    transformers SmolLM2 where llama-cpp-python is missing. Which model proposes a draft does not
    change what a lossless verification must output; only the time it takes."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return hf_smol
    from speclive.loader import load_backend

    # one thread: the two test workers share two cores (the talon tests' async draft is this one)
    return load_backend(SMALL, "llamacpp", n_ctx=2048, threads=1)


@pytest.fixture(scope="session")
def static_smol(hf_smol):
    """The static-cache backend (``hf_static``) over the same weights, without CUDA graphs."""
    from speclive.backends.hf_static import StaticHFBackend

    return StaticHFBackend(hf_smol.model, hf_smol.tokenizer, name=hf_smol.name, n_ctx=2048, graphs=False)


@pytest.fixture(params=["hf", "hf-static", "llamacpp"])
def any_smol(request):
    names = {"hf": "hf_smol", "hf-static": "static_smol", "llamacpp": "llama_smol"}
    return request.getfixturevalue(names[request.param])


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One intra-op torch thread for the whole run. The test models are tiny (SmolLM2-135M,
    Whisper tiny, toy speech LMs): a second thread gains nothing on them, and on a loaded 2-core
    machine (servers and draft jobs of the tests themselves, other processes) two spinning
    OpenMP threads make each forward up to ten times slower. Tests that measure thread
    settings use llama.cpp backends, whose thread counts are their own."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
