"""Facts about the machine that both the engine and the benchmark reports need.

Kept apart from ``speclive_bench`` so the backends can key measurements by CPU without
importing the benchmark layer.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path


@functools.cache
def _cpuinfo() -> str | None:
    """/proc/cpuinfo, read once per process (keys of saved measurements ask for it per model
    weight and per server request); None where it is not there."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or ``platform.processor()``)."""
    for line in (_cpuinfo() or "").splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _first_processor() -> dict[str, str]:
    """The fields of the first processor's block of /proc/cpuinfo (empty where it is not there)."""
    fields: dict[str, str] = {}
    for line in (_cpuinfo() or "").splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the first processor's block is enough
            continue
        fields.setdefault(key.strip().lower(), value.strip())
    return fields


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``avx2``, ``avx512_vnni``, ``amx_int8``, ...); empty where
    /proc/cpuinfo is not there."""
    return set(_first_processor().get("flags", "").split())


def cpu_isa() -> str | None:
    """The widest vector ISA the CPU has (``avx512f``, ``avx2``, ...), if known."""
    flags = cpu_flags()
    return next((f for f in ("avx512f", "avx2", "avx", "neon", "asimd") if f in flags), None)


def cpu_detail() -> str | None:
    """Family, model and widest vector ISA of the CPU (``"family 25 model 1, avx2"``): a
    virtual machine's model name ("AMD EPYC") does not tell two host generations apart, and
    their speeds differ by up to 2x. None where /proc/cpuinfo is not there."""
    if _cpuinfo() is None:
        return None
    fields = _first_processor()
    isa = cpu_isa()
    parts = []
    if "cpu family" in fields and "model" in fields:
        parts.append(f"family {fields['cpu family']} model {fields['model']}")
    if isa:
        parts.append(isa)
    return ", ".join(parts) or None
