"""DescribeShareGroupInFlight served from real engines of a running ShareService (virtual time,
in-memory upstream log from test_manager's fakes), through the wire route as a client sends it."""

from __future__ import annotations

import uuid

import pytest
import trio
from kio.schema.errors import ErrorCode

from codec import extensions
from codec.headers import RequestHeader, encode_request_header, parse_request_header, parse_response_header
from codec.registry import decode_entity, encode
from proxy.connection import Request
from proxy.share.in_flight import (
    InFlightFilter,
    describe_group_in_flight,
    held_since,
    hold_deadline,
    in_flight_routes,
    is_stale,
)
from proxy.share.manager import ShareService
from proxy.share.partition import InFlightRun, PartitionConfig
from proxy.share.states import RecordState
from tests.proxy.share.test_manager import (
    ACCEPT,
    GROUP,
    LOCK_MS,
    RELEASE,
    TOPIC_ID,
    TP,
    FakeCluster,
    FakeWriter,
    Harness,
    acquired,
    service_config,
    virtual_ms,
)

WALL_OFFSET_MS = 1_700_000_000_000  # wall clock = virtual monotonic clock + this
AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED, IN_PROGRESS = (int(s) for s in (
    RecordState.AVAILABLE, RecordState.ACQUIRED, RecordState.ACKNOWLEDGED, RecordState.ARCHIVED,
    RecordState.IN_PROGRESS))
STALENESS_MS, MAX_EXTENSION_MS = 90_000, 1_800_000  # the defaults


async def start(nursery, partitions: int = 1) -> Harness:
    cluster, writer = FakeCluster(partitions=partitions), FakeWriter()
    service = ShareService(cluster, writer, service_config(), clock=virtual_ms,
                           wall_clock=lambda: virtual_ms() + WALL_OFFSET_MS)
    await nursery.start(service.run)
    return Harness(service, cluster, writer)


def ranges(result, tp=TP) -> list[tuple]:
    """(first, last, state, count, member) of one partition's described ranges."""
    partition = only_partition(result, tp)
    return [(r.first_offset, r.last_offset, r.state, r.delivery_count, r.member_id) for r in partition.ranges]


def only_partition(result, tp=TP):
    for topic in result.topics:
        if topic.topic_id == tp[0]:
            for partition in topic.partitions:
                if partition.partition == tp[1]:
                    return partition
    raise AssertionError(f"{tp} not described: {result}")


async def test_window_is_described_as_ranges_of_uniform_state(nursery, autojump_clock):
    harness = await start(nursery)
    harness.cluster.append([b"a", b"b", b"c"])
    harness.cluster.append([b"d", b"e"])
    one, two = harness.member("one"), harness.member("two")
    assert acquired(await harness.fetch(one, max_records=3)) == [(0, 2, 1)]
    assert acquired(await harness.fetch(two)) == [(3, 4, 1)]
    await harness.acknowledge(one, [(TP, 1, 1, ACCEPT)])

    result = describe_group_in_flight(harness.service, GROUP, None, InFlightFilter())

    assert result.error is ErrorCode.none
    assert [t.name for t in result.topics] == ["orders"]
    partition = only_partition(result)
    assert (partition.start_offset, partition.end_offset) == (0, 5)
    assert ranges(result) == [
        (0, 0, ACQUIRED, 1, one.member_id),
        (1, 1, ACKNOWLEDGED, 1, None),
        (2, 2, ACQUIRED, 1, one.member_id),
        (3, 4, ACQUIRED, 1, two.member_id),
    ]


async def test_acquisition_time_and_lock_deadline_are_wall_clock(nursery, autojump_clock):
    harness = await start(nursery)
    harness.cluster.append([b"a", b"b"])
    member = harness.member("m")
    await harness.join(member)
    await trio.sleep(3)
    acquired_at = virtual_ms() + WALL_OFFSET_MS
    await harness.fetch(member)
    await trio.sleep(2)

    [described] = only_partition(describe_group_in_flight(harness.service, GROUP, None, InFlightFilter())).ranges

    assert described.acquired_timestamp == acquired_at
    assert described.lock_deadline_timestamp == acquired_at + LOCK_MS


async def test_filters_by_state_and_by_time_held(nursery, autojump_clock):
    harness = await start(nursery)
    harness.cluster.append([b"a", b"b"])
    early = harness.member("early")
    await harness.fetch(early)
    await trio.sleep(5)
    harness.cluster.append([b"c"])
    late = harness.member("late")
    await harness.fetch(late)
    await harness.acknowledge(early, [(TP, 1, 1, RELEASE)])

    def describe(**wanted):
        return ranges(describe_group_in_flight(harness.service, GROUP, None, InFlightFilter(**wanted)))

    assert describe(states=frozenset({AVAILABLE})) == [(1, 1, AVAILABLE, 1, None)]
    assert describe(states=frozenset({ACQUIRED})) == [(0, 0, ACQUIRED, 1, early.member_id),
                                                       (2, 2, ACQUIRED, 1, late.member_id)]
    # Held longer than 4 s: only what `early` took 5 s ago.
    assert describe(held_longer_than_ms=4_000) == [(0, 0, ACQUIRED, 1, early.member_id)]
    assert describe(held_longer_than_ms=60_000) == []
    # Nothing is IN_PROGRESS: a progress filter matches nothing (not even records never marked).
    assert describe(progress_staleness_ms=0) == []


def leader_engine(harness):
    return harness.service.leaders.active((GROUP, *TP)).engine


async def test_in_progress_ranges_carry_owner_times_and_when_the_sweeper_releases_them(nursery, autojump_clock):
    harness = await start(nursery)
    harness.cluster.append([b"a", b"b", b"c", b"d"])
    member = harness.member("worker")
    await harness.fetch(member)
    acquired_at = virtual_ms()
    await trio.sleep(3)
    engine = leader_engine(harness)
    marked_at = virtual_ms()
    engine.mark_in_progress(member.member_id, [(0, 1)], now=marked_at)
    await trio.sleep(2)
    refreshed_at = virtual_ms()
    engine.mark_in_progress(member.member_id, [(0, 0)], now=refreshed_at)
    await trio.sleep(1)

    described = only_partition(describe_group_in_flight(harness.service, GROUP, None, InFlightFilter())).ranges

    wall = WALL_OFFSET_MS
    assert [(r.first_offset, r.last_offset, r.state, r.delivery_count, r.member_id) for r in described] == [
        (0, 0, IN_PROGRESS, 1, member.member_id), (1, 1, IN_PROGRESS, 1, member.member_id),
        (2, 3, ACQUIRED, 1, member.member_id)]
    refreshed, marked_once, held = described
    # The acquisition time is kept through marks; the start is the first mark, progress the latest.
    assert (refreshed.acquired_timestamp, refreshed.in_progress_start_timestamp,
            refreshed.last_progress_timestamp) == (acquired_at + wall, marked_at + wall, refreshed_at + wall)
    assert (marked_once.in_progress_start_timestamp, marked_once.last_progress_timestamp) == (
        marked_at + wall, marked_at + wall)
    # Not under the acquisition lock: held until no progress for the staleness threshold.
    assert refreshed.lock_deadline_timestamp == refreshed_at + STALENESS_MS + wall
    assert marked_once.lock_deadline_timestamp == marked_at + STALENESS_MS + wall
    assert (refreshed.stale, marked_once.stale) == (False, False)
    assert (held.in_progress_start_timestamp, held.last_progress_timestamp, held.stale) == (-1, -1, False)
    assert held.lock_deadline_timestamp == acquired_at + LOCK_MS + wall


async def test_progress_staleness_and_state_filters_find_the_quiet_in_progress_records(nursery, autojump_clock):
    harness = await start(nursery)
    harness.cluster.append([b"a", b"b"])
    harness.cluster.append([b"c", b"d"])
    busy, quiet = harness.member("busy"), harness.member("quiet")
    await harness.fetch(busy, max_records=2)
    await harness.fetch(quiet, max_records=2)
    engine = leader_engine(harness)
    engine.mark_in_progress(quiet.member_id, [(2, 2)], now=virtual_ms())
    engine.mark_in_progress(busy.member_id, [(0, 1)], now=virtual_ms())
    await trio.sleep(10)
    engine.mark_in_progress(busy.member_id, [(0, 1)], now=virtual_ms())
    await trio.sleep(1)

    def describe(**wanted):
        return ranges(describe_group_in_flight(harness.service, GROUP, None, InFlightFilter(**wanted)))

    # quiet marked 11 s ago, busy 1 s ago; offset 3 is only acquired.
    assert describe(progress_staleness_ms=5_000) == [(2, 2, IN_PROGRESS, 1, quiet.member_id)]
    assert describe(progress_staleness_ms=500) == [(0, 1, IN_PROGRESS, 1, busy.member_id),
                                                   (2, 2, IN_PROGRESS, 1, quiet.member_id)]
    assert describe(progress_staleness_ms=60_000) == []
    assert describe(states=frozenset({IN_PROGRESS})) == [(0, 1, IN_PROGRESS, 1, busy.member_id),
                                                         (2, 2, IN_PROGRESS, 1, quiet.member_id)]
    assert describe(states=frozenset({ACQUIRED}), progress_staleness_ms=0) == []
    # Held longer than 10 s: every record taken 11 s ago, marked or not.
    assert [r[:3] for r in describe(held_longer_than_ms=10_000)] == [(0, 1, IN_PROGRESS), (2, 2, IN_PROGRESS),
                                                                     (3, 3, ACQUIRED)]


def run(state=RecordState.IN_PROGRESS, *, acquired_at=1_000, lock_deadline=-1, start=2_000, last=5_000,
        grace=-1) -> InFlightRun:
    return InFlightRun(0, 9, state, 1, "m", acquired_at, lock_deadline, start, last, grace)


CONFIG = PartitionConfig(in_progress_staleness_threshold_ms=10_000, in_progress_max_lock_extension_ms=20_000,
                         in_progress_rebalance_grace_ms=5_000)


def test_stale_means_no_progress_for_longer_than_the_groups_threshold():
    assert not is_stale(run(last=5_000), CONFIG, now=15_000)  # exactly the threshold: not yet
    assert is_stale(run(last=5_000), CONFIG, now=15_001)
    assert not is_stale(run(RecordState.ACQUIRED, start=-1, last=-1, lock_deadline=31_000), CONFIG, now=10**9)


def test_the_hold_of_in_progress_records_ends_at_staleness_max_extension_or_grace_whichever_is_first():
    assert hold_deadline(run(start=2_000, last=5_000), CONFIG) == 15_000  # staleness
    assert hold_deadline(run(start=2_000, last=19_000), CONFIG) == 22_000  # max extension, progress or not
    assert hold_deadline(run(start=2_000, last=5_000, grace=9_000), CONFIG) == 9_000  # the owner left
    assert hold_deadline(run(RecordState.ACQUIRED, start=-1, last=-1, lock_deadline=31_000), CONFIG) == 31_000
    assert hold_deadline(run(RecordState.AVAILABLE, acquired_at=-1, start=-1, last=-1), CONFIG) == -1


def test_held_since_is_the_acquisition_or_for_a_recovered_in_progress_record_its_start():
    assert held_since(run(acquired_at=1_000)) == 1_000
    assert held_since(run(acquired_at=-1, start=2_000)) == 2_000
    assert held_since(run(RecordState.AVAILABLE, acquired_at=-1, start=-1, last=-1)) == -1
    recovered = InFlightFilter(held_longer_than_ms=1_000)
    assert recovered.matches(run(acquired_at=-1, start=2_000), now=3_001)
    assert not recovered.matches(run(acquired_at=-1, start=2_000), now=3_000)


def test_the_progress_filter_matches_only_in_progress_records_quiet_for_longer():
    quiet = InFlightFilter(progress_staleness_ms=3_000)
    assert quiet.matches(run(last=5_000), now=8_001)
    assert not quiet.matches(run(last=5_000), now=8_000)
    assert not quiet.matches(run(RecordState.ACQUIRED, start=-1, last=-1), now=10**9)
    assert InFlightFilter(states=frozenset({IN_PROGRESS}), progress_staleness_ms=0).problem() is None
    assert "ProgressStalenessMs" in InFlightFilter(progress_staleness_ms=-2).problem()


async def test_a_renewed_lock_keeps_the_time_the_records_were_acquired(nursery, autojump_clock):
    harness = await start(nursery)
    harness.cluster.append([b"a"])
    member = harness.member("m")
    await harness.fetch(member)
    first_acquired = virtual_ms() + WALL_OFFSET_MS
    await trio.sleep(5)
    await harness.acknowledge(member, [(TP, 0, 0, 4)])  # RENEW (KIP-1222)

    [described] = only_partition(describe_group_in_flight(harness.service, GROUP, None, InFlightFilter())).ranges

    assert described.state == ACQUIRED
    assert described.acquired_timestamp == first_acquired
    assert described.lock_deadline_timestamp == first_acquired + 5_000 + LOCK_MS


async def test_unknown_group_and_bad_filters_are_refused_with_protocol_codes(nursery, autojump_clock):
    harness = await start(nursery)

    missing = describe_group_in_flight(harness.service, "no-such-group", None, InFlightFilter())
    bad_state = describe_group_in_flight(harness.service, GROUP, None, InFlightFilter(states=frozenset({9})))
    bad_time = describe_group_in_flight(harness.service, GROUP, None, InFlightFilter(held_longer_than_ms=-5))

    assert (missing.error, missing.topics) == (ErrorCode.group_id_not_found, ())
    assert "no-such-group" in missing.message
    assert bad_state.error is ErrorCode.invalid_request and "9" in bad_state.message
    assert bad_time.error is ErrorCode.invalid_request


async def test_requested_partitions_unknown_ones_and_uninitialised_ones(nursery, autojump_clock):
    harness = await start(nursery, partitions=2)
    harness.cluster.append([b"a"], partition=0)
    member = harness.member("m")
    await harness.fetch(member)  # initialises and reads partition 0 only
    unknown_topic = uuid.uuid4()

    result = describe_group_in_flight(harness.service, GROUP, {TOPIC_ID: [0, 7], unknown_topic: [0]},
                                      InFlightFilter())

    assert result.error is ErrorCode.none
    assert ranges(result, (TOPIC_ID, 0)) == [(0, 0, ACQUIRED, 1, member.member_id)]
    assert only_partition(result, (TOPIC_ID, 7)).error is ErrorCode.unknown_topic_or_partition
    missing = only_partition(result, (unknown_topic, 0))
    assert missing.error is ErrorCode.unknown_topic_or_partition
    assert [t.name for t in result.topics if t.topic_id == unknown_topic] == [None]


async def test_a_parked_share_partition_is_described_from_its_spso_without_waking_it(nursery, autojump_clock):
    harness = await start(nursery)
    harness.cluster.append([b"a", b"b", b"c"])
    member = harness.member("m")
    await harness.fetch(member)
    await harness.acknowledge(member, [(TP, 0, 2, ACCEPT)])
    registry = harness.service.leaders
    await trio.sleep(1)
    assert registry.park_idle([GROUP]) == 1

    result = describe_group_in_flight(harness.service, GROUP, None, InFlightFilter())

    partition = only_partition(result)
    assert (partition.start_offset, partition.end_offset, partition.ranges) == (3, 3, ())
    assert registry.active((GROUP, *TP)) is None  # still parked


# ----- the wire ------------------------------------------------------------------------------


class Connection:
    id = 1
    peer = "127.0.0.1:5555"


def wire_request(api_key: int, group_id: str, *, topics=None, states=(), held_longer_than_ms=-1) -> Request:
    api = extensions.describe_in_flight(api_key)
    request_type = api.requests[0]
    entity = request_type(
        group_id=group_id,
        topics=None if topics is None else tuple(
            request_type.DescribeTopic(topic_id=t, partitions=tuple(ps)) for t, ps in topics.items()),
        held_longer_than_ms=held_longer_than_ms, progress_staleness_ms=-1, states=tuple(states),
    )
    header = encode_request_header(RequestHeader(api_key, 0, 42, "test"))
    frame = header + encode(entity)
    parsed, offset = parse_request_header(frame)
    return Request(header=parsed, frame=frame, body_offset=offset)


@pytest.mark.parametrize("api_key", [82, 80])
async def test_route_answers_under_its_configured_key(nursery, autojump_clock, api_key):
    harness = await start(nursery)
    harness.cluster.append([b"a", b"b"])
    member = harness.member("m")
    await harness.fetch(member)
    route = in_flight_routes(harness.service, api_key)[api_key]

    payload = await route.handler(wire_request(api_key, GROUP, states=(ACQUIRED,)), Connection())

    header, offset = parse_response_header(payload, 1)
    response = decode_entity(extensions.describe_in_flight(api_key).responses[0], memoryview(payload)[offset:])
    assert header.correlation_id == 42
    assert (response.error_code, response.group_id) == (ErrorCode.none, GROUP)
    [topic] = response.topics
    [partition] = topic.partitions
    assert (topic.topic_name, partition.start_offset, partition.end_offset) == ("orders", 0, 2)
    assert [(r.first_offset, r.last_offset, r.state, r.delivery_count, r.member_id) for r in partition.records] == [
        (0, 1, ACQUIRED, 1, member.member_id)]


async def test_in_progress_times_and_stale_travel_on_the_wire(nursery, autojump_clock):
    harness = await start(nursery)
    harness.cluster.append([b"a", b"b"])
    member = harness.member("m")
    await harness.fetch(member)
    marked_at = virtual_ms()
    leader_engine(harness).mark_in_progress(member.member_id, [(1, 1)], now=marked_at)
    route = in_flight_routes(harness.service)[82]

    payload = await route.handler(wire_request(82, GROUP, states=(IN_PROGRESS,)), Connection())

    _, offset = parse_response_header(payload, 1)
    response = decode_entity(extensions.describe_in_flight().responses[0], memoryview(payload)[offset:])
    [records] = response.topics[0].partitions[0].records
    assert (records.first_offset, records.last_offset, records.state, records.member_id) == (
        1, 1, IN_PROGRESS, member.member_id)
    assert records.in_progress_start_timestamp == records.last_progress_timestamp == marked_at + WALL_OFFSET_MS
    assert records.lock_deadline_timestamp == marked_at + STALENESS_MS + WALL_OFFSET_MS
    assert records.stale is False
