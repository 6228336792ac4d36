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
