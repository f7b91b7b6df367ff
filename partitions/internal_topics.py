"""Internal topics (Kafka's `Topic.isInternal`): the topics kraftlog itself writes and reads.

`__consumer_offsets` holds every group's committed offsets and `__transaction_state` the
transaction coordinator's log. Their layout is part of the coordinators' state (a group's
partition is crc32(group) % partition count), so changing it from outside loses data: more
partitions move groups to partitions without their offsets, `cleanup.policy=delete` or a
short retention drops committed offsets, a client record or delete-records corrupts or
truncates the coordinator's log.

The rules, for every caller (the broker routes and the controller both apply them):
- partition changes: refused (`POLICY_VIOLATION`);
- config changes: refused (`POLICY_VIOLATION`) except the storage tuning keys in
  `INTERNAL_TOPIC_TUNABLE_CONFIGS`, which change neither what is kept nor how groups map to
  partitions (Kafka's operators tune these too; the group coordinator's rules stay intact);
- client produce and delete-records: refused (`INVALID_TOPIC_EXCEPTION`, as Kafka answers a
  produce to an internal topic); the coordinators append through the replica manager, not
  through the client routes, so their writes are not affected;
- client creation (explicit or auto-created by a produce or a describe): refused; the
  coordinator creates its topic on first use with the configs it needs;
- deletion: refused.

Pure: no IO. Every refusal message says what to do instead.
"""
from __future__ import annotations

from typing import Any, Iterable

from partitions.errors import ErrorCode, KraftlogError
from partitions.groups.records import OFFSETS_TOPIC

TRANSACTION_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS: frozenset[str] = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})

# storage tuning only: segment rolling, cleaner eagerness, replication durability floor
INTERNAL_TOPIC_TUNABLE_CONFIGS: frozenset[str] = frozenset(
    {"segment.bytes", "segment.ms", "min.cleanable.dirty.ratio", "min.insync.replicas"})

_WHAT = {
    OFFSETS_TOPIC: "every consumer group's committed offsets",
    TRANSACTION_STATE_TOPIC: "the transaction coordinator's state",
}
_INSTEAD = {
    OFFSETS_TOPIC: "commit offsets with POST /v1/groups/{group}/offsets and drop them by deleting the group "
                   "(DELETE /v1/groups/{group})",
    TRANSACTION_STATE_TOPIC: "use the transactional producer API",
}


def is_internal_topic(name: Any) -> bool:
    """True for the names of kraftlog's internal topics (exact names, as Kafka)."""
    return isinstance(name, str) and name in INTERNAL_TOPICS


def _about(name: str) -> str:
    return f"{name} is an internal topic ({_WHAT.get(name, 'kraftlog state')})"


def _instead(name: str) -> str:
    return _INSTEAD.get(name, "leave it to the broker")


def check_partition_change(name: Any) -> None:
    """Raise POLICY_VIOLATION when `name` is internal (its partition count is fixed)."""
    if is_internal_topic(name):
        raise KraftlogError(ErrorCode.POLICY_VIOLATION,
                            f"{_about(name)}: its partition count is fixed at creation because each group's "
                            f"offsets live in the partition its id hashes to, and adding partitions would "
                            f"lose them; {_instead(name)}")


def check_config_change(name: Any, keys: Iterable[str]) -> None:
    """Raise POLICY_VIOLATION when `name` is internal and `keys` hold one that is not a
    storage tuning key (cleanup.policy, retention, ... would drop or alter its records)."""
    if not is_internal_topic(name):
        return
    refused = sorted(str(k) for k in keys if k not in INTERNAL_TOPIC_TUNABLE_CONFIGS)
    if refused:
        raise KraftlogError(ErrorCode.POLICY_VIOLATION,
                            f"{_about(name)}: config(s) {refused} cannot change (the broker keeps it compacted "
                            f"and never expires its records); only {sorted(INTERNAL_TOPIC_TUNABLE_CONFIGS)} "
                            f"may be tuned; {_instead(name)}")


def check_client_write(name: Any, what: str) -> None:
    """Raise INVALID_TOPIC_EXCEPTION when a client `what` ("produce", "delete-records",
    "creation") targets an internal topic; only its coordinator writes to it."""
    if is_internal_topic(name):
        raise KraftlogError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                            f"{_about(name)}: client {what} is not allowed, only its coordinator writes it; "
                            f"{_instead(name)}")


def check_deletion(name: Any) -> None:
    """Raise INVALID_TOPIC_EXCEPTION when `name` is internal (it is never deleted)."""
    if is_internal_topic(name):
        raise KraftlogError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                            f"{_about(name)} and cannot be deleted; {_instead(name)}")
