"""Record -> partition choice shared by the broker and the Python client.

Keyed records go to `crc32c(key) % partitions` (same key, same partition, for as long as
the partition count is unchanged); keyless records are spread round robin.
"""
from __future__ import annotations

import itertools

import crc32c


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """Stable partition of a key (CRC-32C, C speed, identical in every process)."""
    return crc32c.crc32c(key) % num_partitions


class RoundRobin:
    """Per-topic round-robin counter for keyless records."""

    def __init__(self) -> None:
        self._counters: dict[str, itertools.count] = {}

    def next(self, topic: str, num_partitions: int) -> int:
        counter = self._counters.get(topic)
        if counter is None:
            counter = self._counters[topic] = itertools.count()
        return next(counter) % num_partitions
