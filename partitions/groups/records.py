"""`__consumer_offsets` records: keys and values with a deterministic encoding.

Record kinds, all keyed so that log compaction keeps only the latest per key:
- offset commit: key {"type": "offset", "group", "topic", "partition"} ->
  value {"offset", "metadata", "commit_timestamp_ms"}; a tombstone (value None) deletes it;
- group metadata: key {"type": "group", "group"} -> the whole group state
  (epochs, assignor, members with their assignments, target assignment); tombstone deletes;
- read barrier: one fixed key {"type": "barrier"} -> {"broker_id", "leader_epoch"}, written
  by a coordinator before it answers a read of group state (see README.md); it carries no
  state, `decode_key` rejects it, so a replay skips it.

Encoding: canonical JSON (sorted keys, no spaces, UTF-8) with a version field "v", so equal
states give equal bytes and a replay is byte-for-byte reproducible. Group -> partition is
crc32(group id) % offsets.topic.num.partitions (stable across processes, unlike hash()).
"""
from __future__ import annotations

import json
import zlib
from typing import Any

OFFSETS_TOPIC = "__consumer_offsets"
RECORD_VERSION = 1


def canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def partition_for_group(group_id: str, num_partitions: int) -> int:
    assert num_partitions > 0, "offsets topic needs at least one partition"
    return zlib.crc32(group_id.encode()) % num_partitions


def offset_key(group: str, topic: str, partition: int) -> bytes:
    return canonical({"v": RECORD_VERSION, "type": "offset", "group": group, "topic": topic,
                      "partition": partition})


def offset_value(offset: int, metadata: str, commit_timestamp_ms: int) -> bytes:
    return canonical({"v": RECORD_VERSION, "offset": offset, "metadata": metadata,
                      "commit_timestamp_ms": commit_timestamp_ms})


def group_key(group: str) -> bytes:
    return canonical({"v": RECORD_VERSION, "type": "group", "group": group})


def group_value(state: dict) -> bytes:
    return canonical(dict(state, v=RECORD_VERSION))


def barrier_key() -> bytes:
    return canonical({"v": RECORD_VERSION, "type": "barrier"})


def barrier_value(broker_id: int, leader_epoch: int) -> bytes:
    return canonical({"v": RECORD_VERSION, "broker_id": broker_id, "leader_epoch": leader_epoch})


def decode_key(key: bytes) -> dict:
    """The key as a dict; ValueError for anything that is not one of ours."""
    doc = json.loads(key)
    if not isinstance(doc, dict) or doc.get("type") not in ("offset", "group") or "group" not in doc:
        raise ValueError(f"not a __consumer_offsets key: {key[:80]!r}")
    return doc


def decode_value(value: bytes | None) -> dict | None:
    if value is None:
        return None
    doc = json.loads(value)
    if not isinstance(doc, dict):
        raise ValueError(f"not a __consumer_offsets value: {value[:80]!r}")
    return doc
