"""Typed seams between the storage engine and the replication layer.

`PartitionLog` is what a replica needs from one partition's log and `LogDirectory` what the
replica manager needs from the broker's log directory (Kafka's `LogManager`). The storage
engine (`partitions.log.log.Log`, `partitions.log.log_manager.LogManager`) satisfies them,
and so does the in-memory fake of the replication unit tests;
`tests/unit/replication/test_protocols.py` checks both, signatures included.

`TopicPartition` names the key every partition map uses; it is a tuple, so `(topic, p)`
keys stay interchangeable with it.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable


class TopicPartition(NamedTuple):
    """A partition's key: (topic name, partition number)."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@runtime_checkable
class AppendedBatches(Protocol):
    """Where an append landed (`partitions.log.log.AppendInfo`). `duplicate`: an idempotent
    retry recognised, nothing written (offsets of the original append, -1 when unknown)."""

    first_offset: int
    last_offset: int
    log_append_time_ms: int
    duplicate: bool


@runtime_checkable
class FetchedBatches(Protocol):
    """Whole batches read from a log (`partitions.log.log.FetchDataInfo`); `next_offset` is
    the offset to fetch next (the start offset when nothing was read)."""

    records: bytes
    next_offset: int


@runtime_checkable
class PartitionLog(Protocol):
    """One partition's log as the replication layer uses it.

    Offsets: log_start_offset <= high_watermark <= log_end_offset. The high watermark only
    moves forward through `update_high_watermark`; truncation lowers it to the new end.
    """

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def recovery_point(self) -> int: ...

    @property
    def latest_epoch(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def append_as_leader(self, records: bytes | bytearray | memoryview, leader_epoch: int) -> AppendedBatches:
        """Assign offsets and stamp `leader_epoch`; raises partitions.log.errors on bad input."""
        ...

    def append_as_follower(self, records: bytes | bytearray | memoryview) -> AppendedBatches:
        """Append the leader's batches as they are (offsets and epochs kept)."""
        ...

    def read(self, start_offset: int, max_bytes: int, *, max_offset: int | None = None,
             min_one_message: bool = True) -> FetchedBatches:
        """Whole batches from the one holding `start_offset`; OffsetOutOfRangeError outside the log."""
        ...

    def update_high_watermark(self, offset: int) -> int:
        """Move the HW forward to `offset` (clamped to the log); returns the HW."""
        ...

    def truncate_to(self, offset: int) -> bool:
        """Drop every batch at or above `offset`; True if anything was removed."""
        ...

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Empty the log and start it (and the HW) at `offset`."""
        ...

    def delete_records(self, before_offset: int) -> int:
        """Advance the log start offset (at most to the HW); returns the new log start."""
        ...

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(largest epoch <= `epoch`, the offset where the next epoch starts or the LEO)."""
        ...

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """First offset whose timestamp >= `timestamp_ms`, None if none."""
        ...

    def needs_flush(self, now_ms: int | None = None) -> bool:
        """True when the flush policy (flush.messages / flush.ms) asks for an fsync."""
        ...

    def flush(self, up_to_offset: int | None = None) -> None:
        """fsync up to `up_to_offset` (default: the log end) and advance the recovery point."""
        ...


@runtime_checkable
class LogDirectory(Protocol):
    """The broker's partition logs (Kafka's LogManager) as the replica manager uses them."""

    def get(self, topic: str, partition: int) -> PartitionLog | None: ...

    def get_or_create(self, topic: str, partition: int, config=None) -> PartitionLog:
        """The partition's log, created (with `config`, a LogConfig) if new."""
        ...

    def partitions(self) -> list[tuple[str, int]]:
        """Every (topic, partition) with a local log, sorted."""
        ...

    def update_config(self, topic: str, config) -> None:
        """Use `config` (a LogConfig) for `topic` from now on."""
        ...

    def delete_log(self, topic: str, partition: int) -> bool:
        """Close and delete the partition's log; False if there was none."""
        ...
