"""Turn what a user typed for a model (registry name, local file/folder, hub id) into a ModelRef.

Resolution order:

1. a registry name (``speclive models list``) -> installed on demand; ``source="registry"``;
2. an existing local file ending in ``.gguf`` -> ``source="gguf"``;
3. an existing local folder -> ``source="hf-dir"`` (a transformers / CTranslate2 / Piper folder);
4. something shaped like a hub id, ``owner/name`` -> ``source="hub"`` (loaded by the backend
   from the hub; nothing is downloaded here);
5. anything else -> UnknownModelError listing the registry names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from speclive.errors import UnknownModelError
from speclive.models.install import ModelNotInstalledError, install, is_installed, model_dir
from speclive.models.registry import REGISTRY, ModelSpec

Source = Literal["registry", "gguf", "hf-dir", "hub"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class ModelRef:
    """A resolved model.

    ``path`` is the folder holding the model's files (the registry install folder, the folder of
    a ``.gguf`` file, or the given folder); ``gguf`` the GGUF file when there is one; ``hub_id``
    the hub id (registry entries carry theirs too); ``spec`` the registry entry, if any.
    """

    name: str
    source: Source
    path: Path | None
    gguf: Path | None
    hub_id: str | None
    spec: ModelSpec | None

    @property
    def kind(self) -> str | None:
        """The registry kind ("llm-gguf", "whisper-ct2", ...) or a guess from the source."""
        if self.spec is not None:
            return self.spec.kind
        return "llm-gguf" if self.gguf is not None else None


def _unknown(spec: str, why: str) -> UnknownModelError:
    return UnknownModelError(
        f"{why}: {spec!r}. Known registry models: {', '.join(REGISTRY)}. "
        "A path to a local .gguf file or model folder, or a hub id like 'Qwen/Qwen2.5-Coder-0.5B-Instruct', "
        "is accepted too."
    )


def _single_gguf(folder: Path) -> Path | None:
    ggufs = sorted(folder.glob("*.gguf"))
    return ggufs[0] if len(ggufs) == 1 else None


def resolve(spec: str | Path, install_missing: bool = True) -> ModelRef:
    """Resolve a model name, local path or hub id (see the module docstring for the order).

    A registry model that is not installed is installed when ``install_missing`` is true and
    otherwise raises ModelNotInstalledError.
    """
    text = str(spec).strip()
    if not text:
        raise _unknown(text, "empty model name")

    entry = REGISTRY.get(text)
    if entry is not None:
        if not is_installed(entry):
            if not install_missing:
                raise ModelNotInstalledError(
                    f"model {text!r} is not installed in {model_dir(entry)}; "
                    f"run `speclive models install {text}`"
                )
            install(entry)
        folder = model_dir(entry)
        gguf = folder / entry.main_file if entry.kind == "llm-gguf" else None
        return ModelRef(text, "registry", folder, gguf, entry.hub_id, entry)

    path = Path(text).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        path = path.resolve()
        return ModelRef(path.stem, "gguf", path.parent, path, None, None)
    if path.is_dir():
        path = path.resolve()
        return ModelRef(path.name, "hf-dir", path, _single_gguf(path), None, None)
    if path.exists():
        raise _unknown(text, "not a .gguf file or a model folder")
    if text.lower().endswith(".gguf") or text.startswith((".", "~", "/")):
        raise _unknown(text, "no such file or folder")
    if _HUB_ID.match(text):
        return ModelRef(text, "hub", None, None, text, None)
    raise _unknown(text, "unknown model")
