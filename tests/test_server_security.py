"""Security properties of the server that need no running server: model files are hashed
before they load, and no request can name a file on disk.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("fastapi")

from speclive.errors import ConfigError  # noqa: E402
from speclive.models.install import model_dir  # noqa: E402
from speclive.server.services import verify_installed  # noqa: E402

VOICE = "piper-joe-medium"


def test_a_tampered_model_file_stops_the_server_before_it_loads(tmp_path, monkeypatch):
    src = model_dir(VOICE)
    if not (src / "manifest.json").is_file():
        pytest.skip(f"{VOICE} is not installed (make models)")
    monkeypatch.setenv("SPECLIVE_HOME", str(tmp_path))
    dst = model_dir(VOICE)
    shutil.copytree(src, dst)
    verify_installed([VOICE, "/some/local/path.gguf", "not-a-registry-name"])  # intact: passes
    onnx = dst / "en_US-joe-medium.onnx"
    data = bytearray(onnx.read_bytes())
    data[len(data) // 2] ^= 0xFF
    onnx.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="integrity check.*en_US-joe-medium.onnx.*SHA-256"):
        verify_installed([VOICE])
