"""Fenced state writes: one transactional producer ("lane") per state-topic partition.

Why (docs/scale-out.md, "Fencing and the commit pipeline"): the proxy writes its state topic
directly, so the only way to make sure a paused or duplicated instance can never overwrite the
state another instance now owns is to have the *broker* refuse its writes. A transactional
producer does exactly that: a new producer calling ``init_transactions`` with the same
``transactional.id`` aborts the old one's open transaction and makes every later write of the old
one fail with ``_FENCED``. The id of a lane is ``<prefix>.<state topic>.<partition>``: the same
whichever instance owns the partition, so taking a partition over fences whoever had it.

The order that makes it safe: :meth:`TransactionalStateWriter.fence` (``init_transactions`` on
every lane) runs **before** replay, and replay reads ``read_committed``. After the fence nothing an
earlier owner had open can commit, so what replay reads is everything any earlier owner ever
confirmed to a client.

Each :meth:`write` groups its records by partition (the same placement as
:class:`proxy.share.persister.StateLogWriter`) and runs one transaction per lane, the lanes side by
side in worker threads (the confluent-kafka calls block): begin, produce, commit (which flushes).
It succeeds only if every lane committed. A lane whose transaction failed but can go on is aborted
(or, if even that fails, replaced by a fresh producer whose ``init_transactions`` aborts it) and
the write raises :class:`PersistError`, as a failed idempotent write does; records of lanes that did
commit are idempotent to re-apply. A **fenced** lane raises :class:`StateFenced` on this and every
later write: another instance owns that partition now, and this one must not take it back.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence

import structlog
import trio
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from proxy.share import metrics
from proxy.share.persister import PersistError, StateRecord, route_partition

log = structlog.get_logger(__name__)

DEFAULT_TRANSACTIONAL_ID_PREFIX = "ksp-state"

# librdkafka reports a fenced transactional producer as _FENCED (fatal); the broker's own codes for
# it are PRODUCER_FENCED (KIP-588) and, from older brokers, INVALID_PRODUCER_EPOCH.
_FENCED_CODES = frozenset(
    code for code in (getattr(KafkaError, "_FENCED", None), getattr(KafkaError, "PRODUCER_FENCED", None),
                      getattr(KafkaError, "INVALID_PRODUCER_EPOCH", None)) if code is not None)


class StateFenced(PersistError):
    """Another producer took over a lane's transactional id: this instance no longer owns that
    state-topic partition and never writes to it again."""

    def __init__(self, topic: str, partition: int, detail: str) -> None:
        self.topic = topic
        self.partition = partition
        super().__init__(f"state partition {topic}-{partition} was fenced by another producer: {detail}")


def transactional_id(prefix: str, topic: str, partition: int) -> str:
    return f"{prefix}.{topic}.{partition}"


class _Lane:
    """One state partition's transactional producer; one transaction at a time."""

    __slots__ = ("topic", "partition", "transactional_id", "producer", "fenced", "lock", "owned")

    def __init__(self, topic: str, partition: int, transactional_id: str) -> None:
        self.topic = topic
        self.partition = partition
        self.transactional_id = transactional_id
        self.producer: Producer | None = None  # None until init_transactions succeeded
        self.fenced: str | None = None
        self.lock = trio.Lock()
        self.owned = False  # fence() took it over (what owned_only writers require)


class TransactionalStateWriter:
    """Same interface as persister.StateLogWriter; every write is fenced per state partition."""

    def __init__(
        self,
        bootstrap: str,
        *,
        transactional_id_prefix: str = DEFAULT_TRANSACTIONAL_ID_PREFIX,
        client_config: Mapping[str, str] | None = None,
        delivery_timeout_ms: int = 30_000,
        linger_ms: int = 0,
        producer_factory: Callable[[dict[str, object]], Producer] = Producer,
        partition_reader: Callable[[str], int] | None = None,
        owned_only: bool = False,
    ) -> None:
        self._bootstrap = bootstrap
        self._client_config = dict(client_config or {})
        self._prefix = transactional_id_prefix
        self._timeout_s = delivery_timeout_ms / 1000
        self._config: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            **self._client_config,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": linger_ms,
            "message.timeout.ms": delivery_timeout_ms,
            # A transaction the broker has not seen committed by then is aborted by it (a frozen
            # instance's open transaction, if nobody fences it first).
            "transaction.timeout.ms": max(60_000, delivery_timeout_ms * 2),
            "compression.type": "lz4",
        }
        self._producer_factory = producer_factory
        self._partition_reader = partition_reader or self._read_partitions
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._partition_counts: dict[str, int] = {}
        self._started = False
        # Scale-out: write only lanes fence() took over for this instance's owned partitions; a
        # write to any other fails instead of initialising its lane (which would fence its owner).
        self._owned_only = owned_only

    def start(self) -> None:
        self._started = True  # no poller: commit_transaction serves the delivery queue itself

    # ----- partitions and lanes ------------------------------------------------------------------

    def _read_partitions(self, topic: str) -> int:
        metadata = AdminClient({"bootstrap.servers": self._bootstrap, **self._client_config}).list_topics(
            topic, timeout=10.0)
        described = metadata.topics.get(topic)
        if described is None or described.error is not None or not described.partitions:
            raise PersistError(f"cannot read the partitions of {topic!r}: {described and described.error}")
        return len(described.partitions)

    async def partition_count(self, topic: str) -> int:
        count = self._partition_counts.get(topic)
        if count is None:
            try:
                count = await trio.to_thread.run_sync(self._partition_reader, topic, abandon_on_cancel=True)
            except KafkaException as exc:
                raise PersistError(f"cannot read the partitions of {topic!r}: {exc}") from exc
            self._partition_counts[topic] = count
        return count

    def _lane(self, topic: str, partition: int) -> _Lane:
        lane = self._lanes.get((topic, partition))
        if lane is None:
            lane = self._lanes[(topic, partition)] = _Lane(
                topic, partition, transactional_id(self._prefix, topic, partition))
        return lane

    async def _ready(self, lane: _Lane) -> Producer:
        """The lane's producer, initialised (which fences any earlier owner of its id)."""
        if lane.fenced is not None:
            raise StateFenced(lane.topic, lane.partition, lane.fenced)
        if lane.producer is None:
            config = {**self._config, "transactional.id": lane.transactional_id}
            producer = self._producer_factory(config)
            try:
                await trio.to_thread.run_sync(producer.init_transactions, self._timeout_s)
            except KafkaException as exc:
                raise PersistError(f"init_transactions for {lane.transactional_id} failed: {exc}") from exc
            lane.producer = producer
            log.info("state lane fenced earlier owners", transactional_id=lane.transactional_id)
        return lane.producer

    async def fence(self, topic: str, partitions: Iterable[int] | None = None) -> None:
        """Initialise the lanes of ``partitions`` (every partition of ``topic`` when None): each
        ``init_transactions`` aborts what an earlier owner had open and fences it. Call before replay."""
        if partitions is None:
            partitions = range(await self.partition_count(topic))
        lanes = [self._lane(topic, p) for p in partitions]
        errors: list[PersistError] = []

        async def one(lane: _Lane) -> None:
            async with lane.lock:
                lane.fenced = None  # (re)gained: whatever fenced it before is in the past
                try:
                    await self._ready(lane)
                    lane.owned = True
                except PersistError as error:
                    errors.append(error)

        async with trio.open_nursery() as nursery:
            for lane in lanes:
                nursery.start_soon(one, lane)
        if errors:
            raise errors[0]

    # ----- writes --------------------------------------------------------------------------------

    async def write(self, topic: str, records: Sequence[StateRecord]) -> None:
        """Append ``records`` durably, one transaction per state partition they go to."""
        if not self._started:
            raise RuntimeError("TransactionalStateWriter.start() was not called")
        if not records:
            return
        partitions = await self.partition_count(topic)
        by_partition: dict[int, list[tuple[bytes, bytes | None]]] = {}
        for record in records:
            if len(record) == 3:
                route = record[2]
                partition = route if isinstance(route, int) else route_partition(route, partitions)
            else:
                partition = zlib.crc32(record[0]) % partitions  # where librdkafka's partitioner puts the key
            if not 0 <= partition < partitions:
                raise PersistError(f"partition {partition} of {topic!r} does not exist ({partitions})")
            by_partition.setdefault(partition, []).append((record[0], record[1]))
        errors: list[PersistError] = []

        async def one(partition: int, batch: list[tuple[bytes, bytes | None]]) -> None:
            try:
                await self._transaction(self._lane(topic, partition), batch)
            except PersistError as error:
                errors.append(error)

        async with trio.open_nursery() as nursery:
            for partition, batch in by_partition.items():
                nursery.start_soon(one, partition, batch)
        if errors:  # the partition count stays the one learnt first (see StateLogWriter.write)
            raise next((e for e in errors if isinstance(e, StateFenced)), errors[0])

    def owns(self, topic: str, partition: int) -> bool:
        """Whether this writer holds ``partition``'s lane (fenced it over and not released it)."""
        lane = self._lanes.get((topic, partition))
        return lane is not None and lane.owned and lane.fenced is None

    async def release(self, topic: str, partitions: Iterable[int]) -> None:
        """Give lanes up (their partitions moved to another instance): no more writes through them;
        their producers are closed (an open transaction is aborted by the next owner's fence)."""
        for partition in partitions:
            lane = self._lanes.get((topic, partition))
            if lane is None:
                continue
            async with lane.lock:
                lane.owned = False
                producer, lane.producer = lane.producer, None
            if producer is not None:
                await trio.to_thread.run_sync(_discard, producer)

    async def _transaction(self, lane: _Lane, batch: list[tuple[bytes, bytes | None]]) -> None:
        async with lane.lock:
            if self._owned_only and not lane.owned and lane.fenced is None:
                raise PersistError(f"state partition {lane.topic}-{lane.partition} is not owned by this instance")
            producer = await self._ready(lane)
            try:
                await trio.to_thread.run_sync(_run_transaction, producer, lane.topic, lane.partition, batch,
                                              self._timeout_s)
            except KafkaException as exc:
                await self._failed(lane, producer, exc.args[0] if exc.args else None, exc)

    async def _failed(self, lane: _Lane, producer: Producer, error: KafkaError | None, exc: Exception) -> None:
        """Leave the lane ready for the next transaction (or fenced for good), then raise."""
        detail = f"{error.name()}: {error.str()}" if isinstance(error, KafkaError) else str(exc)
        if isinstance(error, KafkaError) and error.code() in _FENCED_CODES:
            lane.fenced, lane.producer = detail, None
            metrics.STATE_LANES_FENCED.inc()
            log.error("state partition fenced: another instance owns it now; this one stops writing it",
                      topic=lane.topic, partition=lane.partition, transactional_id=lane.transactional_id,
                      error=detail)
            await trio.to_thread.run_sync(_discard, producer)
            raise StateFenced(lane.topic, lane.partition, detail) from exc
        if isinstance(error, KafkaError) and not error.fatal():
            try:
                await trio.to_thread.run_sync(producer.abort_transaction, self._timeout_s)
                raise PersistError(f"state write to {lane.topic}-{lane.partition} failed: {detail}") from exc
            except KafkaException:
                pass  # cannot abort: a fresh producer's init_transactions aborts it instead (below)
        # Fatal, or not abortable: replace the producer (its init_transactions aborts what is open).
        lane.producer = None
        await trio.to_thread.run_sync(_discard, producer)
        log.warning("state lane replaced after a failed transaction", transactional_id=lane.transactional_id,
                    error=detail)
        raise PersistError(f"state write to {lane.topic}-{lane.partition} failed: {detail}") from exc

    async def aclose(self, timeout_s: float = 10.0) -> None:
        for lane in self._lanes.values():
            producer, lane.producer = lane.producer, None
            if producer is not None:
                await trio.to_thread.run_sync(producer.flush, timeout_s)


def _run_transaction(producer: Producer, topic: str, partition: int, batch: list[tuple[bytes, bytes | None]],
                     timeout_s: float) -> None:
    """One transaction (blocking; a worker thread): begin, produce every record, commit (flushes)."""
    producer.begin_transaction()
    for key, value in batch:
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=partition)
                break
            except BufferError:
                producer.poll(0.005)
    producer.commit_transaction(timeout_s)


def _discard(producer: Producer) -> None:
    try:
        producer.purge()
        producer.flush(0)
    except Exception:  # noqa: BLE001 - a fenced or broken producer is dropped whatever it says
        log.debug("discarding a state lane producer raised", exc_info=True)

