"""The two plug points of tiered storage (KIP-405), as protocols. Pure: no IO here.

- `RemoteStorageManager` moves bytes: copy one segment with its offset index, time index,
  leader epoch checkpoint and producer snapshot; fetch a byte range of one of them; delete
  them. Kafka's `org.apache.kafka.server.log.remote.storage.RemoteStorageManager`.
- `RemoteLogMetadataManager` records which segments of a partition are remote and in which
  state (`RemoteLogSegmentMetadata`), so that any broker (a new leader) can list them.

Implementations raise `RemoteStorageError` for anything the store refuses or cannot do
now (down, timeout, throttled): callers retry with backoff; `RemoteResourceNotFoundError`
when the object is gone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .metadata import RemoteLogSegmentMetadata


class RemoteStorageError(Exception):
    """The remote store failed or is unreachable; retriable."""


class RemoteResourceNotFoundError(RemoteStorageError):
    """The remote object does not exist (deleted, or never fully copied)."""


# the files of one remote segment (KIP-405's IndexType, plus the segment itself)
SEGMENT = "log"
OFFSET_INDEX = "index"
TIME_INDEX = "timeindex"
LEADER_EPOCH = "leader-epoch-checkpoint"
PRODUCER_SNAPSHOT = "snapshot"
TXN_INDEX = "txnindex"   # aborted transactions whose ABORT marker is in the segment (may be empty)
SEGMENT_FILES = (SEGMENT, OFFSET_INDEX, TIME_INDEX, LEADER_EPOCH, PRODUCER_SNAPSHOT, TXN_INDEX)


@dataclass(frozen=True)
class LogSegmentData:
    """What one copy uploads: the segment bytes (exactly its valid length), its two
    indexes, the leader epoch entries up to its end, the producer state snapshot and the
    transaction index (read_committed reads of remote data, KIP-405's TRANSACTION index)."""

    segment: bytes
    offset_index: bytes
    time_index: bytes
    leader_epoch_checkpoint: bytes
    producer_snapshot: bytes
    transaction_index: bytes = b""

    def files(self) -> dict[str, bytes]:
        return {SEGMENT: self.segment, OFFSET_INDEX: self.offset_index, TIME_INDEX: self.time_index,
                LEADER_EPOCH: self.leader_epoch_checkpoint, PRODUCER_SNAPSHOT: self.producer_snapshot,
                TXN_INDEX: self.transaction_index}


class RemoteStorageManager(Protocol):
    def copy_log_segment_data(self, md: RemoteLogSegmentMetadata, data: LogSegmentData) -> int:
        """Upload every file of the segment; returns bytes uploaded."""
        ...

    def fetch(self, md: RemoteLogSegmentMetadata, kind: str, start: int, end_inclusive: int | None = None) -> bytes:
        """Bytes [start, end_inclusive] (to the end when None) of one file of the segment."""
        ...

    def delete_log_segment_data(self, md: RemoteLogSegmentMetadata) -> None:
        """Delete every file of the segment (missing files are fine)."""
        ...

    def delete_partition_data(self, topic: str, topic_id: str) -> int:
        """Delete everything stored for the topic (topic deletion); returns objects deleted."""
        ...


class RemoteLogMetadataManager(Protocol):
    def put_segment_metadata(self, md: RemoteLogSegmentMetadata) -> None:
        """Record a segment's (new) state; DELETE_SEGMENT_FINISHED removes the record."""
        ...

    def list_segments(self, topic: str, topic_id: str, partition: int) -> list[RemoteLogSegmentMetadata]:
        """Every recorded segment of the partition in its latest state."""
        ...

    def put_log_start_floor(self, topic: str, topic_id: str, partition: int, offset: int) -> None:
        """Record that no offset below `offset` is readable any more (DeleteRecords)."""
        ...

    def log_start_floor(self, topic: str, topic_id: str, partition: int) -> int:
        """The highest floor recorded (0 when none)."""
        ...


__all__ = ["RemoteStorageManager", "RemoteLogMetadataManager", "LogSegmentData", "RemoteStorageError",
           "RemoteResourceNotFoundError", "SEGMENT", "OFFSET_INDEX", "TIME_INDEX", "LEADER_EPOCH",
           "PRODUCER_SNAPSHOT", "TXN_INDEX", "SEGMENT_FILES"]
