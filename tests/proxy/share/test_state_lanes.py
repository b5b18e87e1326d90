"""TransactionalStateWriter without a broker: a lane per state partition, one transaction per lane
per write, and what each kind of failure leaves behind (the real fence is shown against a broker in
integration/share/test_state_fencing.py)."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from proxy.share.persister import PersistError, route_partition
from proxy.share.state_lanes import StateFenced, TransactionalStateWriter, transactional_id


class FakeTransactionalProducer:
    """Records the transaction calls; `fail_commit` (a KafkaError) fails the next commit."""

    def __init__(self, config: dict, log: list) -> None:
        self.id = config["transactional.id"]
        self.log = log
        self.lock = threading.Lock()
        self.fail_commit: KafkaError | None = None
        self.fail_abort = False
        self.open: list = []

    def _note(self, *call) -> None:
        with self.lock:
            self.log.append((self.id, *call))

    def init_transactions(self, timeout=None) -> None:
        self._note("init")

    def begin_transaction(self) -> None:
        self._note("begin")

    def produce(self, topic, key=None, value=None, partition=-1) -> None:
        self.open.append((partition, key, value))

    def commit_transaction(self, timeout=None) -> None:
        if self.fail_commit is not None:
            error, self.fail_commit = self.fail_commit, None
            raise KafkaException(error)
        self._note("commit", tuple(self.open))
        self.open = []

    def abort_transaction(self, timeout=None) -> None:
        if self.fail_abort:
            raise KafkaException(KafkaError(KafkaError._STATE, "cannot abort"))
        self._note("abort")
        self.open = []

    def purge(self) -> None:
        self._note("purge")

    def flush(self, timeout=None) -> int:
        return 0

    def poll(self, timeout=None) -> int:
        return 0


def make_writer(partitions: int = 3):
    log: list = []
    producers: dict[str, list[FakeTransactionalProducer]] = {}

    def factory(config: dict) -> FakeTransactionalProducer:
        producer = FakeTransactionalProducer(config, log)
        producers.setdefault(config["transactional.id"], []).append(producer)
        return producer

    writer = TransactionalStateWriter("unused:9092", producer_factory=factory, partition_reader=lambda _: partitions)
    writer.start()
    return writer, log, producers


def lane(partition: int) -> str:
    return transactional_id("ksp-state", "state", partition)


async def test_fence_initialises_every_lane_before_anything_is_written():
    writer, log, _ = make_writer()
    await writer.fence("state")
    assert sorted(log) == [(lane(p), "init") for p in range(3)]


async def test_a_write_is_one_transaction_per_state_partition_it_touches():
    writer, log, _ = make_writer()
    home = route_partition(b"route", 3)
    await writer.write("state", [(b"a", b"1", b"route"), (b"b", None, b"route"), (b"c", b"3", (home + 1) % 3)])
    commits = {entry[0]: entry[2] for entry in log if entry[1] == "commit"}
    assert commits == {lane(home): ((home, b"a", b"1"), (home, b"b", None)),
                       lane((home + 1) % 3): (((home + 1) % 3, b"c", b"3"),)}
    assert [entry[1] for entry in log if entry[0] == lane(home)] == ["init", "begin", "commit"]
    await writer.write("state", [(b"a", b"2", b"route")])
    assert [entry[1] for entry in log if entry[0] == lane(home)] == ["init", "begin", "commit", "begin", "commit"]


async def test_an_abortable_failure_is_aborted_reported_and_the_lane_goes_on():
    writer, log, producers = make_writer()
    await writer.fence("state", [0])
    producers[lane(0)][0].fail_commit = KafkaError(KafkaError.REQUEST_TIMED_OUT, "slow", retriable=True,
                                                   txn_requires_abort=True)
    with pytest.raises(PersistError) as failed:
        await writer.write("state", [(b"k", b"v", 0)])
    assert not isinstance(failed.value, StateFenced)
    await writer.write("state", [(b"k", b"v2", 0)])
    assert [entry[1] for entry in log] == ["init", "begin", "abort", "begin", "commit"]
    assert len(producers[lane(0)]) == 1


async def test_a_failure_that_cannot_be_aborted_replaces_the_producer():
    writer, log, producers = make_writer()
    await writer.fence("state", [0])
    first = producers[lane(0)][0]
    first.fail_commit = KafkaError(KafkaError._STATE, "broken", fatal=True)
    with pytest.raises(PersistError):
        await writer.write("state", [(b"k", b"v", 0)])
    await writer.write("state", [(b"k", b"v2", 0)])
    assert len(producers[lane(0)]) == 2  # the new one's init_transactions aborts what the old left open
    assert [entry[1] for entry in log] == ["init", "begin", "purge", "init", "begin", "commit"]


async def test_a_fenced_lane_is_given_up_for_good_and_the_others_still_write():
    writer, log, producers = make_writer()
    await writer.fence("state")
    producers[lane(1)][0].fail_commit = KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)
    with pytest.raises(StateFenced) as fenced:
        await writer.write("state", [(b"x", b"1", 0), (b"y", b"1", 1)])
    assert fenced.value.partition == 1
    with pytest.raises(StateFenced):  # never taken back: no new producer, no init_transactions
        await writer.write("state", [(b"y", b"2", 1)])
    await writer.write("state", [(b"x", b"2", 0)])
    assert len(producers[lane(1)]) == 1
    assert [entry[1] for entry in log if entry[0] == lane(1)] == ["init", "begin", "purge"]
    assert [entry[1] for entry in log if entry[0] == lane(0)] == ["init", "begin", "commit", "begin", "commit"]


async def test_an_unrouted_record_goes_where_librdkafkas_partitioner_would_put_its_key():
    writer, log, _ = make_writer(partitions=5)
    await writer.write("state", [(b"group-key", b"v")])
    (commit,) = [entry for entry in log if entry[1] == "commit"]
    assert commit[0] == lane(route_partition(b"group-key", 5))
    with pytest.raises(PersistError, match="does not exist"):
        await writer.write("state", [(b"k", b"v", 9)])


async def test_a_lane_is_owned_from_its_fence_to_its_release_and_not_once_fenced():
    writer, _, producers = make_writer()
    assert not writer.owns("state", 0)
    await writer.fence("state", [0, 1])
    assert writer.owns("state", 0) and writer.owns("state", 1)
    await writer.release("state", [0])
    assert not writer.owns("state", 0)
    producers[lane(1)][0].fail_commit = KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)
    with pytest.raises(StateFenced):
        await writer.write("state", [(b"k", b"v", 1)])
    assert not writer.owns("state", 1)
