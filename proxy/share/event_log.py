"""The share-group event log publisher (docs/event-log.md).

Theory of operation
-------------------
Compacted share state forgets history; the event log keeps it. :class:`EventLog` subscribes to
the commit pipeline's change hook and hears ``Change.events`` -- the events that are *settled*
(an unstaged change when recorded, a staged acknowledgement when its write commits, ACQUIRED
events when records are handed out). The hook appends the change's events, as they are, with the
wall clock of that moment to its share-partition's buffer and returns: O(1) (O(events) only when
the bound cuts a change), no I/O, never raises into a commit. It runs inside every commit, so it
builds nothing per event: per-event work there cost ~12% of acknowledgement throughput when events do not
merge (docs/benchmarks.md).

A trio task flushes every ``linger_ms``: per share-partition it merges adjacent events that
differ only in their offsets (same kind, member, count, reason and millisecond) and encodes them
into one event-topic record (split when very long), key and value from :mod:`codec.share_events`,
handed to a confluent-kafka producer of its own (acks=all, idempotent) whose deliveries a poller
thread reports back to trio.

Bounded: at most ``buffer_events`` events are held, in the buffer (as heard, before merging) and
in the producer's queue (after merging) together. Past that, new events are dropped and counted
(``reason="buffer_full"``); records the producer gives up on (``message.timeout.ms``) are counted
as ``reason="delivery_failed"``.
Nothing here can block or fail an acknowledgement or a state write: state durability never
depends on the event log.

Loss bound under kill -9: an event is in the buffer at most ``linger_ms`` plus one flush, then in
the producer until the broker acknowledges it; events whose record was acknowledged survive. So
events of changes settled more than ``linger_ms`` + the producer's delivery time (time to the
broker's acknowledgement) before the kill are all present.

The topic is created at start-up when missing (cleanup.policy=delete, the configured
retention.ms and partitions, the broker's default replication). Until it exists (or is found),
nothing is produced -- so a broker with auto-creation never creates it with other configs --
and creation is retried in the background; the proxy runs on regardless.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog
import trio
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from codec.errors import CodecError
from codec.share_events import encode_event_key, encode_event_rows
from proxy.share.commit import Change
from proxy.share.metrics import EVENTS_BUFFERED, EVENTS_DROPPED, EVENTS_PUBLISHED
from proxy.share.leaders import SharePartitionKey
from proxy.share.partition import RecordEvent

log = structlog.get_logger(__name__)

# Events per event-topic record at most: ~40-100 bytes each keeps a record far below Kafka's
# default 1 MB max.message.bytes.
MAX_EVENTS_PER_RECORD = 5_000
DEFAULT_TOPIC = "__share_group_events"


@dataclass(frozen=True, slots=True)
class EventLogSettings:
    topic: str = DEFAULT_TOPIC
    buffer_events: int = 100_000
    linger_ms: int = 100
    retention_ms: int = 604_800_000
    partitions: int = 1
    # The producer's message.timeout.ms: a record not acknowledged by then counts as delivery_failed.
    delivery_timeout_ms: int = 30_000


class EventSink:
    """A confluent-kafka producer for the event topic, driven from trio (as persister.StateLogWriter).

    ``produce`` never waits: ``on_done(error or None)`` is called in trio when the broker
    acknowledged the record or the producer gave up on it."""

    def __init__(self, bootstrap: str, *, delivery_timeout_ms: int,
                 client_config: Mapping[str, object] | None = None) -> None:
        self._config: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,  # the event log lingers itself; this only groups one flush's records
            "message.timeout.ms": delivery_timeout_ms,
            "compression.type": "lz4",
            # Java's partitioner, so Kafka tools agree on where a share-partition's events go.
            "partitioner": "murmur2_random",
            "error_cb": self._on_error,
            **(client_config or {}),
        }
        self._producer = Producer(self._config)
        self._token: trio.lowlevel.TrioToken | None = None
        self._stopping = threading.Event()
        self._poller: threading.Thread | None = None
        self._fatal: str | None = None

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._fatal = f"{error.name()}: {error.str()}"

    def start(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._poller = threading.Thread(target=self._poll_loop, name="event-log-poller", daemon=True)
        self._poller.start()

    def _poll_loop(self) -> None:
        while not self._stopping.is_set():
            self._producer.poll(0.05)

    def produce(self, topic: str, key: bytes, value: bytes, on_done: Callable[[str | None], None]) -> bool:
        """Queue one record; False when the producer refuses it now (its queue is full)."""
        if self._fatal is not None:
            # An idempotent producer that failed fatally never writes again, and one that timed
            # a record out may not for minutes (the state writer's note in persister.py): replace it.
            log.error("replacing the event-log producer", reason=self._fatal)
            old, self._producer, self._fatal = self._producer, Producer(self._config), None
            old.purge()  # its queued records fail with _PURGE_QUEUE: counted as delivery_failed
            old.flush(0)
        token = self._token
        assert token is not None, "EventSink.start() was not called"

        def delivered(err: KafkaError | None, _msg: object) -> None:  # the poller thread
            if err is not None and err.code() == KafkaError._MSG_TIMED_OUT and self._fatal is None:
                self._fatal = f"{err.name()}: {err.str()}"
            token.run_sync_soon(on_done, None if err is None else f"{err.name()}: {err.str()}")

        try:
            self._producer.produce(topic, key=key, value=value, on_delivery=delivered)
        except BufferError:
            return False
        except KafkaException as exc:
            token.run_sync_soon(on_done, str(exc))
        return True

    async def aclose(self, timeout_s: float) -> None:
        await trio.to_thread.run_sync(self._producer.flush, timeout_s)
        self._stopping.set()
        if self._poller is not None:
            await trio.to_thread.run_sync(self._poller.join, timeout_s)


def ensure_event_topic(bootstrap: str, settings: EventLogSettings, *, timeout_s: float = 30.0,
                       client_config: Mapping[str, object] | None = None) -> bool:
    """Create the event topic if missing; True if it was created. An existing one is left as it is.
    Blocking: call from a worker thread. Raises KafkaException when the cluster refuses.
    `client_config`: extra librdkafka properties (the upstream security settings)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(client_config or {})})
    if settings.topic in admin.list_topics(timeout=timeout_s).topics:
        return False
    topic = NewTopic(settings.topic, num_partitions=settings.partitions, replication_factor=-1,
                     config={"cleanup.policy": "delete", "retention.ms": str(settings.retention_ms)})
    try:
        admin.create_topics([topic], operation_timeout=timeout_s)[settings.topic].result(timeout=timeout_s)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise
    return True


def merged_rows(heard: list[tuple[int, tuple[RecordEvent, ...]]]) -> list[list]:
    """The events as encode_event_rows rows, stamped with when they were heard, each merged into the
    previous one when it continues its offsets and nothing else differs."""
    rows: list[list] = []
    last: list | None = None
    for now, events in heard:
        for event in events:
            if last is not None and last[2] + 1 == event.first_offset and last[6] == now \
                    and last[0] is event.kind and last[3] == event.member_id \
                    and last[4] == event.delivery_count and last[5] is event.reason:
                last[2] = event.last_offset
                continue
            last = [event.kind, event.first_offset, event.last_offset, event.member_id, event.delivery_count,
                    event.reason, now]
            rows.append(last)
    return rows


class EventLog:
    """Buffers settled share-group events and publishes them to the event topic (module doc)."""

    def __init__(
        self,
        sink,
        settings: EventLogSettings,
        *,
        topic_name: Callable[[uuid.UUID], str | None],
        wall_clock: Callable[[], int],
        ensure_topic: Callable[[], object] | None = None,
    ) -> None:
        self._sink = sink
        self.settings = settings
        self._topic_name = topic_name
        self._wall_clock = wall_clock
        self._ensure_topic = ensure_topic
        # Per share-partition: (wall-clock ms when heard, the change's events) in the order heard.
        self._buffer: dict[SharePartitionKey, list[tuple[int, tuple[RecordEvent, ...]]]] = {}
        self._buffered = 0  # events in _buffer, as heard (before merging)
        self._in_producer = 0  # events in records the producer has not settled
        self.topic_ready = ensure_topic is None
        self._topic_ready_event = trio.Event()
        if self.topic_ready:
            self._topic_ready_event.set()

    # ----- the change hook (synchronous, O(1) per change) ------------------------------------

    @property
    def held(self) -> int:
        return self._buffered + self._in_producer

    def on_change(self, change: Change) -> None:
        events = change.events
        if not events:
            return
        room = self.settings.buffer_events - self._buffered - self._in_producer
        if room < len(events):
            dropped = len(events) - max(room, 0)
            EVENTS_DROPPED.labels(reason="buffer_full").inc(dropped)
            events = events[: max(room, 0)]
            if not events:
                return
        pending = self._buffer.get(change.key)
        if pending is None:
            pending = self._buffer[change.key] = []
        pending.append((self._wall_clock(), events))
        self._buffered += len(events)
        EVENTS_BUFFERED.set(self.held)

    # ----- the flush task ------------------------------------------------------------------

    async def run(self) -> None:
        """Flush every linger_ms, forever (supervised by the caller)."""
        await self._topic_ready_event.wait()
        while True:
            await trio.sleep(self.settings.linger_ms / 1000)
            await self.flush_once()

    async def ensure_topic_task(self) -> None:
        """Create (or find) the event topic, retrying with backoff; then flushing may start."""
        delay = 0.5
        while not self.topic_ready:
            try:
                created = await trio.to_thread.run_sync(self._ensure_topic, abandon_on_cancel=True)
            except Exception as exc:  # noqa: BLE001 - any confluent-kafka error: retried, never fatal
                log.error("event topic not created yet; retrying", topic=self.settings.topic, error=str(exc),
                          retry_in_s=delay)
                await trio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            if created:
                log.info("event topic created", topic=self.settings.topic, partitions=self.settings.partitions,
                         retention_ms=self.settings.retention_ms)
            self.topic_ready = True
            self._topic_ready_event.set()

    async def flush_once(self) -> int:
        """Hand every buffered share-partition's events to the producer; returns records produced."""
        if not self._buffer:
            return 0
        buffer, self._buffer = self._buffer, {}
        records = 0
        for key, heard in buffer.items():
            self._buffered -= sum(len(events) for _, events in heard)
            group_id, topic_id, partition = key
            try:
                encoded_key = encode_event_key(group_id, topic_id, partition)
            except CodecError:
                log.error("event key not encodable; events dropped", key=str(key), exc_info=True)
                EVENTS_DROPPED.labels(reason="encode_failed").inc(sum(len(events) for _, events in heard))
                continue
            rows = merged_rows(heard)
            topic = self._topic_name(topic_id) or ""
            for start in range(0, len(rows), MAX_EVENTS_PER_RECORD):
                chunk = rows[start : start + MAX_EVENTS_PER_RECORD]
                try:
                    value = encode_event_rows(topic, chunk)
                except CodecError:
                    log.error("events not encodable; dropped", key=str(key), exc_info=True)
                    EVENTS_DROPPED.labels(reason="encode_failed").inc(len(chunk))
                    continue
                self._in_producer += len(chunk)
                if not self._sink.produce(self.settings.topic, encoded_key, value, self._settler(len(chunk))):
                    self._in_producer -= len(chunk)
                    EVENTS_DROPPED.labels(reason="buffer_full").inc(len(chunk))
                    continue
                records += 1
        EVENTS_BUFFERED.set(self.held)
        await trio.lowlevel.checkpoint()
        return records

    def _settler(self, count: int) -> Callable[[str | None], None]:
        def settle(error: str | None) -> None:
            self._in_producer -= count
            if error is None:
                EVENTS_PUBLISHED.inc(count)
            else:
                EVENTS_DROPPED.labels(reason="delivery_failed").inc(count)
                log.warning("event-log record not delivered; its events are dropped", events=count, error=error)
            EVENTS_BUFFERED.set(self.held)

        return settle

    async def hand_over(self, timeout_s: float = 5.0) -> bool:
        """Scale-out, share-partitions handed to another instance: publish what is buffered and wait
        (at most `timeout_s`) until the producer has settled everything, so a handed-over
        share-partition's events precede the new owner's on the event topic. False on time-out."""
        if not self.topic_ready:
            return True  # nothing can be produced yet; the buffer goes out once the topic exists
        await self.flush_once()
        with trio.move_on_after(timeout_s):
            while self._in_producer > 0:
                await trio.sleep(0.01)
            return True
        log.warning("event-log records of handed-over share-partitions not delivered in time; they may "
                    "follow the new owner's", pending_events=self._in_producer, timeout_s=timeout_s)
        return False

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Shutdown: hand over what is buffered (if the topic is there) and flush the producer."""
        if self.topic_ready:
            await self.flush_once()
        await self._sink.aclose(timeout_s)


__all__ = ["DEFAULT_TOPIC", "EventLog", "EventLogSettings", "EventSink", "ensure_event_topic"]
