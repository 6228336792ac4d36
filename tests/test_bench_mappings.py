"""Resident memory by kind of mapping (``speclive_bench.mappings``): the layout rules on a
made-up ``smaps``, then this process's own threads and heaps."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import threading

import pytest

from speclive_bench import mappings

MIB = 2**20
SMAPS = """\
55d000000000-55d000100000 r-xp 00000000 08:01 42   /usr/lib/libfoo.so
Rss:                 400 kB
55d000200000-55d000300000 rw-p 00000000 00:00 0    [heap]
Rss:                1000 kB
7f0004000000-7f0005000000 rw-p 00000000 00:00 0
Rss:               16384 kB
7f0005000000-7f0008000000 ---p 00000000 00:00 0
Rss:                   0 kB
7f0008000000-7f000c000000 rw-p 00000000 00:00 0
Rss:                4096 kB
7f0010000000-7f0010001000 ---p 00000000 00:00 0
Rss:                   0 kB
7f0010001000-7f0010801000 rw-p 00000000 00:00 0
Rss:                  64 kB
7f0010900000-7f0010a00000 rw-p 00000000 00:00 0
Rss:                1024 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0    [stack]
Rss:                 132 kB
7ffd00100000-7ffd00102000 r-xp 00000000 00:00 0    [vdso]
Rss:                   8 kB
"""


def test_the_layout_tells_files_heaps_stacks_and_other_anonymous_memory_apart():
    maps = mappings.parse_smaps(SMAPS.splitlines())
    assert len(maps) == 10 and maps[0].path == "/usr/lib/libfoo.so" and maps[2].rss == 16384 * 1024
    kinds = mappings.by_kind(maps)
    kib = {k: rss // 1024 for k, (rss, _) in kinds.items()}
    assert kib == {
        "files": 400,
        "brk_heap": 1000,
        # an aligned heap with its sealed rest, and a full one (64 MiB, nothing sealed after it)
        "malloc_heaps": 16384 + 4096,
        "stacks": 64 + 132,  # the mapping above a guard page, and the main thread's
        "anon_other": 1024 + 8,  # a block with no neighbour that says what it is; the vdso
    }
    # mapped sizes leave out what is reserved but inaccessible (a heap's sealed rest, guards)
    assert kinds["malloc_heaps"][1] == 16 * MIB + 64 * MIB and kinds["stacks"][1] == 8 * MIB + 0x21000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_thread_deep_in_c_calls_shows_as_stack_and_in_the_thread_count():
    before = mappings.sample()
    ready, done = threading.Event(), threading.Event()

    def deep() -> None:
        nested: list = []
        for _ in range(20_000):
            nested = [nested]
        json.dumps(nested)  # the C encoder recurses once per level: about 2 MiB of stack
        ready.set()
        done.wait(10)

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    t = threading.Thread(target=deep)
    try:
        t.start()
        assert ready.wait(10)
        during = mappings.sample()
    finally:
        done.set()
        t.join()
        sys.setrecursionlimit(old)
    assert during["threads"] == before["threads"] + 1
    assert during["rss_stacks_bytes"] - before["rss_stacks_bytes"] > MIB


#: run in a process of its own: a server started in this one may have capped malloc's arenas
_THREAD_HEAP = """
import ctypes, ctypes.util, threading
from speclive_bench import mappings
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
grown = {}

def allocate():  # a new thread gets an arena of its own
    before = mappings.sample()
    for _ in range(4000):
        libc.memset(libc.malloc(2000), 1, 2000)
    after = mappings.sample()
    grown.update({k: after[k] - before[k] for k in after})

t = threading.Thread(target=allocate)
t.start()
t.join()
print(grown["rss_malloc_heaps_bytes"])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_threads_small_blocks_show_in_mallocs_heaps():
    libc = ctypes.util.find_library("c")
    if libc is None or not hasattr(ctypes.CDLL(libc), "mallinfo2"):
        pytest.skip("not glibc")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    cmd = [sys.executable, "-c", _THREAD_HEAP]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    assert float(out.stdout) > 4 * MIB  # 4000 blocks of 2000 bytes, touched


def test_run_probe_reads_the_last_json_line_and_fails_with_the_probe():
    from speclive_bench.report import run_probe

    code = "import json, sys; print('loading'); print(json.dumps({'arg': sys.argv[1]}))"
    assert run_probe(code, "x") == {"arg": "x"}
    with pytest.raises(subprocess.CalledProcessError):
        run_probe("raise SystemExit(3)")


def test_steps_name_the_mapping_that_grew_and_a_new_one_but_not_small_growth():
    last = mappings.parse_smaps(SMAPS.splitlines())
    now_text = (
        SMAPS.replace("Rss:                1024 kB", "Rss:               20480 kB").replace(  # the lone block
            "Rss:                1000 kB", "Rss:                5000 kB"
        )  # [heap]: +3.9 MiB
        + "7f0020000000-7f0022000000 rw-p 00000000 00:00 0\nRss:               12288 kB\n"
    )
    found = mappings.steps(last, mappings.parse_smaps(now_text.splitlines()))
    assert [(x["start"], x["kind"], x["new"]) for x in found] == [
        ("0x7f0010900000", "anon_other", False),
        ("0x7f0020000000", "anon_other", True),
    ]
    assert found[0]["resident_before_mib"] == 1.0 and found[0]["resident_after_mib"] == 20.0
    assert found[0]["mapped_mib"] == 1.0 and found[1]["resident_before_mib"] == 0.0
    assert mappings.steps(last, last) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_watch_finds_a_buffer_touched_between_two_readings():
    import mmap

    buf = mmap.mmap(-1, 32 * MIB)  # mapped, not yet resident
    watch = mappings.StepWatch(os.getpid())
    first = watch.sample(1.0)
    assert first["rss_anon_other_bytes"] > 0 and watch.found == []
    for i in range(0, 32 * MIB, 4096):
        buf[i] = 1  # the pages are touched for the first time
    watch.sample(2.0)
    hit = [x for x in watch.found if x["mapped_mib"] == 32.0]
    assert len(hit) == 1 and hit[0]["t"] == 2.0 and not hit[0]["new"], watch.found
    assert hit[0]["resident_after_mib"] - hit[0]["resident_before_mib"] >= 31
    buf.close()
