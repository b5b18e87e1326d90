"""The records a ShareFetch acquired for this consumer, out of the partition's ``records`` bytes.

:mod:`codec.batch_records` decompresses and parses the batches; a share consumer must return only
the records its ShareFetch acquired: :func:`acquired_records` keeps those inside the AcquiredRecords
ranges, each with the range's delivery count (aborted transactional records are never acquired:
the share-partition leader archives them under read_committed).
"""

from __future__ import annotations

from collections.abc import Sequence

from codec.batch_records import Record, decode_records
from codec.records import TimestampType

# confluent_kafka's timestamp types, as Message.timestamp() returns them.
TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2
CONFLUENT_TIMESTAMP_TYPE = {
    TimestampType.CREATE_TIME: TIMESTAMP_CREATE_TIME,
    TimestampType.LOG_APPEND_TIME: TIMESTAMP_LOG_APPEND_TIME,
}


def acquired_records(data: bytes | memoryview | None, acquired: Sequence[tuple[int, int, int]], *,
                     verify_crc: bool = True) -> list[tuple[Record, int]]:
    """(record, delivery count) for each record of ``data`` inside an acquired (first, last, count) range.

    The broker sends whole batches, which may hold records before, between or after the acquired
    ranges (held by other members, or archived); those are dropped.
    """
    if not acquired:
        return []
    ranges = sorted(acquired)
    out: list[tuple[Record, int]] = []
    index = 0
    for record in decode_records(data, verify_crc=verify_crc):
        offset = record.offset
        while index < len(ranges) and ranges[index][1] < offset:
            index += 1
        if index == len(ranges):
            break
        first, _last, count = ranges[index]
        if offset >= first:
            out.append((record, count))
    return out


__all__ = [
    "acquired_records", "CONFLUENT_TIMESTAMP_TYPE",
    "TIMESTAMP_NOT_AVAILABLE", "TIMESTAMP_CREATE_TIME", "TIMESTAMP_LOG_APPEND_TIME",
]
