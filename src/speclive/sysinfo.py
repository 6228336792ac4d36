"""Facts about the machine that both the engine and the benchmark reports need.

Kept apart from ``speclive.bench`` so the backends can key measurements by CPU without
importing the benchmark layer.
"""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
