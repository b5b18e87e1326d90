"""Kafka's authorization rules for the share APIs the proxy serves, applied at the route edge.

Each route asks :func:`authorization_for` once per request; None means nothing is enforced
(``share_authorization`` off, or auto mode on a cluster without an authorizer). The questions go
to the client's own connection through :class:`proxy.share.authorization.Authorization`, cached.
The rules follow KafkaApis.scala's handlers (docs/security.md, "Authorization", has the table):
refusals use Kafka's codes and messages, and a refused part of a request changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from proxy.metrics import api_name
from proxy.share import metrics
from proxy.share.authorization import Authorization, AuthorizationPolicy, Operation

# Errors.X.message() of Kafka's clients library: what getErrorResponse(Errors.X.exception) carries.
GROUP_DENIED_MESSAGE = "Group authorization failed."
TOPIC_DENIED_MESSAGE = "Topic authorization failed."
CLUSTER_DENIED_MESSAGE = "Cluster authorization failed."
# KafkaApis.handleShareGroupDescribe / handleConsumerGroupDescribe.
DESCRIBED_TOPICS_DENIED_MESSAGE = "The group has described topic(s) that the client is not authorized to describe."

GROUP, TOPIC, CLUSTER = "group", "topic", "cluster"


def authorization_for(policy: AuthorizationPolicy | None, connection: Any) -> Authorization | None:
    """The connection's authorization when share operations are enforced now, else None."""
    return None if policy is None else policy.for_connection(connection)


def count_denied(api_key: int, resource: str, count: int = 1) -> None:
    if count:
        metrics.AUTHORIZATION_DENIED.labels(api=api_name(api_key), resource=resource).inc(count)


async def group_allowed(authz: Authorization, api_key: int, group_id: str, operation: Operation) -> bool:
    allowed = await authz.group(group_id, operation)
    if not allowed:
        count_denied(api_key, GROUP)
    return allowed


async def instance_allowed(authz: Authorization, api_key: int) -> bool:
    """Whether the caller is a proxy instance (:meth:`Authorization.is_instance`); counted as a
    cluster denial when not (Kafka's share-state RPCs ask CLUSTER_ACTION on the cluster)."""
    allowed = await authz.is_instance()
    if not allowed:
        count_denied(api_key, CLUSTER)
    return allowed


async def group_or_instance_allowed(authz: Authorization, api_key: int, group_id: str, operation: Operation) -> bool:
    """`operation` on the group, or the caller is a proxy instance asking on a client's behalf (the
    instance that received the client's request authorized the client)."""
    if await authz.group(group_id, operation) or await authz.is_instance():
        return True
    count_denied(api_key, GROUP)
    return False


async def topics_allowed(authz: Authorization, api_key: int, names: Iterable[str], operation: Operation) -> set[str]:
    """The names on which `operation` is allowed; the others are counted as denied."""
    wanted = set(names)
    if not wanted:
        return set()
    allowed = await authz.topics(wanted, operation)
    count_denied(api_key, TOPIC, len(wanted - allowed))
    return allowed


def topic_check(authz: Authorization, cluster: Any, api_key: int, operation: Operation = Operation.READ):
    """A ``TopicCheck`` for the share service: the topic ids (by their names in the proxy's
    metadata) on which `operation` is denied. Ids the proxy does not know are not judged here:
    the service answers them as unknown, as Kafka does before authorizing."""

    async def check(topic_ids: set[uuid.UUID]) -> set[uuid.UUID]:
        names = {}
        for topic_id in topic_ids:
            topic = cluster.topic_by_id(topic_id)
            if topic is not None:
                names[topic_id] = topic.name
        allowed = await topics_allowed(authz, api_key, names.values(), operation)
        return {topic_id for topic_id, name in names.items() if name not in allowed}

    return check


__all__ = ["authorization_for", "count_denied", "group_allowed", "group_or_instance_allowed", "instance_allowed",
           "topics_allowed", "topic_check", "CLUSTER_DENIED_MESSAGE", "GROUP_DENIED_MESSAGE", "TOPIC_DENIED_MESSAGE", "DESCRIBED_TOPICS_DENIED_MESSAGE"]
