"""Long loops on the event loop's thread, cut into time slices so that other tasks run between them.

Every connection the proxy serves shares one thread: a loop over ten thousand share-partitions
(rebuilding their engines, reading them for a scrape) would hold all of them for its whole length.
Such a loop calls :meth:`TimeSlices.pause_if_due` once per item; every ``slice_s`` seconds of work
it lets the other tasks run once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import trio


class TimeSlices:
    """Lets other tasks run after every ``slice_s`` seconds of a loop's own work."""

    def __init__(self, slice_s: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.slice_s = slice_s
        self._clock = clock
        self._resume_at = clock() + slice_s

    async def pause_if_due(self) -> None:
        if self._clock() >= self._resume_at:
            await trio.sleep(0)
            self._resume_at = self._clock() + self.slice_s
