"""StateLogWriter without a broker: a producer that failed fatally is replaced before the next write."""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace

import pytest
import trio
from confluent_kafka import KafkaError

from proxy.share.persister import PersistError, StateLogWriter, route_partition


@contextlib.asynccontextmanager
async def running(writer: StateLogWriter):
    """`writer` started, and closed at the end (within 5 s, whatever its producers do)."""
    writer.start()
    try:
        yield writer
    finally:
        with trio.move_on_after(5):
            await writer.aclose()


class FakeProducer:
    """Delivers on poll(); the first `fatal_deliveries` deliveries fail with a fatal error."""

    def __init__(self, config: dict, fatal: bool) -> None:
        self.config = config
        self.fatal = fatal
        self.pending: list = []
        self.lock = threading.Lock()
        self.purged = False

    def produce(self, topic, key=None, value=None, partition=None, on_delivery=None) -> None:
        with self.lock:
            self.pending.append(on_delivery)

    def list_topics(self, topic, timeout):
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions={0: None, 1: None})})

    def poll(self, timeout: float) -> int:
        with self.lock:
            pending, self.pending = self.pending, []
        for callback in pending:
            error = KafkaError(KafkaError._FATAL, "producer fenced", fatal=True) if self.fatal else None
            if error is not None:
                self.config["error_cb"](error)
            callback(error, None)
        threading.Event().wait(min(timeout, 0.005))
        return len(pending)

    def purge(self) -> None:
        self.purged = True

    def flush(self, timeout: float = 0) -> int:
        return 0


async def test_a_fatally_failed_producer_is_replaced_and_the_next_write_succeeds():
    made: list[FakeProducer] = []

    def factory(config: dict) -> FakeProducer:
        made.append(FakeProducer(config, fatal=not made))  # only the first one is broken
        return made[-1]

    writer = StateLogWriter("unused:9092", producer_factory=factory)
    async with running(writer):
        with pytest.raises(PersistError, match="FATAL"):
            await writer.write("state", [(b"k", b"v")])
        await writer.write("state", [(b"k", b"v2")])  # on a new producer
        assert len(made) == 2 and made[0].purged and writer.recreated == 1


class RoutingProducer:
    """Delivers at once; remembers each record's partition (None: the partitioner's choice) and counts
    metadata reads. `failures` deliveries fail first."""

    def __init__(self, config: dict, partitions: int = 3) -> None:
        self.partitions = partitions
        self.produced: list[tuple[bytes, int | None]] = []
        self.metadata_reads = 0
        self.failures = 0
        self.pending: list = []
        self.lock = threading.Lock()

    def list_topics(self, topic, timeout):
        self.metadata_reads += 1
        partitions = {p: object() for p in range(self.partitions)}
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=partitions)})

    def produce(self, topic, key=None, value=None, partition=None, on_delivery=None) -> None:
        with self.lock:
            self.produced.append((key, partition))
            failed = self.failures > 0
            self.failures -= failed
            self.pending.append((on_delivery, KafkaError(KafkaError._MSG_TIMED_OUT) if failed else None))

    def poll(self, timeout: float) -> int:
        with self.lock:
            pending, self.pending = self.pending, []
        for callback, error in pending:
            callback(error, None)
        threading.Event().wait(min(timeout, 0.005))
        return len(pending)

    def flush(self, timeout: float = 0) -> int:
        return 0


def test_route_partition_is_crc32_of_the_route_modulo_the_partition_count():
    # librdkafka's consistent_random partitioner: rd_crc32(key) % partitions (checked against a broker
    # in integration/share/test_persister.py).
    assert route_partition(b"123456789", 1 << 32) == 0xCBF43926  # the CRC-32 check value
    assert route_partition(b"123456789", 3) == 0xCBF43926 % 3
    assert {route_partition(bytes([i]), 4) for i in range(64)} == {0, 1, 2, 3}


async def test_routed_records_go_to_their_routes_partition_and_others_to_the_partitioner():
    made: list[RoutingProducer] = []
    writer = StateLogWriter("unused:9092", producer_factory=lambda config: made.append(RoutingProducer(config))
                            or made[-1])
    async with running(writer):
        producer = made[0]
        await writer.write("state", [(b"group", b"v"), (b"snapshot-key", b"s", b"snapshot-key"),
                                     (b"update-key", b"u", b"snapshot-key"), (b"update-key", None, b"snapshot-key")])
        expected = route_partition(b"snapshot-key", 3)
        assert producer.produced == [(b"group", None), (b"snapshot-key", expected), (b"update-key", expected),
                                     (b"update-key", expected)]
        await writer.write("state", [(b"k", b"v", b"r")])
        assert producer.metadata_reads == 1  # the partition count is cached
        await writer.write("state", [(b"k", b"v")])
        assert producer.metadata_reads == 1  # unrouted writes need none
        producer.failures = 1
        with pytest.raises(PersistError):
            await writer.write("state", [(b"k", b"v", b"r")])
        made[-1].partitions = 6  # partitions added mid-run: records stay homed by the count learnt first
        await writer.write("state", [(b"k", b"v", b"r")])  # (the next start migrates them)
        assert len(made) == 2  # the timed-out write replaced the producer
        assert made[-1].metadata_reads == 0 and made[-1].produced[-1] == (b"k", route_partition(b"r", 3))


async def test_a_timed_out_write_replaces_the_producer_before_the_retry():
    """An idempotent producer that timed a record out may not deliver again for minutes (seen
    against a restarted broker): the next write goes through a fresh one."""
    made: list[RoutingProducer] = []
    writer = StateLogWriter("unused:9092", producer_factory=lambda config: made.append(RoutingProducer(config))
                            or made[-1])
    async with running(writer):
        made[0].failures = 1  # its deliveries fail with _MSG_TIMED_OUT
        with pytest.raises(PersistError, match="timed out|TIMED_OUT"):
            await writer.write("state", [(b"k", b"v")])
        await writer.write("state", [(b"k", b"v")])
        assert len(made) == 2 and made[1].produced == [(b"k", None)]
        assert writer.recreated == 1


async def test_submit_hands_every_record_to_the_producer_before_it_returns_and_the_delivery_reports_each():
    made: list[RoutingProducer] = []

    def factory(config: dict) -> RoutingProducer:
        made.append(RoutingProducer(config))
        return made[-1]

    writer = StateLogWriter("unused:9092", producer_factory=factory)
    async with running(writer):
        first = await writer.submit("state", [(b"a", b"1", b"route"), (b"b", b"1", b"route")])
        second = await writer.submit("state", [(b"a", b"2", b"route")])
        # In the producer, in submission order, before either delivery is known.
        assert [key for key, _ in made[0].produced] == [b"a", b"b", b"a"]
        await first.wait()
        await second.wait()
        made[0].failures = 1
        failing = await writer.submit("state", [(b"c", b"1", b"route"), (b"d", b"1", b"route")])
        with pytest.raises(PersistError, match="state write to 'state' failed"):
            await failing.wait()
        await (await writer.submit("state", [])).wait()  # nothing to write: delivered at once


async def test_with_several_producers_each_partition_is_always_written_by_the_same_one():
    made: list[RoutingProducer] = []
    writer = StateLogWriter("unused:9092", producers=2,
                            producer_factory=lambda config: made.append(RoutingProducer(config, partitions=4))
                            or made[-1])
    async with running(writer):
        routes = [bytes([i]) for i in range(16)]
        await writer.write("state", [(b"k%d" % i, b"v", route) for i, route in enumerate(routes)])
        await writer.write("state", [(b"again", b"v", route) for route in routes])
        assert len(made) == 2 and made[0].produced and made[1].produced
        for lane, producer in enumerate(made):
            assert {partition % 2 for _, partition in producer.produced} == {lane}
        # Per partition, records reach its producer in submission order.
        for partition in range(4):
            written = [key for producer in made for key, p in producer.produced if p == partition]
            expected = [b"k%d" % i for i, route in enumerate(routes) if route_partition(route, 4) == partition]
            assert written == expected + [b"again"] * len(expected)
        # A record without a route is placed as librdkafka's partitioner would place it, by the writer.
        await writer.write("state", [(b"group-key", b"v")])
        home = route_partition(b"group-key", 4)
        assert made[home % 2].produced[-1] == (b"group-key", home)


async def test_a_fatal_error_replaces_every_producer():
    made: list[FakeProducer] = []

    def factory(config: dict) -> FakeProducer:
        made.append(FakeProducer(config, fatal=len(made) == 0))  # only the first lane's first producer
        return made[-1]

    writer = StateLogWriter("unused:9092", producers=2, producer_factory=factory)
    async with running(writer):
        with pytest.raises(PersistError, match="FATAL"):
            await writer.write("state", [(b"k", b"v", 0)])
        await writer.write("state", [(b"k", b"v2", 0), (b"k", b"v2", 1)])
        assert len(made) == 4 and made[0].purged and made[1].purged and writer.recreated == 1


def test_a_writer_needs_a_producer():
    with pytest.raises(ValueError, match="at least one producer"):
        StateLogWriter("unused:9092", producers=0, producer_factory=lambda config: None)


async def test_closing_flushes_every_producer_at_once():
    flushing = []

    class SlowFlush(RoutingProducer):
        def flush(self, timeout: float = 0) -> int:
            flushing.append(self)
            threading.Event().wait(timeout)  # a broker that never answers: flush waits its whole timeout
            return 1

    writer = StateLogWriter("unused:9092", producers=3, producer_factory=SlowFlush)
    writer.start()
    started = trio.current_time()
    await writer.aclose(timeout_s=0.3)
    assert len(flushing) == 3
    assert trio.current_time() - started < 0.8  # not 3 x 0.3 s one after the other
