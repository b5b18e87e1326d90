"""How the process's C allocator treats the large buffers the proxy moves (set once at start-up).

Why: every frame the proxy reads or builds is a fresh Python ``bytes`` of up to a few MB
(a Fetch response, a ShareFetch response, the pieces a frame arrives in). With glibc's defaults
a freed block of that size goes back to the kernel -- blocks above the mmap threshold are
unmapped, and free memory at the top of the heap beyond the trim threshold is trimmed -- so the
next frame's buffer is new memory again and every one of its 4 KiB pages costs a page fault on
first touch. On the project's VMs that made a 1 MB receive-join-build cycle cost 1.9-2.5 ms where
the copies themselves take 0.12-0.16 ms (``integration.bench.alloc_bench``; docs/benchmarks.md,
"Freed memory kept for reuse").

With ``--heap-retain-bytes N`` (default 128 MiB) the proxy asks glibc (``mallopt``) to serve
blocks up to 32 MiB from its heap and to keep up to N bytes of freed memory for reuse instead of
returning it; the cost is resident memory that stays at its recent high-water mark (plus at most N
free). 0 leaves glibc's defaults. Other C libraries (musl) have no such knobs: nothing is done.

glibc's bounds are per arena, and it gives each thread that allocates an arena of its own, up to
8 per core: librdkafka's threads, the state replay's and a scale-out move's threads each may keep
their own heap with its own free memory held for reuse. ``--malloc-arenas N`` (default 2) caps
them at N (threads beyond share them), so what is kept stays near N bounds instead of one per
thread. Measured (docs/benchmarks.md, "Malloc arenas capped"): over 20 moves of 5,000
share-partitions resident memory stayed flat with the cap where it had climbed 36-50 MiB.
"""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Callable

#: glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
#: Blocks above this still get their own mapping (glibc's largest dynamic threshold on 64-bit):
#: a rare huge frame is returned to the kernel at once rather than held in the heap.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024


def retain_freed_memory(retain_bytes: int) -> bool:
    """Keep up to `retain_bytes` of freed heap memory for reuse (see the module doc); True when
    glibc took the settings, False when there is nothing to set (0, or not glibc)."""
    mallopt = _glibc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    if retain_bytes <= 0 or mallopt is None:
        return False
    # mallopt takes an int: a value past 2 GiB is capped there (still "keep it all" in practice).
    retain = min(retain_bytes, 2**31 - 1)
    mmap_threshold = min(MMAP_THRESHOLD_BYTES, retain)
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, retain))


def limit_arenas(arenas: int) -> bool:
    """Let glibc make at most `arenas` malloc arenas from now on (threads beyond share them); True
    when glibc took it, False when there is nothing to set (0, or not glibc). Set before the
    process's threads start: an arena once made stays."""
    mallopt = _glibc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    if arenas <= 0 or mallopt is None:
        return False
    return bool(mallopt(M_ARENA_MAX, min(arenas, 2**31 - 1)))


def _glibc_function(name: str, argtypes: tuple) -> Callable[..., int] | None:
    """glibc's `name` with an int result, or None when this is not glibc or glibc lacks it."""
    if platform.libc_ver()[0] != "glibc":
        return None
    function = getattr(ctypes.CDLL(None), name, None)
    if function is None:
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


def release_freed_memory() -> bool:
    """Give the free pages of every heap back to the kernel now (glibc's ``malloc_trim(0)``), for
    after start-up: what the replay read, freed in librdkafka's and the replay thread's own heaps,
    would otherwise stay resident for the process's life under --heap-retain-bytes
    (docs/benchmarks.md, "Replay folded as it reads"). True when glibc released something, False
    otherwise or when not glibc."""
    malloc_trim = _glibc_function("malloc_trim", (ctypes.c_size_t,))
    return malloc_trim is not None and bool(malloc_trim(0))
