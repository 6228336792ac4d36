"""Read a CTranslate2 ``model.bin`` and rebuild a transformers ``WhisperForConditionalGeneration``.

The CTranslate2 binary format (version 6, written by ``ctranslate2.specs.ModelSpec.save``) is a
flat list of named tensors::

    uint32 version; string spec_name; uint32 revision; uint32 n_vars;
    n_vars × (string name; uint8 rank; uint32 dims[rank]; uint8 dtype; uint32 nbytes; bytes)
    uint32 n_aliases; n_aliases × (string alias; string target)

where a ``string`` is a uint16 length (terminating NUL included) and the bytes. This module
maps the Whisper spec's variable names onto the transformers parameter names; int8/float16
weights (with their ``*_scale`` companions) are dequantized to float32. The converted model is
cached as a safetensors folder so later loads take about a second.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def _read_string(buf: memoryview, off: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<H", buf, off)
    off += 2
    s = bytes(buf[off : off + n - 1]).decode("utf-8")
    return s, off + n


def read_ct2(path: str | Path) -> tuple[str, dict[str, np.ndarray]]:
    """Spec name and every variable (aliases resolved) of a CTranslate2 ``model.bin``."""
    data = Path(path).read_bytes()
    buf = memoryview(data)
    if len(data) < 12:
        raise ValueError(f"{path}: too short to be a CTranslate2 model")
    (version,) = struct.unpack_from("<I", buf, 0)
    if not 5 <= version <= 6:
        raise ValueError(f"{path}: unsupported CTranslate2 binary version {version}")
    spec, off = _read_string(buf, 4)
    off += 4  # revision
    (n_vars,) = struct.unpack_from("<I", buf, off)
    off += 4
    out: dict[str, np.ndarray] = {}
    for _ in range(n_vars):
        name, off = _read_string(buf, off)
        (rank,) = struct.unpack_from("<B", buf, off)
        off += 1
        dims = struct.unpack_from(f"<{rank}I", buf, off)
        off += 4 * rank
        dtype_id, nbytes = struct.unpack_from("<BI", buf, off)
        off += 5
        if dtype_id == 5:  # bfloat16: widen through uint32
            raw = np.frombuffer(data, dtype=np.uint16, count=nbytes // 2, offset=off)
            arr = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            dt = np.dtype(_DTYPES[dtype_id])
            arr = np.frombuffer(data, dtype=dt, count=nbytes // dt.itemsize, offset=off)
        out[name] = arr.reshape(dims) if rank else arr.reshape(())
        off += nbytes
    (n_alias,) = struct.unpack_from("<I", buf, off)
    off += 4
    for _ in range(n_alias):
        alias, off = _read_string(buf, off)
        target, off = _read_string(buf, off)
        out[alias] = out[target]
    return spec, out


def _f32(a: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    out = a.astype(np.float32)
    if scale is not None and a.dtype == np.int8:  # int8 rows carry a per-row scale
        out = out / scale.astype(np.float32).reshape(-1, *([1] * (a.ndim - 1)))
    return out


def _count_layers(v: dict[str, np.ndarray], prefix: str) -> int:
    n = 0
    while f"{prefix}/layer_{n}/ffn/linear_0/weight" in v:
        n += 1
    return n


def ct2_to_hf_state(v: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """transformers state dict (float32 numpy) and the shape hyper-parameters of a Whisper spec."""

    def g(name: str) -> np.ndarray:
        return _f32(v[name], v.get(name + "_scale"))

    sd: dict[str, np.ndarray] = {}

    def linear(dst: str, src: str, bias: bool = True) -> None:
        sd[f"{dst}.weight"] = g(f"{src}/weight")
        if bias:
            sd[f"{dst}.bias"] = g(f"{src}/bias")

    def norm(dst: str, src: str) -> None:
        sd[f"{dst}.weight"] = g(f"{src}/gamma")
        sd[f"{dst}.bias"] = g(f"{src}/beta")

    def split_proj(dst: str, names: tuple[str, ...], src: str) -> None:
        w = g(f"{src}/weight")
        b = g(f"{src}/bias")
        d = w.shape[0] // len(names)
        for i, nm in enumerate(names):
            sd[f"{dst}.{nm}.weight"] = w[i * d : (i + 1) * d]
            if nm != "k_proj":  # Whisper's key projections have no bias (CT2 stores zeros)
                sd[f"{dst}.{nm}.bias"] = b[i * d : (i + 1) * d]

    n_enc = _count_layers(v, "encoder")
    n_dec = _count_layers(v, "decoder")
    e, dd = "model.encoder", "model.decoder"
    for c in ("conv1", "conv2"):
        sd[f"{e}.{c}.weight"] = g(f"encoder/{c}/weight")
        sd[f"{e}.{c}.bias"] = g(f"encoder/{c}/bias")
    sd[f"{e}.embed_positions.weight"] = g("encoder/position_encodings/encodings")
    norm(f"{e}.layer_norm", "encoder/layer_norm")
    for i in range(n_enc):
        s, h = f"encoder/layer_{i}", f"{e}.layers.{i}"
        split_proj(f"{h}.self_attn", ("q_proj", "k_proj", "v_proj"), f"{s}/self_attention/linear_0")
        linear(f"{h}.self_attn.out_proj", f"{s}/self_attention/linear_1")
        norm(f"{h}.self_attn_layer_norm", f"{s}/self_attention/layer_norm")
        linear(f"{h}.fc1", f"{s}/ffn/linear_0")
        linear(f"{h}.fc2", f"{s}/ffn/linear_1")
        norm(f"{h}.final_layer_norm", f"{s}/ffn/layer_norm")
    sd[f"{dd}.embed_tokens.weight"] = g("decoder/embeddings/weight")
    sd[f"{dd}.embed_positions.weight"] = g("decoder/position_encodings/encodings")
    norm(f"{dd}.layer_norm", "decoder/layer_norm")
    for i in range(n_dec):
        s, h = f"decoder/layer_{i}", f"{dd}.layers.{i}"
        split_proj(f"{h}.self_attn", ("q_proj", "k_proj", "v_proj"), f"{s}/self_attention/linear_0")
        linear(f"{h}.self_attn.out_proj", f"{s}/self_attention/linear_1")
        norm(f"{h}.self_attn_layer_norm", f"{s}/self_attention/layer_norm")
        linear(f"{h}.encoder_attn.q_proj", f"{s}/attention/linear_0")
        split_proj(f"{h}.encoder_attn", ("k_proj", "v_proj"), f"{s}/attention/linear_1")
        linear(f"{h}.encoder_attn.out_proj", f"{s}/attention/linear_2")
        norm(f"{h}.encoder_attn_layer_norm", f"{s}/attention/layer_norm")
        linear(f"{h}.fc1", f"{s}/ffn/linear_0")
        linear(f"{h}.fc2", f"{s}/ffn/linear_1")
        norm(f"{h}.final_layer_norm", f"{s}/ffn/layer_norm")
    proj = v.get("decoder/projection/weight")
    sd["proj_out.weight"] = (
        g("decoder/projection/weight") if proj is not None else sd[f"{dd}.embed_tokens.weight"]
    )
    emb = sd[f"{dd}.embed_tokens.weight"]
    shape = {
        "vocab_size": int(emb.shape[0]),
        "d_model": int(emb.shape[1]),
        "encoder_layers": n_enc,
        "decoder_layers": n_dec,
        "encoder_attention_heads": int(v["encoder/num_heads"]),
        "decoder_attention_heads": int(v["decoder/num_heads"]),
        "encoder_ffn_dim": int(sd[f"{e}.layers.0.fc1.weight"].shape[0]),
        "decoder_ffn_dim": int(sd[f"{dd}.layers.0.fc1.weight"].shape[0]),
        "num_mel_bins": int(sd[f"{e}.conv1.weight"].shape[1]),
        "max_source_positions": int(sd[f"{e}.embed_positions.weight"].shape[0]),
        "max_target_positions": int(sd[f"{dd}.embed_positions.weight"].shape[0]),
    }
    return sd, shape


def load_ct2_whisper(folder: str | Path, special: dict[str, int]):  # -> WhisperForConditionalGeneration
    """Build a float32 ``WhisperForConditionalGeneration`` from a CTranslate2 Whisper folder.

    ``special`` gives the ids transformers' config needs (``eos``, ``sot``).
    """
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    folder = Path(folder)
    spec, v = read_ct2(folder / "model.bin")
    if spec != "WhisperSpec":
        raise ValueError(f"{folder}/model.bin holds a {spec}, not a Whisper model")
    sd, shape = ct2_to_hf_state(v)
    cfg = WhisperConfig(
        **shape,
        pad_token_id=special["eos"],
        bos_token_id=special["eos"],
        eos_token_id=special["eos"],
        decoder_start_token_id=special["sot"],
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(cfg)
    tensors = {k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in sd.items()}
    model.load_state_dict(tensors, strict=True, assign=True)
    model.proj_out.weight = model.model.decoder.embed_tokens.weight
    return model.eval()


def read_ct2_config(folder: str | Path) -> dict:
    p = Path(folder) / "config.json"
    return json.loads(p.read_text()) if p.exists() else {}
