"""Where a process's resident memory is, by kind of mapping (Linux ``/proc/PID/smaps``).

malloc's own figures (``/metrics``) say what its arenas and large blocks hold; a resident size
that grows while they stay flat is memory mapped by someone else. This module reads the
process's mappings from outside and sums their resident bytes into kinds that tell those
owners apart:

- ``files``: mappings of files (model weights, shared libraries);
- ``brk_heap``: the main arena's heap (``[heap]``, grown with ``brk``);
- ``malloc_heaps``: the heaps of glibc's other arenas. glibc maps each at an address aligned
  to its largest size (64 MiB on 64-bit hosts), readable and writable up to what the arena
  uses, with the rest of the reservation inaccessible after it;
- ``stacks``: threads' stacks. glibc puts an inaccessible guard page right below each one (the
  main thread's is ``[stack]``);
- ``anon_other``: every other anonymous mapping: malloc's large blocks, Python's object
  arenas, memory a library maps itself.

Each kind also has its mapped size: resident memory that grows inside a size that does not is
pages of fixed buffers touched for the first time (a larger batch reaching further into a
compute buffer), bounded by that size, not memory allocated anew.

``steps`` (and ``StepWatch``, over a run) names the mappings whose resident memory grew by a
step between two readings, with their address and mapped size, so that one buffer's growth can
be told from many small ones.

``threads`` is the process's thread count (``/proc/PID/status``), since a new thread pool shows
as new stacks. The kinds are read from the mappings' layout, so a mapping of one kind can pass
for another (an anonymous block that happens to start at a 64 MiB boundary is counted as a
heap); they are a diagnosis, not an account.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: glibc's largest arena heap on 64-bit hosts (``HEAP_MAX_SIZE``, twice the largest mmap
#: threshold); its arenas' heaps start at multiples of it
MALLOC_HEAP_ALIGN = 64 * 2**20
#: the kinds, in the order they are reported
KINDS = ("files", "brk_heap", "malloc_heaps", "stacks", "anon_other")
#: a mapping whose resident memory grows by this much between two readings is a step (``steps``)
STEP_BYTES = 8 * 2**20


@dataclass
class Mapping:
    start: int
    end: int
    perms: str
    path: str
    rss: int = 0  # bytes

    @property
    def size(self) -> int:
        return self.end - self.start


def parse_smaps(lines: Iterable[str]) -> list[Mapping]:
    """The mappings of a ``smaps`` text, each with its resident bytes."""
    maps: list[Mapping] = []
    for line in lines:
        head = line.split(maxsplit=5)
        if not head:
            continue
        if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            lo, hi = head[0].split("-")
            path = head[5].strip() if len(head) > 5 else ""
            maps.append(Mapping(int(lo, 16), int(hi, 16), head[1], path))
        elif head[0] == "Rss:" and maps:
            maps[-1].rss = int(head[1]) * 1024
    return maps


def kind_of(m: Mapping, before: Mapping | None, after: Mapping | None) -> str:
    """The kind (``KINDS``) of mapping ``m``, from its neighbours ``before`` and ``after``."""
    if m.path.startswith("/"):
        return "files"
    if m.path == "[heap]":
        return "brk_heap"
    if m.path == "[stack]":
        return "stacks"
    if m.path and not m.path.startswith("[anon"):
        return "anon_other"  # [vdso], [vvar], [vsyscall]: the kernel's, a few pages
    writable = m.perms.startswith("rw")
    if writable and m.start % MALLOC_HEAP_ALIGN == 0:
        rest_sealed = after is not None and after.start == m.end and after.perms.startswith("---")
        if rest_sealed or m.size == MALLOC_HEAP_ALIGN:
            return "malloc_heaps"
    if writable and before is not None and before.end == m.start and before.perms.startswith("---"):
        return "stacks"
    return "anon_other"


def with_kinds(maps: list[Mapping]) -> list[tuple[str, Mapping]]:
    """Each mapping with its kind (``kind_of``, from its neighbours)."""
    out = []
    for i, m in enumerate(maps):
        before = maps[i - 1] if i > 0 else None
        after = maps[i + 1] if i + 1 < len(maps) else None
        out.append((kind_of(m, before, after), m))
    return out


def by_kind(maps: list[Mapping]) -> dict[str, tuple[int, int]]:
    """(resident bytes, mapped bytes) per kind, every kind present (0 where none)."""
    rss, size = dict.fromkeys(KINDS, 0), dict.fromkeys(KINDS, 0)
    for kind, m in with_kinds(maps):
        rss[kind] += m.rss
        size[kind] += m.size if m.perms[0] != "-" else 0  # reserved, inaccessible: not mapped memory
    return {k: (rss[k], size[k]) for k in KINDS}


def steps(
    last: list[Mapping], now: list[Mapping], least: int = STEP_BYTES
) -> list[dict[str, float | str | bool]]:
    """The mappings of ``now`` whose resident memory is at least ``least`` bytes above the
    mapping at the same address in ``last`` (0 for a new one): a fixed buffer's pages touched
    for the first time, a new large block, a heap that grew. Each with its kind, address,
    mapped size and resident size before and after (MiB)."""
    was = {m.start: m for m in last}
    out: list[dict[str, float | str | bool]] = []
    for kind, m in with_kinds(now):
        old = was.get(m.start)
        before = old.rss if old is not None else 0
        if m.rss - before >= least:
            out.append(
                {
                    "kind": kind,
                    "start": hex(m.start),
                    "mapped_mib": m.size / 2**20,
                    "resident_before_mib": before / 2**20,
                    "resident_after_mib": m.rss / 2**20,
                    "new": old is None,
                }
            )
    return out


def threads(pid: int | str = "self") -> int | None:
    """The thread count of process ``pid`` (None where ``/proc`` cannot tell)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def read(pid: int | str = "self") -> list[Mapping] | None:
    """The mappings of process ``pid`` (None where ``/proc/PID/smaps`` cannot be read: not
    Linux, the process gone)."""
    try:
        with open(f"/proc/{pid}/smaps") as f:
            return parse_smaps(f)
    except OSError:
        return None


def sample(pid: int | str = "self", maps: list[Mapping] | None = None) -> dict[str, float]:
    """One reading of process ``pid`` (its ``maps`` when already read): ``rss_<kind>_bytes``
    and ``size_<kind>_bytes`` per kind, and ``threads``; empty where the mappings cannot be
    read."""
    maps = maps if maps is not None else read(pid)
    if maps is None:
        return {}
    out: dict[str, float] = {}
    for kind, (rss, size) in by_kind(maps).items():
        out[f"rss_{kind}_bytes"], out[f"size_{kind}_bytes"] = float(rss), float(size)
    n = threads(pid)
    if n is not None:
        out["threads"] = float(n)
    return out


class StepWatch:
    """Readings of one process over time that also keep its steps: at each reading, the
    mappings whose resident memory grew by at least ``least`` bytes since the last one
    (``steps``), with the time given; ``found`` holds them all, in order."""

    def __init__(self, pid: int | str, least: int = STEP_BYTES) -> None:
        self.pid, self.least = pid, least
        self._last: list[Mapping] | None = None
        self.found: list[dict[str, float | str | bool]] = []

    def sample(self, t: float) -> dict[str, float]:
        """``sample`` of the process now; steps since the last reading go to ``found`` with
        ``t`` (seconds)."""
        maps = read(self.pid)
        if maps is None:
            return {}
        if self._last is not None:
            self.found += [{"t": t, **x} for x in steps(self._last, maps, self.least)]
        self._last = maps
        return sample(self.pid, maps)
