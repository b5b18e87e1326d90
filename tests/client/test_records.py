"""client.records: only the records inside the acquired ranges, with their delivery counts; confluent's timestamp types."""

from __future__ import annotations

from client.records import CONFLUENT_TIMESTAMP_TYPE, TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, acquired_records
from codec.records import TimestampType, encode_batch


def test_only_records_inside_acquired_ranges_are_returned_with_their_delivery_counts():
    data = encode_batch(0, [b"%d" % i for i in range(10)]) + encode_batch(10, [b"%d" % i for i in range(10, 20)])
    got = acquired_records(data, [(12, 14, 3), (2, 4, 1), (19, 19, 2)])
    assert [(r.offset, count) for r, count in got] == [(2, 1), (3, 1), (4, 1), (12, 3), (13, 3), (14, 3), (19, 2)]
    assert acquired_records(data, []) == []



def test_timestamp_types_are_confluent_kafkas():
    assert CONFLUENT_TIMESTAMP_TYPE == {TimestampType.CREATE_TIME: TIMESTAMP_CREATE_TIME,
                                        TimestampType.LOG_APPEND_TIME: TIMESTAMP_LOG_APPEND_TIME}
    assert (TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME) == (1, 2)  # Message.timestamp()'s, as confluent_kafka
