"""Offset bookkeeping the consumer sends in batches: progress marks and acknowledgements.

:class:`ProgressQueue` holds the records marked in progress and not yet sent, per partition, as
contiguous offset ranges (marking 5, 6 and 7 is one progress batch, 5-7; marking 6 again changes
nothing): the KIP's "pending progress batches" are these ranges, and the consumer flushes them at
the next poll or as soon as there are more than ``max.in-flight.progress.batches``.

:func:`acknowledgement_batches` turns per-offset acknowledgement types into the wire's batches:
runs of contiguous offsets with the same type.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Mapping


class OffsetRanges:
    """A set of offsets kept as sorted, disjoint, non-adjacent inclusive ranges."""

    __slots__ = ("_firsts", "_lasts")

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._lasts: list[int] = []

    def add(self, first: int, last: int | None = None) -> None:
        last = first if last is None else last
        if last < first:
            raise ValueError(f"range {first}-{last} is empty")
        # Ranges that touch [first, last] (overlap or adjacency) merge into one.
        low = bisect.bisect_left(self._lasts, first - 1)
        high = bisect.bisect_right(self._firsts, last + 1)
        if low < high:
            first = min(first, self._firsts[low])
            last = max(last, self._lasts[high - 1])
        self._firsts[low:high] = [first]
        self._lasts[low:high] = [last]

    def __len__(self) -> int:
        """How many ranges (not offsets)."""
        return len(self._firsts)

    def __contains__(self, offset: int) -> bool:
        index = bisect.bisect_right(self._firsts, offset) - 1
        return index >= 0 and self._lasts[index] >= offset

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._firsts, self._lasts))

    def offsets(self) -> int:
        return sum(last - first + 1 for first, last in zip(self._firsts, self._lasts))


class ProgressQueue:
    """Progress marks not yet sent, per partition key, coalesced into ranges."""

    def __init__(self, max_batches: int) -> None:
        self.max_batches = max_batches
        self._pending: dict[Hashable, OffsetRanges] = {}
        self._batches = 0

    def add(self, key: Hashable, offset: int) -> bool:
        """Queue ``offset`` of partition ``key``; True when the queue should be flushed now
        (more than ``max_batches`` progress batches pending)."""
        ranges = self._pending.get(key)
        if ranges is None:
            ranges = self._pending[key] = OffsetRanges()
        before = len(ranges)
        ranges.add(offset)
        self._batches += len(ranges) - before
        return self._batches > self.max_batches

    @property
    def batches(self) -> int:
        """Pending progress batches (contiguous ranges) over all partitions."""
        return self._batches

    def __bool__(self) -> bool:
        return self._batches > 0

    def drain(self) -> dict[Hashable, list[tuple[int, int]]]:
        """Everything pending, as ranges per key; the queue is empty afterwards."""
        drained = {key: ranges.ranges() for key, ranges in self._pending.items() if len(ranges)}
        self._pending.clear()
        self._batches = 0
        return drained

    def requeue(self, drained: Mapping[Hashable, list[tuple[int, int]]]) -> None:
        """Put back ranges that could not be sent (merged with anything queued since)."""
        for key, ranges in drained.items():
            pending = self._pending.setdefault(key, OffsetRanges())
            before = len(pending)
            for first, last in ranges:
                pending.add(first, last)
            self._batches += len(pending) - before


def acknowledgement_batches(types_by_offset: Mapping[int, int]) -> list[tuple[int, int, int]]:
    """(first, last, type) for each run of contiguous offsets acknowledged with one type."""
    batches: list[tuple[int, int, int]] = []
    for offset in sorted(types_by_offset):
        kind = types_by_offset[offset]
        if batches and batches[-1][1] == offset - 1 and batches[-1][2] == kind:
            first, _, _ = batches[-1]
            batches[-1] = (first, offset, kind)
        else:
            batches.append((offset, offset, kind))
    return batches
