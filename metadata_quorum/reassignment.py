"""Partition reassignment (Kafka's KIP-455) and broker decommission: the pure rules.

A reassignment moves a partition from its original replicas to target replicas without a
gap in availability:

- start: `replicas` becomes target + removing (the original replicas not in the target, in
  their original order), `adding_replicas` = target - original, `removing_replicas` =
  original - target. The adding replicas fetch from the leader like any follower and join
  the ISR once caught up (the leader's AlterPartition);
- complete, as soon as the ISR holds every target replica: `replicas` = target, the ISR
  keeps only target replicas, the removing replicas leave (their brokers delete the local
  log when they apply the change), and leadership goes to the first target replica (the
  preferred one) when it is usable, else stays or moves to a usable target ISR member;
- cancel: `replicas` = the original replicas (`replicas` minus `adding_replicas`), the
  ISR keeps only those; the adding replicas delete what they had copied.

Everything lives in the replicated partition records, so a move survives a controller
failover (the new active controller finishes it from the image) and broker restarts.

The replication throttle is a cluster-wide broker config (Kafka's
`leader.replication.throttled.rate` / `follower.replication.throttled.rate`, bytes/s), set
with a reassignment and deleted in the batch that ends the last move. Brokers apply it
only to adding replicas outside the ISR.

Decommission (Redpanda's): the broker is cordoned (state "draining": no new placements),
every replica it holds is moved to another placeable broker chosen deterministically
(`placement.replacement_broker`), and once it holds none its registration is removed
(state "decommissioned"). This module parses requests and builds the target lists; the
`QuorumController` turns them into records.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from metadata_quorum.image import MetadataImage, PartitionRegistration
from metadata_quorum.placement import replacement_broker
from partitions.errors import ErrorCode, KraftlogError

THROTTLE_KEYS = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
CLUSTER_DEFAULT = ""   # broker config resource of the cluster-wide default (Kafka's <default>)
REASSIGNMENT_VERSION = 1
REQUEST_MAX_PARTITIONS = 20_000


@dataclass(frozen=True)
class Move:
    """One requested partition move; `target` None cancels that partition's move."""

    topic: str
    partition: int
    target: Optional[tuple]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_request(image: MetadataImage, doc: Any) -> tuple[list[Move], Optional[int]]:
    """Validate Kafka's reassignment JSON `{"version": 1, "partitions": [{"topic",
    "partition", "replicas"}], "throttle"?}` against `image`. Raises KraftlogError (4xx)
    naming the first problem; nothing is changed then."""
    if not isinstance(doc, dict):
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            'body must be {"version": 1, "partitions": [{"topic", "partition", "replicas"}]}')
    unknown = set(doc) - {"version", "partitions", "throttle"}
    if unknown:
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            f"unknown field(s) {sorted(map(str, unknown))}; allowed: version, partitions, throttle")
    if doc.get("version", REASSIGNMENT_VERSION) != REASSIGNMENT_VERSION:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"version must be {REASSIGNMENT_VERSION}, got {doc.get('version')!r}")
    throttle = doc.get("throttle")
    if throttle is not None and (not _is_int(throttle) or throttle < 1):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"throttle must be an integer >= 1 (bytes/s), got {throttle!r}")
    parts = doc.get("partitions")
    if not isinstance(parts, list) or not parts:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, "partitions must be a non-empty list of {topic, partition, replicas}")
    if len(parts) > REQUEST_MAX_PARTITIONS:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"at most {REQUEST_MAX_PARTITIONS} partitions per request")
    moves: list[Move] = []
    seen: set = set()
    for i, entry in enumerate(parts):
        where = f"partitions[{i}]"
        if not isinstance(entry, dict):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{where} must be an object {{topic, partition, replicas}}")
        extra = set(entry) - {"topic", "partition", "replicas", "log_dirs"}
        if extra:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{where}: unknown field(s) {sorted(map(str, extra))}")
        topic, partition, replicas = entry.get("topic"), entry.get("partition"), entry.get("replicas", ...)
        if not isinstance(topic, str) or not _is_int(partition):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{where} needs a string topic and an integer partition")
        if image.partition(topic, partition) is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"{where}: partition {topic}-{partition} does not exist; list topics with GET /v1/topics")
        if (topic, partition) in seen:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{where}: {topic}-{partition} is listed twice; list it once")
        seen.add((topic, partition))
        if replicas is None:   # Kafka: null replicas cancel that partition's reassignment
            moves.append(Move(topic, partition, None))
            continue
        if replicas is ... or not isinstance(replicas, list) or not all(_is_int(r) for r in replicas):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{where}: replicas must be a list of broker ids")
        if not replicas:
            raise KraftlogError(ErrorCode.INVALID_REPLICATION_FACTOR,
                                f"{where}: replicas is empty (replication factor 0); name at least one broker")
        if len(set(replicas)) != len(replicas):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{where}: replicas {replicas} repeat a broker; list each once")
        unknown_ids = [r for r in replicas if r not in image.brokers]
        if unknown_ids:
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                f"{where}: broker(s) {unknown_ids} are not registered; use ids from GET /v1/brokers")
        draining = [r for r in replicas if r in image.broker_states]
        if draining:
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                f"{where}: broker(s) {draining} are being decommissioned and take no new replicas; "
                                "recommission them first")
        moves.append(Move(topic, partition, tuple(replicas)))
    return moves, throttle


def moving_replicas(p: PartitionRegistration, target: tuple) -> tuple[tuple, tuple, tuple]:
    """(replicas, adding, removing) of `p` moving from its original replicas to `target`
    (a move in flight is replaced: its original replicas stay the base, as in Kafka)."""
    original = p.original_replicas
    removing = tuple(r for r in original if r not in target)
    adding = tuple(r for r in target if r not in original)
    return tuple(target) + removing, adding, removing


def ordered(replicas: tuple, members) -> tuple:
    return tuple(r for r in replicas if r in members)


def drain_targets(image: MetadataImage, broker_id: int) -> list[tuple[str, int, tuple]]:
    """(topic, partition, target) moving every replica of `broker_id` not already moving
    away to a placeable broker, chosen deterministically (fewest replicas, then id;
    rack-aware when racks exist: the removed replica's rack first, else a rack the
    partition does not use yet). Raises POLICY_VIOLATION, naming the topic, when some
    partition has no broker left to take the replica (decommissioning would break its
    replication factor)."""
    candidates = {b: image.brokers[b].rack for b in image.placeable_broker_ids() if b != broker_id}
    load = {b: image.replica_count(b) for b in candidates}
    leaving = image.brokers.get(broker_id)
    rack = leaving.rack if leaving is not None else image.decommissioned.get(broker_id, (None, None))[1]
    out = []
    for name in sorted(image.topics):
        t = image.topics[name]
        for part in sorted(t.partitions):
            p = t.partitions[part]
            if broker_id not in p.replicas or broker_id in p.removing_replicas:
                continue
            base = p.target_replicas
            free = {b: r for b, r in candidates.items() if b not in p.replicas}
            if not free:
                raise KraftlogError(
                    ErrorCode.POLICY_VIOLATION,
                    f"cannot decommission broker {broker_id}: {name}-{part} has replication factor {len(base)} and "
                    f"no other active broker can take its replica (active brokers: {sorted(candidates)}); add a broker "
                    "or lower the topic's replication factor first")
            used_racks = {image.brokers[r].rack for r in base if r != broker_id and r in image.brokers}
            chosen = replacement_broker(free, load, rack, used_racks)
            load[chosen] += 1
            out.append((name, part, tuple(chosen if r == broker_id else r for r in base)))
    return out
