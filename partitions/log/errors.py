"""Exceptions raised by the partition log storage engine.

Plain exceptions (no HTTP imports): the broker shell maps them to Kafka error codes
(CorruptRecordError -> CORRUPT_MESSAGE, RecordTooLargeError -> MESSAGE_TOO_LARGE,
OffsetOutOfRangeError -> OFFSET_OUT_OF_RANGE, ...).
"""
from __future__ import annotations


class LogError(Exception):
    """Base class of every error raised by partitions.log."""


class CorruptRecordError(LogError, ValueError):
    """A record batch failed validation (length bounds, magic, CRC-32C, record layout).

    The batch must be rejected (or, during recovery, the log truncated before it).
    """


class InvalidRecordError(CorruptRecordError):
    """A well-formed batch the topic refuses (Kafka INVALID_RECORD), e.g. a record without
    a key on a compacted topic. Subclass of CorruptRecordError so that handlers written
    for the latter still refuse the request."""


class RecordTooLargeError(LogError, ValueError):
    """A batch is larger than max.message.bytes; the producer must send smaller batches
    or the topic's max.message.bytes must be raised."""


class OffsetOutOfRangeError(LogError):
    """A fetch or delete asked for an offset outside [log_start_offset, log_end_offset]."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int, message: str | None = None):
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        super().__init__(
            message
            or f"offset {offset} is out of range [{log_start_offset}, {log_end_offset}]: "
            f"reset the position to the log start or end offset"
        )


class OffsetMismatchError(LogError):
    """A follower append whose first offset is not the log end offset; the follower must
    truncate or re-fetch from its log end offset."""

    def __init__(self, expected: int, got: int):
        self.expected = expected
        self.got = got
        super().__init__(
            f"follower append starts at offset {got} but the log end offset is {expected}: "
            f"fetch from the log end offset"
        )


class FencedLeaderEpochError(LogError):
    """A leader append carries a leader epoch older than the log's latest: this replica was
    deposed. The broker answers NOT_LEADER_OR_FOLLOWER; the client refreshes metadata."""

    def __init__(self, leader_epoch: int, latest_epoch: int):
        self.leader_epoch = leader_epoch
        self.latest_epoch = latest_epoch
        super().__init__(
            f"leader epoch {leader_epoch} is older than the log's latest epoch "
            f"{latest_epoch}: this replica is no longer the leader"
        )


class LogClosedError(LogError):
    """The log was closed or deleted; reopen it through the LogManager."""


class OutOfOrderSequenceError(LogError):
    """An idempotent producer sent a batch whose sequence number does not follow the last one."""


class InvalidProducerEpochError(LogError):
    """An idempotent producer used an epoch older than the one the log has seen (it was fenced)."""


__all__ = [
    "LogError",
    "CorruptRecordError",
    "InvalidRecordError",
    "RecordTooLargeError",
    "OffsetOutOfRangeError",
    "OffsetMismatchError",
    "LogClosedError",
    "OutOfOrderSequenceError",
    "InvalidProducerEpochError",
]
