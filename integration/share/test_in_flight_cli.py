"""IN_PROGRESS made visible, against a real broker: `share-proxy groups --in-flight`, the
DescribeShareGroupInFlight RPC and the metrics, on a scripted scenario.

Three wire members share one partition of eight records (four producer batches of two):

* `worker` takes 0-1, marks them IN_PROGRESS and keeps marking (fresh), and accepts 6-7;
* `stuck` takes 2-3, marks them once and goes quiet (stuck);
* `holder` takes 4-5 and only holds them (ACQUIRED).

The group's staleness threshold is 10 s (sweep every 2.5 s), so everything happens in seconds.
The CLI (the real binary) asked for IN_PROGRESS records quiet for more than 3 s lists exactly the
stuck worker's 2-3; once they pass the threshold the same command marks them STALE and the gauges
count them; after the sweeper they are released (reason staleness). The STALE check runs the
command in-process: a record is stale only until the next sweep (~1.25 s here), less than the
binary's start-up takes on a loaded machine. Then the worker leaves with fresh
progress: its 0-1 stay its own for the rebalance grace (2 s) and are then released (reason
grace_expiry).
"""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

import client
from codec import extensions
from integration.share.conftest import (
    ACK_ACCEPT,
    Names,
    WireMember,
    acquired_offsets,
    metric,
    produce,
    scrape_metrics,
    wire_call,
)
from proxy import groups_cli
from proxy.cli import build_parser
from proxy.localkafka.broker import free_port

pytestmark = pytest.mark.integration

SHARE_PROXY = str(Path(sys.executable).with_name("share-proxy"))
STALENESS_MS = 10_000  # sweep every 2.5 s
GRACE_MS = 2_000
QUIET_MS = 3_000  # what the operator asks for: quiet for longer than this
AVAILABLE, ACQUIRED, ACKNOWLEDGED, IN_PROGRESS = 0, 1, 2, 5
PROXY_FLAGS = (
    "--share-in-progress-staleness-threshold-ms", str(STALENESS_MS),
    "--share-in-progress-max-lock-extension-ms", "120000",
    "--share-in-progress-rebalance-grace-ms", str(GRACE_MS),
)


async def mark(member: WireMember, topic_id, first: int, last: int) -> None:
    """MarkInProgress (key 81) for one range on the member's share session; must succeed."""
    api = extensions.mark_in_progress()
    request_type = api.requests[0]
    request = request_type(
        group_id=member.group, member_id=member.member_id, share_session_epoch=member.session_epoch,
        topics=(request_type.ProgressTopic(topic_id=topic_id, partitions=(request_type.ProgressPartition(
            partition_index=0, progress_batches=(request_type.ProgressBatch(first_offset=first, last_offset=last),)),)),),
    )
    assert member.session is not None
    response = await member.session.call(request, api.responses[0])
    assert int(response.error_code) == 0, response
    member.session_epoch += 1  # a mark counts as a ShareAcknowledge for the session
    [topic] = response.responses
    [partition] = topic.partitions
    assert int(partition.error_code) == 0, partition


async def in_flight(bootstrap: str, group: str, **filters):
    api = extensions.describe_in_flight()
    return await wire_call(bootstrap, api.requests[0](group_id=group, **filters), api.responses[0])


def ranges_of(response) -> list[tuple[int, int, int, str | None]]:
    return [(r.first_offset, r.last_offset, r.state, r.member_id)
            for t in response.topics for p in t.partitions for r in p.records]


def cli_subprocess(*args: str) -> subprocess.CompletedProcess[str]:
    """The real `share-proxy groups` binary."""
    return subprocess.run([SHARE_PROXY, "groups", *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ))


def cli_in_process(*args: str) -> tuple[int, str, str]:
    """The same command without a process start (~1.5 s of imports), for the short STALE window."""
    out, err = io.StringIO(), io.StringIO()
    code = groups_cli.run(build_parser().parse_args(["groups", *args]), out, err)
    return code, out.getvalue(), err.getvalue()


def table_rows(text: str) -> list[list[str]]:
    header, *rows = text.splitlines()
    assert header.split() == ["TOPIC", "PARTITION", "OFFSETS", "STATE", "MEMBER", "DELIVERY-COUNT", "HELD-FOR",
                              "LAST-PROGRESS"]
    return [row.split() for row in rows]


async def fetch_exactly(member: WireMember, topic_id, wanted: set[int], timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        got: set[int] = set()
        while not got:
            got = acquired_offsets(await member.fetch(topic_id, max_records=2, max_wait_ms=1000))
    assert got == wanted, f"{member.member_id} acquired {sorted(got)}, expected {sorted(wanted)}"


def test_cli_and_metrics_show_the_stuck_records_of_a_scripted_scenario(kafka, share_proxy, create_topic,
                                                                       names: Names) -> None:
    port = free_port()
    proxy = share_proxy("--metrics-port", str(port), *PROXY_FLAGS)
    create_topic(names.topic)
    for first in range(0, 8, 2):  # one producer batch per pair: acquisition is batch-aligned
        produce(kafka.bootstrap, names.topic, 2, start=first)
    group = {"group": names.group}
    describe = ("--bootstrap-server", proxy.bootstrap, "--describe", "--group", names.group, "--in-flight")

    async def main() -> None:
        worker = await WireMember(proxy.bootstrap, names.group).connect()
        stuck = await WireMember(proxy.bootstrap, names.group).connect()
        holder = await WireMember(proxy.bootstrap, names.group).connect()
        try:
            await scenario(worker, stuck, holder)
        finally:
            for member in (worker, stuck, holder):
                await member.aclose()

    async def scenario(worker: WireMember, stuck: WireMember, holder: WireMember) -> None:
        async with trio.open_nursery() as nursery:
            topic_id = None
            for member in (worker, stuck, holder):
                topic_id = await member.join(names.topic)
                nursery.start_soon(member.keep_alive)
            await fetch_exactly(worker, topic_id, {0, 1})
            await fetch_exactly(stuck, topic_id, {2, 3})
            await fetch_exactly(holder, topic_id, {4, 5})
            await fetch_exactly(worker, topic_id, {6, 7})
            accepted = await worker.acknowledge(topic_id, [(6, 7, ACK_ACCEPT)])
            assert int(accepted.error_code) == 0, accepted

            # The worker's first mark starts the partition's sweep (every 2.5 s); the stuck
            # worker marks half a sweep later, so its records are stale for ~1.25 s before a
            # sweep releases them.
            await mark(worker, topic_id, 0, 1)
            await trio.sleep(1.25)
            await mark(stuck, topic_id, 2, 3)
            stuck_marked = time.monotonic()

            async def keep_marking() -> None:
                while True:
                    await trio.sleep(0.5)
                    await mark(worker, topic_id, 0, 1)

            nursery.start_soon(keep_marking)

            everything = await in_flight(proxy.bootstrap, names.group)
            assert ranges_of(everything) == [
                (0, 1, IN_PROGRESS, worker.member_id), (2, 3, IN_PROGRESS, stuck.member_id),
                (4, 5, ACQUIRED, holder.member_id), (6, 7, ACKNOWLEDGED, None)]
            [partition] = everything.topics[0].partitions
            assert (partition.start_offset, partition.end_offset) == (0, 8)

            # Quiet for more than 3 s, not yet past the 10 s threshold: the stuck range only, no STALE.
            await trio.sleep(QUIET_MS / 1000 + 0.5 - (time.monotonic() - stuck_marked))
            quiet = await trio.to_thread.run_sync(
                cli_subprocess, *describe, "--state", "IN_PROGRESS", "--progress-stale-longer-than-ms",
                str(QUIET_MS))
            assert quiet.returncode == 0, quiet.stderr
            [row] = table_rows(quiet.stdout)
            assert row[:6] == [names.topic, "0", "2-3", "IN_PROGRESS", stuck.member_id, "1"]
            assert row[-1] == "ago" and "STALE" not in row, row  # quiet, but within the threshold
            code, quiet_json, err = await trio.to_thread.run_sync(
                cli_in_process, *describe, "--state", "in_progress", "--progress-stale-longer-than-ms",
                str(QUIET_MS), "--format", "json")
            assert code == 0, err
            [described] = json.loads(quiet_json)["ranges"]
            assert (described["first_offset"], described["last_offset"], described["member_id"],
                    described["stale"]) == (2, 3, stuck.member_id, False)
            assert described["lock_deadline_timestamp"] == described["last_progress_timestamp"] + STALENESS_MS
            # The Python client's admin call lists the same stuck range, with the same times.
            [listed] = await trio.to_thread.run_sync(functools.partial(
                client.describe_share_group_in_flight, proxy.bootstrap, names.group,
                progress_staleness_ms=QUIET_MS, only_state="IN_PROGRESS"))
            assert (listed.topic, listed.partition, listed.first_offset, listed.last_offset, listed.state,
                    listed.member_id, listed.delivery_count, listed.stale) == (
                names.topic, 0, 2, 3, "IN_PROGRESS", stuck.member_id, 1, False)
            # Same times; each answer converts the engine's monotonic clock to wall time anew (+-1 ms).
            assert abs(listed.in_progress_start_ms - described["in_progress_start_timestamp"]) <= 2
            assert abs(listed.last_progress_ms - described["last_progress_timestamp"]) <= 2
            assert abs(listed.acquired_at_ms - described["acquired_timestamp"]) <= 2
            assert listed.in_progress_start_ms == listed.last_progress_ms  # marked once

            # Past the threshold: STALE until the next sweep (the RPC is polled to catch it).
            with trio.fail_after(STALENESS_MS / 1000 + 5):
                while True:
                    answer = await in_flight(proxy.bootstrap, names.group, states=(IN_PROGRESS,))
                    stale = [(r.first_offset, r.last_offset) for t in answer.topics for p in t.partitions
                             for r in p.records if r.stale]
                    if stale:
                        break
                    await trio.sleep(0.05)
            assert stale == [(2, 3)]
            listed_stale = await trio.to_thread.run_sync(functools.partial(
                client.describe_share_group_in_flight, proxy.bootstrap, names.group,
                progress_staleness_ms=QUIET_MS, only_state="IN_PROGRESS"))
            # The sweep may have run meanwhile (the stale window is ~1.25 s): then nothing is listed.
            assert [(r.first_offset, r.last_offset, r.member_id, r.stale) for r in listed_stale] in (
                [(2, 3, stuck.member_id, True)], [])
            code, out, err = await trio.to_thread.run_sync(
                cli_in_process, *describe, "--state", "IN_PROGRESS", "--progress-stale-longer-than-ms",
                str(QUIET_MS))
            samples = await trio.to_thread.run_sync(scrape_metrics, port)
            assert code == 0, err
            rows = table_rows(out) if out.startswith("TOPIC") else []
            # The stale window lasts until the next sweep (~1.25 s here); the command takes ~50 ms.
            [row] = rows
            assert row[:6] == [names.topic, "0", "2-3", "IN_PROGRESS", stuck.member_id, "1"]
            assert row[-3:] == [row[-3], "ago", "STALE"]
            assert metric(samples, "ksp_share_group_records_in_progress", **group) == 4
            assert metric(samples, "ksp_share_group_records_in_progress_stale", **group) == 2
            assert metric(samples, "ksp_share_group_records_marked_in_progress_total", **group) >= 4

            # The sweeper releases the stuck records: available again, counted as staleness.
            with trio.fail_after(10):
                while (await in_flight(proxy.bootstrap, names.group, states=(AVAILABLE,))).topics[0] \
                        .partitions[0].records == ():
                    await trio.sleep(0.1)
            after_sweep = await in_flight(proxy.bootstrap, names.group)
            assert ranges_of(after_sweep) == [
                (0, 1, IN_PROGRESS, worker.member_id), (2, 3, AVAILABLE, None),
                (4, 5, ACQUIRED, holder.member_id), (6, 7, ACKNOWLEDGED, None)]
            samples = await trio.to_thread.run_sync(scrape_metrics, port)
            assert metric(samples, "ksp_share_group_in_progress_released_records_total", **group,
                          reason="staleness") == 2
            assert metric(samples, "ksp_share_group_records_in_progress", **group) == 2
            assert metric(samples, "ksp_share_group_records_in_progress_stale", **group) == 0
            nothing_quiet = await trio.to_thread.run_sync(
                cli_in_process, *describe, "--state", "IN_PROGRESS", "--progress-stale-longer-than-ms",
                str(QUIET_MS))
            assert nothing_quiet[1] == f"Share group '{names.group}' has no in-flight records that match.\n"

            nursery.cancel_scope.cancel()  # heartbeats and the worker's marks stop

        # The worker leaves with fresh progress: 0-1 stay its own for the grace, then go.
        left = await worker.heartbeat(epoch=-1)
        assert int(left.error_code) == 0, left
        during_grace = await in_flight(proxy.bootstrap, names.group, states=(IN_PROGRESS,))
        [held] = [r for t in during_grace.topics for p in t.partitions for r in p.records]
        assert (held.first_offset, held.last_offset, held.member_id, held.stale) == (0, 1, worker.member_id, False)
        # While the owner is gone the hold ends at the grace deadline (before staleness would).
        assert held.lock_deadline_timestamp < held.last_progress_timestamp + STALENESS_MS
        with trio.fail_after(GRACE_MS / 1000 + 5):
            while (await in_flight(proxy.bootstrap, names.group, states=(IN_PROGRESS,))).topics[0] \
                    .partitions[0].records != ():
                await trio.sleep(0.1)
        samples = await trio.to_thread.run_sync(scrape_metrics, port)
        assert metric(samples, "ksp_share_group_in_progress_released_records_total", **group,
                      reason="grace_expiry") == 2
        assert metric(samples, "ksp_share_group_in_progress_released_records_total", **group,
                      reason="max_extension") == 0
        assert metric(samples, "ksp_share_group_records_in_progress", **group) == 0
        # Four records left IN_PROGRESS: 2-3 after ~11 s, 0-1 after ~15 s.
        assert metric(samples, "ksp_share_group_in_progress_duration_seconds_count", **group) == 4
        assert metric(samples, "ksp_share_group_in_progress_duration_seconds_bucket", **group, le="5.0") == 0
        assert metric(samples, "ksp_share_group_in_progress_duration_seconds_bucket", **group, le="30.0") == 4

    trio.run(main)


def test_cli_finds_a_moved_describe_key_in_the_proxys_api_versions(share_proxy, create_topic, names: Names) -> None:
    proxy = share_proxy("--describe-in-flight-api-key", "80")  # AddRaftVoter's key, flexible from v0
    create_topic(names.topic)

    async def joined() -> None:
        member = await WireMember(proxy.bootstrap, names.group).connect()
        try:
            await member.join(names.topic)
        finally:
            await member.aclose()

    trio.run(joined)
    found = cli_subprocess("--bootstrap-server", proxy.bootstrap, "--describe", "--group", names.group,
                           "--in-flight", "--format", "json")
    wrong = cli_subprocess("--bootstrap-server", proxy.bootstrap, "--describe", "--group", names.group,
                           "--api-key", "82")

    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["ranges"] == []
    assert wrong.returncode == 4 and "API key 82" in wrong.stderr
