"""IN_PROGRESS on a real broker: the draft KIP's must-show scenarios, through the proxy on the wire.

Members are WireMembers (conftest: kio requests over real sockets) with MarkInProgress added; the
proxy runs with a 1 s acquisition lock, a 2 s staleness threshold and a 2 s rebalance grace
(flags), and groups lower or raise the rest through IncrementalAlterConfigs, so every scenario
takes seconds. What each scenario checks is in its name; docs/in-progress.md has the rules.
"""

from __future__ import annotations

import time

import pytest
import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v1.request import AlterableConfig, AlterConfigsResource

from codec import extensions
from integration.share.conftest import (
    ACK_ACCEPT,
    Names,
    WireMember,
    durable_state,
    finished_durably,
    only_partition,
    produce,
    wire_call,
)
from proxy.share.state_store import engine_clock_offset_ms
from proxy.share.states import RecordState

pytestmark = pytest.mark.integration

LOCK_MS = 1_000
STALE_MS = 2_000
MAX_EXTENSION_MS = 20_000
GRACE_MS = 2_000
IN_PROGRESS, ACQUIRED, AVAILABLE, ACKNOWLEDGED = 5, 1, 0, 2
# Real time: how late a timer-driven release may be observed beyond its rule.
SLACK_S = 0.6

PROXY_FLAGS = (
    "--share-record-lock-duration-ms", str(LOCK_MS), "--share-min-record-lock-duration-ms", str(LOCK_MS),
    "--share-in-progress-staleness-threshold-ms", str(STALE_MS),
    "--share-in-progress-max-lock-extension-ms", str(MAX_EXTENSION_MS),
    "--share-in-progress-rebalance-grace-ms", str(GRACE_MS),
)


@pytest.fixture(scope="module")
def proxy(module_share_proxy):
    return module_share_proxy(*PROXY_FLAGS)


class ProgressMember(WireMember):
    """A WireMember that also speaks MarkInProgress (on its session connection, like ShareAcknowledge)."""

    async def mark(self, topic_id, ranges, *, partition: int = 0, epoch: int | None = None):
        api = extensions.mark_in_progress()
        request_type = api.requests[0]
        request = request_type(
            group_id=self.group, member_id=self.member_id,
            share_session_epoch=self.session_epoch if epoch is None else epoch,
            topics=(request_type.ProgressTopic(topic_id=topic_id, partitions=(request_type.ProgressPartition(
                partition_index=partition,
                progress_batches=tuple(request_type.ProgressBatch(first_offset=f, last_offset=la) for f, la in ranges),
            ),)),),
        )
        assert self.session is not None
        response = await self.session.call(request, api.responses[0])
        self._next_epoch(response, epoch)
        return response

    async def leave(self):
        return await self.heartbeat(epoch=-1)


def mark_code(response) -> ErrorCode:
    assert response.error_code == ErrorCode.none, response
    return ErrorCode(only_partition(response).error_code)


def fetched(response) -> dict[int, int]:
    """offset -> delivery count of a one-partition ShareFetch response."""
    assert response.error_code == ErrorCode.none, response
    return {offset: int(batch.delivery_count) for topic in response.responses for partition in topic.partitions
            for batch in partition.acquired_records
            for offset in range(int(batch.first_offset), int(batch.last_offset) + 1)}


def ack_code(response) -> ErrorCode:
    assert response.error_code == ErrorCode.none, response
    return ErrorCode(only_partition(response).error_code)


async def in_flight(bootstrap: str, group: str) -> list[tuple[int, int, int, int, str | None]]:
    """(first, last, state, delivery count, member) of partition 0, from DescribeShareGroupInFlight."""
    records = await in_flight_records(bootstrap, group)
    return [(r.first_offset, r.last_offset, r.state, r.delivery_count, r.member_id) for r in records]


async def in_flight_records(bootstrap: str, group: str):
    api = extensions.describe_in_flight()
    response = await wire_call(bootstrap, api.requests[0](group_id=group, topics=None, held_longer_than_ms=-1,
                                                          progress_staleness_ms=-1, states=()), api.responses[0])
    assert response.error_code == ErrorCode.none, response
    return [r for t in response.topics for p in t.partitions if p.partition_index == 0 for r in p.records]


async def set_group_configs(bootstrap: str, group: str, configs: dict[str, str]) -> None:
    request = load_request_schema(44, 1)(
        resources=(AlterConfigsResource(resource_type=32, resource_name=group, configs=tuple(
            AlterableConfig(name=k, config_operation=0, value=v) for k, v in configs.items())),),
        validate_only=False)
    response = await wire_call(bootstrap, request)
    assert [(r.error_code, r.error_message) for r in response.responses] == [(ErrorCode.none, None)], response


async def members(bootstrap: str, group: str, topic: str, *names: str):
    """Connected, joined ProgressMembers (returned with the topic id); close them with `close`."""
    joined = []
    topic_id = None
    for _ in names:
        member = await ProgressMember(bootstrap, group).connect()
        topic_id = await member.join(topic)
        joined.append(member)
    return topic_id, joined


async def close(*wire_members: WireMember) -> None:
    for member in wire_members:
        await member.aclose()


async def wait_for_records(member: ProgressMember, topic_id, *, within_s: float) -> tuple[dict[int, int], float]:
    """Long-poll until `member` acquires something; returns (offset -> delivery count, when)."""
    with trio.fail_after(within_s):
        while True:
            got = fetched(await member.fetch(topic_id, max_wait_ms=500))
            if got:
                return got, time.monotonic()


def topic_with(create_topic, names: Names, kafka, count: int) -> str:
    topic = create_topic(names.topic)
    produce(kafka.bootstrap, topic, count)  # one producer batch: one acquisition takes them all
    return topic


# ----- a, b: the slow worker --------------------------------------------------------------------


async def test_a_slow_worker_that_marks_keeps_its_records_and_nobody_else_gets_them(
        proxy, kafka, create_topic, names: Names):
    topic = topic_with(create_topic, names, kafka, 3)
    topic_id, (slow, other) = await members(proxy.bootstrap, names.group, topic, "slow", "other")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow.keep_alive)
            nursery.start_soon(other.keep_alive)
            assert fetched(await slow.fetch(topic_id)) == {0: 1, 1: 1, 2: 1}
            assert mark_code(await slow.mark(topic_id, [(0, 2)])) == ErrorCode.none
            others = {}
            for offset in range(3):  # each record takes 3 s: three lock durations
                work_ends = time.monotonic() + 3 * LOCK_MS / 1000
                while time.monotonic() < work_ends:
                    others |= fetched(await other.fetch(topic_id, max_wait_ms=100))
                    await trio.sleep(0.4)
                    response = await slow.mark(topic_id, [(offset, 2)])
                    assert (response.acquisition_lock_timeout_ms, mark_code(response)) == (STALE_MS, ErrorCode.none)
                assert await in_flight(proxy.bootstrap, names.group) == [
                    (offset, 2, IN_PROGRESS, 1, slow.member_id)]
                assert ack_code(await slow.acknowledge(topic_id, [(offset, offset, ACK_ACCEPT)])) == ErrorCode.none
            assert others == {}, f"another member received records a marking worker held: {others}"
            nursery.cancel_scope.cancel()
        assert finished_durably(kafka.bootstrap, proxy.state_topic, names.group, {0: 3})
    finally:
        await close(slow, other)


async def test_b_the_same_worker_without_marking_loses_them_to_lock_expiry(proxy, kafka, create_topic, names: Names):
    topic = topic_with(create_topic, names, kafka, 3)
    topic_id, (slow, other) = await members(proxy.bootstrap, names.group, topic, "slow", "other")
    try:
        assert fetched(await slow.fetch(topic_id)) == {0: 1, 1: 1, 2: 1}
        got, _ = await wait_for_records(other, topic_id, within_s=3 * LOCK_MS / 1000)
        assert got == {0: 2, 1: 2, 2: 2}
        # The slow worker finishes its first record only now: too late, it is not its own any more.
        assert ack_code(await slow.acknowledge(topic_id, [(0, 0, ACK_ACCEPT)])) == ErrorCode.invalid_record_state
        assert ack_code(await other.acknowledge(topic_id, [(0, 2, ACK_ACCEPT)])) == ErrorCode.none
    finally:
        await close(slow, other)


# ----- c, d: stuck and runaway workers ------------------------------------------------------------


async def test_c_a_stuck_worker_is_released_after_the_staleness_threshold(proxy, kafka, create_topic, names: Names):
    topic = topic_with(create_topic, names, kafka, 2)
    topic_id, (stuck, other) = await members(proxy.bootstrap, names.group, topic, "stuck", "other")
    try:
        assert fetched(await stuck.fetch(topic_id)) == {0: 1, 1: 1}
        marked_at = time.monotonic()
        assert mark_code(await stuck.mark(topic_id, [(0, 1)])) == ErrorCode.none  # then nothing more
        await trio.sleep(STALE_MS / 1000 - 0.3)
        assert await in_flight(proxy.bootstrap, names.group) == [(0, 1, IN_PROGRESS, 1, stuck.member_id)]
        got, released_at = await wait_for_records(other, topic_id, within_s=3)
        after_s = released_at - marked_at
        # Not before the threshold; at the latest one sweep (threshold / 4) after it.
        assert STALE_MS / 1000 <= after_s <= STALE_MS * 1.25 / 1000 + SLACK_S, after_s
        assert got == {0: 2, 1: 2}  # the acquisition counts; the release from IN_PROGRESS did not
        assert mark_code(await stuck.mark(topic_id, [(0, 1)])) == ErrorCode.invalid_record_state  # not its own
        assert ack_code(await other.acknowledge(topic_id, [(0, 1, ACK_ACCEPT)])) == ErrorCode.none
    finally:
        await close(stuck, other)


async def test_d_a_runaway_worker_is_released_at_the_max_extension(proxy, kafka, create_topic, names: Names):
    topic = topic_with(create_topic, names, kafka, 2)
    max_extension_ms = 4_000
    topic_id, (runaway, other) = await members(proxy.bootstrap, names.group, topic, "runaway", "other")
    await set_group_configs(proxy.bootstrap, names.group,
                            {"share.in.progress.max.lock.extension.ms": str(max_extension_ms)})
    try:
        assert fetched(await runaway.fetch(topic_id)) == {0: 1, 1: 1}
        first_mark = time.monotonic()
        codes = []
        async with trio.open_nursery() as nursery:
            async def keep_marking():
                while True:
                    codes.append((time.monotonic() - first_mark, mark_code(await runaway.mark(topic_id, [(0, 1)]))))
                    await trio.sleep(0.3)

            nursery.start_soon(keep_marking)
            got, released_at = await wait_for_records(other, topic_id, within_s=max_extension_ms / 1000 + 3)
            await trio.sleep(0.5)  # a mark or two after the release
            nursery.cancel_scope.cancel()
        after_s = released_at - first_mark
        # At the max extension, at the latest one sweep (staleness threshold / 4) after it.
        assert max_extension_ms / 1000 <= after_s <= (max_extension_ms + STALE_MS / 4) / 1000 + SLACK_S, after_s
        assert got == {0: 2, 1: 2}
        accepted = [at for at, code in codes if code is ErrorCode.none]
        assert len(accepted) >= 10 and max(accepted) < after_s  # it kept marking all along, never stale
        assert codes[-1][1] is ErrorCode.invalid_record_state  # and is refused afterwards
        assert ack_code(await other.acknowledge(topic_id, [(0, 1, ACK_ACCEPT)])) == ErrorCode.none
    finally:
        await close(runaway, other)


# ----- e: rebalance grace -------------------------------------------------------------------------


async def test_e_a_leaving_member_has_fresh_records_held_for_the_grace_stale_ones_released_at_once(
        proxy, kafka, create_topic, names: Names):
    topic = topic_with(create_topic, names, kafka, 4)
    stale_ms = 8_000  # a stale record is swept within 2 s of going stale: room to leave before that
    topic_id, (leaver, other) = await members(proxy.bootstrap, names.group, topic, "leaver", "other")
    await set_group_configs(proxy.bootstrap, names.group, {"share.in.progress.staleness.threshold.ms": str(stale_ms)})
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other.keep_alive)
            nursery.start_soon(leaver.keep_alive)
            assert fetched(await leaver.fetch(topic_id)) == {0: 1, 1: 1, 2: 1, 3: 1}
            # Sweeps run every stale_ms / 4 (2 s) from the first mark. 0-1 are marked 1 s after it, so
            # they go stale between two sweeps: 9 s after the first mark, swept at 10 s. 2-3 are
            # marked again at 7 s: fresh at the leave (9.5 s).
            first_mark = time.monotonic()
            assert mark_code(await leaver.mark(topic_id, [(0, 3)])) == ErrorCode.none
            await trio.sleep(1.0)
            assert mark_code(await leaver.mark(topic_id, [(0, 1)])) == ErrorCode.none
            await trio.sleep(first_mark + 7.0 - time.monotonic())
            assert mark_code(await leaver.mark(topic_id, [(2, 3)])) == ErrorCode.none
            await trio.sleep(first_mark + 9.4 - time.monotonic())
            assert await in_flight(proxy.bootstrap, names.group) == [  # two runs: their progress times differ
                (0, 1, IN_PROGRESS, 1, leaver.member_id), (2, 3, IN_PROGRESS, 1, leaver.member_id)
            ], "0-1 went stale only just now: not swept yet"
            nursery.cancel_scope.cancel()
        leave_sent = time.monotonic()  # the grace starts when the proxy handles the leave: after this
        response = await leaver.leave()
        left_at = time.monotonic()
        assert response.error_code == ErrorCode.none
        # Stale ones at once; the fresh ones stay the leaver's.
        assert await in_flight(proxy.bootstrap, names.group) == [
            (0, 1, AVAILABLE, 1, None), (2, 3, IN_PROGRESS, 1, leaver.member_id)]
        assert fetched(await other.fetch(topic_id, max_wait_ms=0)) == {0: 2, 1: 2}
        assert ack_code(await other.acknowledge(topic_id, [(0, 1, ACK_ACCEPT)])) == ErrorCode.none
        got, released_at = await wait_for_records(other, topic_id, within_s=GRACE_MS / 1000 + 3)
        assert GRACE_MS / 1000 <= released_at - leave_sent and released_at - left_at <= GRACE_MS / 1000 + SLACK_S, (
            released_at - leave_sent, released_at - left_at)
        assert got == {2: 2, 3: 2}
        assert ack_code(await other.acknowledge(topic_id, [(2, 3, ACK_ACCEPT)])) == ErrorCode.none
    finally:
        await close(leaver, other)


# ----- g: MarkInProgress errors -------------------------------------------------------------------


async def test_g_mark_in_progress_errors(proxy, kafka, create_topic, names: Names):
    topic = topic_with(create_topic, names, kafka, 4)
    topic_id, (owner, other) = await members(proxy.bootstrap, names.group, topic, "owner", "other")
    # A long staleness (sweeps 10 s apart) so that the max-extension check meets the mark, not the sweeper.
    await set_group_configs(proxy.bootstrap, names.group, {"share.in.progress.staleness.threshold.ms": "40000",
                                                           "share.in.progress.max.lock.extension.ms": "60000"})
    try:
        # One producer batch: the owner's acquisition takes all four (whole batches), the other none.
        assert fetched(await owner.fetch(topic_id, max_records=1)) == {0: 1, 1: 1, 2: 1, 3: 1}
        assert fetched(await other.fetch(topic_id, max_records=1)) == {}
        assert mark_code(await owner.mark(topic_id, [(0, 1)])) == ErrorCode.none
        # Not the owner.
        assert mark_code(await other.mark(topic_id, [(0, 0)])) == ErrorCode.invalid_record_state
        # Accepted, then marked: not ACQUIRED or IN_PROGRESS any more.
        assert ack_code(await owner.acknowledge(topic_id, [(3, 3, ACK_ACCEPT)])) == ErrorCode.none
        assert mark_code(await owner.mark(topic_id, [(3, 3)])) == ErrorCode.invalid_record_state
        # Beyond what was ever fetched.
        assert mark_code(await owner.mark(topic_id, [(10, 12)])) == ErrorCode.invalid_record_state
        # Bad ranges.
        assert mark_code(await owner.mark(topic_id, [(1, 0)])) == ErrorCode.invalid_request
        assert mark_code(await owner.mark(topic_id, [(0, 1), (1, 2)])) == ErrorCode.invalid_request
        # Session epochs: a wrong one, and 0 (a mark opens no session).
        wrong = await owner.mark(topic_id, [(0, 1)], epoch=owner.session_epoch + 7)
        assert wrong.error_code == ErrorCode.invalid_share_session_epoch
        assert (await owner.mark(topic_id, [(0, 1)], epoch=0)).error_code == ErrorCode.invalid_share_session_epoch
        # Max extension: the group lowers it below how long 0-1 have been in progress.
        await trio.sleep(1.5)
        await set_group_configs(proxy.bootstrap, names.group, {"share.in.progress.staleness.threshold.ms": "1000",
                                                               "share.in.progress.max.lock.extension.ms": "1000"})
        refused = await owner.mark(topic_id, [(0, 1)])
        assert mark_code(refused) == ErrorCode.invalid_record_state
        assert "share.in.progress.max.lock.extension.ms" in only_partition(refused).error_message
    finally:
        await close(owner, other)


# ----- f: kill -9 -----------------------------------------------------------------------------------


async def test_f_in_progress_survives_kill_9_and_its_owner_finishes_the_work(share_proxy, kafka, create_topic,
                                                                           names: Names):
    # A staleness threshold longer than the restart, so the records are still fresh afterwards.
    proxy = share_proxy("--share-record-lock-duration-ms", str(LOCK_MS), "--share-min-record-lock-duration-ms",
                        str(LOCK_MS), "--share-in-progress-staleness-threshold-ms", "60000",
                        "--share-in-progress-rebalance-grace-ms", str(GRACE_MS))
    topic = topic_with(create_topic, names, kafka, 3)
    topic_id, (owner, other) = await members(proxy.bootstrap, names.group, topic, "owner", "other")
    owner_id = owner.member_id
    try:
        assert fetched(await owner.fetch(topic_id)) == {0: 1, 1: 1, 2: 1}
        assert mark_code(await owner.mark(topic_id, [(0, 2)])) == ErrorCode.none
        await trio.sleep(1.0)
        assert mark_code(await owner.mark(topic_id, [(0, 2)])) == ErrorCode.none  # durable once answered
        assert fetched(await other.fetch(topic_id, max_wait_ms=200)) == {}
    finally:
        await close(owner, other)
    proxy.kill()

    durable = durable_state(kafka.bootstrap, proxy.state_topic, names.group)[0]
    [batch] = durable.state_batches
    assert (batch.first_offset, batch.last_offset, batch.delivery_state, batch.delivery_count, batch.member_id) == (
        0, 2, RecordState.IN_PROGRESS, 1, owner_id)
    assert 700 <= batch.last_progress - batch.in_progress_start <= 2_500, batch

    restarted = proxy.start()
    records = await in_flight_records(restarted.bootstrap, names.group)
    assert [(r.first_offset, r.last_offset, r.state, r.delivery_count, r.member_id) for r in records] == [
        (0, 2, IN_PROGRESS, 1, owner_id)]
    # The restarted proxy shows the times it read back: durable_state rebuilt them on this process's
    # engine clock, so back to wall clock they must match (+-2 ms of conversion each way).
    to_wall = engine_clock_offset_ms()
    assert abs(records[0].in_progress_start_timestamp - (batch.in_progress_start + to_wall)) <= 3, records[0]
    assert abs(records[0].last_progress_timestamp - (batch.last_progress + to_wall)) <= 3, records[0]

    newcomer = await ProgressMember(restarted.bootstrap, names.group).connect()
    back = await ProgressMember(restarted.bootstrap, names.group, member_id=owner_id).connect()
    try:
        await newcomer.join(topic)
        assert fetched(await newcomer.fetch(topic_id, max_wait_ms=1_500)) == {}  # nobody else gets them
        await back.join(topic)  # the same member id rejoins
        assert fetched(await back.fetch(topic_id, max_wait_ms=0)) == {}  # opens its session
        assert mark_code(await back.mark(topic_id, [(0, 2)])) == ErrorCode.none
        assert ack_code(await back.acknowledge(topic_id, [(0, 2, ACK_ACCEPT)])) == ErrorCode.none
    finally:
        await close(newcomer, back)
    assert finished_durably(kafka.bootstrap, restarted.state_topic, names.group, {0: 3})
    assert proxy.process is not None and proxy.process.poll() is None


# ----- the keys on the wire -------------------------------------------------------------------------


async def test_apiversions_advertises_the_extension_keys_as_api_keys_and_features(proxy):
    request = load_request_schema(18, 3)(client_software_name="ksp-test", client_software_version="1")
    response = await wire_call(proxy.bootstrap, request)
    keys = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in response.api_keys}
    assert keys[81] == (0, 0) and keys[82] == (0, 0)
    features = {f.name: (int(f.min_version), int(f.max_version)) for f in response.supported_features}
    assert features[extensions.MARK_IN_PROGRESS_KEY_FEATURE] == (81, 81)
    assert features[extensions.DESCRIBE_IN_FLIGHT_KEY_FEATURE] == (82, 82)
