"""The server's periodic malloc_trim (``speclive.server.memory``)."""

from __future__ import annotations

import asyncio

import pytest

from speclive.errors import ConfigError
from speclive.server.config import ServerConfig
from speclive.server.memory import MemoryTrimmer, resident_bytes


def test_trim_gives_back_freed_heap_pages():
    t = MemoryTrimmer(60.0)
    if not t.available:
        pytest.skip("no glibc malloc_trim on this platform")
    # 120 MB of small blocks freed below blocks still in use: free pages in the middle of the
    # heap, which malloc keeps resident until trimmed
    blocks = [bytearray(4000) for _ in range(60_000)]
    for b in blocks:
        b[0] = 1
    keep = blocks[30_000:]
    del blocks
    before = resident_bytes()
    released = t.trim()
    assert before is not None and released > 50 * 2**20
    assert t.released_bytes == released and t.trims == 1
    assert keep[0][0] == 1  # what is still referenced survives


def test_trimmer_runs_on_its_interval_and_stops():
    seen: list[int] = []

    async def main() -> MemoryTrimmer:
        t = MemoryTrimmer(0.05, on_release=seen.append)
        if not t.available:
            pytest.skip("no glibc malloc_trim on this platform")
        t.start()
        await asyncio.sleep(0.4)
        await t.stop()
        n = t.trims
        await asyncio.sleep(0.15)
        assert t.trims == n  # stopped: no trim after stop()
        return t

    t = asyncio.run(main())
    assert t.trims >= 2
    assert sum(seen) == t.released_bytes


def test_interval_is_checked():
    with pytest.raises(ValueError):
        MemoryTrimmer(0)
    with pytest.raises(ConfigError):
        ServerConfig(memory_trim_s=-1)
    assert ServerConfig(memory_trim_s=0).memory_trim_s == 0  # 0 turns it off


def test_heap_bytes_follow_live_blocks_and_show_on_metrics():
    """``heap_bytes`` counts blocks in use: 40 MB of small live blocks raise ``in_use`` by about
    that much, and freeing them lowers it again; ``/metrics`` carries the same figures."""
    from speclive.server.memory import heap_bytes
    from speclive.server.metrics import Metrics

    if not heap_bytes():
        pytest.skip("no glibc mallinfo2 on this platform")
    before = heap_bytes()["in_use"]
    blocks = [bytearray(2000) for _ in range(20_000)]
    grown = heap_bytes()["in_use"] - before
    del blocks
    shrunk = heap_bytes()["in_use"] - before
    assert 35e6 < grown < 60e6 and shrunk < 5e6, (grown, shrunk)
    text = Metrics().render().decode()
    line = next(x for x in text.splitlines() if x.startswith('speclive_memory_heap_bytes{kind="in_use"}'))
    assert float(line.rsplit(" ", 1)[1]) > 0


_COUNT_ARENAS = """
import ctypes, sys, threading
from speclive.server.memory import limit_arenas
if sys.argv[1] != "0":
    assert limit_arenas(int(sys.argv[1]))
def work():
    blocks = [bytearray(3000) for _ in range(200)]  # each thread's first mallocs pick its arena
    barrier.wait()
barrier = threading.Barrier(9)
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
barrier.wait()
libc = ctypes.CDLL(None)
libc.fdopen.restype = ctypes.c_void_p
out = libc.fdopen(1, b"w")
libc.malloc_info(0, ctypes.c_void_p(out))
libc.fflush(ctypes.c_void_p(out))
"""


def _arenas(limit: int) -> int:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run(
        [sys.executable, "-c", _COUNT_ARENAS, str(limit)], env=env, capture_output=True, text=True, check=True
    ).stdout
    return out.count("<heap nr=")


def test_limit_arenas_caps_the_arenas_threads_get():
    from speclive.server.memory import _libc

    if _libc("malloc_info", [], None) is None or _libc("mallopt", [], None) is None:
        pytest.skip("no glibc malloc on this platform")
    # nine threads allocating at once: glibc gives them several arenas, the limit two
    assert _arenas(0) > 2
    assert _arenas(2) == 2


def test_limit_arenas_leaves_the_environment_setting(monkeypatch):
    from speclive.server.memory import limit_arenas

    with pytest.raises(ValueError):
        limit_arenas(0)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_arenas(2) is False
    with pytest.raises(ConfigError):
        ServerConfig(malloc_arenas=-1)


def test_fixed_mmap_threshold_keeps_large_blocks_out_of_the_heap():
    """After one large block was freed glibc's threshold moves up and the next large blocks land
    in the heap; with the threshold fixed they keep their own mappings."""
    import os
    import subprocess
    import sys

    from speclive.server.memory import _libc, fix_mmap_threshold

    if _libc("mallinfo2", [], None) is None:
        pytest.skip("no glibc malloc on this platform")
    probe = """
import sys
from speclive.server.memory import fix_mmap_threshold, heap_bytes
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold(1 << 20)
big = bytearray(8 << 20); del big  # a mapped block, freed: the moving threshold goes to 8 MiB
blocks = [bytearray(2 << 20) for _ in range(4)]
print(heap_bytes()["mapped"] >> 20)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}

    def mapped(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", probe, mode], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.split()[-1])

    assert mapped("moving") < 8  # the 2 MiB blocks went into the heap
    assert mapped("fixed") >= 8  # each has its own mapping
    with pytest.raises(ValueError):
        fix_mmap_threshold(0)


def test_set_malloc_applies_each_setting_given_and_leaves_a_zero_alone(monkeypatch):
    from speclive.server import memory

    calls = []
    monkeypatch.setattr(memory, "limit_arenas", lambda n: calls.append(("arenas", n)))
    monkeypatch.setattr(memory, "fix_mmap_threshold", lambda b: calls.append(("threshold", b)))
    memory.set_malloc(2, 0)
    memory.set_malloc(0, 1.5)
    assert calls == [("arenas", 2), ("threshold", int(1.5 * 2**20))]


_CYCLES = """
import gc
from collections import deque
from speclive.server.memory import freeze_loaded, unfreeze
alive = 0
class Turn:
    def __init__(self):
        global alive
        alive += 1
        self.me = self  # a cycle: only the cycle collector frees a turn
    def __del__(self):
        global alive
        alive -= 1
loaded = [[i] for i in range(600_000)]  # a loaded model's objects, alive for good
gc.collect()
def turns():
    window = deque(maxlen=3000)  # each turn lives a while (into the oldest generation)
    for _ in range(300_000):
        window.append(Turn())
    return alive - len(window)  # turns let go of and not freed yet
plain = turns()
gc.collect()
freeze_loaded()
print(plain, turns())
unfreeze()
"""


def test_freezing_the_loaded_objects_frees_cycles_sooner():
    """Behind a big long-lived heap Python's full collections come rarely, and garbage in
    cycles piles up; with the loaded objects frozen (``freeze_loaded``) it is freed far
    sooner. Run in a fresh process: the test run's own heap is not a server's."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _CYCLES], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    plain, frozen = int(out[0]), int(out[1])
    if plain < 20_000:
        pytest.skip(f"this Python frees cycles without waiting on its oldest generation ({plain} pending)")
    assert frozen * 4 < plain, (plain, frozen)
