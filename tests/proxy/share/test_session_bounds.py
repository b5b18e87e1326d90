"""The share-session partition bounds as ShareFetch answers them (ShareService + the fakes of test_manager)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from tests.proxy.share.test_manager import TOPIC_ID, TP, start_service

TP1, TP2 = (TOPIC_ID, 1), (TOPIC_ID, 2)


async def test_share_fetch_beyond_the_session_partition_bound_gets_share_session_limit_reached(nursery, autojump_clock):
    harness = await start_service(nursery)
    harness.service.sessions.set_partition_limits(2, 3)
    harness.cluster.append([b"a"])
    greedy = harness.member("greedy")
    result = await harness.fetch(greedy, partitions=(TP, TP1, TP2))
    assert result["error"] == ErrorCode.share_session_limit_reached
    assert harness.service.sessions.get(greedy.node, "queue", greedy.member_id) is None

    # Within the bound the same member is served; a second member then finds the total full.
    result = await harness.fetch(greedy, partitions=(TP, TP1))
    assert result["error"] == ErrorCode.none
    other = harness.member("other")
    assert (await harness.fetch(other, partitions=(TP1, TP2)))["error"] == ErrorCode.share_session_limit_reached
    assert (await harness.fetch(other, partitions=(TP2,)))["error"] == ErrorCode.none
    assert harness.service.sessions.total_partitions() == 3
