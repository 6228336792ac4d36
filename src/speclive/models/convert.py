"""Turn a GGUF file into what the transformers backend loads, once, cached on disk.

transformers dequantizes GGUF weights on load (20-70 s); we save the result as an fp32
safetensors folder next to the tokenizer so later loads take about a second. The tokenizer
alone (which both backends use) is cached separately because it is needed by llama.cpp runs
that never load the torch weights.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from speclive.models.install import speclive_home


def _cache_root() -> Path:
    return speclive_home() / "hf"


def _key(gguf: Path, name: str | None) -> str:
    if name:
        return name
    st = gguf.stat()
    digest = hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return f"{gguf.stem}-{digest}"


def _atomic_dir(final: Path, build) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build(tmp)
        if final.exists():  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def tokenizer_dir_for_gguf(gguf: str | Path, name: str | None = None) -> Path:
    """Folder with the HF tokenizer extracted from ``gguf`` (built on first use)."""
    gguf = Path(gguf)
    final = _cache_root() / _key(gguf, name) / "tokenizer"
    if (final / "tokenizer_config.json").exists():
        return final

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.save_pretrained(str(tmp))

    return _atomic_dir(final, build)


def hf_dir_for_gguf(gguf: str | Path, name: str | None = None) -> Path:
    """Folder with fp32 safetensors weights + config dequantized from ``gguf`` (built once)."""
    gguf = Path(gguf)
    final = _cache_root() / _key(gguf, name) / "fp32"
    if (final / "config.json").exists():
        return final

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp))
        shutil.copytree(tokenizer_dir_for_gguf(gguf, name), tmp, dirs_exist_ok=True)

    return _atomic_dir(final, build)
