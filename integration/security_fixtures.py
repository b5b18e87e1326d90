"""ACLs on a secured local Kafka in one line: `grant(kafka, "User:alice", "topic", name, "read")`.

Both calls run as admin (the super user) through confluent-kafka's AdminClient and return only
once `describe_acls` shows the change, so the next request of the test sees it. (The
StandardAuthorizer applies ACLs from the metadata log; on a single node that is immediate
after the create/delete returns, but waiting costs nothing and keeps tests honest.)
"""

from __future__ import annotations

import time

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from proxy.localkafka import LocalKafka

ANY_HOST = "*"


def admin_for(kafka: LocalKafka, user: str = "admin") -> AdminClient:
    """An AdminClient logged in as `user` on `kafka` (plaintext brokers: no credentials)."""
    return AdminClient(kafka.client_config(user) | {"socket.timeout.ms": "10000"})


def _enum(kind: type, value: object) -> object:
    """`"read"`, `"READ"` or `AclOperation.READ` -> the enum member."""
    if isinstance(value, kind):
        return value
    return kind[str(value).upper()]  # type: ignore[index]


def acl_binding(
    principal: str,
    resource_type: str | ResourceType,
    name: str,
    operation: str | AclOperation,
    pattern: str | ResourcePatternType = "LITERAL",
    permission: str | AclPermissionType = "ALLOW",
    host: str = ANY_HOST,
) -> AclBinding:
    """One ACL; names are case-insensitive strings or confluent-kafka enums."""
    return AclBinding(
        _enum(ResourceType, resource_type),
        name,
        _enum(ResourcePatternType, pattern),
        principal,
        host,
        _enum(AclOperation, operation),
        _enum(AclPermissionType, permission),
    )


def _as_filter(binding: AclBinding) -> AclBindingFilter:
    return AclBindingFilter(
        binding.restype, binding.name, binding.resource_pattern_type,
        binding.principal, binding.host, binding.operation, binding.permission_type,
    )


def _visible(admin: AdminClient, binding: AclBinding, timeout: float) -> bool:
    return bool(admin.describe_acls(_as_filter(binding), request_timeout=timeout).result(timeout=timeout))


def _wait_until(admin: AdminClient, binding: AclBinding, present: bool, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _visible(admin, binding, timeout) != present:
        if time.monotonic() > deadline:
            state = "visible" if present else "gone"
            raise TimeoutError(f"ACL {binding} is not {state} after {timeout}s")
        time.sleep(0.05)


def grant(
    kafka: LocalKafka,
    principal: str,
    resource_type: str | ResourceType,
    name: str,
    operation: str | AclOperation,
    pattern: str | ResourcePatternType = "LITERAL",
    *,
    permission: str | AclPermissionType = "ALLOW",
    timeout: float = 30.0,
) -> AclBinding:
    """Create one ACL as admin and wait until describe_acls lists it; the binding created."""
    binding = acl_binding(principal, resource_type, name, operation, pattern, permission)
    admin = admin_for(kafka)
    for future in admin.create_acls([binding], request_timeout=timeout).values():
        future.result(timeout=timeout)
    _wait_until(admin, binding, True, timeout)
    return binding


def revoke(
    kafka: LocalKafka,
    principal: str,
    resource_type: str | ResourceType,
    name: str,
    operation: str | AclOperation,
    pattern: str | ResourcePatternType = "LITERAL",
    *,
    permission: str | AclPermissionType = "ALLOW",
    timeout: float = 30.0,
) -> None:
    """Delete that ACL as admin and wait until describe_acls no longer lists it."""
    binding = acl_binding(principal, resource_type, name, operation, pattern, permission)
    admin = admin_for(kafka)
    for future in admin.delete_acls([_as_filter(binding)], request_timeout=timeout).values():
        future.result(timeout=timeout)
    _wait_until(admin, binding, False, timeout)
