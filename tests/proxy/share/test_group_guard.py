"""The consumer-group guard builds valid error responses for every JoinGroup/ConsumerGroupHeartbeat version."""

from __future__ import annotations

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from codec.registry import decode_entity, encode
from proxy.share.group_guard import CONSUMER_GROUP_HEARTBEAT, JOIN_GROUP, error_response

CASES = [(JOIN_GROUP, v) for v in range(0, 10)] + [(CONSUMER_GROUP_HEARTBEAT, v) for v in range(0, 2)]


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_error_response_round_trips_and_carries_only_the_error(api_key: int, version: int) -> None:
    response_type = load_response_schema(api_key, version)
    response = error_response(response_type, ErrorCode.inconsistent_group_protocol, "Group g is a share group.")

    decoded = decode_entity(response_type, encode(response))

    assert decoded.error_code is ErrorCode.inconsistent_group_protocol
    if hasattr(decoded, "error_message"):
        assert decoded.error_message == "Group g is a share group."
    if hasattr(decoded, "members"):
        assert decoded.members == ()
    if hasattr(decoded, "assignment"):
        assert decoded.assignment is None
