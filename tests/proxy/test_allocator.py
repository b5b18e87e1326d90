"""proxy.allocator: freed frame-sized buffers are reused instead of faulted in afresh.

Each case runs in a subprocess: mallopt changes the whole process's allocator."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from proxy.allocator import retain_freed_memory

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# What a proxied large frame does to the allocator: arrives in 256 KiB pieces, is joined, sliced
# and prefixed; everything is freed before the next frame. Prints page faults per cycle.
_CYCLES = textwrap.dedent("""
    import resource, sys
    from proxy.allocator import retain_freed_memory
    tuned = retain_freed_memory(int(sys.argv[1]))
    source = bytes(1_000_000)
    def cycle():
        pieces = [bytes(source[i:i + 262144]) for i in range(0, len(source), 262144)]
        frame = b"".join(pieces)
        del pieces
        return b"xx" + frame[10:]
    for _ in range(5):
        cycle()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        cycle()
    print(tuned, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
""")


def _faults_per_cycle(retain_bytes: int) -> tuple[bool, float]:
    out = subprocess.run([sys.executable, "-c", _CYCLES, str(retain_bytes)], check=True, capture_output=True,
                         text=True).stdout.split()
    return out[0] == "True", float(out[1])


@glibc_only
def test_kept_memory_serves_the_next_frame_without_page_faults():
    tuned, faults = _faults_per_cycle(128 * 1024 * 1024)
    untuned, default_faults = _faults_per_cycle(0)
    assert tuned and not untuned
    # glibc's defaults: the frame's ~2 MB of buffers are new pages every cycle (~500 faults);
    # kept: the same memory is reused.
    assert default_faults > 200
    assert faults < default_faults / 10


def test_zero_leaves_the_allocator_alone():
    assert retain_freed_memory(0) is False
