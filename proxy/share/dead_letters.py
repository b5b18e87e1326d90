"""The dead-letter writer: KIP-1191 dead-letter queues for share groups (docs/dead-letters.md).

Theory of operation
-------------------
With ``errors.deadletterqueue.topic.name`` set on a group, the engine sends a rejected record, or
one archived at the delivery count limit, to ARCHIVING (persisted, the SPSO waits) instead of
ARCHIVED. This task finishes them, as Kafka's ShareGroupDLQStateManager does:

1. it hears of ARCHIVING records from the change hook (an ``ARCHIVING`` event settled), and at
   start-up (and every few seconds, a safety net) scans every leader with ``archiving_count > 0``
   -- so records left ARCHIVING by a restart are dead-lettered again;
2. it waits until the leader's state is durable (the ARCHIVING state must survive a crash
   before anything is written: the dead letter is then written at least once);
3. it checks the topic as Kafka does (name not empty, not ``__*``; an existing topic must carry
   ``errors.deadletterqueue.group.enable=true``; a missing one needs auto-create; the name must
   start with the prefix) -- a failed check is logged once per group/topic/reason, counted, and the
   records are archived regardless, as Kafka does;
4. it produces one record per offset (acks=all, idempotent; timestamp now; explicit partition =
   source partition mod the DLQ topic's partitions; Kafka's six ``__dlq.errors.*`` headers; the
   original key and value when ``errors.deadletterqueue.copy.record.enable`` is on and the record
   is still in the log), several offsets per round;
5. the offsets whose write succeeded go ARCHIVED through ``finish_archiving(dead_lettered=True)``,
   entered through the commit pipeline (``Cause.DEAD_LETTERED``).

Transient failures (broker down, timeouts, NOT_ENOUGH_REPLICAS, leader moves, the state write not
durable yet) are retried with capped exponential backoff for as long as the proxy runs: stricter
than Kafka, which gives up after a few retries, so nothing is lost. A produce error that no retry
can fix (authorisation, record too large) archives regardless, counted like a failed check.

Duplicates: a dead letter written whose ARCHIVED state was not yet durable when the proxy died is
written again after the restart (Kafka's window, too).

On a broker that does not know the topic config ``errors.deadletterqueue.group.enable`` (Kafka
3.9: DescribeConfigs does not list it, CreateTopics refuses it as unknown) the check is skipped and
auto-created topics are created without it; logged once.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog
import trio

from codec.batch_records import decode_records
from codec.errors import CodecError
from codec.share_events import DEAD_LETTER_MESSAGES, ArchiveReason, EventKind
from proxy.errors import UpstreamError
from proxy.share import metrics
from proxy.share.cluster import EARLIEST_TIMESTAMP, NONE, OFFSET_OUT_OF_RANGE, TopicInfo
from proxy.share.commit import Cause, Change
from proxy.share.leaders import Leader, SharePartitionKey
from proxy.share.partition import ArchivingRun
from proxy.share.persister import PersistError

log = structlog.get_logger(__name__)

# Kafka's header names (KIP-1191); values are UTF-8 strings.
HEADER_TOPIC = "__dlq.errors.topic"
HEADER_PARTITION = "__dlq.errors.partition"
HEADER_OFFSET = "__dlq.errors.offset"
HEADER_GROUP = "__dlq.errors.group"
HEADER_DELIVERY_COUNT = "__dlq.errors.delivery.count"
HEADER_MESSAGE = "__dlq.errors.message"

#: The topic config that marks a topic as a DLQ topic (Kafka 4.4's LogConfig).
DLQ_ENABLE_CONFIG = "errors.deadletterqueue.group.enable"

REASON_LABELS = {ArchiveReason.REJECTED: "rejected", ArchiveReason.DELIVERY_LIMIT: "delivery_limit"}


class TopicProblem(enum.Enum):
    """Why a group's records cannot be dead-lettered: (metrics label, Kafka's log message)."""

    NOT_CONFIGURED = ("not_configured", "Configured DLQ topic name in share group: {group} is empty.")
    INTERNAL_NAME = ("internal_topic_name",
                     "Configured DLQ topic name in share group: {group} cannot start with __, topic: {topic}.")
    NOT_ENABLED = ("topic_not_enabled",
                   "DLQ is not enabled on configured DLQ topic for share group: {group}, topic: {topic}.")
    MISSING = ("topic_missing",
               "DLQ topic does not exist and auto create is disabled on cluster for share group: {group}, "
               "topic: {topic}.")
    PREFIX = ("prefix_mismatch",
              "Configured DLQ topic name does not comply with the DLQ topic prefix in share group: {group}, "
              "topic: {topic}, prefix: {prefix}.")
    PRODUCE_REFUSED = ("produce_refused", "DLQ topic refused the records of share group: {group}, topic: {topic}.")

    @property
    def label(self) -> str:
        return self.value[0]

    def message(self, group: str, topic: str, prefix: str) -> str:
        return self.value[1].format(group=group, topic=topic, prefix=prefix)


@dataclass(frozen=True, slots=True)
class TopicFacts:
    """What the cluster says about a DLQ topic: whether it exists, its partitions, and its
    ``errors.deadletterqueue.group.enable`` (None: the broker does not know that config)."""

    exists: bool
    partitions: int = 0
    dlq_enabled: bool | None = None


def check_topic(topic: str, facts: TopicFacts, *, prefix: str, auto_create: bool) -> TopicProblem | None:
    """Kafka's write-time checks of a group's DLQ topic, in Kafka's order; None when it may be used."""
    if not topic:
        return TopicProblem.NOT_CONFIGURED
    if topic.startswith("__"):
        return TopicProblem.INTERNAL_NAME
    if facts.exists and facts.dlq_enabled is False:
        return TopicProblem.NOT_ENABLED
    if not facts.exists and not auto_create:
        return TopicProblem.MISSING
    if prefix and not topic.startswith(prefix):
        return TopicProblem.PREFIX
    return None


def dead_letter_reason(run: ArchivingRun, delivery_count_limit: int) -> ArchiveReason:
    """The run's reason; unknown (a state written without it) -> Kafka's rule from the count."""
    if run.reason in DEAD_LETTER_MESSAGES:
        return run.reason
    return ArchiveReason.DELIVERY_LIMIT if run.delivery_count >= delivery_count_limit else ArchiveReason.REJECTED


def dead_letter_headers(source_topic: str, partition: int, offset: int, group: str, delivery_count: int,
                        reason: ArchiveReason) -> list[tuple[str, bytes]]:
    """Kafka's six headers of one dead letter, in Kafka's order."""
    return [
        (HEADER_TOPIC, source_topic.encode()),
        (HEADER_PARTITION, str(partition).encode()),
        (HEADER_OFFSET, str(offset).encode()),
        (HEADER_GROUP, group.encode()),
        (HEADER_DELIVERY_COUNT, str(delivery_count).encode()),
        (HEADER_MESSAGE, DEAD_LETTER_MESSAGES[reason].encode()),
    ]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record for the DLQ topic (``offset``: the source offset it stands for)."""

    offset: int
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    reason: ArchiveReason


def dead_letters(group: str, source_topic: str, source_partition: int, runs: Iterable[ArchivingRun], *,
                 dlq_partitions: int, delivery_count_limit: int,
                 originals: Mapping[int, tuple[bytes | None, bytes | None]]) -> list[DeadLetter]:
    """The dead letters for `runs`, offset by offset; `originals` has (key, value) of the offsets to copy."""
    partition = source_partition % dlq_partitions
    out = []
    for run in runs:
        reason = dead_letter_reason(run, delivery_count_limit)
        for offset in range(run.first_offset, run.last_offset + 1):
            key, value = originals.get(offset, (None, None))
            out.append(DeadLetter(offset, partition, key, value,
                                  dead_letter_headers(source_topic, source_partition, offset, group,
                                                      run.delivery_count, reason), reason))
    return out


def offset_ranges(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted offsets -> contiguous (first, last) ranges."""
    ranges: list[tuple[int, int]] = []
    for offset in sorted(offsets):
        if ranges and ranges[-1][1] + 1 == offset:
            ranges[-1] = (ranges[-1][0], offset)
        else:
            ranges.append((offset, offset))
    return ranges


# ----- the cluster side: topic facts, creation, producing ---------------------------------------

class TransientError(Exception):
    """Worth retrying later (the cluster or the state topic is not there yet)."""


# librdkafka error codes after which a later attempt may succeed (besides those it marks retriable).
_TRANSIENT_PRODUCE_ERRORS = frozenset({
    "_MSG_TIMED_OUT", "_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_PURGE_QUEUE", "_PURGE_INFLIGHT",
    "_FATAL", "_UNKNOWN_PARTITION", "_UNKNOWN_TOPIC", "UNKNOWN_TOPIC_OR_PART", "NOT_ENOUGH_REPLICAS",
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "REQUEST_TIMED_OUT",
    "NETWORK_EXCEPTION", "KAFKA_STORAGE_ERROR", "_DESTROY", "OUT_OF_ORDER_SEQUENCE_NUMBER",
    "UNKNOWN_PRODUCER_ID", "INVALID_PRODUCER_EPOCH",
})


class DeadLetterCluster:
    """Topic configs, topic creation and the DLQ producer, over confluent-kafka.

    The blocking AdminClient calls run in worker threads; a topic's config is cached for
    `config_ttl_s` (a topic marked later is seen within it). The producer is idempotent with
    acks=all, polled on a daemon thread whose delivery callbacks hand results back to trio.
    """

    def __init__(self, bootstrap: str, *, delivery_timeout_ms: int = 30_000, config_ttl_s: float = 10.0,
                 timeout_s: float = 15.0, client_config: dict[str, str] | None = None) -> None:
        self._bootstrap = bootstrap
        # Extra librdkafka properties for the admin client and the producer (upstream security).
        self._client_config = dict(client_config or {})
        self._delivery_timeout_ms = delivery_timeout_ms
        self._config_ttl_s = config_ttl_s
        self._timeout_s = timeout_s
        self._admin = None
        self._producer = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._fatal = False
        self._poller = None
        self._stopping = None
        self._enabled_cache: dict[str, tuple[float, bool | None]] = {}
        self.broker_knows_dlq_config: bool | None = None

    # ----- lifecycle (inside trio) -----

    def start(self) -> None:
        import threading

        from confluent_kafka.admin import AdminClient

        self._admin = AdminClient({"bootstrap.servers": self._bootstrap, **self._client_config})
        self._token = trio.lowlevel.current_trio_token()
        self._producer = self._new_producer()
        self._stopping = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="dead-letter-poller", daemon=True)
        self._poller.start()

    def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    def _new_producer(self):
        from confluent_kafka import Producer

        return Producer({
            "bootstrap.servers": self._bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": self._delivery_timeout_ms,
            "error_cb": self._on_error,
            **self._client_config,
        })

    def _on_error(self, error) -> None:
        if error.fatal():
            self._fatal = True

    def _poll_loop(self) -> None:
        while not self._stopping.is_set():
            producer = self._producer
            producer.poll(0.05)

    # ----- topic facts -----

    async def dlq_enabled(self, topic: str) -> bool | None:
        """The topic's ``errors.deadletterqueue.group.enable`` (None: the broker has no such config)."""
        cached = self._enabled_cache.get(topic)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self._config_ttl_s:
            return cached[1]
        enabled = await trio.to_thread.run_sync(self._describe_enabled, topic, abandon_on_cancel=True)
        self._enabled_cache[topic] = (now, enabled)
        return enabled

    def _describe_enabled(self, topic: str) -> bool | None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import ConfigResource

        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        try:
            described = self._admin.describe_configs([resource])[resource].result(timeout=self._timeout_s)
        except KafkaException as exc:
            raise TransientError(f"describe configs of {topic}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - a timeout or a closed client: try again later
            raise TransientError(f"describe configs of {topic}: {exc!r}") from exc
        entry = described.get(DLQ_ENABLE_CONFIG)
        if entry is None:
            self._note_broker_knows(False)
            return None
        self._note_broker_knows(True)
        return str(entry.value).strip().lower() == "true"

    def _note_broker_knows(self, knows: bool) -> None:
        if self.broker_knows_dlq_config is None and not knows:
            log.warning("the Kafka cluster has no topic config errors.deadletterqueue.group.enable (before 4.4): "
                        "DLQ topics cannot be marked, the check is skipped and auto-created DLQ topics are created "
                        "without it")
        self.broker_knows_dlq_config = knows

    async def create_topic(self, topic: str) -> None:
        """Create a DLQ topic with the broker's default partitions and replication, marked as a DLQ
        topic (where the broker knows the config) with CreateTime timestamps, as Kafka does."""
        await trio.to_thread.run_sync(self._create_topic, topic, abandon_on_cancel=True)
        self._enabled_cache.pop(topic, None)

    def _create_topic(self, topic: str) -> None:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic

        configs = {"message.timestamp.type": "CreateTime"}
        if self.broker_knows_dlq_config is not False:
            configs[DLQ_ENABLE_CONFIG] = "true"
        while True:
            future = self._admin.create_topics([NewTopic(topic, num_partitions=-1, replication_factor=-1,
                                                         config=configs)])[topic]
            try:
                future.result(timeout=self._timeout_s)
                log.info("dead-letter topic created", topic=topic, configs=configs)
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    return
                if (error.code() == KafkaError.INVALID_CONFIG and DLQ_ENABLE_CONFIG in configs
                        and DLQ_ENABLE_CONFIG in error.str()):
                    # Kafka before 4.4: "Unknown topic config name: errors.deadletterqueue.group.enable".
                    self._note_broker_knows(False)
                    del configs[DLQ_ENABLE_CONFIG]
                    continue
                raise TransientError(f"cannot create DLQ topic {topic}: {error.str()}") from exc
            except Exception as exc:  # noqa: BLE001
                raise TransientError(f"cannot create DLQ topic {topic}: {exc!r}") from exc

    # ----- producing -----

    async def produce(self, topic: str, letters: Sequence[DeadLetter]) -> list[str | None]:
        """Write `letters`; per letter None when durable, else the librdkafka error name."""
        from confluent_kafka import KafkaException

        if self._fatal:
            # An idempotent producer that failed fatally never writes again: replace it.
            old, self._producer, self._fatal = self._producer, self._new_producer(), False
            log.error("dead-letter producer replaced after a fatal error")
            try:
                old.purge()
                old.flush(0)
            except Exception:  # noqa: BLE001
                pass
        results: list[str | None] = [None] * len(letters)
        outstanding = len(letters)
        done = trio.Event()
        token = self._token

        def settle(index: int, error: str | None) -> None:
            nonlocal outstanding
            results[index] = error
            outstanding -= 1
            if outstanding == 0:
                done.set()

        def on_delivery_for(index: int):
            def on_delivery(err, _msg) -> None:
                if err is not None and err.fatal():
                    self._fatal = True
                token.run_sync_soon(settle, index, None if err is None else err.name())
            return on_delivery

        now_ms = time.time_ns() // 1_000_000
        for index, letter in enumerate(letters):
            while True:
                try:
                    self._producer.produce(topic, value=letter.value, key=letter.key, partition=letter.partition,
                                           headers=letter.headers, timestamp=now_ms,
                                           on_delivery=on_delivery_for(index))
                    break
                except BufferError:
                    await trio.sleep(0.005)  # the local queue is full: the poller drains it
                except KafkaException as exc:
                    token.run_sync_soon(settle, index, exc.args[0].name())
                    break
        if letters:
            await done.wait()
        return results


def is_transient(error: str) -> bool:
    return error in _TRANSIENT_PRODUCE_ERRORS


# ----- the writer task --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class DeadLetterSettings:
    auto_create_topics: bool = False  # errors.deadletterqueue.auto.create.topics.enable
    topic_name_prefix: str = "dlq."  # errors.deadletterqueue.topic.name.prefix
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    scan_interval_s: float = 5.0  # the safety-net scan for ARCHIVING records nobody announced
    max_letters_per_round: int = 500
    max_copy_fetch_bytes: int = 8 * 1024 * 1024


class DeadLetterWriter:
    """Finishes ARCHIVING records: writes their dead letters, then archives them (module doc)."""

    def __init__(self, service, cluster: DeadLetterCluster, settings: DeadLetterSettings = DeadLetterSettings(),
                 *, wall_clock: Callable[[], int] | None = None) -> None:
        self.service = service
        self.cluster = cluster
        self.settings = settings
        self._active: set[SharePartitionKey] = set()
        self._scopes: dict[SharePartitionKey, trio.CancelScope] = {}
        self._logged: set[tuple[str, str, str]] = set()
        self._wakeup = trio.Event()
        self._pending: set[SharePartitionKey] = set()
        self._subscribed = False
        metrics.RECORDS_ARCHIVING.set_function(self.archiving_count)

    def archiving_count(self) -> int:
        return sum(leader.engine.archiving_count for leader in self.service.leaders.values())

    def on_change(self, change: Change) -> None:
        """Change hook: an ARCHIVING event became settled (unstaged, or its reject committed)."""
        if any(event.kind == EventKind.ARCHIVING for event in change.events):
            self._pending.add(change.key)
            self._wakeup.set()

    async def run(self) -> None:
        """Forever: start a drain per share-partition with ARCHIVING records (supervised)."""
        if not self._subscribed:
            self.service.commits.subscribe(self.on_change)
            self._subscribed = True
        self.cluster.start()
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    self._scan()  # start-up / replay, and the safety net
                    with trio.move_on_after(self.settings.scan_interval_s):
                        while True:
                            await self._wakeup.wait()
                            self._wakeup = trio.Event()
                            pending, self._pending = self._pending, set()
                            for key in pending:
                                self._start(nursery, key)
        finally:
            self.cluster.stop()

    def _scan(self) -> None:
        for leader in self.service.leaders.values():
            if leader.engine.archiving_count:
                self._pending.add(leader.key)
        if self._pending:
            self._wakeup.set()

    def _start(self, nursery: trio.Nursery, key: SharePartitionKey) -> None:
        if key not in self._active:
            self._active.add(key)
            nursery.start_soon(self._drain, key)

    def cancel(self, keys: Iterable[SharePartitionKey]) -> None:
        """Scale-out hand-over: stop the drains of share-partitions another instance now leads. A
        round cut short writes no more letters and archives nothing here; the new owner's replay
        finds the records ARCHIVING and dead-letters them (letters already produced are written
        again: at least once, as after a crash)."""
        for key in keys:
            scope = self._scopes.get(key)
            if scope is not None:
                scope.cancel()

    async def _drain(self, key: SharePartitionKey) -> None:
        scope = self._scopes[key] = trio.CancelScope()
        try:
            with scope:
                await self._drain_rounds(key)
        finally:
            self._active.discard(key)
            if self._scopes.get(key) is scope:
                del self._scopes[key]

    async def _drain_rounds(self, key: SharePartitionKey) -> None:
        backoff = self.settings.initial_backoff_s
        previous: list[ArchivingRun] | None = None
        while True:
            leader = self.service.leaders.active(key)
            if leader is None or not leader.engine.archiving_count:
                return
            runs = leader.engine.archiving()
            if not runs:
                return  # all staged: their commit announces them again
            if runs == previous:
                # A round finished nothing (should not happen): never spin on it.
                await trio.sleep(backoff)
                backoff = min(self.settings.max_backoff_s, backoff * 2)
            previous = runs
            try:
                # The ARCHIVING state must be durable first: a crash then writes the letters again.
                await self.service.commits.durable(leader, leader.version)
                await self._write_round(leader, runs)
                backoff = self.settings.initial_backoff_s
            except (TransientError, PersistError, UpstreamError) as exc:
                log.warning("dead-letter write not done; retrying", group=key[0], partition=key[2],
                            error=str(exc), retry_in_s=backoff)
                await trio.sleep(backoff)
                backoff = min(self.settings.max_backoff_s, backoff * 2)

    async def _write_round(self, leader: Leader, runs: list[ArchivingRun]) -> None:
        group_id, topic_id, partition = leader.key
        config = self.service.coordinator.group_config(group_id)
        runs = _first_records(runs, self.settings.max_letters_per_round)
        source = self.service.cluster.topic_by_id(topic_id)
        if source is None:
            raise TransientError(f"source topic {topic_id} not in metadata")
        dlq_topic = config.dead_letter_topic
        facts = await self._facts(dlq_topic) if dlq_topic and not dlq_topic.startswith("__") else TopicFacts(False)
        problem = check_topic(dlq_topic, facts, prefix=self.settings.topic_name_prefix,
                              auto_create=self.settings.auto_create_topics)
        if problem is not None:
            self._give_up(leader, runs, dlq_topic, problem)
            return
        if not facts.exists:
            await self.cluster.create_topic(dlq_topic)
            facts = await self._facts(dlq_topic, refresh=True)
            if not facts.exists:
                raise TransientError(f"created DLQ topic {dlq_topic} not in metadata yet")
        originals = await self._originals(source, partition, runs) if config.dead_letter_copy_record else {}
        letters = dead_letters(group_id, source.name, partition, runs, dlq_partitions=facts.partitions,
                               delivery_count_limit=config.delivery_count_limit, originals=originals)
        results = await self.cluster.produce(dlq_topic, letters)
        written = [letter for letter, error in zip(letters, results) if error is None]
        refused = [letter for letter, error in zip(letters, results) if error is not None and not is_transient(error)]
        for letter in written:
            metrics.DEAD_LETTER_RECORDS.labels(group=group_id, reason=REASON_LABELS[letter.reason]).inc()
        self._finish(leader, [letter.offset for letter in written], dead_lettered=True)
        if refused:
            errors = sorted({error for error in results if error is not None and not is_transient(error)})
            self._give_up_offsets(leader, [letter.offset for letter in refused], dlq_topic,
                                  TopicProblem.PRODUCE_REFUSED, detail=", ".join(errors))
        if len(written) + len(refused) < len(letters):
            errors = sorted({error for error in results if error is not None and is_transient(error)})
            raise TransientError(f"produce to {dlq_topic}: {', '.join(errors)}")

    async def _facts(self, topic: str, *, refresh: bool = False) -> TopicFacts:
        cluster = self.service.cluster
        info = cluster.snapshot.topics_by_name.get(topic)
        if info is None or refresh:
            # A refresh that ran before the topic was created would call it missing, and a missing
            # topic without auto-create archives regardless: only a refresh begun after this miss may
            # decide (refresh_if_due alone re-uses one from the last interval).
            refresher = self.service.refresher
            await trio.sleep_until(refresher.last_refresh + refresher.min_interval_s)
            await refresher.refresh_if_due("dead-letters")
            info = cluster.snapshot.topics_by_name.get(topic)
        if info is None:
            return TopicFacts(exists=False)
        return TopicFacts(exists=True, partitions=len(info.partitions), dlq_enabled=await self.cluster.dlq_enabled(topic))

    async def _originals(self, source: TopicInfo, partition: int,
                         runs: list[ArchivingRun]) -> dict[int, tuple[bytes | None, bytes | None]]:
        """(key, value) of the runs' offsets still in the source log (the rest: headers only)."""
        wanted = {offset for run in runs for offset in range(run.first_offset, run.last_offset + 1)}
        found: dict[int, tuple[bytes | None, bytes | None]] = {}
        cluster = self.service.cluster
        log_start = await cluster.list_offset(source, partition, EARLIEST_TIMESTAMP)
        last = max(wanted)
        offset = max(min(wanted), log_start)
        while offset <= last:
            fetched = await cluster.fetch(source, partition, offset, max_bytes=self.settings.max_copy_fetch_bytes,
                                          max_wait_ms=0, read_committed=False)
            if fetched.error_code == OFFSET_OUT_OF_RANGE:
                break  # retention passed them meanwhile: headers only
            if fetched.error_code != NONE:
                raise TransientError(f"fetch of {source.name}-{partition} for a dead-letter copy: "
                                     f"error {fetched.error_code}")
            next_offset = offset
            try:
                for record in decode_records(fetched.records):
                    if record.offset in wanted:
                        found[record.offset] = (record.key, record.value)
                    next_offset = max(next_offset, record.offset + 1)
            except CodecError as exc:
                log.warning("dead-letter copy: source records do not decode; headers only", topic=source.name,
                            partition=partition, offset=offset, error=str(exc))
                break
            if next_offset == offset:
                break  # nothing more (compacted away, or past the end)
            offset = next_offset
        return found

    def _finish(self, leader: Leader, offsets: Iterable[int], *, dead_lettered: bool) -> None:
        if leader.removed:
            return  # handed over (or deleted) meanwhile: its new owner finishes these records
        for first, last in offset_ranges(offsets):
            delta = leader.engine.finish_archiving(first, last, dead_lettered=dead_lettered)
            if delta is not None:
                self.service.commits.record(leader, delta, Cause.DEAD_LETTERED)
        # The SPSO may have moved and the window shrunk: waiting fetches may acquire now.
        self.service.work.fire(leader.key)

    def _give_up(self, leader: Leader, runs: list[ArchivingRun], topic: str, problem: TopicProblem) -> None:
        offsets = [offset for run in runs for offset in range(run.first_offset, run.last_offset + 1)]
        self._give_up_offsets(leader, offsets, topic, problem)

    def _give_up_offsets(self, leader: Leader, offsets: list[int], topic: str, problem: TopicProblem,
                         detail: str = "") -> None:
        group_id = leader.group_id
        metrics.DEAD_LETTER_FAILURES.labels(group=group_id, reason=problem.label).inc(len(offsets))
        if (group_id, topic, problem.label) not in self._logged:
            self._logged.add((group_id, topic, problem.label))
            log.error("Failed to write to DLQ, proceeding to ARCHIVED regardless",
                      reason=problem.message(group_id, topic, self.settings.topic_name_prefix), detail=detail or None,
                      group=group_id, topic=topic)
        self._finish(leader, offsets, dead_lettered=False)


def _first_records(runs: list[ArchivingRun], limit: int) -> list[ArchivingRun]:
    """The first `limit` records of `runs` (a round's batch), the last run cut if need be."""
    out, left = [], limit
    for run in runs:
        if left <= 0:
            break
        size = run.last_offset - run.first_offset + 1
        if size > left:
            run = ArchivingRun(run.first_offset, run.first_offset + left - 1, run.delivery_count, run.reason)
            size = left
        out.append(run)
        left -= size
    return out


__all__ = [
    "DLQ_ENABLE_CONFIG",
    "DeadLetter",
    "DeadLetterCluster",
    "DeadLetterSettings",
    "DeadLetterWriter",
    "TopicFacts",
    "TopicProblem",
    "check_topic",
    "dead_letter_headers",
    "dead_letter_reason",
    "dead_letters",
    "offset_ranges",
]
