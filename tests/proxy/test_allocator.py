"""proxy.allocator: freed frame-sized buffers are reused instead of faulted in afresh.

Each case runs in a subprocess (integration.bench.alloc_bench's measuring mode): mallopt changes
the whole process's allocator."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from integration.bench.alloc_bench import in_child
from proxy.allocator import limit_arenas, retain_freed_memory

ROOT = Path(__file__).resolve().parents[2]
glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


@glibc_only
def test_kept_memory_serves_the_next_frame_without_page_faults(monkeypatch):
    monkeypatch.chdir(ROOT)  # the subprocess runs the bench module from the checkout
    kept = in_child(128 * 1024 * 1024, 50)
    default = in_child(0, 50)
    assert kept["tuned"] and not default["tuned"]
    # glibc's defaults: the frame's ~2 MB of buffers are new pages every cycle (~500 faults);
    # kept: the same memory is reused.
    assert default["faults_per_cycle"] > 200
    assert kept["faults_per_cycle"] < default["faults_per_cycle"] / 10


def test_zero_leaves_the_allocator_alone():
    assert retain_freed_memory(0) is False


RELEASE_AFTER_A_PEAK = """
import json
import os

from integration.bench.procfs import proc_status_kib
from proxy.allocator import release_freed_memory, retain_freed_memory

def resident_mib():
    return proc_status_kib(os.getpid(), "VmRSS") / 1024

retain_freed_memory(512 * 1024 * 1024)  # keep it all: as --heap-retain-bytes does, but larger
blocks = [b"\\x01" * (1 << 20) for _ in range(200)]  # written: resident
top = b"\\x02" * (1 << 20)  # allocated last, holds the heap's top: the freed blocks sit below it
peak = resident_mib()
del blocks
kept = resident_mib()
released = release_freed_memory()
print(json.dumps({"peak": peak, "kept": kept, "after": resident_mib(), "released": released}))
"""


@glibc_only
def test_release_gives_a_peaks_freed_memory_back():
    """After start-up's replay: memory retained for reuse goes back to the kernel at once."""
    import json
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", RELEASE_AFTER_A_PEAK], cwd=ROOT, capture_output=True, text=True,
                            env={"PYTHONPATH": str(ROOT)}, timeout=60, check=True)
    numbers = json.loads(result.stdout)
    assert numbers["kept"] > numbers["peak"] - 20, numbers  # retained: freeing alone gave nothing back
    assert numbers["released"] is True
    assert numbers["after"] < numbers["kept"] - 150, numbers


#: Six threads each allocate; prints `applied` (what {setup} set), then glibc's arenas on stderr.
ARENAS_OF_SIX_THREADS = """
import ctypes
import sys
import threading

{setup}
all_holding = threading.Barrier(7)
counted = threading.Barrier(7)

def allocate_and_hold():
    held = bytearray(100_000)  # a malloc from this thread: glibc gives it an arena
    all_holding.wait()
    counted.wait()

threads = [threading.Thread(target=allocate_and_hold) for _ in range(6)]
for thread in threads:
    thread.start()
all_holding.wait()
sys.stdout.write(f"{{applied}}\\n")
sys.stdout.flush()
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" block per arena, on stderr
counted.wait()
for thread in threads:
    thread.join()
"""


def arenas_in_use(setup: str) -> tuple[str, int]:
    """Run six allocating threads after `setup` (which sets `applied`) in a fresh process: what
    `applied` printed, and how many arenas glibc made."""
    import subprocess
    import sys

    script = ARENAS_OF_SIX_THREADS.format(setup=setup)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, env={"PYTHONPATH": str(ROOT)}, timeout=60, check=True)
    arenas = sum(1 for line in result.stderr.splitlines() if line.startswith("Arena "))
    return result.stdout.strip(), arenas


@glibc_only
def test_the_arena_cap_makes_threads_share_arenas():
    """Six threads each allocating: glibc gives each its own arena unless capped (--malloc-arenas)."""
    capping = "from proxy.allocator import limit_arenas\napplied = limit_arenas({})"
    assert arenas_in_use(capping.format(0)) == ("False", 7)  # glibc's default: the main arena and one per thread
    assert arenas_in_use(capping.format(2)) == ("True", 2)


def test_zero_arenas_leaves_the_allocator_alone():
    assert limit_arenas(0) is False
