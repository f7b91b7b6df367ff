"""Kafka's ACL model: bindings of (principal, resource pattern, operation, allow/deny) and
the decision over them (Kafka's StandardAuthorizer rules).

Decision for (principal, operation, resource):
- a super user is allowed everything;
- a DENY binding that matches (the operation itself or ALL) denies: deny wins;
- otherwise an ALLOW binding that matches allows; ALLOW of READ, WRITE, DELETE or ALTER
  implies DESCRIBE, ALLOW of ALTER_CONFIGS implies DESCRIBE_CONFIGS, ALLOW of ALL implies all;
- otherwise deny (default deny once the authorizer is on).
A binding matches a principal when equal or `User:*`; a resource when its type is equal and
its pattern is LITERAL with the same name (or `*`), or PREFIXED and the name starts with it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable

ANY_PRINCIPAL = "User:*"
WILDCARD_RESOURCE = "*"
CLUSTER_RESOURCE_NAME = "kafka-cluster"    # the one CLUSTER resource, as Kafka names it


def _parse_member(cls, name, what: str):
    """The member of ACL enum `cls` named `name` (any case); ValueError listing the choices."""
    try:
        return cls[str(name).upper()]
    except KeyError:
        raise ValueError(f"unknown ACL {what} {name!r}; use one of {', '.join(m.name for m in cls)}") from None


class Operation(enum.Enum):
    ALL = "ALL"
    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DELETE = "DELETE"
    ALTER = "ALTER"
    DESCRIBE = "DESCRIBE"
    DESCRIBE_CONFIGS = "DESCRIBE_CONFIGS"
    ALTER_CONFIGS = "ALTER_CONFIGS"
    CLUSTER_ACTION = "CLUSTER_ACTION"
    IDEMPOTENT_WRITE = "IDEMPOTENT_WRITE"

    @classmethod
    def parse(cls, name: str) -> "Operation":
        return _parse_member(cls, name, "operation")


class ResourceType(enum.Enum):
    TOPIC = "TOPIC"
    GROUP = "GROUP"
    CLUSTER = "CLUSTER"
    TRANSACTIONAL_ID = "TRANSACTIONAL_ID"

    @classmethod
    def parse(cls, name: str) -> "ResourceType":
        return _parse_member(cls, name, "resource type")


class PatternType(enum.Enum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Permission(enum.Enum):
    ALLOW = "ALLOW"
    DENY = "DENY"


# an ALLOW of the key implies ALLOW of these (Kafka: DESCRIBE by READ/WRITE/DELETE/ALTER,
# DESCRIBE_CONFIGS by ALTER_CONFIGS)
IMPLIED_BY: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset({Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.ALTER_CONFIGS}),
}


def parse_principal(principal: str) -> tuple[str, str]:
    """`User:alice` -> ("User", "alice"); ValueError names the expected form."""
    kind, sep, name = str(principal).partition(":")
    if not sep or not kind or not name:
        raise ValueError(f"principal {principal!r} must look like User:NAME")
    return kind, name


@dataclass(frozen=True)
class AclBinding:
    """One ACL: `principal` (User:NAME or User:*) may (ALLOW) or may not (DENY) perform
    `operation` on resources of `resource_type` matched by (`pattern_type`, `resource_name`)."""

    principal: str
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    operation: Operation
    permission: Permission = Permission.ALLOW
    host: str = "*"

    def __post_init__(self) -> None:
        parse_principal(self.principal)
        if not self.resource_name:
            raise ValueError("an ACL needs a resource name (use * for every resource)")
        if self.resource_type is ResourceType.CLUSTER and self.resource_name != CLUSTER_RESOURCE_NAME:
            object.__setattr__(self, "resource_name", CLUSTER_RESOURCE_NAME)

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        if resource_type is not self.resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name == WILDCARD_RESOURCE or self.resource_name == name

    def matches_principal(self, principal: str) -> bool:
        return self.principal == principal or self.principal == ANY_PRINCIPAL

    def to_dict(self) -> dict:
        return {"principal": self.principal, "resource_type": self.resource_type.name,
                "resource_name": self.resource_name, "pattern_type": self.pattern_type.name,
                "operation": self.operation.name, "permission": self.permission.name, "host": self.host}

    @classmethod
    def from_dict(cls, d: dict) -> "AclBinding":
        """ValueError (naming the field) on a malformed binding."""
        try:
            return cls(principal=str(d["principal"]), resource_type=ResourceType.parse(d["resource_type"]),
                       resource_name=str(d.get("resource_name") or CLUSTER_RESOURCE_NAME),
                       pattern_type=PatternType[str(d.get("pattern_type", "LITERAL")).upper()],
                       operation=Operation.parse(d["operation"]),
                       permission=Permission[str(d.get("permission", "ALLOW")).upper()],
                       host=str(d.get("host", "*")))
        except KeyError as e:
            raise ValueError(f"ACL binding misses or has a bad {e.args[0]!r}; expected principal, resource_type, "
                             f"resource_name, pattern_type (LITERAL|PREFIXED), operation, permission (ALLOW|DENY)") from None


class Authorizer:
    """The decision over a fixed set of bindings (rebuild it when the ACLs change).

    Pure and immutable: `authorize()` reads only the bindings and `super_users`.
    """

    def __init__(self, acls: Iterable[AclBinding] = (), super_users: Iterable[str] = ()):
        self.acls: tuple[AclBinding, ...] = tuple(acls)
        self.super_users: frozenset[str] = frozenset(super_users)
        self._by_type: dict[ResourceType, list[AclBinding]] = {}
        for b in self.acls:
            self._by_type.setdefault(b.resource_type, []).append(b)

    def authorize(self, principal: str, operation: Operation, resource_type: ResourceType,
                  resource_name: str = CLUSTER_RESOURCE_NAME) -> bool:
        if principal in self.super_users:
            return True
        allowed = False
        implied_by = IMPLIED_BY.get(operation, frozenset())
        for b in self._by_type.get(resource_type, ()):
            if not (b.matches_principal(principal) and b.matches_resource(resource_type, resource_name)):
                continue
            if b.permission is Permission.DENY:
                if b.operation is operation or b.operation is Operation.ALL:
                    return False
            elif b.operation is operation or b.operation is Operation.ALL or b.operation in implied_by:
                allowed = True
        return allowed

    def describable(self, principal: str, resource_type: ResourceType, names: Iterable[str]) -> list[str]:
        """The names among `names` that `principal` may DESCRIBE (what listings show)."""
        return [n for n in names if self.authorize(principal, Operation.DESCRIBE, resource_type, n)]
