"""ShareService: a fetch that fails upstream refreshes the proxy's metadata, rate-limited.

After an upstream broker restart the proxy's snapshot can name no leader (-1) for a partition;
every fetch then fails locally while clients retry at once. The service must refresh instead of
waiting for the periodic refresh, and a burst of failures must cost one refresh, not one each.
Harness and fakes come from test_manager (virtual time, in-memory upstream).
"""

from __future__ import annotations

import trio
from kio.schema.errors import ErrorCode

from proxy.errors import UpstreamError
from proxy.share.cluster import ClusterSnapshot
from tests.proxy.share.test_manager import TP, FakeCluster, acquired, start_service


class StaleLeaderCluster(FakeCluster):
    """Fetch fails (as with leader -1) until the next metadata refresh."""

    def __init__(self) -> None:
        super().__init__()
        self.stale = False

    async def refresh(self) -> ClusterSnapshot:
        self.stale = False
        return await super().refresh()

    async def fetch(self, topic, partition, offset, **kwargs):
        if self.stale:
            self.fetches += 1
            await trio.sleep(0)
            raise UpstreamError("no upstream broker with node id -1")
        return await super().fetch(topic, partition, offset, **kwargs)


async def test_failed_upstream_fetch_refreshes_metadata_and_recovers(nursery, autojump_clock):
    harness = await start_service(nursery, cluster=StaleLeaderCluster())
    harness.cluster.append([b"a", b"b"])
    member = harness.member("m")
    await harness.join(member)
    harness.cluster.stale = True

    failed = await harness.fetch(member)
    await trio.sleep(1)  # far less than the periodic refresh interval (10 s)
    recovered = await harness.fetch(member)

    assert failed[TP].error == ErrorCode.not_leader_or_follower
    assert acquired(recovered) == [(0, 1, 1)]


async def test_a_burst_of_failed_fetches_costs_one_refresh_per_interval(nursery, autojump_clock):
    harness = await start_service(nursery)
    harness.cluster.append([b"a"])
    member = harness.member("m")
    await harness.join(member)
    before = harness.cluster.refreshes
    harness.cluster.fail_fetch = True

    for _ in range(20):
        assert (await harness.fetch(member))[TP].error == ErrorCode.not_leader_or_follower
    await trio.sleep(0.6)

    # The first refresh at once, at most one more after STALE_METADATA_REFRESH_S.
    assert 1 <= harness.cluster.refreshes - before <= 2
