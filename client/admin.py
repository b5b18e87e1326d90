"""describe_share_group_in_flight: the draft KIP's admin call over DescribeShareGroupInFlight.

One request to a bootstrap server (the proxy answers for every share group it serves); the api key
is the one the proxy advertises in ApiVersions SupportedFeatures, else
``ksp.describe.in.flight.api.key`` / the KIP's 82.
"""

from __future__ import annotations

import dataclasses

from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i64

from codec import extensions
from codec.share_state import DeliveryState

from .cluster import Cluster, api_versions, extension_keys
from .config import parse_config
from .errors import KafkaError, KafkaException


@dataclasses.dataclass(frozen=True, slots=True)
class InFlightRange:
    """Consecutive in-flight records of one share-partition in one state, owner and delivery count.

    Times are wall-clock ms since the epoch (-1 when not applicable); ``stale`` is true for
    IN_PROGRESS records whose last progress is older than the group's staleness threshold.
    """

    topic: str | None
    partition: int
    first_offset: int
    last_offset: int
    state: str
    member_id: str | None
    delivery_count: int
    acquired_at_ms: int
    in_progress_start_ms: int
    last_progress_ms: int
    stale: bool


def _state_id(name: str) -> int:
    try:
        return int(DeliveryState[name.upper()])
    except KeyError:
        raise KafkaException(KafkaError(
            KafkaError.INVALID_ARG,
            f"only_state {name!r} is not a state name; one of {', '.join(s.name for s in DeliveryState)}")) from None


def _state_name(state_id: int) -> str:
    try:
        return DeliveryState(state_id).name
    except ValueError:
        return f"UNKNOWN({state_id})"


def describe_share_group_in_flight(bootstrap_servers: str, group_id: str, held_longer_than_ms: int | None = None,
                                   progress_staleness_ms: int | None = None, only_state: str | None = None,
                                   *, timeout: float = 30.0, client_id: str = "ksp-admin",
                                   describe_in_flight_api_key: int | None = None,
                                   config: dict[str, object] | None = None) -> list[InFlightRange]:
    """The in-flight record ranges of ``group_id`` matching the filters (all of them when None).

    ``only_state`` takes a state name (``"IN_PROGRESS"``, ``"ACQUIRED"``, ...); ``config`` adds client
    properties (security.protocol, ssl.*, sasl.*: docs/client.md). Raises
    KafkaException for a top-level error (e.g. GROUP_ID_NOT_FOUND) or a partition error.
    """
    for name, value in (("held_longer_than_ms", held_longer_than_ms), ("progress_staleness_ms", progress_staleness_ms)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise KafkaException(KafkaError(KafkaError.INVALID_ARG, f"{name} must be a non-negative int, not {value!r}"))
    states = () if only_state is None else (i8(_state_id(only_state)),)
    config = parse_config({"bootstrap.servers": bootstrap_servers, "group.id": group_id, "client.id": client_id,
                           "request.timeout.ms": int(timeout * 1000),
                           **({} if describe_in_flight_api_key is None
                              else {"ksp.describe.in.flight.api.key": describe_in_flight_api_key}),
                           **(config or {})})
    connection = Cluster(config).connect_bootstrap()
    try:
        keys, features = api_versions(connection, timeout)
        extension = extension_keys(keys, features, config.mark_in_progress_api_key, config.describe_in_flight_api_key)
        if not extension.describe_in_flight_served:
            raise KafkaException(KafkaError(
                KafkaError.UNSUPPORTED_FEATURE,
                f"the server does not serve DescribeShareGroupInFlight (api key {extension.describe_in_flight})"))
        api = extensions.describe_in_flight(extension.describe_in_flight)
        request = api.requests[0](
            group_id=group_id, topics=None,
            held_longer_than_ms=i64(-1 if held_longer_than_ms is None else held_longer_than_ms),
            progress_staleness_ms=i64(-1 if progress_staleness_ms is None else progress_staleness_ms),
            states=states)
        response = connection.call(request, timeout_s=timeout, response_type=api.responses[0])
    finally:
        connection.close()
    code = int(response.error_code)
    if code:
        raise KafkaException(KafkaError(code, response.error_message or ErrorCode(code).name))
    ranges: list[InFlightRange] = []
    for topic in response.topics:
        for partition in topic.partitions:
            if int(partition.error_code):
                raise KafkaException(KafkaError(int(partition.error_code),
                                                f"{topic.topic_name}[{partition.partition_index}]: {partition.error_message}"))
            for run in partition.records:
                ranges.append(InFlightRange(
                    topic=topic.topic_name, partition=int(partition.partition_index),
                    first_offset=int(run.first_offset), last_offset=int(run.last_offset),
                    state=_state_name(int(run.state)), member_id=run.member_id,
                    delivery_count=int(run.delivery_count), acquired_at_ms=int(run.acquired_timestamp),
                    in_progress_start_ms=int(run.in_progress_start_timestamp),
                    last_progress_ms=int(run.last_progress_timestamp),
                    # The Stale field arrives with the observe part of issue 10; older proxies lack it.
                    stale=bool(getattr(run, "stale", False))))
    return sorted(ranges, key=lambda r: (r.topic or "", r.partition, r.first_offset))
