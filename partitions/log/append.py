"""What an append carries between `Log`, `LogSegment` and `ProducerStateManager`.

`BatchEntry` describes one batch of an append as the log placed it (the segment writes and
indexes it, the producer state records it); `AppendInfo` answers the whole append. Both
live here, below `log.py`, so that the modules `Log` uses can name them without importing
`Log` back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class BatchEntry(NamedTuple):
    """One batch of an append, as the log placed it: where it starts within the appended
    bytes, the offsets it was given ([base_offset, next_offset)), its size in bytes
    (offset and length prefix included) and its max timestamp (the append time for
    LogAppendTime topics)."""

    position: int
    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """Result of an append: offsets assigned, timestamps, sizes. `duplicate` is True when
    an idempotent producer's retry was recognised and nothing was written (the offsets
    are those of the original append)."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    num_records: int
    num_bytes: int
    duplicate: bool = False


__all__ = ["AppendInfo", "BatchEntry"]
