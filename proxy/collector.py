"""How often Python's cyclic garbage collector runs, and what it scans (set at start-up).

Why: with CPython's defaults (a young collection every 700 net allocations, an older one every 10
of those, a full one every 10 of those when enough long-lived objects have piled up) a full
collection walks every tracked object the process holds -- kio's schema classes, the modules, every
share-partition's state -- although nearly none of them is ever garbage. In a 100,000-record
fragmented ``state_bench`` run the proxy made 3 full collections, 154 ms in all, each 25 ms or more;
those pauses stop every connection at once and were the proxy's ``commit_sync`` p99 (60-67 ms,
against 30-40 ms for Kafka's own share coordinator; 16-20 ms with this module's settings).

With ``--gc-threshold N`` (default 10,000) the youngest generation is collected every N net
allocations (the older thresholds stay 10 and 10), and once start-up is done (modules imported,
share state replayed, before the listeners open) the objects alive then are collected once and
frozen: later collections never walk them again (:func:`gc.freeze`; they are still freed by
reference counting, only a reference cycle among them would now outlive its last use). 0 leaves
CPython's defaults and freezes nothing. Every collection's pause is timed either way
(``ksp_gc_pause_seconds{generation}``).

A scale-out instance (``--instance-id``) restores share state when it gains state partitions, after
start-up's freeze, and drops it when it loses them; so half a second after each change of what it
owns it freezes again (:func:`refreeze`, called by ``runtime.ScaleOut``). The gained engines leave
the collector's reach as replayed state does at start-up (measured: a full collection walking
10,000 restored share-partitions paused the loop 0.18 s, and per-partition scrapes set such
collections off), and what was frozen and has become garbage since -- engines handed over,
connections closed, with any reference cycle among them -- is collected rather than kept. One full
collection per change of ownership, instead of one per full collection for as long as the state
is held.
"""

from __future__ import annotations

import gc
import time

from proxy import metrics

#: The older generations' thresholds (CPython's defaults): only the young one moves.
OLDER_THRESHOLDS = (10, 10)


def tune_collector(young_threshold: int) -> bool:
    """Collect the youngest generation every `young_threshold` net allocations; False (nothing
    changed) for 0."""
    if young_threshold <= 0:
        return False
    gc.set_threshold(young_threshold, *OLDER_THRESHOLDS)
    return True


def freeze_startup_objects() -> int:
    """Collect once, then move every object alive into the generation collections skip; returns
    how many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def refreeze() -> int:
    """Freeze again what is alive now, once something was frozen (:func:`freeze_startup_objects`):
    frozen objects go back to the collector, one full collection frees whatever of them and of
    everything since is garbage, and what is left is frozen; returns how many were frozen (0, and
    nothing done, when nothing was)."""
    if gc.get_freeze_count() == 0:
        return 0
    gc.unfreeze()
    return freeze_startup_objects()


class PauseTimer:
    """Times every collection into ``ksp_gc_pause_seconds{generation}`` (a gc callback: called
    by the interpreter before and after each collection, in the thread that triggered it)."""

    def __init__(self) -> None:
        self._started = 0.0
        self._observers = [metrics.GC_PAUSE_SECONDS.labels(generation=str(g)) for g in range(3)]

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._observers[info["generation"]].observe(time.perf_counter() - self._started)


def time_pauses() -> PauseTimer:
    """Time every collection from now on (once per process; see PauseTimer)."""
    for callback in gc.callbacks:
        if isinstance(callback, PauseTimer):
            return callback
    timer = PauseTimer()
    gc.callbacks.append(timer)
    return timer
