"""Durable share state on Kafka topics, written and replayed through confluent-kafka.

Theory of operation
-------------------
The proxy keeps share-partition state in memory and makes every change that must survive a
restart durable by appending a record to a state topic (``__share_proxy_state`` by default;
Kafka 4.x reserves ``__share_group_state`` for itself)
before it answers the client. The producer is idempotent with ``acks=all``; a write completes
only when the broker has acknowledged every record of it, and a failure is raised to the caller
(never a silent success), so the caller can answer the client with a retriable error.

librdkafka delivers acknowledgements through ``poll()``. A dedicated daemon thread polls, and
each delivery callback hands its result back to trio with ``TrioToken.run_sync_soon`` (which is
thread-safe), where it completes the waiting write. The trio side never blocks on the producer.

Replay reads every partition of a state topic from the beginning up to the high watermark seen
at start, in a worker thread, and yields the records in log order per partition as they are
read (the proxy folds them as they come, in that thread). The topics are
compacted, so replay cost is bounded by the number of live keys, not by history; this module
knows nothing of the record formats (bytes in, bytes out).
"""

from __future__ import annotations

import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import structlog
import trio
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from proxy.share import metrics

log = structlog.get_logger(__name__)


class PersistError(Exception):
    """A state write or replay did not complete; nothing may be reported as durable."""


DEFAULT_MAX_REPLICATION_FACTOR = 3
DEFAULT_MAX_MIN_INSYNC_REPLICAS = 2


def state_topic_replication(
    brokers: int, replication_factor: int | None = None, min_insync_replicas: int | None = None
) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) for a new state topic on a cluster of `brokers`.

    Unless configured: min(3, brokers) replicas and min.insync.replicas min(2, RF), as for
    Kafka's own internal topics in production (an acknowledged state write survives the loss
    of a broker). A configured value wins; min.insync.replicas follows the effective RF.
    """
    factor = replication_factor if replication_factor is not None else max(
        1, min(DEFAULT_MAX_REPLICATION_FACTOR, brokers))
    min_insync = min_insync_replicas if min_insync_replicas is not None else min(
        DEFAULT_MAX_MIN_INSYNC_REPLICAS, factor)
    return factor, min_insync


@dataclass(frozen=True, slots=True)
class StateTopicSpec:
    """A state topic the proxy owns, created on first start when missing.

    `replication_factor` / `min_insync_replicas` None: chosen from the broker count at creation
    (state_topic_replication).
    """

    name: str
    partitions: int = 3
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    # Compaction keeps the newest record per key; the writer's record layout makes the newest
    # snapshot plus the newest cumulative update per share-partition sufficient for recovery.
    configs: Mapping[str, str] = field(
        default_factory=lambda: {
            "cleanup.policy": "compact",
            "min.compaction.lag.ms": "0",
            "segment.bytes": str(64 * 1024 * 1024),
        }
    )


@dataclass(frozen=True, slots=True)
class ReplayedRecord:
    partition: int
    offset: int
    key: bytes
    value: bytes | None


def _client_config(bootstrap: str, extra: Mapping[str, str] | None) -> dict[str, object]:
    config: dict[str, object] = {"bootstrap.servers": bootstrap}
    config.update(extra or {})
    return config


def ensure_state_topics(
    bootstrap: str,
    specs: Sequence[StateTopicSpec],
    *,
    client_config: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Create missing state topics; refuse to run on one that is not compacted.

    A created topic gets the spec's replication (state_topic_replication when unset) and
    cleanup.policy=compact. An existing topic is never altered. Blocking: call from a worker thread.
    """
    admin = AdminClient(_client_config(bootstrap, client_config))
    metadata = admin.list_topics(timeout=timeout_s)
    existing = metadata.topics
    missing = [spec for spec in specs if spec.name not in existing]
    if missing:
        new_topics = []
        for spec in missing:
            factor, min_insync = state_topic_replication(
                len(metadata.brokers), spec.replication_factor, spec.min_insync_replicas
            )
            configs = {"min.insync.replicas": str(min_insync), **spec.configs}
            if spec.min_insync_replicas is not None:
                configs["min.insync.replicas"] = str(spec.min_insync_replicas)
            new_topics.append(
                NewTopic(spec.name, num_partitions=spec.partitions, replication_factor=factor, config=configs)
            )
        futures = admin.create_topics(new_topics, operation_timeout=timeout_s)
        created = {topic.topic: topic for topic in new_topics}
        for name, future in futures.items():
            try:
                future.result(timeout=timeout_s)
                log.info("state_topic_created", topic=name, partitions=created[name].num_partitions,
                         replication_factor=created[name].replication_factor,
                         min_insync_replicas=created[name].config["min.insync.replicas"])
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise PersistError(f"cannot create state topic {name!r}: {exc}") from exc
    for spec in specs:
        if spec.name in existing:
            resource = ConfigResource(ConfigResource.Type.TOPIC, spec.name)
            described = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
            policy = described["cleanup.policy"].value
            if "compact" not in policy:
                raise PersistError(
                    f"state topic {spec.name!r} has cleanup.policy={policy}; it must be compacted "
                    "or share state would be deleted by retention"
                )


def route_partition(route: bytes, partitions: int) -> int:
    """The partition librdkafka's default partitioner (``consistent_random``) gives a non-empty key:
    CRC-32 of its bytes (rd_crc32, the same polynomial as zlib's) modulo the partition count."""
    return zlib.crc32(route) % partitions


StateRecord = tuple[bytes, bytes | None] | tuple[bytes, bytes | None, bytes | int]


class Delivery:
    """The outcome of a submitted state write (:meth:`StateLogWriter.submit`)."""

    def __init__(self, topic: str, records: int) -> None:
        self._topic = topic
        self._outstanding = records
        self._errors: list[str] = []
        self._done = trio.Event()
        if records == 0:
            self._done.set()

    def settle(self, error: str | None) -> None:
        """One record's outcome (None: durable); called in trio."""
        self._outstanding -= 1
        if error is not None:
            self._errors.append(error)
        if self._outstanding == 0:
            self._done.set()

    async def wait(self) -> None:
        """Return once every record is durable; PersistError when any failed."""
        await self._done.wait()
        if self._errors:
            # The partition count stays the one learnt first: records are homed by it, and a topic
            # grown since is re-homed by the migration at the next start (state_layout.py), never
            # mid-run. (Learning it again after a failed write cost a 10 s metadata call per retry
            # through a broker outage.)
            raise PersistError(f"state write to {self._topic!r} failed: {self._errors[0]}")


class StateLogWriter:
    """Appends records to state topics; `write` returns only once they are durable.

    A record is (key, value-or-tombstone), placed by librdkafka's default partitioner, or (key,
    value, route): produced to :func:`route_partition` of ``route``, so records with different keys
    can share a partition (a share-partition's snapshot and update), or, when ``route`` is an int,
    to that partition (a layout migration's tombstones of copies left off their home). The
    partition count is read from metadata on the first routed write and again after a routed
    write fails.

    An idempotent producer that hits a *fatal* error (e.g. its producer id fenced, or sequence
    numbers out of sync after a long outage) can never write again; the writer then replaces it
    with a fresh producer before the next write, so the share service recovers without a restart.

    **Producers** (``--state-producers``): librdkafka sends one ProduceRequest per partition, and a
    broker works through one connection's requests one at a time, so a write touching several
    state partitions through one producer waits for each partition's request in turn. With
    ``producers`` > 1 each state partition is written by producer ``partition % producers`` (its
    own connection, its own poller thread), so the broker takes those requests at once; a
    partition is always written by the same producer, which keeps each partition's records in
    submission order. Records without a route are then placed by this writer as librdkafka's
    partitioner would (:func:`route_partition` of the key), so they too stay with their
    partition's producer.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        client_config: Mapping[str, str] | None = None,
        delivery_timeout_ms: int = 30_000,
        linger_ms: int = 0,
        producers: int = 1,
        producer_factory: Callable[[dict[str, object]], Producer] = Producer,
    ) -> None:
        if producers < 1:
            raise ValueError("a state writer needs at least one producer")
        config = _client_config(bootstrap, client_config)
        config.update(
            {
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": linger_ms,
                "message.timeout.ms": delivery_timeout_ms,
                "compression.type": "lz4",
                "error_cb": self._on_error,
            }
        )
        self._config = config
        self._producer_factory = producer_factory
        self._producers = [producer_factory(config) for _ in range(producers)]
        self._token: trio.lowlevel.TrioToken | None = None
        self._stopping = threading.Event()
        self._pollers: list[threading.Thread] = []
        self._fatal: str | None = None
        self.recreated = 0
        self._partition_counts: dict[str, int] = {}  # topic -> partitions, for routed records

    def _on_error(self, error: KafkaError) -> None:
        # librdkafka's client-level errors (poller thread); only fatal ones change anything.
        if error.fatal():
            self._fatal = f"state producer failed fatally: {error.name()}: {error.str()}"

    def _recreate_if_fatal(self) -> None:
        if self._fatal is None:
            return
        # Which producer failed is not known (librdkafka's error callback does not say): all are
        # replaced, their queued records failing so their writes are retried.
        log.error("replacing the state producer", reason=self._fatal, producers=len(self._producers))
        old, self._producers = self._producers, [self._producer_factory(self._config) for _ in self._producers]
        self._fatal = None
        self.recreated += 1
        metrics.STATE_PRODUCER_RECREATED.inc()
        for producer in old:
            try:
                producer.purge()  # its queued records fail with _PURGE_QUEUE: their writes report failure
                producer.flush(0)
            except Exception:  # noqa: BLE001 - a broken producer is dropped whatever it says
                log.warning("discarding the failed state producer raised", exc_info=True)

    def start(self) -> None:
        """Start delivering acknowledgements; call from inside trio."""
        self._token = trio.lowlevel.current_trio_token()
        for lane in range(len(self._producers)):
            poller = threading.Thread(target=self._poll_loop, args=(lane,), name=f"state-log-poller-{lane}",
                                      daemon=True)
            poller.start()
            self._pollers.append(poller)

    def _poll_loop(self, lane: int) -> None:
        while not self._stopping.is_set():
            self._producers[lane].poll(0.05)  # read each time: a fatal error replaces the producers

    async def partition_count(self, topic: str) -> int:
        """Partitions of `topic` (metadata, read once); PersistError if unknown."""
        count = self._partition_counts.get(topic)
        if count is not None:
            return count
        producer = self._producers[0]
        try:
            metadata = await trio.to_thread.run_sync(lambda: producer.list_topics(topic, timeout=10.0),
                                                     abandon_on_cancel=True)
        except KafkaException as exc:
            raise PersistError(f"cannot read the partitions of {topic!r}: {exc}") from exc
        described = metadata.topics.get(topic)
        if described is None or described.error is not None or not described.partitions:
            raise PersistError(f"cannot read the partitions of {topic!r}: {described and described.error}")
        count = self._partition_counts[topic] = len(described.partitions)
        return count

    async def write(self, topic: str, records: Sequence[StateRecord]) -> None:
        """Append `records` (key, value-or-tombstone[, route]) to `topic` and wait until all are durable.

        Raises PersistError when any record fails; the caller must treat the whole write as not
        done (records that did land are idempotent to re-apply on replay).
        """
        await (await self.submit(topic, records)).wait()

    async def submit(self, topic: str, records: Sequence[StateRecord]) -> Delivery:
        """Hand `records` to the producer; the returned :class:`Delivery` tells when they are durable.

        Records of writes submitted one after the other land in that order on each state partition
        (the producer is idempotent), whichever delivery completes first: the commit pipeline
        submits its writes in order and keeps several in flight.
        """
        if self._token is None:
            raise RuntimeError("StateLogWriter.start() was not called")
        self._recreate_if_fatal()
        delivery = Delivery(topic, len(records))
        if not records:
            return delivery
        lanes = len(self._producers)
        placed_here = lanes > 1 or any(len(record) == 3 for record in records)
        partitions = await self.partition_count(topic) if placed_here else 0
        token = self._token

        def on_delivery(err: KafkaError | None, _msg: object) -> None:
            # Runs on the poller thread: hand the outcome back to trio.
            message = None if err is None else f"{err.name()}: {err.str()}"
            if err is not None and err.fatal():
                self._fatal = f"state producer failed fatally: {message}"
            elif err is not None and err.code() == KafkaError._MSG_TIMED_OUT:
                # Seen against a restarted 3.9 broker: the idempotent producer timed out every
                # record for minutes after the broker was back (integration/share/test_broker_outage.py).
                # The write is retried anyway; a fresh producer (new connections, metadata, PID)
                # delivers as soon as the broker does.
                self._fatal = f"a state write timed out: {message}"
            token.run_sync_soon(delivery.settle, message)

        for record in records:
            key, value = record[0], record[1]
            partition = partition_of(record, partitions, lanes)
            if partition >= max(partitions, 1):
                delivery.settle(f"partition {partition} of {topic!r} does not exist ({partitions})")
                continue
            while True:
                producer = self._producers[max(partition, 0) % lanes]
                try:
                    if partition < 0:
                        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
                    else:
                        producer.produce(topic, key=key, value=value, partition=partition, on_delivery=on_delivery)
                    break
                except BufferError:
                    # librdkafka's queue is full: let the poller drain it, then retry.
                    await trio.sleep(0.005)
                except KafkaException as exc:
                    delivery.settle(str(exc))
                    break
        return delivery

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Flush what is queued (every producer at once: shutdown waits `timeout_s` at most), then
        stop the pollers."""
        async with trio.open_nursery() as nursery:
            for producer in self._producers:
                nursery.start_soon(trio.to_thread.run_sync, producer.flush, timeout_s)
        self._stopping.set()
        for poller in self._pollers:
            await trio.to_thread.run_sync(poller.join, timeout_s)


def partition_of(record: StateRecord, partitions: int, lanes: int = 1) -> int:
    """The partition `record` is produced to; -1 leaves it to librdkafka's partitioner, which only
    a single producer may do (with several, the partition picks the producer)."""
    if len(record) == 3:
        route = record[2]
        return route if isinstance(route, int) else route_partition(route, partitions)
    key = record[0]
    return route_partition(key, partitions) if lanes > 1 and key else -1


def replay_state_topic(
    bootstrap: str,
    topic: str,
    *,
    client_config: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    partitions: Iterable[int] | None = None,
) -> list[ReplayedRecord]:
    """Every record of `topic` (only ``partitions`` of it, when given) from the beginning to its
    current end, in log order per partition (:func:`read_state_topic`, held in a list: tools and
    tests; the proxy folds the records as they come instead).

    Blocking: call from a worker thread. Raises PersistError when the topic cannot be read to
    its end within `timeout_s` (serving from partial state would lose acknowledgements).
    """
    return list(read_state_topic(bootstrap, topic, client_config=client_config, timeout_s=timeout_s,
                                 partitions=partitions))


def read_state_topic(
    bootstrap: str,
    topic: str,
    *,
    client_config: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    partitions: Iterable[int] | None = None,
) -> Iterator[ReplayedRecord]:
    """The records of `topic` (only ``partitions`` of it, when given) from the beginning to the
    high watermarks seen at the start, yielded as they are read, in log order per partition: a
    caller that folds them holds its state, never the whole topic (a million records held at
    once cost ~600 B each at start-up; docs/benchmarks.md, "Replay folded as it reads").

    Blocking: iterate in a worker thread. Raises PersistError while iterating when the topic
    cannot be read to its end within `timeout_s`; the caller starts again with a fresh call.
    """
    config = _client_config(bootstrap, client_config)
    config.update(
        {
            # Only assign() is used: the group id is required by librdkafka but never joins.
            "group.id": f"share-proxy-replay-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "isolation.level": "read_committed",
            # Pre-fetch less than librdkafka's defaults (100,000 messages a partition, 64 MiB): the
            # fold cannot keep up with them anyway, and they were most of a replay's peak. A proxy
            # replaying a million state records peaked at 311-325 MiB (543 MiB with 16 MiB here),
            # its replay 16.4-18.0 s (docs/benchmarks.md, "Replay folded as it reads").
            "queued.min.messages": 10_000,
            "queued.max.messages.kbytes": 4_096,
        }
    )
    consumer = Consumer(config)
    try:
        yield from _replay(consumer, topic, timeout_s, None if partitions is None else set(partitions))
    except KafkaException as exc:
        # e.g. NOT_LEADER_FOR_PARTITION right after the topic was created: the caller retries.
        raise PersistError(f"replay of {topic!r} failed: {exc}") from exc
    finally:
        consumer.close()


def _replay(consumer: Consumer, topic: str, timeout_s: float, only: set[int] | None = None) -> Iterator[ReplayedRecord]:
    """Read `topic` from its start to the high watermarks seen now (see read_state_topic)."""
    metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if metadata is None or metadata.error is not None:
        raise PersistError(f"state topic {topic!r} is not readable: {metadata and metadata.error}")
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    for partition in metadata.partitions:
        if only is not None and partition not in only:
            continue
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=timeout_s
        )
        if high > low:
            starts[partition], ends[partition] = low, high
    if not ends:
        return
    consumer.assign([TopicPartition(topic, p, offset) for p, offset in starts.items()])
    remaining = dict(ends)
    deadline = time.monotonic() + timeout_s
    while remaining:
        if time.monotonic() > deadline:
            raise PersistError(f"replay of {topic!r} did not reach the end in {timeout_s}s")
        for message in consumer.consume(num_messages=10_000, timeout=0.5):
            if message.error() is not None:
                raise PersistError(f"replay of {topic!r} failed: {message.error()}")
            partition, offset = message.partition(), message.offset()
            if partition in remaining:
                yield ReplayedRecord(partition, offset, message.key() or b"", message.value())
                if offset + 1 >= remaining[partition]:
                    del remaining[partition]
        # Compaction can remove the records just below the high watermark; the consumer's
        # position then tells us we are past them without returning a message.
        for tp in consumer.position([TopicPartition(topic, p) for p in list(remaining)]):
            if tp.offset >= 0 and tp.offset >= remaining[tp.partition]:
                del remaining[tp.partition]

