"""Share-group configs on the wire: DescribeConfigs (32), IncrementalAlterConfigs (44) and the
legacy AlterConfigs (33), which Kafka also accepts on GROUP resources (it replaces the resource's
whole config: keys it does not name go back to their defaults).

Kafka keeps group configs (``share.*``, ``consumer.*``, ...) in its metadata and answers for them
on GROUP resources (ConfigResource type 32). Share groups live in the proxy, so the proxy answers
for the group resources that are its own and passes everything else to the cluster unchanged:

* a GROUP resource is the proxy's when the id is one of its share groups, or the proxy already
  holds configs for it (set before the group's first member arrived), or -- IncrementalAlterConfigs
  only -- the request sets a ``share.*`` or ``errors.deadletterqueue.*`` (KIP-1191, share groups
  only) key on an id that is not an upstream group (checked with
  ListGroups, as a share group's first heartbeat is: one group-id namespace);
* everything else passes through: other resource types, upstream (consumer, classic, streams)
  groups and their ``consumer.*`` keys, and DescribeConfigs of ids the proxy knows nothing of.

A request mixing both is split (proxy.route_split): the cluster's resources are re-encoded and go
on through the wrapped route, the proxy's answers are added to the cluster's. IncrementalAlterConfigs
is also wrapped by the state-topic guard, which passes the rest of a request on through this route.

Alterations are checked as Kafka's controller checks them (group_config.altered_overrides, then the
resulting config against the proxy's bounds, Kafka's GroupConfig.validateValues) and answered
INVALID_CONFIG with the reason; ``validate_only`` checks without changing anything. An accepted
change is applied at once in request order (engines take it at their next acquisition, members at
their next heartbeat, new share-partitions at initialisation) and written to the state topic as
the group's config record; the answer waits until that write is durable, as Kafka answers after
its metadata write. DescribeConfigs lists every ``share.*`` key with its value and source
(group_config.describe_group_config).

With share authorization enforced (:mod:`proxy.share.enforce`) a group resource the proxy answers
needs DESCRIBE_CONFIGS (describe) or ALTER_CONFIGS (alter) on the group, else it is answered
GROUP_AUTHORIZATION_FAILED, as Kafka's ConfigHelper and ControllerApis answer it, and nothing
changes. Resources passed on to the cluster are authorized by the cluster itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from codec.registry import decode_entity
from proxy.connection import FORWARD, ClientConnection, Request, Route
from proxy.errors import UpstreamError
from proxy.rewrite import decode_response, encode_response
from proxy.route_split import AnswerView, build, constant, item_type, split_request
from proxy.share import state_store
from proxy.share.commit import CommitPipeline
from proxy.share.coordinator import ShareGroupCoordinator
from proxy.share.authorization import AuthorizationPolicy, Operation
from proxy.share.enforce import GROUP_DENIED_MESSAGE, authorization_for, group_or_instance_allowed
from proxy.share.peers import is_peer_call
from proxy.share.group_config import GroupConfigError, altered_overrides, describe_group_config, is_share_group_key

log = structlog.get_logger(__name__)

DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
INCREMENTAL_ALTER_CONFIGS = 44
LIST_CONFIG_RESOURCES = 74
GROUP_RESOURCE = 32  # ConfigResource.Type.GROUP

#: The request list and the response list of each API.
_FIELDS = {
    DESCRIBE_CONFIGS: ("resources", "results"),
    ALTER_CONFIGS: ("resources", "responses"),
    INCREMENTAL_ALTER_CONFIGS: ("resources", "responses"),
}
_SET, _DELETE = 0, 1  # IncrementalAlterConfigs operations

UpstreamGroupType = Callable[[str], Awaitable[str | None]]


class GroupConfigs:
    """The proxy's side of group configs: whose configs it holds, describing and altering them."""

    def __init__(
        self,
        coordinator: ShareGroupCoordinator,
        commits: CommitPipeline,
        upstream_group_type: UpstreamGroupType,
        *,
        write_timeout_s: float = 30.0,
    ) -> None:
        self.coordinator = coordinator
        self.commits = commits
        self.upstream_group_type = upstream_group_type
        self.write_timeout_s = write_timeout_s
        #: Scale-out: passes GROUP resources of groups coordinated elsewhere to their coordinator
        #: (proxy.share.peers.GroupConfigForwarder); None with one instance.
        self.forwarder = None

    def holds(self, group_id: str) -> bool:
        """A share group of the proxy's, or an id the proxy holds configs for."""
        return self.coordinator.has_group(group_id) or bool(self.coordinator.group_config_overrides(group_id))

    async def serves_alteration(self, group_id: str, names: list[str]) -> bool:
        if self.holds(group_id):
            return True
        if not any(is_share_group_key(name) for name in names):
            return False
        try:
            return await self.upstream_group_type(group_id) is None
        except UpstreamError as exc:
            # Share keys mean nothing to an upstream group, so the proxy keeps them: forwarding
            # would have the broker accept a config the proxy never applies.
            log.warning("cannot check upstream groups; share configs kept by the proxy", group=group_id,
                        error=str(exc))
            return True

    # ----- DescribeConfigs ----------------------------------------------------------------------

    def describe(self, result_type: type, resource: Any, *, include_synonyms: bool,
                 include_documentation: bool) -> object:
        """One DescribeConfigsResult for a group resource the proxy holds."""
        group_id = resource.resource_name
        entry_type = item_type(result_type, "configs")
        synonym_type = item_type(entry_type, "synonyms") if _has(entry_type, "synonyms") else None
        described = describe_group_config(
            self.coordinator.group_config_overrides(group_id),
            self.coordinator.config.group_defaults,
            resource.configuration_keys,
        )
        configs = tuple(
            build(
                entry_type,
                name=entry.name,
                value=entry.value,
                read_only=False,
                is_default=entry.source != entry.source.GROUP_CONFIG,  # v0
                config_source=int(entry.source),
                is_sensitive=False,
                synonyms=tuple(build(synonym_type, name=n, value=v, source=int(s)) for n, v, s in entry.synonyms)
                if include_synonyms and synonym_type is not None else (),
                config_type=int(entry.config_type),
                documentation=entry.documentation if include_documentation else None,
            )
            for entry in described
        )
        return build(result_type, error_code=ErrorCode.none, error_message=None,
                     resource_type=resource.resource_type, resource_name=group_id, configs=configs)

    # ----- IncrementalAlterConfigs --------------------------------------------------------------

    def alter(self, resource: Any, *, validate_only: bool,
              replace_all: bool = False) -> tuple[ErrorCode, str | None, int | None]:
        """Check and apply one group resource's operations: (error, message, ticket to await).

        `replace_all` (legacy AlterConfigs, whose configs carry no operation): the keys named are
        set, every other override goes back to its default.
        """
        group_id = resource.resource_name
        if not group_id:
            return ErrorCode.invalid_request, "Group name must not be empty", None
        if replace_all:
            named = {c.name for c in resource.configs}
            operations = [(c.name, _SET, c.value) for c in resource.configs] + [
                (name, _DELETE, None) for name in self.coordinator.group_config_overrides(group_id)
                if name not in named]
        else:
            operations = [(c.name, int(c.config_operation), c.value) for c in resource.configs]
        try:
            changes = altered_overrides(self.coordinator.group_config_overrides(group_id), operations)
            self.coordinator.set_group_config(group_id, changes, validate_only=validate_only)
        except GroupConfigError as error:
            log.info("group config change refused", group=group_id, error=str(error))
            return error.code, str(error), None
        if validate_only:
            return ErrorCode.none, None, None
        overrides = self.coordinator.group_config_overrides(group_id)
        record = (state_store.group_config_record(group_id, overrides) if overrides
                  else state_store.group_tombstones(group_id)[2])
        log.info("group config changed", group=group_id, overrides=overrides)
        return ErrorCode.none, None, self.commits.queue_group_records([record])

    async def durable(self, ticket: int | None) -> tuple[ErrorCode, str | None]:
        if ticket is None:
            return ErrorCode.none, None
        with trio.move_on_after(self.write_timeout_s):
            await self.commits.group_records_durable(ticket)
            return ErrorCode.none, None
        return ErrorCode.request_timed_out, (
            "The group config is applied but not yet written to the state topic; "
            "it is written as soon as the state topic is writable again.")


def _has(entity_type: type, field: str) -> bool:
    return any(f.name == field for f in dataclasses.fields(entity_type))


@dataclasses.dataclass(frozen=True, slots=True)
class GroupConfigRoute:
    """Route for DescribeConfigs / (Incremental)AlterConfigs: the proxy's group resources answered
    here, the rest through `inner` (forwarded upstream unless something else wraps it)."""

    configs: GroupConfigs
    inner: Route = FORWARD
    policy: AuthorizationPolicy | None = None

    async def _refused(self, connection: ClientConnection, api_key: int, resources: list[Any],
                       operation: Operation) -> set[int]:
        """Indexes (into `resources`) of the proxy's group resources the client may not touch."""
        authz = authorization_for(self.policy, connection)
        if authz is None:
            return set()
        # In scale-out, instances ask a group's coordinator as themselves (a leader's GroupConfigMirror,
        # an instance passing on a client's request it authorized): an instance's principal passes.
        return {i for i, r in enumerate(resources)
                if not await group_or_instance_allowed(authz, api_key, r.resource_name, operation)}

    async def start(self, request: Request, connection: ClientConnection) -> None:
        header = request.header
        entity = decode_entity(load_request_schema(header.api_key, header.api_version),
                               memoryview(request.frame)[request.body_offset:])
        resources = entity.resources or ()
        request_field, response_field = _FIELDS[header.api_key]
        result_type = item_type(load_response_schema(header.api_key, header.api_version), response_field)

        def refusal(resource: Any) -> object:
            return build(result_type, error_code=ErrorCode.group_authorization_failed,
                         error_message=GROUP_DENIED_MESSAGE, resource_type=resource.resource_type,
                         resource_name=resource.resource_name, configs=())

        # Another instance passing a request on is answered here, never passed again.
        forwarder = None if is_peer_call(header) else self.configs.forwarder

        def elsewhere(resource: Any) -> bool:
            return (forwarder is not None and int(resource.resource_type) == GROUP_RESOURCE
                    and forwarder.elsewhere(resource.resource_name))

        def failed(resource: Any, code: ErrorCode, message: str) -> object:
            return build(result_type, error_code=code, error_message=message, resource_type=resource.resource_type,
                         resource_name=resource.resource_name, configs=())

        async def forwarded(mine: list, remote: list[int]) -> dict[int, object]:
            """The coordinating instances' results for ``mine[i]``, i in ``remote``, by i."""
            if not remote:
                return {}
            answers = await forwarder.forward(entity, [mine[i] for i in remote], response_field, failed)
            return dict(zip(remote, answers))

        if header.api_key == DESCRIBE_CONFIGS:
            local = [int(r.resource_type) == GROUP_RESOURCE and (elsewhere(r) or self.configs.holds(r.resource_name))
                     for r in resources]
            if not any(local):
                await self.inner.start(request, connection)
                return
            mine = [r for r, is_local in zip(resources, local) if is_local]
            refused = await self._refused(connection, header.api_key, mine, Operation.DESCRIBE_CONFIGS)
            synonyms = bool(getattr(entity, "include_synonyms", False))
            documentation = bool(getattr(entity, "include_documentation", False))

            def described(here: dict[int, object]) -> list:
                return [refusal(r) if i in refused else here[i] if i in here else
                        self.configs.describe(result_type, r, include_synonyms=synonyms,
                                              include_documentation=documentation)
                        for i, r in enumerate(mine)]

            remote = [i for i, r in enumerate(mine) if i not in refused and elsewhere(r)]
            if not remote:
                entries = constant(described({}))  # described now, in request order; nothing to wait for
            else:
                async def with_coordinators() -> tuple:
                    return tuple(described(await forwarded(mine, remote)))

                entries = with_coordinators
        else:
            local = [
                int(r.resource_type) == GROUP_RESOURCE
                and (elsewhere(r) or await self.configs.serves_alteration(r.resource_name, [c.name for c in r.configs]))
                for r in resources
            ]
            if not any(local):
                await self.inner.start(request, connection)
                return
            mine = [r for r, is_local in zip(resources, local) if is_local]
            refused = await self._refused(connection, header.api_key, mine, Operation.ALTER_CONFIGS)
            remote = [i for i, r in enumerate(mine) if i not in refused and elsewhere(r)]
            here = [i for i in range(len(mine)) if i not in refused and i not in remote]
            outcomes = {i: outcome for i, (_, outcome) in zip(here, _alter_all(
                self.configs, [mine[i] for i in here], validate_only=bool(entity.validate_only),
                replace_all=header.api_key == ALTER_CONFIGS))}
            outcomes.update({i: (ErrorCode.group_authorization_failed, GROUP_DENIED_MESSAGE, None) for i in refused})

            async def altered() -> tuple:
                answered = await forwarded(mine, remote)
                results = []
                for i, resource in enumerate(mine):
                    if i in answered:
                        results.append(answered[i])
                        continue
                    code, message, ticket = outcomes[i]
                    if code == ErrorCode.none:
                        code, message = await self.configs.durable(ticket)
                    results.append(build(result_type, error_code=code, error_message=message,
                                         resource_type=resource.resource_type, resource_name=resource.resource_name))
                return tuple(results)

            entries = altered
        await split_request(request, connection, entity=entity, request_field=request_field,
                            response_field=response_field, forwarded=[not is_local for is_local in local],
                            local_entries=entries, inner=self.inner)


def _alter_all(configs: GroupConfigs, resources: list[Any], *, validate_only: bool, replace_all: bool) -> list:
    """Apply each group resource; a group named twice is INVALID_REQUEST for both, as in Kafka."""
    names = [r.resource_name for r in resources]
    outcomes = []
    for resource in resources:
        if names.count(resource.resource_name) > 1:
            outcome = (ErrorCode.invalid_request, "Duplicate resource in request", None)
        else:
            outcome = configs.alter(resource, validate_only=validate_only, replace_all=replace_all)
        outcomes.append((resource, outcome))
    return outcomes


@dataclasses.dataclass(frozen=True, slots=True)
class ListConfigResourcesRoute:
    """Route for ListConfigResources (v1+): the cluster's answer plus the group ids the proxy holds
    configs for (kafka-configs --describe of a group checks this list, or ListGroups, first)."""

    configs: GroupConfigs
    inner: Route = FORWARD

    async def start(self, request: Request, connection: ClientConnection) -> None:
        header = request.header
        if header.api_version >= 1:
            entity = decode_entity(load_request_schema(header.api_key, header.api_version),
                                   memoryview(request.frame)[request.body_offset:])
            types = {int(t) for t in entity.resource_types}
            if not types or GROUP_RESOURCE in types:  # empty: every type
                # Another instance asking gets this instance's groups only.
                forwarder = None if is_peer_call(header) else self.configs.forwarder

                async def add_groups(request: Request, payload: bytes) -> bytes:
                    elsewhere = set()
                    if forwarder is not None:
                        elsewhere = await forwarder.groups_configured_elsewhere(
                            dataclasses.replace(entity, resource_types=(GROUP_RESOURCE,)))
                    return self._add_groups(request, payload, elsewhere)

                await self.inner.start(request, AnswerView(connection, add_groups))
                return
        await self.inner.start(request, connection)

    def _add_groups(self, request: Request, payload: bytes, elsewhere: set[str]) -> bytes:
        """The cluster's answer plus the groups configured here and (scale-out) at other instances."""
        header, response = decode_response(request.header.api_key, request.header.api_version, payload)
        if response.error_code != ErrorCode.none:
            return payload
        listed = {r.resource_name for r in response.config_resources if int(r.resource_type) == GROUP_RESOURCE}
        entry_type = item_type(type(response), "config_resources")
        held = set(self.configs.coordinator.configured_group_ids()) | elsewhere
        extra = tuple(build(entry_type, resource_name=group_id, resource_type=GROUP_RESOURCE)
                      for group_id in sorted(held - listed))
        return encode_response(header, dataclasses.replace(
            response, config_resources=tuple(response.config_resources) + extra))


def group_config_routes(configs: GroupConfigs, routes: dict[int, Route],
                        policy: AuthorizationPolicy | None = None) -> dict[int, Route]:
    """Routes for DescribeConfigs, (Incremental)AlterConfigs and ListConfigResources, each wrapping
    the route it replaces."""
    return {
        **{api_key: GroupConfigRoute(configs, routes.get(api_key, FORWARD), policy)
           for api_key in (DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS)},
        LIST_CONFIG_RESOURCES: ListConfigResourcesRoute(configs, routes.get(LIST_CONFIG_RESOURCES, FORWARD)),
    }
