"""MarkInProgress served by a running ShareService through its wire route (virtual time, the
in-memory upstream log and fake state writer of test_manager): validation, durability, the
sweeper, the rebalance grace, and the causes the commit pipeline records."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from codec import extensions
from codec.headers import RequestHeader, encode_request_header, parse_request_header, parse_response_header
from codec.registry import decode_entity, encode
from proxy.apiversions import VersionRange
from proxy.connection import Request
from proxy.share import state_store
from proxy.share.commit import Cause
from proxy.share.coordinator import CoordinatorConfig, ShareGroupConfig, ShareGroupLimits, parse_auto_offset_reset
from proxy.share.manager import ShareServiceConfig
from proxy.share.progress import extension_features, progress_routes, progress_version_range
from proxy.share.states import RecordState
from tests.proxy.share.test_manager import (
    ACCEPT,
    GROUP,
    TOPIC_ID,
    TP,
    TP1,
    FakeCluster,
    Harness,
    Member,
    acquired,
    holders,
    start_service,
    virtual_ms,
)

LOCK_MS = 15_000
STALE_MS = 4_000
MAX_EXTENSION_MS = 20_000
GRACE_MS = 2_000
MARK_KEY = extensions.DEFAULT_MARK_IN_PROGRESS_KEY


def in_progress_config(*, delivery_count_limit: int = 5, max_extension_ms: int = MAX_EXTENSION_MS) -> ShareServiceConfig:
    defaults = ShareGroupConfig(
        record_lock_duration_ms=LOCK_MS, delivery_count_limit=delivery_count_limit,
        auto_offset_reset=parse_auto_offset_reset("earliest"),
        in_progress_staleness_threshold_ms=STALE_MS, in_progress_max_lock_extension_ms=max_extension_ms,
        in_progress_rebalance_grace_ms=GRACE_MS,
    )
    return ShareServiceConfig(coordinator=CoordinatorConfig(group_defaults=defaults, limits=ShareGroupLimits()))


@pytest.fixture
async def harness(nursery) -> Harness:
    harness = await start_service(nursery, config=in_progress_config())
    harness.causes = []
    harness.service.commits.subscribe(lambda change: harness.causes.append(change.cause))
    return harness


@dataclass
class Connection:
    id: int
    closed: trio.Event
    node_id: int = 1
    peer: str = "127.0.0.1:5555"


async def mark(harness: Harness, member: Member, ranges, *, tp=TP, epoch: int | None = None,
               group_id: str = GROUP, member_id: str | None = None, api_key: int = MARK_KEY):
    """Send MarkInProgress through the wire route; returns (top error, {tp: (code, message)}, lock ms)."""
    request_type = extensions.mark_in_progress(api_key).requests[0]
    entity = request_type(
        group_id=group_id, member_id=member.member_id if member_id is None else member_id,
        share_session_epoch=member.epoch if epoch is None else epoch,
        topics=(request_type.ProgressTopic(topic_id=tp[0], partitions=(request_type.ProgressPartition(
            partition_index=tp[1],
            progress_batches=tuple(request_type.ProgressBatch(first_offset=f, last_offset=la) for f, la in ranges),
        ),)),),
    )
    frame = encode_request_header(RequestHeader(api_key, 0, 7, "test")) + encode(entity)
    header, offset = parse_request_header(frame)
    route = progress_routes(harness.service, api_key)[api_key]
    payload = await route.handler(Request(header=header, frame=frame, body_offset=offset),
                                  Connection(member.connection, member.closed, member.node))
    response_header, body = parse_response_header(payload, 1)
    assert response_header.correlation_id == 7
    response = decode_entity(extensions.mark_in_progress(api_key).responses[0], memoryview(payload)[body:])
    if response.error_code == ErrorCode.none and epoch is None:
        member.epoch += 1  # counts as a ShareAcknowledge for the session
    results = {(t.topic_id, p.partition_index): (p.error_code, p.error_message)
               for t in response.responses for p in t.partitions}
    return response.error_code, results, response.acquisition_lock_timeout_ms


def runs(harness: Harness) -> list[tuple]:
    """(first, last, state, count, member) of the window, as DescribeShareGroupInFlight shows it."""
    engine = harness.service.leaders.active((GROUP, *TP)).engine
    return [(r.first_offset, r.last_offset, r.state, r.delivery_count, r.member_id) for r in engine.in_flight_locked()]


async def leave(harness: Harness, member: Member) -> None:
    request = load_request_schema(76, 1)(group_id=GROUP, member_id=member.member_id, member_epoch=-1,
                                         rack_id=None, subscribed_topic_names=None)
    await harness.service.heartbeat(request, client_id="test", client_host="/127.0.0.1")


IN_PROGRESS, ACQUIRED, ACKNOWLEDGED, AVAILABLE, ARCHIVED = (
    RecordState.IN_PROGRESS, RecordState.ACQUIRED, RecordState.ACKNOWLEDGED, RecordState.AVAILABLE,
    RecordState.ARCHIVED)


# ----- marks ---------------------------------------------------------------------------------


async def test_a_worker_that_marks_keeps_its_records_past_the_lock(harness, autojump_clock):
    harness.cluster.append([b"a", b"b", b"c"])
    slow, other = harness.member("slow"), harness.member("other")
    assert acquired(await harness.fetch(slow)) == [(0, 2, 1)]
    for _ in range(6):  # 18 s of work, past the 15 s lock (within the 20 s max extension), a mark every 3 s
        await trio.sleep(3)
        error, results, lock_ms = await mark(harness, slow, [(0, 2)])
        assert (error, results, lock_ms) == (ErrorCode.none, {TP: (ErrorCode.none, None)}, STALE_MS)
        assert acquired(await harness.fetch(other)) == []
    assert runs(harness) == [(0, 2, IN_PROGRESS, 1, slow.member_id)]
    response = await harness.acknowledge(slow, [(TP, 0, 2, ACCEPT)])
    assert [p.error_code for t in response.responses for p in t.partitions] == [ErrorCode.none]
    assert harness.service.leaders.active((GROUP, *TP)).engine.start_offset == 3
    assert Cause.MARKED_IN_PROGRESS in harness.causes


async def test_the_answer_waits_for_the_state_write(harness, autojump_clock):
    harness.cluster.append([b"a"])
    member = harness.member("m")
    await harness.fetch(member)
    await trio.sleep(1)
    harness.writer.hold = trio.Event()
    answered = []

    async def send():
        answered.append(await mark(harness, member, [(0, 0)]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        await trio.sleep(5)
        assert answered == [], "answered before the mark was durable"
        harness.writer.hold.set()
    assert answered[0][1] == {TP: (ErrorCode.none, None)}


async def test_a_failed_write_rolls_the_mark_back_and_answers_a_retriable_error(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    member, other = harness.member("m"), harness.member("other")
    await harness.fetch(member)
    await trio.sleep(1)
    harness.writer.fail = True
    _, results, _ = await mark(harness, member, [(0, 1)])
    assert results[TP][0] == ErrorCode.kafka_storage_error
    assert runs(harness) == [(0, 1, ACQUIRED, 1, member.member_id)]  # still under the acquisition lock
    harness.writer.fail = False
    await trio.sleep(LOCK_MS / 1000)
    assert acquired(await harness.fetch(other)) == [(0, 1, 2)]


# ----- errors --------------------------------------------------------------------------------


async def test_session_and_membership_errors_are_shareacknowledges(harness, autojump_clock):
    harness.cluster.append([b"a"])
    member, stranger = harness.member("m"), harness.member("stranger")
    await harness.fetch(member)
    assert (await mark(harness, member, [(0, 0)], member_id=""))[0] == ErrorCode.invalid_request
    assert (await mark(harness, member, [(0, 0)], epoch=0))[0] == ErrorCode.invalid_share_session_epoch
    assert (await mark(harness, member, [(0, 0)], epoch=-1))[0] == ErrorCode.invalid_share_session_epoch
    assert (await mark(harness, member, [(0, 0)], epoch=member.epoch + 5))[0] == ErrorCode.invalid_share_session_epoch
    assert (await mark(harness, member, [(0, 0)], group_id="nope"))[0] == ErrorCode.group_id_not_found
    assert (await mark(harness, stranger, [(0, 0)], epoch=1))[0] == ErrorCode.unknown_member_id
    await harness.join(stranger)
    assert (await mark(harness, stranger, [(0, 0)], epoch=1))[0] == ErrorCode.share_session_not_found
    # None of that closed or advanced the session: the right epoch still works, and advances it.
    epoch = member.epoch
    assert (await mark(harness, member, [(0, 0)]))[1] == {TP: (ErrorCode.none, None)}
    assert (await mark(harness, member, [(0, 0)], epoch=epoch))[0] == ErrorCode.invalid_share_session_epoch


async def test_per_partition_errors(harness, autojump_clock):
    for values in ([b"a", b"b"], [b"c"], [b"d"]):  # acquisitions take whole batches
        harness.cluster.append(values)
    owner, other = harness.member("owner"), harness.member("other")
    assert acquired(await harness.fetch(owner, max_records=2)) == [(0, 1, 1)]
    assert acquired(await harness.fetch(other, max_records=1)) == [(2, 2, 1)]

    async def code(ranges, tp=TP):
        _, results, _ = await mark(harness, owner, ranges, tp=tp)
        return results[tp]

    assert (await code([(2, 2)]))[0] == ErrorCode.invalid_record_state  # another member's
    assert (await code([(3, 3)]))[0] == ErrorCode.invalid_record_state  # AVAILABLE (never fetched)
    assert (await code([(0, 1), (2, 2)]))[0] == ErrorCode.invalid_record_state  # all or nothing
    assert runs(harness)[0] == (0, 1, ACQUIRED, 1, owner.member_id)
    assert (await code([(1, 0)]))[0] == ErrorCode.invalid_request
    assert (await code([(0, 1), (1, 1)]))[0] == ErrorCode.invalid_request
    unknown = (uuid.UUID(int=7), 0)
    assert (await code([(0, 0)], tp=unknown))[0] == ErrorCode.unknown_topic_or_partition
    assert (await code([(0, 0)], tp=(TOPIC_ID, 9)))[0] == ErrorCode.unknown_topic_or_partition


async def test_a_runaway_worker_is_released_at_the_max_extension_and_refused_after(harness, autojump_clock):
    harness.cluster.append([b"a"])
    member = harness.member("m")
    await harness.fetch(member)
    assert (await mark(harness, member, [(0, 0)]))[1][TP][0] == ErrorCode.none
    # Keep marking until the sweeper takes the record at the max extension.
    refused = None
    for _ in range(MAX_EXTENSION_MS // 1000 + 3):
        await trio.sleep(1)
        _, results, _ = await mark(harness, member, [(0, 0)])
        if results[TP][0] != ErrorCode.none:
            refused = results[TP]
            break
    assert refused is not None and refused[0] == ErrorCode.invalid_record_state
    assert Cause.MAX_EXTENSION_RELEASED in harness.causes
    assert runs(harness) == [(0, 0, AVAILABLE, 1, None)]


async def test_a_mark_past_a_lowered_max_extension_is_refused_naming_the_config(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    member = harness.member("m")
    await harness.fetch(member)
    await mark(harness, member, [(0, 0)])
    await trio.sleep(1.5)
    # Both lowered at once (the max extension may not go below the staleness threshold).
    harness.service.coordinator.set_group_config(GROUP, {"share.in.progress.staleness.threshold.ms": "1000",
                                                         "share.in.progress.max.lock.extension.ms": "1000"})
    _, results, lock_ms = await mark(harness, member, [(0, 1)])
    code, message = results[TP]
    assert code == ErrorCode.invalid_record_state and "share.in.progress.max.lock.extension.ms" in message
    assert lock_ms == 1_000  # the group's staleness threshold, as it is now
    assert runs(harness)[1] == (1, 1, ACQUIRED, 1, member.member_id)  # all or nothing: 1 not marked


# ----- sweeper -------------------------------------------------------------------------------


async def test_a_stuck_worker_is_released_after_the_staleness_threshold(harness, autojump_clock):
    harness.cluster.append([b"a", b"b"])
    stuck, other = harness.member("stuck"), harness.member("other")
    await harness.fetch(stuck)
    await mark(harness, stuck, [(0, 1)])
    marked_at = trio.current_time()
    while runs(harness)[0][2] is IN_PROGRESS:
        await trio.sleep(0.05)
    released_after_ms = (trio.current_time() - marked_at) * 1000
    assert STALE_MS < released_after_ms <= STALE_MS + STALE_MS / 4 + 100
    assert Cause.STALE_RELEASED in harness.causes
    # No IN_PROGRESS path counts a delivery; the next acquisition does.
    assert runs(harness) == [(0, 1, AVAILABLE, 1, None)]
    assert acquired(await harness.fetch(other)) == [(0, 1, 2)]


async def test_a_group_config_change_reaches_the_sweeper(harness, autojump_clock):
    harness.cluster.append([b"a"])
    member = harness.member("m")
    await harness.fetch(member)
    await mark(harness, member, [(0, 0)])
    harness.service.coordinator.set_group_config(GROUP, {"share.in.progress.staleness.threshold.ms": "1000"})
    await trio.sleep(2)
    assert runs(harness) == [(0, 0, AVAILABLE, 1, None)]


# ----- rebalance grace -----------------------------------------------------------------------


async def test_a_leaving_members_fresh_records_are_held_for_the_grace_stale_ones_released_at_once(
        harness, autojump_clock):
    harness.cluster.append([b"a", b"b", b"c", b"d"])
    leaver, other = harness.member("leaver"), harness.member("other")
    assert acquired(await harness.fetch(leaver)) == [(0, 3, 1)]
    await mark(harness, leaver, [(0, 1)])
    await trio.sleep(STALE_MS / 1000 - 1)
    await mark(harness, leaver, [(2, 3)])  # 0-1 will be stale at the leave, 2-3 fresh
    await trio.sleep(1.5)
    assert runs(harness)[0][2] is IN_PROGRESS, "0-1 went stale only just now; the sweep has not run"
    await leave(harness, leaver)
    assert Cause.STALE_RELEASED in harness.causes
    assert runs(harness) == [(0, 1, AVAILABLE, 1, None), (2, 3, IN_PROGRESS, 1, leaver.member_id)]
    assert acquired(await harness.fetch(other)) == [(0, 1, 2)]
    await trio.sleep(GRACE_MS / 1000 - 0.5)
    assert acquired(await harness.fetch(other)) == []  # held for the grace
    await trio.sleep(1)
    assert Cause.GRACE_EXPIRED in harness.causes
    assert acquired(await harness.fetch(other)) == [(2, 3, 2)]


async def test_a_member_that_rejoins_within_the_grace_keeps_its_records(harness, autojump_clock):
    harness.cluster.append([b"a"])
    member, other = harness.member("m"), harness.member("other")
    await harness.fetch(member)
    await mark(harness, member, [(0, 0)])
    await leave(harness, member)
    await trio.sleep(GRACE_MS / 2000)
    await harness.join(member)  # the same member id
    assert (await mark(harness, member, [(0, 0)]))[1] == {TP: (ErrorCode.none, None)}
    await trio.sleep(GRACE_MS / 1000 * 2)
    assert acquired(await harness.fetch(other)) == []
    assert runs(harness) == [(0, 0, IN_PROGRESS, 1, member.member_id)]
    response = await harness.acknowledge(member, [(TP, 0, 0, ACCEPT)])
    assert [p.error_code for t in response.responses for p in t.partitions] == [ErrorCode.none]


async def test_a_member_fenced_by_its_session_timeout_gets_the_grace_too(nursery, autojump_clock):
    harness = await start_service(nursery, config=in_progress_config(max_extension_ms=120_000))
    harness.cluster.append([b"a"])
    silent, other = harness.member("silent"), harness.member("other")
    await harness.fetch(silent)
    await mark(harness, silent, [(0, 0)])
    await harness.join(other)
    # Keep marking (progress stays fresh) but stop heartbeating: the 45 s session timeout fences it.
    timed_out = False
    for _ in range(60):
        await trio.sleep(1)
        if not harness.service.coordinator.has_member(GROUP, silent.member_id):
            timed_out = True
            break
        await mark(harness, silent, [(0, 0)])
        await harness.join(other)  # `other` heartbeats (epoch 0 rejoins are fine for this)
    assert timed_out
    assert runs(harness) == [(0, 0, IN_PROGRESS, 1, silent.member_id)]
    await trio.sleep(GRACE_MS / 1000 + 1)
    assert runs(harness) == [(0, 0, AVAILABLE, 1, None)]


# ----- restart ---------------------------------------------------------------------------------


async def test_a_restored_service_keeps_in_progress_records_for_their_owner_without_a_grace(nursery, autojump_clock):
    first = await start_service(nursery, config=in_progress_config())
    first.cluster.append([b"a", b"b"])
    owner = first.member("owner")
    await first.fetch(owner)
    await mark(first, owner, [(0, 1)])
    await trio.sleep(1)
    await mark(first, owner, [(0, 1)])

    wall_minus_engine = first.service.wall_clock() - virtual_ms()
    recovered = state_store.recover(first.writer.replayed(), clock_offset_ms=wall_minus_engine)
    second = await start_service(nursery, cluster=first.cluster, config=in_progress_config(), recovered=recovered)
    engine = second.service.leaders.active((GROUP, *TP)).engine
    [run] = engine.in_flight_locked()
    assert (run.state, run.member_id, run.delivery_count, run.last_progress - run.in_progress_start) == (
        IN_PROGRESS, owner.member_id, 1, 1_000)
    assert run.grace_deadline == -1  # no grace from recovery: its owner is still working
    newcomer = second.member("newcomer")
    assert acquired(await second.fetch(newcomer)) == []
    back = Member(member_id=owner.member_id, connection=999)  # the same member id, a new connection
    second.service.watch_connection(back.connection, back.closed)
    assert acquired(await second.fetch(back)) == []  # rejoins and opens a session
    assert (await mark(second, back, [(0, 1)]))[1] == {TP: (ErrorCode.none, None)}
    response = await second.acknowledge(back, [(TP, 0, 1, ACCEPT)])
    assert [p.error_code for t in response.responses for p in t.partitions] == [ErrorCode.none]


async def test_a_restored_record_whose_owner_never_returns_goes_stale(nursery, autojump_clock):
    first = await start_service(nursery, config=in_progress_config())
    first.cluster.append([b"a"])
    owner = first.member("owner")
    await first.fetch(owner)
    await mark(first, owner, [(0, 0)])
    recovered = state_store.recover(first.writer.replayed(),
                                    clock_offset_ms=first.service.wall_clock() - virtual_ms())
    second = await start_service(nursery, cluster=first.cluster, config=in_progress_config(), recovered=recovered)
    newcomer = second.member("newcomer")
    assert acquired(await second.fetch(newcomer)) == []
    await trio.sleep(STALE_MS * 1.25 / 1000 + 0.1)
    assert acquired(await second.fetch(newcomer)) == [(0, 0, 2)]


# ----- the wire ------------------------------------------------------------------------------


@pytest.mark.parametrize("api_key", [81, 80])
async def test_route_answers_under_its_configured_key(nursery, autojump_clock, api_key):
    harness = await start_service(nursery, config=in_progress_config())
    harness.cluster.append([b"a"])
    member = harness.member("m")
    await harness.fetch(member)
    assert (await mark(harness, member, [(0, 0)], api_key=api_key))[1] == {TP: (ErrorCode.none, None)}
    assert progress_version_range(api_key) == (api_key, VersionRange(0, 0))


def test_the_extension_keys_are_advertised_as_features():
    assert extension_features(81, 82) == {
        "kafka-share-proxy.mark-in-progress.api-key": VersionRange(81, 81),
        "kafka-share-proxy.describe-in-flight.api-key": VersionRange(82, 82),
    }


# ----- one share session per node ------------------------------------------------------------


async def test_marks_use_the_nodes_own_session_and_a_closed_session_holds_only_its_partitions_for_the_grace(
        nursery, autojump_clock):
    """A worker marks P0 through broker 1's listener and P1 through broker 2's, each in that node's
    session; when node 1's connection closes only P0's fresh IN_PROGRESS records get the grace."""
    harness = await start_service(nursery, cluster=FakeCluster(partitions=2), config=in_progress_config())
    harness.cluster.append([b"a", b"b"], partition=0)
    harness.cluster.append([b"c", b"d"], partition=1)
    on_one = harness.member("worker")
    on_two = harness.on_node(on_one, 2)
    assert acquired(await harness.fetch(on_one, partitions=(TP,))) == [(0, 1, 1)]
    on_two.joined = True
    assert acquired(await harness.fetch(on_two, partitions=(TP1,)), TP1) == [(0, 1, 1)]
    assert (await mark(harness, on_one, [(0, 1)]))[:2] == (ErrorCode.none, {TP: (ErrorCode.none, None)})
    assert (await mark(harness, on_two, [(0, 1)], tp=TP1))[:2] == (ErrorCode.none, {TP1: (ErrorCode.none, None)})
    sessions = harness.service.sessions
    assert (sessions.get(1, GROUP, on_one.member_id).epoch, sessions.get(2, GROUP, on_one.member_id).epoch) == (2, 2)
    # A mark with node 1's epoch sent to node 2 is refused by node 2's session.
    stale_epoch = Member(member_id=on_one.member_id, connection=on_two.connection, node=2, epoch=1)
    assert (await mark(harness, stale_epoch, [(0, 1)], tp=TP1))[0] == ErrorCode.invalid_share_session_epoch

    on_one.closed.set()
    await trio.sleep(0.1)
    grace = {tp: [r.grace_deadline >= 0 for r in harness.service.leaders.active((GROUP, *tp)).engine.in_flight_locked()]
             for tp in (TP, TP1)}
    assert grace == {TP: [True], TP1: [False]}
    await trio.sleep(GRACE_MS / 1000 + 0.5)
    assert holders(harness, TP) == [(0, 1, AVAILABLE, 1, None)]  # the grace ran out: released
    assert holders(harness, TP1) == [(0, 1, IN_PROGRESS, 1, on_one.member_id)]
    response = await harness.acknowledge(on_two, [(TP1, 0, 1, ACCEPT)])
    assert [p.error_code for t in response.responses for p in t.partitions] == [ErrorCode.none]


async def test_a_forgotten_partition_with_records_in_progress_stays_watched(nursery, autojump_clock):
    """Records IN_PROGRESS are not abandoned (no lock to expire): while the member holds them on a
    partition its session forgot, the partition stays watched, so closing the session still
    releases them with its own."""
    harness = await start_service(nursery, config=in_progress_config(), cluster=FakeCluster(partitions=2))
    harness.cluster.append([b"a", b"b"], partition=0)
    harness.cluster.append([b"c", b"d"], partition=1)
    worker = harness.member("worker")
    assert acquired(await harness.fetch(worker)) == [(0, 1, 1)]
    assert (await mark(harness, worker, [(0, 1)]))[0] == ErrorCode.none
    await harness.fetch(worker, add=[TP1], forget=[TP])  # P1 0-1
    await harness.acknowledge(worker, [(TP1, 0, 1, ACCEPT)])
    [session] = harness.service.sessions.sessions_of_member(GROUP, worker.member_id)
    assert harness.service.forgotten.watching(session.key)
    assert runs(harness) == [(0, 1, IN_PROGRESS, 1, worker.member_id)]
