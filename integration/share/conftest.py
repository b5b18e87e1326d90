"""Fixtures for share-group integration tests: proxies, topics, names, clients.

`share_proxy(*flags)` starts `share-proxy serve` as a subprocess in front of the session `kafka`
broker (from integration/conftest.py), with its own fresh state topic unless one is given, and
SIGTERMs it at teardown. Every test gets unique topic and group names, so tests share the broker
but never each other's data.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from confluent_kafka import AcknowledgeType, KafkaException, Message, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.index import load_request_schema

from proxy.config import parse_host_port
from proxy.share.partition import PartitionConfig, PartitionSnapshot, SharePartition
from proxy.share.persister import replay_state_topic
from proxy.share.state_store import recover
from proxy.upstream import UpstreamClient, open_upstream

SHARE_PROXY = str(Path(sys.executable).with_name("share-proxy"))
READY = re.compile(rb"ready bootstrap=(\S+)")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


@dataclass(eq=False)
class RunningProxy:
    """A `share-proxy serve` subprocess; its stdout and stderr go to `log_path`."""

    upstream: str
    state_topic: str
    flags: tuple[str, ...]
    log_path: Path
    # Extra environment for the proxy process (e.g. KSP_INJECT_TASK_CRASH), over this process's own.
    env: Mapping[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None
    bootstrap: str = ""
    starts: int = field(default=0)

    def start(self) -> RunningProxy:
        """Start (or start again, with the same state topic) and wait for the ready line."""
        assert self.process is None, "already running"
        self.starts += 1
        log = self.log_path.with_suffix(f".{self.starts}.log")
        command = [
            SHARE_PROXY, "serve",
            "--upstream", self.upstream,
            "--listen", "127.0.0.1:0",
            "--state-topic", self.state_topic,
            "--share-auto-offset-reset", "earliest",
            *self.flags,
        ]
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, **self.env} if self.env else None)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            match = READY.search(log.read_bytes())
            if match:
                self.bootstrap = match.group(1).decode()
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"share-proxy did not become ready:\n{self.log_tail(log)}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send `sig` and wait for the exit; SIGKILL if it does not exit in time."""
        process, self.process = self.process, None
        if process is None:
            return 0
        if process.poll() is None:
            process.send_signal(sig)
            try:
                return process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise RuntimeError(f"share-proxy ignored signal {sig} for {STOP_TIMEOUT_S}s")
        return process.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> RunningProxy:
        self.stop()
        return self.start()

    def log_tail(self, log: Path | None = None, lines: int = 60) -> str:
        log = log or self.log_path.with_suffix(f".{self.starts}.log")
        if not log.exists():
            return ""
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


ProxyFactory = Callable[..., RunningProxy]


class ProxyStarter:
    """Starts proxies against one broker, each with a fresh state topic unless given one."""

    def __init__(self, upstream: str, directory: Path) -> None:
        self.upstream = upstream
        self.directory = directory
        self.started: list[RunningProxy] = []

    def __call__(self, *flags: str, state_topic: str | None = None,
                 env: Mapping[str, str] | None = None) -> RunningProxy:
        proxy = RunningProxy(
            upstream=self.upstream,
            state_topic=state_topic or f"__share_proxy_state_{uuid.uuid4().hex[:12]}",
            flags=tuple(flags),
            log_path=self.directory / f"share-proxy-{len(self.started)}",
            env=env,
        )
        self.started.append(proxy)
        return proxy.start()

    def stop_all(self) -> None:
        failures = []
        for proxy in self.started:
            exit_code = proxy.stop()
            # SIGTERM is a clean shutdown; anything else means the proxy crashed or hung.
            if exit_code not in (0, -signal.SIGTERM):
                failures.append(f"proxy exited {exit_code}:\n{proxy.log_tail()}")
        assert not failures, "\n".join(failures)


@pytest.fixture
def share_proxy(kafka, tmp_path: Path) -> Iterator[ProxyFactory]:
    """Factory: `share_proxy("--share-delivery-count-limit", "2", state_topic=None, env=None)` -> RunningProxy.

    Every proxy it started is stopped (SIGTERM) when the test ends.
    """
    starter = ProxyStarter(kafka.bootstrap, tmp_path)
    yield starter
    starter.stop_all()


@pytest.fixture(scope="module")
def module_share_proxy(kafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyFactory]:
    """As `share_proxy`, but the proxies live for the module (a start costs seconds of imports).

    Tests sharing a proxy stay independent through their own topics and groups.
    """
    starter = ProxyStarter(kafka.bootstrap, tmp_path_factory.mktemp("share-proxy"))
    yield starter
    starter.stop_all()


@dataclass(frozen=True, slots=True)
class Names:
    topic: str
    group: str

    def another(self, kind: str) -> str:
        return f"{self.topic}-{kind}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def names(request: pytest.FixtureRequest) -> Names:
    stem = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:60].strip("-")
    suffix = uuid.uuid4().hex[:8]
    return Names(topic=f"t-{stem}-{suffix}", group=f"g-{stem}-{suffix}")


@pytest.fixture
def create_topic(kafka) -> Callable[..., str]:
    """`create_topic(name, partitions=1)`: create and wait until the broker has it."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})

    def create(name: str, partitions: int = 1, config: dict[str, str] | None = None) -> str:
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                                config=config or {})])
        futures[name].result(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            topic = admin.list_topics(name, timeout=10).topics.get(name)
            if topic is not None and topic.error is None and len(topic.partitions) == partitions:
                return name
            time.sleep(0.1)
        raise RuntimeError(f"topic {name} did not appear")

    return create


def produce(bootstrap: str, topic: str, count: int, *, partitions: int = 1, start: int = 0,
            batch_records: int = 10_000) -> list[bytes]:
    """Produce values str(start)..str(start+count-1), round-robin over `partitions`; returns them.

    `batch_records` caps records per producer batch: share acquisition is batch-aligned, so
    smaller batches spread a burst over more consumers.
    """
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                         "batch.num.messages": batch_records})
    values = [str(i).encode() for i in range(start, start + count)]
    failures: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            failures.append(str(err))

    for i, value in enumerate(values):
        while True:
            try:
                producer.produce(topic, value=value, partition=i % partitions, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
    remaining = producer.flush(60)
    assert remaining == 0 and not failures, f"produce failed: {remaining} unflushed, {failures[:3]}"
    return values


EXPLICIT = {"share.acknowledgement.mode": "explicit"}


def poll_until(consumer, wanted: int, timeout: float = 20.0) -> list:
    """Poll until at least `wanted` records arrived (acknowledging nothing); returns them."""
    messages: list = []
    deadline = time.monotonic() + timeout
    while len(messages) < wanted:
        if time.monotonic() > deadline:
            raise AssertionError(f"got {len(messages)} of {wanted} records in {timeout}s: "
                                 f"{[(m.offset(), m.delivery_count()) for m in messages]}")
        for message in consumer.poll(0.5):
            assert message.error() is None, message.error()
            messages.append(message)
    return messages


def acknowledge_all(consumer, messages, ack_type_for=lambda message: AcknowledgeType.ACCEPT) -> None:
    for message in messages:
        consumer.acknowledge(message, ack_type_for(message))
    results = consumer.commit_sync(30)
    failed = {tp: error for tp, error in results.items() if error is not None}
    assert not failed, f"acknowledgement failed: {failed}"


def share_consumer(bootstrap: str, group: str, topic: str, config: dict[str, object] | None = None) -> ShareConsumer:
    """A confluent_kafka.ShareConsumer in `group`, subscribed to `topic`."""
    settings: dict[str, object] = {"bootstrap.servers": bootstrap, "group.id": group}
    settings.update(config or {})
    consumer = ShareConsumer(settings)
    consumer.subscribe([topic])
    return consumer


# ----- share consumers in threads ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Delivery:
    value: bytes
    partition: int
    offset: int
    delivery_count: int


class ConsumerThread(threading.Thread):
    """Polls a ShareConsumer (implicit acknowledgement) until stopped, recording every delivery.

    `processing_s` is slept after each non-empty poll: work that takes time, so a fast consumer
    cannot take everything before the others fetch.
    """

    def __init__(self, bootstrap: str, group: str, topic: str, *, name: str,
                 config: dict[str, object] | None = None, processing_s: float = 0.0) -> None:
        super().__init__(name=name, daemon=True)
        self.consumer = share_consumer(bootstrap, group, topic, config)
        self.processing_s = processing_s
        self.deliveries: list[Delivery] = []
        self.errors: list[str] = []
        self.polls = 0
        self._stop_requested = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_requested.is_set():
                messages = self.consumer.poll(0.2)
                self.polls += 1
                for message in messages:
                    if message.error() is not None:
                        self.errors.append(str(message.error()))
                        continue
                    self.deliveries.append(Delivery(message.value(), message.partition(), message.offset(),
                                                    message.delivery_count()))
                if messages and self.processing_s:
                    time.sleep(self.processing_s)
        except Exception as exc:  # noqa: BLE001 - reported by the test through `errors`
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            try:
                # librdkafka's close() does not accept the last poll's records in implicit mode
                # (its final ShareAcknowledge carries none), so they would be released and
                # delivered again: accept them first, as a clean shutdown would.
                self.consumer.commit_sync(30)
            except Exception as exc:  # noqa: BLE001 - reported by the test through `errors`
                self.errors.append(f"commit before close: {type(exc).__name__}: {exc}")
            self.consumer.close()

    def finish(self, timeout: float = 30.0) -> None:
        self._stop_requested.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not stop"


@contextlib.contextmanager
def consumer_threads(bootstrap: str, group: str, topic: str, count: int, *,
                     processing_s: float = 0.0, name: str = "consumer") -> Iterator[list[ConsumerThread]]:
    """`count` ConsumerThreads in `group`, started and reconciled on entry, finished on exit."""
    consumers = [ConsumerThread(bootstrap, group, topic, name=f"{name}-{i}", processing_s=processing_s)
                 for i in range(count)]
    for consumer in consumers:
        consumer.start()
    try:
        wait_for_assigned_members(bootstrap, group, count)
        yield consumers
    finally:
        for consumer in consumers:
            consumer.finish()


class AcknowledgingConsumer(threading.Thread):
    """Polls, accepts every record explicitly and commits synchronously after each poll, until stopped.

    The crash and outage tests record what happened through hooks:
    `on_delivery(message, polled_at)` sees each record before it is accepted;
    `on_acknowledged(offsets, error, sent_at)` is the acknowledgement-commit callback, `sent_at`
    being the earliest moment any of those acknowledgements could have been sent -- when
    `acknowledge()` was called (kept per record: librdkafka may send acknowledgements on a ShareFetch
    of its own before commit_sync, and runs the callback of a commit that failed at a disconnect
    during a later poll);
    `before_acknowledge(messages)`, if given, runs after each poll and may block to hold records.
    Poll, commit and per-message errors are kept in `errors` (transient while a proxy or broker is down).
    """

    def __init__(self, bootstrap: str, group: str, topic: str, *, name: str,
                 on_delivery: Callable[[Message, float], None],
                 on_acknowledged: Callable[[dict, KafkaException | None, float], None],
                 processing_s: float,
                 before_acknowledge: Callable[[list[Message]], None] | None = None,
                 config: dict[str, object] | None = None) -> None:
        super().__init__(name=name, daemon=True)
        self.on_delivery = on_delivery
        self.before_acknowledge = before_acknowledge
        self.processing_s = processing_s
        self.sent_at = time.monotonic()
        # (partition, offset) -> when the commit carrying its acknowledgement began; read by the callback.
        self._acknowledgement_sent_at: dict[tuple[int, int], float] = {}
        self.errors: list[str] = []
        self.consumer = share_consumer(bootstrap, group, topic, {**EXPLICIT, **(config or {})})
        self.consumer.set_acknowledgement_commit_callback(
            lambda offsets, error: on_acknowledged(offsets, error, self._first_sent_at(offsets)))
        self._stop_requested = threading.Event()

    def _first_sent_at(self, offsets: dict) -> float:
        records = [(tp.partition, offset) for tp, batch in offsets.items() for offset in batch]
        sent = [self._acknowledgement_sent_at.pop(record) for record in records
                if record in self._acknowledgement_sent_at]
        return min(sent, default=self.sent_at)

    def run(self) -> None:
        try:
            while not self._stop_requested.is_set():
                self.sent_at = time.monotonic()
                try:
                    messages = self.consumer.poll(0.5)
                except KafkaException as exc:
                    self.errors.append(f"{self.name} poll: {exc}")
                    continue
                polled_at = time.monotonic()
                if messages and self.before_acknowledge is not None:
                    self.before_acknowledge(messages)
                acknowledged = 0
                for message in messages:
                    if message.error() is not None:
                        self.errors.append(f"{self.name} message: {message.error()}")
                        continue
                    self.on_delivery(message, polled_at)
                    # The earliest the acknowledgement can leave: librdkafka may carry it on a
                    # ShareFetch of its own before commit_sync is called.
                    self._acknowledgement_sent_at.setdefault((message.partition(), message.offset()),
                                                             time.monotonic())
                    self.consumer.acknowledge(message)
                    acknowledged += 1
                if acknowledged:
                    time.sleep(self.processing_s)
                    self.sent_at = time.monotonic()
                    try:
                        self.consumer.commit_sync(30)
                    except KafkaException as exc:
                        # Not confirmed: the records come back once their acquisition ends.
                        self.errors.append(f"{self.name} commit: {exc}")
        finally:
            self.consumer.close()

    def finish(self, timeout: float = 30.0) -> None:
        self._stop_requested.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not stop"


def wait_until(predicate: Callable[[], bool], timeout: float, what: str | Callable[[], str],
               interval: float = 0.05) -> None:
    """Poll `predicate`; `what` (or what it returns, evaluated on timeout) names the wait."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


# ----- ShareGroupDescribe through the proxy --------------------------------------------------


@contextlib.asynccontextmanager
async def wire_client(bootstrap: str, client_id: str = "share-integration-test"):
    """A Kafka-protocol client on `bootstrap` speaking the project's own codec, closed afterwards."""
    stream = await open_upstream(parse_host_port(bootstrap), timeout=10, max_frame_size=1 << 24)
    client = UpstreamClient(stream, client_id=client_id)
    try:
        yield client
    finally:
        await client.aclose()


async def wire_call(bootstrap: str, request, response_type: type | None = None):
    """One request on a fresh connection; `response_type` for the extension RPCs (see UpstreamClient.call)."""
    async with wire_client(bootstrap) as client:
        return await client.call(request, response_type)


def describe_share_group(bootstrap: str, group: str):
    """The proxy's ShareGroupDescribe (v1) answer for `group` (a kio DescribedGroup)."""
    request = load_request_schema(77, 1)(group_ids=(group,), include_authorized_operations=False)
    return trio.run(wire_call, bootstrap, request).groups[0]


def wait_for_assigned_members(bootstrap: str, group: str, count: int, timeout: float = 30.0):
    """Wait until `group` has `count` members, each reconciled and assigned at least one partition.

    A share member takes its new assignment on its next heartbeat (no revocation step), so right
    after a join an older member can still hold partitions the target gave to the newcomer.
    "Reconciled" means every member is at the group's assignment epoch: the assignments then
    are the target's, as describe tools show them.
    """
    described = None

    def ready() -> bool:
        nonlocal described
        described = describe_share_group(bootstrap, group)
        members = described.members or ()
        return len(members) == count and all(
            m.member_epoch == described.assignment_epoch
            and any(t.partitions for t in m.assignment.topic_partitions)
            for m in members
        )

    wait_until(ready, timeout, f"{count} assigned members in {group}", interval=0.2)
    return described


# ----- the durable share state, read back ------------------------------------------------------


def state_topic_partitions(bootstrap: str, state_topic: str) -> int:
    """The state topic's partition count: replay judges each record against its home partition
    (layout 2), so a migrated topic's leftover copies and their tombstones are folded correctly."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(state_topic, timeout=10)
    return len(metadata.topics[state_topic].partitions)


def durable_state(bootstrap: str, state_topic: str, group: str) -> dict[int, PartitionSnapshot]:
    """What a restarted proxy would rebuild for `group` from the state topic: partition -> snapshot.

    Rebuilt through the engine, as a restart does: a snapshot written when an acknowledgement was
    staged has the finished records at its head and the SPSO before them (the SPSO moves in
    memory once the write is durable, and is written with the partition's next change)."""
    recovered = recover(replay_state_topic(bootstrap, state_topic, timeout_s=20),
                        partitions=state_topic_partitions(bootstrap, state_topic))
    return {
        key[2]: SharePartition.from_persisted(PartitionConfig(), found.snapshot, found.updates).snapshot()
        for key, found in recovered.partitions.items() if key[0] == group
    }


def finished_durably(bootstrap: str, state_topic: str, group: str, ends: dict[int, int]) -> bool:
    """True when every partition's durable SPSO is at its log end (`ends`) with nothing in flight."""
    state = durable_state(bootstrap, state_topic, group)
    return all(p in state and state[p].start_offset == end and not state[p].state_batches
               for p, end in ends.items())


# ----- the proxy's Prometheus metrics --------------------------------------------------------


def scrape_metrics(port: int, host: str = "127.0.0.1") -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """One scrape of `share-proxy serve --metrics-port PORT`: (sample name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def metric(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    """The value of sample `name` with exactly `labels` in a scrape, None when absent."""
    return samples.get((name, frozenset(labels.items())))


# ----- a share-group member speaking the protocol by hand ------------------------------------

SHARE_GROUP_HEARTBEAT_KEY, SHARE_FETCH_KEY, SHARE_ACKNOWLEDGE_KEY = 76, 78, 79
ACK_ACCEPT, ACK_RELEASE = 1, 2


class WireMember:
    """A share-group member built from kio requests over real sockets to the proxy.

    Two connections: `session` carries ShareFetch/ShareAcknowledge (a share session belongs to
    its connection), `control` carries heartbeats, so `keep_alive()` can run beside them. The
    session epoch is tracked: each call without a top-level error moves it on, as a client does.
    """

    def __init__(self, bootstrap: str, group: str, member_id: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.member_id = member_id or uuid.uuid4().hex[:22]
        self.member_epoch = 0
        self.session_epoch = 0
        self.session: UpstreamClient | None = None
        self.control: UpstreamClient | None = None
        self._control_lock = trio.Lock()

    async def connect(self) -> WireMember:
        for role in ("session", "control"):
            stream = await open_upstream(parse_host_port(self.bootstrap), timeout=10, max_frame_size=1 << 24)
            setattr(self, role, UpstreamClient(stream, client_id=f"wire-member-{role}"))
        return self

    async def aclose(self) -> None:
        for client in (self.session, self.control):
            if client is not None:
                with trio.move_on_after(5, shield=True):
                    await client.aclose()

    async def heartbeat(self, topics: tuple[str, ...] | None = None, *, epoch: int | None = None):
        request = load_request_schema(SHARE_GROUP_HEARTBEAT_KEY, 1)(
            group_id=self.group, member_id=self.member_id,
            member_epoch=self.member_epoch if epoch is None else epoch, rack_id=None,
            subscribed_topic_names=topics)
        assert self.control is not None
        async with self._control_lock:
            response = await self.control.call(request)
        if int(response.error_code) == 0:
            self.member_epoch = int(response.member_epoch)
        return response

    async def join(self, topic: str, timeout: float = 30.0):
        """Join with a subscription to `topic`; returns its topic id once a partition is assigned."""
        response = await self.heartbeat((topic,), epoch=0)
        assert int(response.error_code) == 0, response
        with trio.fail_after(timeout):
            while not (response.assignment and response.assignment.topic_partitions):
                await trio.sleep(0.2)
                response = await self.heartbeat()
                assert int(response.error_code) == 0, response
        return response.assignment.topic_partitions[0].topic_id

    async def keep_alive(self, interval_s: float = 1.0) -> None:
        """Heartbeat until cancelled (share heartbeats are served by the proxy, broker or not)."""
        while True:
            await trio.sleep(interval_s)
            await self.heartbeat()

    def _next_epoch(self, response, epoch: int | None) -> None:
        if epoch is None and int(response.error_code) == 0:
            self.session_epoch += 1

    async def fetch(self, topic_id, *, partition: int = 0, acks=(), max_records: int = 10, max_wait_ms: int = 500,
                    epoch: int | None = None, member_id: str | None = None, group: str | None = None,
                    no_partitions: bool = False):
        """ShareFetch v2 for one partition (for none with `no_partitions`, as a final fetch must be);
        `acks` are (first, last, type) triples."""
        schema = load_request_schema(SHARE_FETCH_KEY, 2)
        module = sys.modules[schema.__module__]
        request = schema(
            group_id=group or self.group, member_id=member_id or self.member_id,
            share_session_epoch=self.session_epoch if epoch is None else epoch,
            max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1, max_bytes=1 << 20,
            max_records=max_records, batch_size=max_records, share_acquire_mode=0, is_renew_ack=False,
            topics=() if no_partitions else (module.FetchTopic(topic_id=topic_id, partitions=(module.FetchPartition(
                partition_index=partition,
                acknowledgement_batches=tuple(
                    module.AcknowledgementBatch(first_offset=first, last_offset=last, acknowledge_types=(kind,))
                    for first, last, kind in acks)),)),),
            forgotten_topics_data=(),
        )
        assert self.session is not None
        response = await self.session.call(request)
        self._next_epoch(response, epoch)
        return response

    async def acknowledge(self, topic_id, acks, *, partition: int = 0, epoch: int | None = None,
                          member_id: str | None = None, group: str | None = None):
        """ShareAcknowledge v2 for one partition; `acks` are (first, last, type) triples."""
        schema = load_request_schema(SHARE_ACKNOWLEDGE_KEY, 2)
        module = sys.modules[schema.__module__]
        request = schema(
            group_id=group or self.group, member_id=member_id or self.member_id,
            share_session_epoch=self.session_epoch if epoch is None else epoch, is_renew_ack=False,
            topics=(module.AcknowledgeTopic(topic_id=topic_id, partitions=(module.AcknowledgePartition(
                partition_index=partition,
                acknowledgement_batches=tuple(
                    module.AcknowledgementBatch(first_offset=first, last_offset=last, acknowledge_types=(kind,))
                    for first, last, kind in acks)),)),),
        )
        assert self.session is not None
        response = await self.session.call(request)
        self._next_epoch(response, epoch)
        return response


def only_partition(response):
    """The single partition answer of a one-partition ShareFetch/ShareAcknowledge response."""
    [topic] = response.responses
    [partition] = topic.partitions
    return partition


def acquired_offsets(response) -> set[int]:
    """Offsets a one-partition ShareFetch response acquired (empty when it has no partition answer)."""
    return {offset for topic in response.responses for partition in topic.partitions
            for batch in partition.acquired_records
            for offset in range(int(batch.first_offset), int(batch.last_offset) + 1)}
