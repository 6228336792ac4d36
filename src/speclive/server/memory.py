"""Hand freed heap memory back to the operating system while the server runs.

A long-running server allocates and frees from several threads at once: the event loop, one
worker per model, llama.cpp's, onnxruntime's and CTranslate2's thread pools. glibc's malloc
gives each thread an arena of its own and returns a freed block to the kernel only when it sits
at the top of that arena, so pages freed in the middle of an arena stay counted in the process's
resident memory. Over hours that reads as a slow leak although nothing is held. ``malloc_trim``
releases every whole free page of every arena (``madvise(MADV_DONTNEED)``), so the resident
size follows what is really in use.

Trimming cannot return a page that still holds one live block, and every extra arena is one more
heap whose pages stay partly used. ``limit_arenas`` caps their number (glibc's ``M_ARENA_MAX``,
as the ``MALLOC_ARENA_MAX`` variable does); ``speclive serve`` sets it before it loads a model,
so the threads that come later share the few arenas there are. ``fix_mmap_threshold`` keeps
large blocks (audio, logits) out of the arenas altogether.

Python frees an object caught in a reference cycle only when its cycle collector runs, and it
runs a full collection only once the objects that survived earlier collections have grown by a
quarter. A loaded server holds a million or more objects from its models' libraries, so full
collections come minutes apart, and garbage in cycles (a closed connection's traceback, an
answer's audio held by a frame) piles up in between. ``freeze_loaded`` collects once after the
models are loaded and moves every object alive then into Python's permanent generation
(``gc.freeze``): full collections then count and walk only what came after, so they come often
and stay cheap.

``MemoryTrimmer`` runs ``malloc_trim(0)`` every ``interval_s`` seconds on a thread of its own
(it takes the arena locks for a few milliseconds; the event loop keeps serving meanwhile) and
counts what it released. Off glibc (musl, macOS, Windows) it does nothing: ``available`` is
False.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging
import os
from collections.abc import Callable

log = logging.getLogger("speclive.server")


def _libc(name: str, argtypes: list, restype: object) -> Callable | None:
    """The C library's function ``name`` with its signature, or None where there is none."""
    lib = ctypes.util.find_library("c")
    if lib is None:
        return None
    try:
        fn = getattr(ctypes.CDLL(lib), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    return _libc("malloc_trim", [ctypes.c_size_t], ctypes.c_int)


#: glibc's ``mallopt`` parameters (malloc.h): the most arenas; the size from which a block gets
#: a mapping of its own
_M_ARENA_MAX = -8
_M_MMAP_THRESHOLD = -3


def _mallopt(param: int, value: int, env: str) -> bool:
    """glibc's ``mallopt(param, value)`` unless the variable ``env`` set it already (glibc reads
    it at start-up, and the user's choice wins). True when set."""
    if value < 1:
        raise ValueError(f"the value must be >= 1, got {value}")
    if os.environ.get(env):
        return False
    mallopt = _libc("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int)
    return bool(mallopt is not None and mallopt(param, int(value)) == 1)


def limit_arenas(n: int) -> bool:
    """Let malloc create at most ``n`` arenas from now on (glibc; the main arena counts).
    ``MALLOC_ARENA_MAX`` in the environment wins. True when the limit was set."""
    return _mallopt(_M_ARENA_MAX, n, "MALLOC_ARENA_MAX")


def fix_mmap_threshold(size: int) -> bool:
    """Blocks of ``size`` bytes and more get mappings of their own, returned to the kernel when
    freed. glibc's default threshold moves up (to 32 MiB) each time such a block is freed, so
    the audio buffers and logits of later requests land in the arenas and fragment them; a
    fixed threshold stops that. ``MALLOC_MMAP_THRESHOLD_`` in the environment wins. True when
    set."""
    return _mallopt(_M_MMAP_THRESHOLD, size, "MALLOC_MMAP_THRESHOLD_")


def set_malloc(arenas: int, mmap_threshold_mib: float) -> None:
    """The server's malloc settings (``--malloc-arenas``, ``--malloc-mmap-threshold``; 0 leaves
    glibc's default): call before any model loads, so that every thread it starts is bound by
    them. A process that embeds the server (a benchmark) calls it as ``speclive serve`` does."""
    if arenas:
        limit_arenas(arenas)
    if mmap_threshold_mib:
        fix_mmap_threshold(int(mmap_threshold_mib * 2**20))


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (glibc >= 2.33): byte counts summed over every arena."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    """glibc's ``mallinfo2``, or None where the C library has none (older glibc, musl, macOS)."""
    return _libc("mallinfo2", [], _MallInfo2)


_MALLINFO2 = _mallinfo2()


def freeze_loaded() -> int:
    """Collect, then move every object alive now into the permanent generation (``gc.freeze``):
    call once the models are loaded. Returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    # a full collection of the now empty oldest generation: Python counts the survivors of its
    # last full collection to decide when the next one is due, and that count held the frozen
    gc.collect()
    return gc.get_freeze_count()


def unfreeze() -> None:
    """Undo ``freeze_loaded`` (at shutdown: a process that goes on, such as a test run, collects
    those objects again)."""
    gc.unfreeze()


def heap_bytes() -> dict[str, int]:
    """What malloc holds, in bytes, where glibc can tell (empty otherwise): ``in_use`` (blocks
    allocated now), ``free`` (free blocks kept in the arenas), ``arenas`` (the arenas' size, both
    together) and ``mapped`` (large blocks in their own mappings). Memory that others map
    themselves (model weights, llama.cpp's KV buffer) is in none of them, so a resident size
    that grows while ``in_use`` stays flat is fragmentation or outside malloc, not a leak of
    objects."""
    if _MALLINFO2 is None:
        return {}
    m = _MALLINFO2()
    return {
        "in_use": int(m.uordblks),
        "free": int(m.fordblks),
        "arenas": int(m.arena),
        "mapped": int(m.hblkhd),
    }


def resident_bytes() -> int | None:
    """This process's resident set size (Linux ``/proc/self/statm``), None where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class MemoryTrimmer:
    """Periodic ``malloc_trim(0)``; ``released_bytes`` adds up the resident memory it gave back."""

    def __init__(self, interval_s: float = 60.0, on_release: Callable[[int], None] | None = None):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self.on_release = on_release
        self._trim = _malloc_trim()
        self.released_bytes = 0
        self.trims = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def available(self) -> bool:
        return self._trim is not None

    def trim(self) -> int:
        """Trim now (blocking); the drop in resident bytes it caused (0 when it gave nothing)."""
        if self._trim is None:
            return 0
        before = resident_bytes()
        self._trim(0)
        after = resident_bytes()
        self.trims += 1
        released = max(0, before - after) if before is not None and after is not None else 0
        self.released_bytes += released
        if released and self.on_release is not None:
            self.on_release(released)
        return released

    def start(self) -> None:
        """Trim every ``interval_s`` seconds from the running event loop until ``stop()``."""
        if self._trim is None or self._task is not None:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="speclive-memory-trim")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await asyncio.to_thread(self.trim)
            except Exception:  # noqa: BLE001 - trimming is an optimisation: never take the server down
                log.exception("malloc_trim failed; memory is no longer trimmed")
                return

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
