"""Replica placement, as Kafka's AdminUtils.assignReplicasToBrokers does it.

Round robin over the brokers from a random start index, with the follower offset shifted
by one every full round so the replicas of consecutive partitions do not pile on the same
pairs. When every broker declares a rack, the broker list is rack-alternated first and the
followers of a partition go to racks not used yet by that partition (while any is left).
The randomness comes from the `rng` passed in (the active controller's); the result is
recorded in PartitionRecords, so replay is deterministic.
"""
from __future__ import annotations

import random
from typing import Optional


def assign_replicas(
    brokers: dict,
    num_partitions: int,
    replication_factor: int,
    rng: random.Random,
    start_partition_id: int = 0,
) -> list[list[int]]:
    """`brokers`: broker id -> rack (or None). Returns one replica list per partition."""
    ids = sorted(brokers)
    n = len(ids)
    if n == 0 or replication_factor < 1 or replication_factor > n:
        raise ValueError(f"cannot place {replication_factor} replicas on {n} brokers")
    racks = {b: brokers[b] for b in ids}
    if all(r is not None for r in racks.values()) and len(set(racks.values())) > 1:
        return _assign_rack_aware(ids, racks, num_partitions, replication_factor, rng, start_partition_id)
    return _assign_round_robin(ids, num_partitions, replication_factor, rng, start_partition_id)


def _replica_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def _assign_round_robin(ids, num_partitions, rf, rng, start_partition_id) -> list[list[int]]:
    n = len(ids)
    start_index = rng.randrange(n)
    shift = rng.randrange(n)
    out = []
    current = start_partition_id
    for _ in range(num_partitions):
        if current > 0 and current % n == 0:
            shift += 1
        first = (current + start_index) % n
        replicas = [ids[first]]
        for j in range(rf - 1):
            replicas.append(ids[_replica_index(first, shift, j, n)])
        out.append(replicas)
        current += 1
    return out


def _rack_alternated(ids, racks) -> list[int]:
    by_rack: dict = {}
    for b in ids:
        by_rack.setdefault(racks[b], []).append(b)
    ordered_racks = sorted(by_rack)
    out = []
    i = 0
    while len(out) < len(ids):
        for r in ordered_racks:
            if i < len(by_rack[r]):
                out.append(by_rack[r][i])
        i += 1
    return out


def _assign_rack_aware(ids, racks, num_partitions, rf, rng, start_partition_id) -> list[list[int]]:
    arranged = _rack_alternated(ids, racks)
    n = len(arranged)
    num_racks = len(set(racks.values()))
    start_index = rng.randrange(n)
    shift = rng.randrange(n)
    out = []
    current = start_partition_id
    for _ in range(num_partitions):
        if current > 0 and current % n == 0:
            shift += 1
        first = (current + start_index) % n
        leader = arranged[first]
        replicas = [leader]
        used_racks = {racks[leader]}
        k = 0
        while len(replicas) < rf:
            candidate = arranged[_replica_index(first, shift, k, n)]
            k += 1
            if candidate in replicas:
                if k > 4 * n:  # safety net: fill with any broker not chosen yet
                    candidate = next(b for b in arranged if b not in replicas)
                else:
                    continue
            if racks[candidate] in used_racks and len(used_racks) < num_racks and k <= 4 * n:
                continue
            replicas.append(candidate)
            used_racks.add(racks[candidate])
            if len(used_racks) == num_racks:
                used_racks = set()  # every rack has one: start a new round of racks
        out.append(replicas)
        current += 1
    return out


def preferred_leader(replicas) -> Optional[int]:
    return replicas[0] if replicas else None


def replacement_broker(candidates: dict, load: dict, removed_rack: Optional[str] = None,
                       used_racks: frozenset | set = frozenset()) -> int:
    """The broker that takes over a replica moved off a decommissioned broker, among
    `candidates` (broker id -> rack; none of them holds the partition yet). Deterministic:
    when racks are declared, a broker in the removed replica's rack first (the partition's
    rack spread stays as it was), else one in a rack the partition does not use yet; then
    the fewest replicas (`load`: broker id -> replicas held), then the lowest id."""
    if not candidates:
        raise ValueError("no broker can take the replica")
    racked = all(r is not None for r in candidates.values())

    def rank(b: int) -> tuple:
        rack_rank = 0
        if racked:
            rack = candidates[b]
            rack_rank = 0 if rack == removed_rack else (1 if rack not in used_racks else 2)
        return (rack_rank, load.get(b, 0), b)

    return min(candidates, key=rank)
