"""proxy.share.authorization: probes and their answers, the per-connection cache, coalescing, modes."""

from __future__ import annotations

import datetime
import typing
import uuid

import pytest
import trio
import trio.testing
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from proxy.errors import UpstreamError
from proxy.share import authorization as authz
from proxy.share import metrics
from proxy.share.authorization import (
    GROUP_OPERATIONS,
    Authorization,
    AuthorizationPolicy,
    Operation,
    bits,
)

ZERO = datetime.timedelta(0)
OMITTED = -2147483648
GROUP_DENIED, TOPIC_DENIED, NOT_COORDINATOR, INVALID_REQUEST, UNKNOWN_TOPIC = 30, 29, 16, 42, 3


def nested(entity_type: type, field: str) -> type:
    hint = typing.get_type_hints(entity_type)[field]
    arrays = [a for a in typing.get_args(hint) if typing.get_origin(a) is tuple] or [hint]
    return typing.get_args(arrays[0])[0]


# ----- responses as a broker builds them ------------------------------------------------------


def group_answer(operation: Operation, group_id: str, code: int):
    error = ErrorCode(code)
    if operation is Operation.READ:
        return load_response_schema(12, 4)(throttle_time=ZERO, error_code=error)
    if operation is Operation.DESCRIBE:
        schema = load_response_schema(15, 5)
        group = nested(schema, "groups")(error_code=error, group_id=group_id, group_state="", protocol_type="",
                                         protocol_data="", members=(), authorized_operations=OMITTED)
        return schema(throttle_time=ZERO, groups=(group,))
    if operation is Operation.DELETE:
        return load_response_schema(47, 0)(error_code=error, throttle_time=ZERO, topics=())
    if operation is Operation.DESCRIBE_CONFIGS:
        schema = load_response_schema(32, 4)
        result = nested(schema, "results")(error_code=error, error_message=None, resource_type=32,
                                           resource_name=group_id, configs=())
        return schema(throttle_time=ZERO, results=(result,))
    schema = load_response_schema(44, 1)
    result = nested(schema, "responses")(error_code=error, error_message=None, resource_type=32,
                                         resource_name=group_id)
    return schema(throttle_time=ZERO, responses=(result,))


def metadata_answer(topics: dict[str, tuple[int, int]]):
    """topics: name -> (error code, authorized operations)."""
    schema = load_response_schema(3, 12)
    topic_type = nested(schema, "topics")
    return schema(throttle_time=ZERO, brokers=(), cluster_id="c", controller_id=1, topics=tuple(
        topic_type(error_code=ErrorCode(code), name=name, topic_id=uuid.UUID(int=0), is_internal=False,
                   partitions=(), topic_authorized_operations=operations)
        for name, (code, operations) in topics.items()))


def cluster_answer(code: int, operations: int):
    return load_response_schema(60, 0)(throttle_time=ZERO, error_code=ErrorCode(code), error_message=None,
                                       cluster_id="c", controller_id=1, brokers=(),
                                       cluster_authorized_operations=operations)


def acls_answer(code: int):
    return load_response_schema(29, 2)(throttle_time=ZERO, error_code=ErrorCode(code), error_message=None,
                                       resources=())


READ_AND_DESCRIBE = bits([Operation.READ, Operation.DESCRIBE])
DESCRIBE_ONLY = bits([Operation.DESCRIBE])


class FakeCluster:
    """Answers probes as a broker with ACLs would; counts them. `gate` holds answers back."""

    def __init__(self, *, groups=None, topics=None, cluster_ops: int = 0) -> None:
        self.groups: dict[tuple[str, Operation], bool] = groups or {}
        self.topics: dict[str, int] = topics or {}  # name -> bitfield; missing: TOPIC_AUTHORIZATION_FAILED
        self.cluster_ops = cluster_ops
        self.calls: list = []
        self.gate: trio.Event | None = None
        self.fail: Exception | None = None
        self.group_configs_known = True  # False: a Kafka 3.9 broker (no GROUP config resources)

    async def call(self, request, response_type=None):
        self.calls.append(request)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        key = int(request.__api_key__)
        if key == 3:
            return metadata_answer({
                t.name: ((0, self.topics[t.name]) if t.name in self.topics else (TOPIC_DENIED, OMITTED))
                for t in request.topics})
        if key == 60:
            return cluster_answer(0, self.cluster_ops)
        operation = {12: Operation.READ, 15: Operation.DESCRIBE, 47: Operation.DELETE, 32: Operation.DESCRIBE_CONFIGS,
                     44: Operation.ALTER_CONFIGS}[key]
        group_id = _probed_group(request)
        if key in (32, 44) and not self.group_configs_known:
            return group_answer(operation, group_id, INVALID_REQUEST)
        allowed = self.groups.get((group_id, operation), False)
        return group_answer(operation, group_id, NOT_COORDINATOR if allowed else GROUP_DENIED)


def _probed_group(request) -> str:
    if hasattr(request, "group_id"):
        return request.group_id
    if hasattr(request, "groups"):
        return request.groups[0]
    return request.resources[0].resource_name


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


# ----- the probes and what their answers say --------------------------------------------------


@pytest.mark.parametrize("operation", GROUP_OPERATIONS)
def test_each_group_probe_is_denied_exactly_by_group_authorization_failed(operation):
    request = authz.group_probe("g", operation)
    assert _probed_group(request) == "g"
    assert authz.group_probe_allows(operation, group_answer(operation, "g", GROUP_DENIED)) is False
    # Anything else (here: the broker is not the group's coordinator) comes after the check.
    assert authz.group_probe_allows(operation, group_answer(operation, "g", NOT_COORDINATOR)) is True
    assert authz.group_probe_allows(operation, group_answer(operation, "g", 0)) is True


def test_probes_have_no_side_effects_by_construction():
    read = authz.group_probe("g", Operation.READ)
    assert (read.generation_id, read.member_id) == (-1, "")  # no member: nothing to heart-beat
    assert authz.group_probe("g", Operation.DELETE).topics == ()  # deletes no offsets
    assert authz.group_probe("g", Operation.ALTER_CONFIGS).validate_only is True
    assert authz.group_probe("g", Operation.ALTER_CONFIGS).resources[0].configs == ()
    metadata = authz.topics_probe(["a", "b"])
    assert metadata.allow_auto_topic_creation is False and metadata.include_topic_authorized_operations is True
    assert [t.name for t in metadata.topics] == ["a", "b"]


@pytest.mark.parametrize("operation", [Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS])
def test_a_config_probe_a_broker_refuses_before_authorizing_cannot_tell(operation):
    # Kafka 3.9 does not know GROUP config resources: INVALID_REQUEST says nothing about ACLs.
    assert authz.group_probe_allows(operation, group_answer(operation, "g", INVALID_REQUEST)) is None


def test_invalid_request_from_a_group_probe_that_authorizes_first_still_allows():
    assert authz.group_probe_allows(Operation.READ, group_answer(Operation.READ, "g", INVALID_REQUEST)) is True


def test_topic_probe_reads_the_bitfield_and_denies_what_it_cannot_tell():
    answer = metadata_answer({
        "readable": (0, READ_AND_DESCRIBE),
        "described": (0, DESCRIBE_ONLY),
        "hidden": (TOPIC_DENIED, OMITTED),
        "unknown": (UNKNOWN_TOPIC, READ_AND_DESCRIBE),  # Kafka fills the bitfield for unknown topics too
        "unreported": (0, OMITTED),
    })
    found = authz.topics_probe_operations(["readable", "described", "hidden", "unknown", "unreported", "absent"],
                                          answer)
    assert found == {"readable": READ_AND_DESCRIBE, "described": DESCRIBE_ONLY, "hidden": 0,
                     "unknown": READ_AND_DESCRIBE, "unreported": 0, "absent": 0}


def test_cluster_probe_and_the_authorizer_question():
    assert authz.cluster_probe_operations(cluster_answer(0, bits([Operation.DESCRIBE]))) == 1 << 8
    assert authz.cluster_probe_operations(cluster_answer(0, OMITTED)) == 0
    assert authz.cluster_probe_operations(cluster_answer(31, 1 << 8)) == 0
    assert authz.has_authorizer(acls_answer(54)) is False
    assert authz.has_authorizer(acls_answer(0)) is True
    assert authz.has_authorizer(acls_answer(31)) is True  # the proxy may not list ACLs: there is an authorizer
    request = authz.describe_acls_request()
    assert (request.resource_type_filter, request.operation, request.permission_type) == (1, 1, 1)


# ----- Authorization: questions, cache, coalescing ---------------------------------------------


async def test_group_and_topic_questions():
    cluster = FakeCluster(groups={("g", Operation.READ): True, ("g", Operation.DESCRIBE): True},
                          topics={"t1": READ_AND_DESCRIBE, "t2": DESCRIBE_ONLY})
    a = Authorization(cluster.call, ttl_ms=5_000, clock=Clock())
    assert await a.group("g", Operation.READ) is True
    assert await a.group("g", Operation.DELETE) is False
    assert await a.group("other", Operation.READ) is False
    assert await a.topics(["t1", "t2", "t3"], Operation.READ) == {"t1"}
    assert await a.topics(["t1", "t2", "t3"], Operation.DESCRIBE) == {"t1", "t2"}
    assert await a.group_operations("g") == bits([Operation.READ, Operation.DESCRIBE])


async def test_answers_are_cached_until_the_ttl_passes():
    clock = Clock()
    cluster = FakeCluster(groups={("g", Operation.READ): True}, topics={"t": READ_AND_DESCRIBE})
    a = Authorization(cluster.call, ttl_ms=5_000, clock=clock)
    before = metrics.AUTHORIZATION_PROBES.labels(operation="READ")._value.get()
    assert await a.group("g", Operation.READ) is True
    assert await a.topics(["t"], Operation.READ) == {"t"}
    assert len(cluster.calls) == 2
    clock.now += 4_999
    cluster.groups[("g", Operation.READ)] = False  # revoked: not seen while cached
    cluster.topics.clear()
    assert await a.group("g", Operation.READ) is True
    assert await a.topics(["t"], Operation.DESCRIBE) == {"t"}
    assert len(cluster.calls) == 2
    clock.now += 1
    assert await a.group("g", Operation.READ) is False
    assert await a.topics(["t"], Operation.READ) == set()
    assert len(cluster.calls) == 4
    assert metrics.AUTHORIZATION_PROBES.labels(operation="READ")._value.get() == before + 2


async def test_a_zero_ttl_asks_every_time():
    cluster = FakeCluster(groups={("g", Operation.READ): True})
    a = Authorization(cluster.call, ttl_ms=0, clock=Clock())
    for _ in range(3):
        assert await a.group("g", Operation.READ) is True
    assert len(cluster.calls) == 3


async def test_only_uncached_topics_are_probed_in_one_request():
    cluster = FakeCluster(topics={"a": READ_AND_DESCRIBE, "b": READ_AND_DESCRIBE, "c": 0})
    a = Authorization(cluster.call, clock=Clock())
    assert await a.topics(["a"], Operation.READ) == {"a"}
    assert await a.topics(["a", "b", "c", "b"], Operation.READ) == {"a", "b"}
    assert [[t.name for t in r.topics] for r in cluster.calls] == [["a"], ["b", "c"]]


async def test_identical_probes_in_flight_are_coalesced():
    cluster = FakeCluster(groups={("g", Operation.READ): True}, topics={"t": READ_AND_DESCRIBE, "u": 0})
    cluster.gate = trio.Event()
    a = Authorization(cluster.call, clock=Clock())
    results = []

    async def ask_group():
        results.append(await a.group("g", Operation.READ))

    async def ask_topics(names):
        results.append(await a.topics(names, Operation.READ))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(ask_group)
        nursery.start_soon(ask_topics, ["t"])
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(ask_topics, ["t", "u"])  # t is in flight: only u is asked
        await trio.testing.wait_all_tasks_blocked()
        cluster.gate.set()
    assert sorted(map(str, results)) == sorted(map(str, [True, True, True, {"t"}, {"t"}]))
    assert [int(r.__api_key__) for r in cluster.calls].count(12) == 1
    assert sorted(tuple(t.name for t in r.topics) for r in cluster.calls if int(r.__api_key__) == 3) == [("t",), ("u",)]


async def test_a_failed_probe_fails_every_waiter_and_is_not_cached():
    cluster = FakeCluster(groups={("g", Operation.READ): True})
    cluster.gate = trio.Event()
    cluster.fail = UpstreamError("upstream closed the connection")
    a = Authorization(cluster.call, clock=Clock())
    errors = []

    async def ask():
        try:
            await a.group("g", Operation.READ)
        except UpstreamError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        cluster.gate.set()
    assert len(errors) == 2 and len(cluster.calls) == 1
    cluster.fail = None
    assert await a.group("g", Operation.READ) is True  # asked again
    assert len(cluster.calls) == 2


async def test_a_failed_topic_probe_fails_its_waiters_too():
    cluster = FakeCluster(topics={"t": READ_AND_DESCRIBE})
    cluster.fail = UpstreamError("broke")
    a = Authorization(cluster.call, clock=Clock())
    with pytest.raises(UpstreamError):
        await a.topics(["t"], Operation.READ)
    cluster.fail = None
    assert await a.topics(["t"], Operation.READ) == {"t"}


async def test_cluster_describe():
    a = Authorization(FakeCluster(cluster_ops=bits([Operation.DESCRIBE, Operation.CREATE])).call, clock=Clock())
    assert await a.cluster_describe() is True
    b = Authorization(FakeCluster(cluster_ops=bits([Operation.CREATE])).call, clock=Clock())
    assert await b.cluster_describe() is False


@pytest.mark.parametrize("operation", [Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS])
async def test_where_group_configs_cannot_be_asked_the_cluster_resource_decides(operation):
    # A group ACL alone does not count on such a broker (Kafka 3.9); the CLUSTER's operation does.
    with_group_acl_only = FakeCluster(groups={("g", operation): True}, cluster_ops=bits([Operation.DESCRIBE]))
    with_group_acl_only.group_configs_known = False
    assert await Authorization(with_group_acl_only.call, clock=Clock()).group("g", operation) is False
    cluster_admin = FakeCluster(cluster_ops=bits([operation]))
    cluster_admin.group_configs_known = False
    authorization = Authorization(cluster_admin.call, clock=Clock())
    assert await authorization.group("g", operation) is True
    assert await authorization.group("g", operation) is True  # cached: two probes in all
    assert [int(request.__api_key__) for request in cluster_admin.calls] == [32 if operation is Operation.DESCRIBE_CONFIGS else 44, 60]


# ----- the policy -------------------------------------------------------------------------------


class FakeConnection:
    def __init__(self, cluster: FakeCluster) -> None:
        self.authorization = None
        self.call_upstream = cluster.call

    def authorizer(self, create):
        if self.authorization is None:
            self.authorization = create()
        return self.authorization


def test_off_never_authorizes_and_cluster_always_does():
    connection = FakeConnection(FakeCluster())
    assert AuthorizationPolicy("off").for_connection(connection) is None
    policy = AuthorizationPolicy("cluster", ttl_ms=7)
    created = policy.for_connection(connection)
    assert isinstance(created, Authorization) and created.ttl_ms == 7
    assert policy.for_connection(connection) is created  # one per connection, kept on it
    assert policy.for_connection(FakeConnection(FakeCluster())) is not created  # a new connection starts empty
    with pytest.raises(ValueError):
        AuthorizationPolicy("sometimes")


async def test_auto_mode_follows_the_clusters_authorizer():
    without = AuthorizationPolicy("auto")
    assert without.active  # undecided: enforced (fail closed)

    async def no_authorizer() -> bool:
        return authz.has_authorizer(acls_answer(54))

    assert await without.decide(no_authorizer) is False
    assert not without.active and without.for_connection(FakeConnection(FakeCluster())) is None

    with_one = AuthorizationPolicy("auto")

    async def authorizer() -> bool:
        return authz.has_authorizer(acls_answer(31))

    assert await with_one.decide(authorizer) is True
    assert with_one.active


async def test_auto_mode_enforces_while_the_cluster_cannot_be_asked_and_decides_later(autojump_clock):
    policy = AuthorizationPolicy("auto")
    attempts = []

    async def unreachable_then_plain() -> bool:
        attempts.append(trio.current_time())
        if len(attempts) < 3:
            raise UpstreamError("cannot connect")
        return False

    assert await policy.decide(unreachable_then_plain) is None
    assert policy.active
    attempts.clear()
    await policy.run(unreachable_then_plain)
    assert len(attempts) == 3 and not policy.active
    assert attempts[1] - attempts[0] == pytest.approx(1.0) and attempts[2] - attempts[1] == pytest.approx(2.0)


async def test_cluster_and_off_modes_never_ask():
    async def ask() -> bool:
        raise AssertionError("must not ask")

    for mode in ("cluster", "off"):
        policy = AuthorizationPolicy(mode)
        await policy.run(ask)
        assert await policy.decide(ask) is None
