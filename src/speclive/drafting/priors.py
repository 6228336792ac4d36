"""Cold-start priors: what the controllers assume before they have measured anything.

The numbers live in ``priors.json`` next to this module, written by
``benchmarks/calibrate_priors.py`` from committed benchmark results (see docs/coldstart.md for
which result each number comes from): the copy-survival curve S_b(j) per match-length bucket
(how often a copied continuation is accepted to depth j, by the length of the match it was
copied after), the llama.cpp verification-cost curve t(k)/t(1), and the draft/target
step-cost ratio and per-token acceptance of the same-vocabulary draft model. Copy survival is
kept apart by where the copied continuation lies: in the ``prompt`` (a code edit quoting its
input: after a 16-token match a copy survives to depth 16 about 91 % of the time) or in the
``output`` so far (self-repetition, which breaks much sooner).

A saved knowledge file (``speclive.knowledge``) replaces these as soon as one process has
learned on the machine.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any


@functools.cache
def _data() -> dict[str, Any]:
    return json.loads(resources.files("speclive.drafting").joinpath("priors.json").read_text())


def copy_survival(bucket: int, depth: int, source: str = "prompt") -> tuple[float, ...] | None:
    """Prior S(1..``depth``) of a copy from ``source`` ("prompt" or "output") after a match in
    ``bucket`` (None: not calibrated).

    Buckets without their own curve take the nearest calibrated bucket below; depths past the
    calibrated ones repeat the last hazard.
    """
    table = _data().get("copy_survival", {}).get(source, {})
    known = sorted(int(b) for b in table)
    below = [b for b in known if b <= bucket]
    if not below:
        return None
    curve = [float(x) for x in table[str(below[-1])]["survival"]]
    if not curve:
        return None
    while len(curve) < depth:
        last = curve[-1]
        prev = curve[-2] if len(curve) > 1 else 1.0
        curve.append(last * (last / prev if prev > 0 else 0.0))
    return tuple(curve[:depth])


def cost_curve() -> dict[int, float]:
    """Prior t(k)/t(1) of a llama.cpp verification pass over k tokens."""
    return {int(k): float(v) for k, v in _data().get("cost_curve", {}).items()}


def draft_alpha() -> float | None:
    """Prior per-token acceptance of the same-vocabulary draft model (greedy, teacher-forced)."""
    a = (_data().get("draft") or {}).get("alpha")
    return float(a) if a else None


def draft_ratio() -> float | None:
    """Prior cost of one draft-model step in target steps (same-vocabulary draft, llama.cpp)."""
    d = _data().get("draft") or {}
    r = d.get("ratio")
    return float(r) if r else None
