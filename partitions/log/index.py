"""Sparse per-segment indexes: offset -> file position, and timestamp -> offset.

Both keep their entries in memory (Python lists, searched with bisect) and mirror them in
an append-only file of fixed-width big-endian entries, like Kafka's `.index` and
`.timeindex`:

- OffsetIndex entry (8 bytes): relative offset int32 (batch base offset - segment base),
  file position int32 of that batch. One entry per ~index.interval.bytes of log.
- TimeIndex entry (12 bytes): timestamp int64, relative offset int32. The timestamp is the
  largest timestamp seen in the segment up to and including the batch at that offset;
  entries are appended only when that maximum grows, so both columns increase.

No file descriptor is held: new entries wait in memory (`_pending`, at most
`INDEX_PENDING_BYTES_MAX`) and are appended to the file by `flush`/`close` (or when that
buffer fills), each time through a short-lived descriptor. A broker with 100,000 partition
replicas would otherwise hold two descriptors per segment for its indexes alone (issue 25:
a process has 20,000). Entries not yet written are what a buffered file lost in a crash
before: nothing, since an index is rebuilt or checked against the log on open.

Invariants: keys strictly increasing, positions strictly increasing (checked on every
append with `partitions.invariants.invariant`, which survives `python -O`). `open` checks them
(plus the file length) and reports `corrupt` instead of trusting the file: the segment
then rebuilds the index from the log. An index is never the source of truth.
"""
from __future__ import annotations

import os
import struct
from bisect import bisect_left, bisect_right
from pathlib import Path

from ..invariants import invariant

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
OFFSET_ENTRY_SIZE = _OFFSET_ENTRY.size
TIME_ENTRY_SIZE = _TIME_ENTRY.size
INDEX_PENDING_BYTES_MAX = 4096   # entries kept in memory before they are appended to the file


class _AppendOnlyIndex:
    """Common machinery: two parallel int lists and an append-only file (entries not yet
    in the file wait in `_pending`; no descriptor is kept open between calls)."""

    entry: struct.Struct

    def __init__(self, path: str | Path, max_entries: int):
        self.path = Path(path)
        self.max_entries = max(1, max_entries)
        self._keys: list[int] = []
        self._values: list[int] = []
        self._pending = bytearray()   # entries not yet appended to the file
        self._dirty = False  # entries written since the last fsync
        self._on_disk = True  # False: the file is not created yet (reset(create_file=False))
        self.corrupt_reason: str | None = None

    # -- loading
    def load(self) -> bool:
        """Read the file; False (and `corrupt_reason`) if it fails the sanity check, in
        which case the in-memory index is empty and the caller must rebuild it."""
        self._keys, self._values = [], []
        self.corrupt_reason = None
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            self.corrupt_reason = "missing"
            return False
        except OSError as exc:
            self.corrupt_reason = f"unreadable: {exc}"
            return False
        size = self.entry.size
        if len(data) % size:
            self.corrupt_reason = f"length {len(data)} is not a multiple of the entry size {size}"
            return False
        keys, values = [], []
        for a, b in self.entry.iter_unpack(data):
            keys.append(a)
            values.append(b)
        if not self._monotonic(keys, values):
            self.corrupt_reason = "entries are not strictly increasing"
            return False
        self._keys, self._values = self._split(keys, values)
        return True

    def _split(self, a: list[int], b: list[int]) -> tuple[list[int], list[int]]:
        return a, b

    @staticmethod
    def _monotonic(keys: list[int], values: list[int]) -> bool:
        return all(x < y for x, y in zip(keys, keys[1:])) and all(x < y for x, y in zip(values, values[1:]))

    def reset(self, create_file: bool = True) -> None:
        """Drop every entry (before a rebuild). create_file=False (no file of this name
        on disk) leaves the file to the first flush, which creates it even if empty."""
        self._keys, self._values = [], []
        self._pending.clear()
        if create_file:
            with open(self.path, "wb"):
                pass
        self._on_disk = create_file
        self._dirty = False
        self.corrupt_reason = None

    # -- state
    def __len__(self) -> int:
        return len(self._keys)

    @property
    def is_full(self) -> bool:
        return len(self._keys) >= self.max_entries

    @property
    def size_bytes(self) -> int:
        return len(self._keys) * self.entry.size

    def _write(self, a: int, b: int) -> None:
        self._pending += self.entry.pack(a, b)
        if len(self._pending) >= INDEX_PENDING_BYTES_MAX:
            self.flush(fsync=False)

    def _truncate_entries(self, n: int) -> None:
        if n >= len(self._keys):
            return
        del self._keys[n:]
        del self._values[n:]
        self.flush(fsync=False)
        with open(self.path, "r+b") as f:
            f.truncate(n * self.entry.size)

    def flush(self, fsync: bool = True) -> None:
        """Append the pending entries to the file; with fsync=True also fsync them (only if
        any were added since the last fsync)."""
        pending = self._pending
        if not pending and not (fsync and self._dirty) and self._on_disk:
            return
        self._on_disk = True
        with open(self.path, "ab") as f:
            if pending:
                f.write(pending)
                pending.clear()
                self._dirty = True
            if fsync and self._dirty:
                f.flush()
                os.fsync(f.fileno())
                self._dirty = False

    def close(self) -> None:
        """Append the pending entries (no fsync); nothing else is held open. An index
        whose file was never created and has no entries stays without one."""
        if self._pending or self._on_disk:
            self.flush(fsync=False)

    def delete(self) -> None:
        self._pending.clear()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class OffsetIndex(_AppendOnlyIndex):
    """Sparse map relative offset -> file position of the batch starting there."""

    entry = _OFFSET_ENTRY

    @property
    def relative_offsets(self) -> list[int]:
        return self._keys

    @property
    def positions(self) -> list[int]:
        return self._values

    def append(self, relative_offset: int, position: int) -> None:
        keys = self._keys
        if keys:
            invariant(relative_offset > keys[-1] and position > self._values[-1],
                      "offset index entries must increase: (%d, %d) after (%d, %d)",
                      relative_offset, position, keys[-1], self._values[-1])
        self._keys.append(relative_offset)
        self._values.append(position)
        self._write(relative_offset, position)

    def lookup(self, relative_offset: int) -> tuple[int, int]:
        """Greatest entry with key <= `relative_offset`; (-1, 0) (start of file) if none."""
        i = bisect_right(self._keys, relative_offset) - 1
        if i < 0:
            return -1, 0
        return self._keys[i], self._values[i]

    def last_entry(self) -> tuple[int, int]:
        if not self._keys:
            return -1, 0
        return self._keys[-1], self._values[-1]

    def truncate_to_offset(self, relative_offset: int) -> None:
        """Drop entries with key >= relative_offset."""

        self._truncate_entries(bisect_left(self._keys, relative_offset))

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or beyond `position` (the log was cut there)."""

        self._truncate_entries(bisect_left(self._values, position))


class TimeIndex(_AppendOnlyIndex):
    """Sparse map max-timestamp-so-far -> relative offset of the batch where it was seen."""

    entry = _TIME_ENTRY

    @property
    def timestamps(self) -> list[int]:
        return self._keys

    @property
    def relative_offsets(self) -> list[int]:
        return self._values

    def maybe_append(self, timestamp: int, relative_offset: int) -> bool:
        """Append when `timestamp` is larger than the last entry's (and the offset is new)."""
        if self._keys:
            if timestamp <= self._keys[-1]:
                return False
            invariant(relative_offset > self._values[-1],
                      "time index offsets must increase: timestamp %d at relative offset %d after offset %d",
                      timestamp, relative_offset, self._values[-1])
        self._keys.append(timestamp)
        self._values.append(relative_offset)
        self._write(timestamp, relative_offset)
        return True

    def lookup_before(self, timestamp: int) -> tuple[int, int]:
        """Greatest entry with timestamp strictly < `timestamp`: every record at or before
        its batch is older than `timestamp`, so a search may start there. (-1, -1) if none."""

        i = bisect_left(self._keys, timestamp) - 1
        if i < 0:
            return -1, -1
        return self._keys[i], self._values[i]

    def last_entry(self) -> tuple[int, int]:
        if not self._keys:
            return -1, -1
        return self._keys[-1], self._values[-1]

    def truncate_to_offset(self, relative_offset: int) -> None:

        self._truncate_entries(bisect_left(self._values, relative_offset))


__all__ = ["OffsetIndex", "TimeIndex", "OFFSET_ENTRY_SIZE", "TIME_ENTRY_SIZE"]
