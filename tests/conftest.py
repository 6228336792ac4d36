"""Shared fixtures: the real SmolLM2-135M model on both backends (installed on first use).

Loading goes through ``speclive.loader.load_backend``, the same path as the CLI, so the
offline bundle, the hash check and the GGUF -> safetensors conversion are exercised too.
"""

from __future__ import annotations

import os

import pytest

SMALL = "smollm2-135m-instruct"


def pytest_configure(config):
    # tests do not read or write the saved cold-start knowledge of the user's speclive home
    # (tests of that feature set their own home and turn it back on)
    os.environ.setdefault("SPECLIVE_NO_KNOWLEDGE", "1")


@pytest.fixture(scope="session")
def hf_smol():
    from speclive.loader import load_backend

    return load_backend(SMALL, "hf")


@pytest.fixture(scope="session")
def llama_smol():
    pytest.importorskip("llama_cpp")
    from speclive.loader import load_backend

    return load_backend(SMALL, "llamacpp", n_ctx=2048)


@pytest.fixture(params=["hf", "llamacpp"])
def any_smol(request):
    return request.getfixturevalue("hf_smol" if request.param == "hf" else "llama_smol")


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: one intra-op thread (two fight each other on a shared 2-core machine)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
