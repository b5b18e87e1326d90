"""Share operations authorized by the cluster's own ACLs, asked on the client's own connection.

Theory of operation
-------------------
The proxy serves the share APIs itself, so a broker never sees those requests and never checks
its ACLs for them. Rather than keep ACLs of its own, the proxy asks the cluster what the client's
principal may do -- on the client's own upstream connection (:meth:`ClientConnection.call_upstream`),
which the cluster authenticated (SASL passes through byte for byte), so the cluster answers for
exactly the principal it would have authorized. The questions are *probes*: requests without side
effects whose authorization Kafka checks before anything else, so their error code says "denied"
or "allowed" on any broker, coordinator or not (KafkaApis.scala, handle* methods):

=====================  =================================================================  ===========
resource / operation   probe                                                              denied when
=====================  =================================================================  ===========
GROUP READ             Heartbeat v4 (group, generation -1, member "")                     error 30
GROUP DESCRIBE         DescribeGroups v5 ([group])                                        group's 30
GROUP DELETE           OffsetDelete v0 (group, no topics)                                 error 30
GROUP DESCRIBE_CONFIGS DescribeConfigs v4 (GROUP resource 32, one key)                    result's 30
GROUP ALTER_CONFIGS    IncrementalAlterConfigs v1 (validate_only, GROUP resource, no ops) result's 30
TOPIC (all ops)        Metadata v12 (topics by name, no auto-creation,                    error 29 = no
                       IncludeTopicAuthorizedOperations): the AclOperation bitfield       DESCRIBE
CLUSTER DESCRIBE       DescribeCluster v0 (IncludeClusterAuthorizedOperations)            bit 8 unset
=====================  =================================================================  ===========

Any other answer means the authorization check passed. A probe whose answer cannot tell (a
bitfield the broker did not fill) counts as denied: fail closed. The one exception is an error a
broker gives *before* authorizing (:data:`UNDECIDABLE`: Kafka 3.9 and GROUP config resources):
then the same operation is asked of the CLUSTER resource instead. A probe that fails on the wire raises
:class:`UpstreamError`; the connection closes and nothing is served.

:class:`Authorization` lives on one client connection (created on first use, dropped with it, so a
reconnect -- perhaps as another principal -- starts empty). Answers are cached for
``share_authorization_cache_ms`` (clock injectable) and identical probes in flight are coalesced:
pipelined requests of one client ask once. :class:`AuthorizationPolicy` is process-wide: the
configured mode (``off`` never probes, ``cluster`` always, ``auto`` asks the cluster once, on the
proxy's own connection, whether it has an authorizer at all: DescribeAcls answering
SECURITY_DISABLED means none, so nothing to enforce).
"""

from __future__ import annotations

import dataclasses
import enum
import time
import typing
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import structlog
import trio
from kio.index import load_request_schema

from proxy.errors import UpstreamError
from proxy.share import metrics

log = structlog.get_logger(__name__)

Clock = Callable[[], int]
#: ClientConnection.call_upstream: a kio request entity in, its response entity out.
Call = Callable[..., Awaitable[Any]]


class Operation(enum.IntEnum):
    """Kafka's AclOperation codes (the bit numbers of an AuthorizedOperations bitfield)."""

    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11


#: The operations a GROUP resource supports (AclEntry.supportedOperations(GROUP)), which a
#: group's AuthorizedOperations bitfield reports.
GROUP_OPERATIONS = (Operation.READ, Operation.DELETE, Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS,
                    Operation.ALTER_CONFIGS)

GROUP_AUTHORIZATION_FAILED = 30
TOPIC_AUTHORIZATION_FAILED = 29
SECURITY_DISABLED = 54
INVALID_REQUEST = 42
#: The schema's "not filled in" value of an AuthorizedOperations field.
OPERATIONS_OMITTED = -2147483648
#: Answers that come before the authorization check on some broker version, so they say nothing
#: about it. Kafka 3.9's brokers refuse a GROUP config resource they do not know with
#: INVALID_REQUEST before any ACL is consulted: the CLUSTER resource decides then
#: (docs/security.md, "Authorization").
UNDECIDABLE = frozenset({INVALID_REQUEST})

GROUP_RESOURCE = 32  # ConfigResource.Type.GROUP
#: One key keeps the DescribeConfigs probe's answer small (an empty list means every key).
PROBED_CONFIG_KEY = "share.auto.offset.reset"
DESCRIBE_ACLS_VERSION = 2
HEARTBEAT_VERSION = 4
DESCRIBE_GROUPS_VERSION = 5
OFFSET_DELETE_VERSION = 0
DESCRIBE_CONFIGS_VERSION = 4
INCREMENTAL_ALTER_CONFIGS_VERSION = 1
METADATA_VERSION = 12  # v8+ carries topic AuthorizedOperations; 12 is served by Kafka 3.x and 4.x alike
DESCRIBE_CLUSTER_VERSION = 0


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def bits(operations: Iterable[Operation]) -> int:
    """An AuthorizedOperations bitfield."""
    value = 0
    for operation in operations:
        value |= 1 << int(operation)
    return value


def _code(value: object) -> int:
    return int(getattr(value, "value", value))


# ----- the probes: request entities and what their answers say ------------------------------


def group_probe(group_id: str, operation: Operation) -> Any:
    """The side-effect-free request whose answer says whether `operation` on the group is allowed."""
    if operation is Operation.READ:
        return load_request_schema(12, HEARTBEAT_VERSION)(group_id=group_id, generation_id=-1, member_id="",
                                                           group_instance_id=None)
    if operation is Operation.DESCRIBE:
        return load_request_schema(15, DESCRIBE_GROUPS_VERSION)(groups=(group_id,),
                                                                 include_authorized_operations=False)
    if operation is Operation.DELETE:
        return load_request_schema(47, OFFSET_DELETE_VERSION)(group_id=group_id, topics=())
    if operation is Operation.DESCRIBE_CONFIGS:
        schema = load_request_schema(32, DESCRIBE_CONFIGS_VERSION)
        resource = _nested(schema, "resources")(resource_type=GROUP_RESOURCE, resource_name=group_id,
                                                configuration_keys=(PROBED_CONFIG_KEY,))
        return schema(resources=(resource,), include_synonyms=False, include_documentation=False)
    if operation is Operation.ALTER_CONFIGS:
        schema = load_request_schema(44, INCREMENTAL_ALTER_CONFIGS_VERSION)
        resource = _nested(schema, "resources")(resource_type=GROUP_RESOURCE, resource_name=group_id, configs=())
        return schema(resources=(resource,), validate_only=True)
    raise ValueError(f"no probe for {operation.name} on a group")


def group_probe_allows(operation: Operation, response: Any) -> bool | None:
    """Whether the probe's answer says `operation` is allowed; None when the broker cannot tell
    (Kafka 3.9 and GROUP config resources)."""
    if operation is Operation.DESCRIBE:
        codes = [_code(g.error_code) for g in response.groups]
    elif operation is Operation.DESCRIBE_CONFIGS:
        codes = [_code(r.error_code) for r in response.results]
    elif operation is Operation.ALTER_CONFIGS:
        codes = [_code(r.error_code) for r in response.responses]
    else:
        codes = [_code(response.error_code)]
    if len(codes) != 1:
        raise UpstreamError(f"{operation.name} probe answered {len(codes)} entries for one group")
    code = codes[0]
    if code in UNDECIDABLE and operation in (Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS):
        return None  # the caller asks the CLUSTER resource instead
    return code != GROUP_AUTHORIZATION_FAILED


def topics_probe(names: Iterable[str]) -> Any:
    schema = load_request_schema(3, METADATA_VERSION)
    topic_type = _nested(schema, "topics")
    return schema(topics=tuple(topic_type(topic_id=None, name=name) if _has(topic_type, "topic_id")
                               else topic_type(name=name) for name in names),
                  allow_auto_topic_creation=False, include_topic_authorized_operations=True)


def topics_probe_operations(names: Iterable[str], response: Any) -> dict[str, int]:
    """Each asked topic's AuthorizedOperations bitfield (0: not even DESCRIBE, or cannot tell)."""
    found: dict[str, int] = {}
    for topic in response.topics:
        if topic.name is None:
            continue
        code = _code(topic.error_code)
        operations = int(topic.topic_authorized_operations)
        if code == TOPIC_AUTHORIZATION_FAILED:
            found[topic.name] = 0
        elif operations == OPERATIONS_OMITTED or operations < 0:
            log.warning("topic authorization not reported; denied", topic=topic.name, error=code)
            found[topic.name] = 0
        else:
            found[topic.name] = operations
    # A topic the answer leaves out is one nothing can be said about: denied.
    return {name: found.get(name, 0) for name in names}


def cluster_probe() -> Any:
    return load_request_schema(60, DESCRIBE_CLUSTER_VERSION)(include_cluster_authorized_operations=True)


def cluster_probe_operations(response: Any) -> int:
    if _code(response.error_code) != 0:
        return 0
    operations = int(response.cluster_authorized_operations)
    return 0 if operations < 0 else operations


def describe_acls_request() -> Any:
    """DescribeAcls matching every binding: what auto mode asks, on the proxy's own connection."""
    any_ = 1  # ResourceType.ANY, PatternType.ANY, AclOperation.ANY, AclPermissionType.ANY
    return load_request_schema(29, DESCRIBE_ACLS_VERSION)(
        resource_type_filter=any_, resource_name_filter=None, pattern_type_filter=any_, principal_filter=None,
        host_filter=None, operation=any_, permission_type=any_)


def has_authorizer(response: Any) -> bool:
    """DescribeAcls answers SECURITY_DISABLED exactly when the cluster runs no authorizer."""
    return _code(response.error_code) != SECURITY_DISABLED


# ----- one connection's answers ---------------------------------------------------------------


class _Waiting:
    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class Authorization:
    """What one client connection's principal may do, asked on that connection, cached briefly."""

    def __init__(self, call: Call, *, ttl_ms: int = 5_000, clock: Clock = monotonic_ms,
                 instance_topic: str | None = None) -> None:
        self._call = call
        self.instance_topic = instance_topic
        self.ttl_ms = ttl_ms
        self._clock = clock
        self._cache: dict[tuple, tuple[int, Any]] = {}
        self._waiting: dict[tuple, _Waiting] = {}

    # -- the questions -------------------------------------------------------------------------

    async def group(self, group_id: str, operation: Operation) -> bool:
        """Whether the principal may perform `operation` on the group."""
        key = ("group", group_id, operation)
        cached = self._cached(key)
        if cached is not None:
            return cached

        async def probe() -> bool:
            metrics.AUTHORIZATION_PROBES.labels(operation=operation.name).inc()
            allowed = group_probe_allows(operation, await self._call(group_probe(group_id, operation)))
            if allowed is None:
                # A broker without GROUP config resources (Kafka 3.9) cannot say; the same
                # operation on the CLUSTER can be asked anywhere, and whoever may change or read
                # the cluster's configs gains nothing new from a share group's.
                allowed = bool(await self.cluster_operations() & (1 << int(operation)))
                log.info("group config ACLs unknown to this broker; decided by the CLUSTER resource",
                         operation=operation.name, allowed=allowed)
            return allowed

        return await self._coalesced(key, probe)

    async def is_instance(self) -> bool:
        """Whether the principal is a proxy instance's: it may WRITE the state topic
        (``instance_topic``), which the proxy keeps from every client. Scale-out's calls between
        instances are authorized by this, where Kafka asks CLUSTER_ACTION of its brokers."""
        if self.instance_topic is None:
            return False
        return self.instance_topic in await self.topics({self.instance_topic}, Operation.WRITE)

    async def group_operations(self, group_id: str) -> int:
        """The group's AuthorizedOperations bitfield, as Kafka's describe APIs report it."""
        allowed = []
        for operation in GROUP_OPERATIONS:
            if await self.group(group_id, operation):
                allowed.append(operation)
        return bits(allowed)

    async def topics(self, names: Iterable[str], operation: Operation) -> set[str]:
        """The topics among `names` on which the principal may perform `operation`."""
        operations = await self.topic_operations(names)
        bit = 1 << int(operation)
        return {name for name, value in operations.items() if value & bit}

    async def topic_operations(self, names: Iterable[str]) -> dict[str, int]:
        """Each topic's AuthorizedOperations bitfield: one Metadata probe for those not cached."""
        wanted = list(dict.fromkeys(names))
        result: dict[str, int] = {}
        missing = []
        waits: dict[str, _Waiting] = {}
        for name in wanted:
            key = ("topic", name)
            cached = self._cached(key)
            if cached is not None:
                result[name] = cached
            elif key in self._waiting:
                waits[name] = self._waiting[key]
            else:
                missing.append(name)
        if missing:
            mine = {name: _Waiting() for name in missing}
            for name, waiting in mine.items():
                self._waiting[("topic", name)] = waiting
            try:
                metrics.AUTHORIZATION_PROBES.labels(operation="TOPIC_OPERATIONS").inc()
                answered = topics_probe_operations(missing, await self._call(topics_probe(missing)))
            except BaseException as exc:
                for name, waiting in mine.items():
                    waiting.error = exc
                    self._release(("topic", name), waiting)
                raise
            for name, waiting in mine.items():
                waiting.value = answered[name]
                self._store(("topic", name), answered[name])
                self._release(("topic", name), waiting)
            result.update(answered)
        for name, waiting in waits.items():
            result[name] = await self._outcome(waiting)
        return result

    async def cluster_describe(self) -> bool:
        """DESCRIBE on the CLUSTER (Kafka's ListGroups then lists every group)."""
        return bool(await self.cluster_operations() & (1 << Operation.DESCRIBE))

    async def cluster_operations(self) -> int:
        """The CLUSTER resource's AuthorizedOperations bitfield (DescribeCluster, any broker)."""
        key = ("cluster",)
        cached = self._cached(key)
        if cached is not None:
            return cached

        async def probe() -> int:
            metrics.AUTHORIZATION_PROBES.labels(operation="CLUSTER_OPERATIONS").inc()
            return cluster_probe_operations(await self._call(cluster_probe()))

        return await self._coalesced(key, probe)

    # -- cache and coalescing --------------------------------------------------------------------

    def _cached(self, key: tuple) -> Any:
        entry = self._cache.get(key)
        if entry is None:
            return None
        expires, value = entry
        if self._clock() >= expires:
            del self._cache[key]
            return None
        return value

    def _store(self, key: tuple, value: Any) -> None:
        if self.ttl_ms > 0:
            self._cache[key] = (self._clock() + self.ttl_ms, value)

    def _release(self, key: tuple, waiting: _Waiting) -> None:
        if self._waiting.get(key) is waiting:
            del self._waiting[key]
        waiting.done.set()

    async def _coalesced(self, key: tuple, probe: Callable[[], Awaitable[Any]]) -> Any:
        waiting = self._waiting.get(key)
        if waiting is not None:
            return await self._outcome(waiting)
        waiting = self._waiting[key] = _Waiting()
        try:
            waiting.value = await probe()
        except BaseException as exc:
            waiting.error = exc
            raise
        else:
            self._store(key, waiting.value)
        finally:
            self._release(key, waiting)
        return waiting.value

    @staticmethod
    async def _outcome(waiting: _Waiting) -> Any:
        await waiting.done.wait()
        if waiting.error is not None:
            if isinstance(waiting.error, UpstreamError):
                raise UpstreamError(str(waiting.error))
            raise UpstreamError(f"the authorization probe this request waited for failed: {waiting.error!r}")
        return waiting.value


# ----- the mode -------------------------------------------------------------------------------


class AuthorizationPolicy:
    """Whether share operations are authorized at all (``share_authorization``), and the
    per-connection :class:`Authorization` when they are."""

    RETRY_S = (1.0, 30.0)  # auto mode: first and longest wait between attempts to decide

    def __init__(self, mode: str = "auto", *, ttl_ms: int = 5_000, clock: Clock = monotonic_ms,
                 instance_topic: str | None = None) -> None:
        if mode not in ("auto", "cluster", "off"):
            raise ValueError(f"share_authorization must be auto, cluster or off, not {mode!r}")
        self.mode = mode
        #: The state topic: WRITE on it marks a proxy instance's principal (Authorization.is_instance).
        self.instance_topic = instance_topic
        self.ttl_ms = ttl_ms
        self._clock = clock
        #: auto mode: True = the cluster has an authorizer, False = it has none, None = not known yet.
        self.cluster_has_authorizer: bool | None = None

    @property
    def active(self) -> bool:
        """Enforced now: always in cluster mode; in auto mode unless the cluster has no authorizer
        (undecided = enforced: fail closed)."""
        if self.mode == "off":
            return False
        if self.mode == "cluster":
            return True
        return self.cluster_has_authorizer is not False

    def for_connection(self, connection: Any) -> Authorization | None:
        """The connection's :class:`Authorization` (created on first use); None when not enforced."""
        if not self.active:
            return None
        return connection.authorizer(lambda: Authorization(connection.call_upstream, ttl_ms=self.ttl_ms,
                                                           clock=self._clock, instance_topic=self.instance_topic))

    async def decide(self, ask: Callable[[], Awaitable[bool]]) -> bool | None:
        """Auto mode, one attempt: `ask` says whether the cluster has an authorizer (on the proxy's
        own connection). Returns the decision, None when the cluster could not be asked."""
        if self.mode != "auto" or self.cluster_has_authorizer is not None:
            return self.cluster_has_authorizer
        try:
            found = await ask()
        except (UpstreamError, OSError) as exc:
            log.warning("share authorization: cannot ask the cluster for its authorizer; enforcing until it answers",
                        error=str(exc))
            return None
        self.cluster_has_authorizer = found
        if found:
            log.info("share authorization: the cluster has an authorizer; share operations are checked against "
                     "its ACLs", mode="auto")
        else:
            log.info("share authorization: the cluster has no authorizer (SECURITY_DISABLED); nothing to enforce",
                     mode="auto")
        return found

    async def run(self, ask: Callable[[], Awaitable[bool]]) -> None:
        """Auto mode: decide, retrying with backoff while the cluster cannot be asked."""
        if self.mode == "off":
            log.info("share authorization: off; share operations are not checked against the cluster's ACLs")
            return
        if self.mode == "cluster":
            log.info("share authorization: cluster; share operations are checked against the cluster's ACLs")
            return
        delay, longest = self.RETRY_S
        while await self.decide(ask) is None:
            await trio.sleep(delay)
            delay = min(delay * 2, longest)


# ----- helpers --------------------------------------------------------------------------------


def _nested(entity_type: type, field: str) -> type:
    """The entry type of an array field (``tuple[X, ...]``, possibly ``| None``)."""
    hint = typing.get_type_hints(entity_type)[field]
    arrays = [arg for arg in typing.get_args(hint) if typing.get_origin(arg) is tuple] or [hint]
    return typing.get_args(arrays[0])[0]


def _has(entity_type: type, field: str) -> bool:
    return any(f.name == field for f in dataclasses.fields(entity_type))


__all__ = ["Authorization", "AuthorizationPolicy", "Operation", "GROUP_OPERATIONS", "bits", "group_probe",
           "group_probe_allows", "topics_probe", "topics_probe_operations", "cluster_probe",
           "cluster_probe_operations", "describe_acls_request", "has_authorizer"]
