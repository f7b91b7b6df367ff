"""Idempotent producer state of one partition log (Kafka's ProducerStateManager).

Per producer id: its current epoch and the metadata of its last 5 batches
(first_seq, last_seq, first_offset, last_offset, max_timestamp). On a leader append of a
batch with producer_id >= 0 and base_sequence >= 0 (`check`):

- epoch older than the known one          -> InvalidProducerEpochError (the producer was fenced)
- newer epoch                             -> its first sequence must be 0
- same epoch, (first_seq, last_seq) equal to one of the last 5 batches
                                          -> duplicate: the original offsets are returned
                                             (AppendInfo.duplicate=True), nothing is written
- same epoch, start_seq <= first_seq <= last_seq <= the last appended sequence (a batch older
  than the 5 cached ones; sequences only grow per producer per partition; start_seq is the
  epoch's first sequence this log saw)
                                          -> duplicate with unknown offsets (-1), nothing written
  A batch below start_seq was never seen here (e.g. it arrived after a later batch of an
  unknown producer): OutOfOrderSequenceError, never an acknowledged duplicate.
  A request is answered as a duplicate only when all its batches are; duplicates followed
  by new batches in one request are OutOfOrderSequenceError (nothing is written).
- same epoch, first_seq != last_seq + 1   -> OutOfOrderSequenceError
- unknown producer id                     -> accepted with any sequence (state may have been
                                             lost with deleted segments)

The state is rebuilt from the batch headers of the log on open and after truncation; a
snapshot (`producer-state-snapshot`, JSON, written at close) lets a clean open skip the
scan. The snapshot is deleted once loaded, so a stale one can never be used after a crash.
"""
from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol, Sequence

from .append import AppendInfo, BatchEntry
from .errors import CorruptRecordError, InvalidProducerEpochError, OutOfOrderSequenceError
from .leader_epoch_cache import write_checkpoint_file
from .record_batch import (
    CONTROL_MASK,
    H_ATTRIBUTES,
    H_BASE_SEQUENCE,
    H_LAST_OFFSET_DELTA,
    H_PRODUCER_EPOCH,
    H_PRODUCER_ID,
)
from .segment import LogSegment

log = logging.getLogger(__name__)

PRODUCER_STATE_SNAPSHOT = "producer-state-snapshot"
NUM_BATCHES_TO_RETAIN = 5
_SEQ_MASK = 0x7FFFFFFF


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """Sequence of the last record of a batch (sequences wrap at 2**31 - 1 to 0)."""
    return (base_sequence + last_offset_delta) & _SEQ_MASK


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == ((last_seq + 1) & _SEQ_MASK)


class BatchMetadata(NamedTuple):
    """What producer state remembers of one appended batch (Kafka's BatchMetadata); the
    offsets are -1 for a duplicate older than the cached batches (offsets unknown)."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerStateEntry:
    """One producer id: its epoch, its last batches (oldest first) and `start_seq`, the first
    sequence of the epoch this log has seen: a batch below it was never seen here, so it is
    out of order, never an old duplicate (its first batch may have arrived after a later one)."""

    producer_id: int
    producer_epoch: int = -1
    batches: deque = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    last_timestamp: int = -1
    start_seq: int = 0

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None


def _duplicate_info(duplicates: list[BatchMetadata], num_records: int) -> AppendInfo:
    """AppendInfo answering a request whose batches were all appended before: the cached
    offsets when every batch is in the window and they are contiguous, else -1 (unknown)."""
    first, last = duplicates[0].first_offset, duplicates[-1].last_offset
    max_ts = max(d.max_timestamp for d in duplicates)
    known = all(d.first_offset >= 0 for d in duplicates) and all(
        a.last_offset + 1 == b.first_offset for a, b in zip(duplicates, duplicates[1:]))
    if not known:
        first = last = -1
    return AppendInfo(first, last, max_ts, -1, num_records, 0, duplicate=True)


class ScannableLog(Protocol):
    """What a rebuild reads of a log (`Log` satisfies it; producer state never imports it)."""

    @property
    def dir(self) -> Path: ...

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def segments(self) -> Sequence[LogSegment]: ...


class ProducerStateManager:
    """Producer id -> ProducerStateEntry for one log (see module docstring)."""

    def __init__(self, log_dir: str | Path | None):
        self.path = Path(log_dir) / PRODUCER_STATE_SNAPSHOT if log_dir is not None else None
        self.producers: dict[int, ProducerStateEntry] = {}

    # ------------------------------------------------------------------ rebuild

    @classmethod
    def rebuild(cls, lg: ScannableLog) -> "ProducerStateManager":
        """State from the snapshot (if any, up to its offset) plus a header scan of the rest."""
        psm = cls(lg.dir)
        start = lg.log_start_offset
        snap_offset = psm._load_snapshot(lg.log_end_offset)
        if snap_offset is not None:
            start = max(start, snap_offset)
        psm._scan(lg, start)
        return psm

    def _load_snapshot(self, log_end_offset: int) -> int | None:
        if self.path is None or not self.path.exists():
            return None
        try:
            offset, producers = self._parse_snapshot(self.path.read_text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable producer state snapshot %s: %s", self.path, exc)
            offset = None
            producers = {}
        finally:
            # consumed: a snapshot is only valid for the log it was written with
            self.path.unlink(missing_ok=True)
        if offset is None or offset > log_end_offset:
            return None
        self.producers = producers
        return offset

    @staticmethod
    def _parse_snapshot(text: str | bytes) -> tuple[int, dict[int, ProducerStateEntry]]:
        """(offset, producers) of a snapshot document (raises ValueError/KeyError/TypeError)."""
        data = json.loads(text)
        producers = {}
        for item in data["producers"]:
            pid, epoch, last_ts, batches = item[:4]
            # start_seq: absent in snapshots written before it existed (0: the old rule)
            entry = ProducerStateEntry(int(pid), int(epoch), last_timestamp=int(last_ts),
                                       start_seq=int(item[4]) if len(item) > 4 else 0)
            for b in batches:
                entry.batches.append(BatchMetadata(*(int(x) for x in b)))
            producers[entry.producer_id] = entry
        return int(data["offset"]), producers

    def merge_snapshot(self, text: str | bytes, below_offset: int) -> int:
        """Add the producers of a snapshot taken at `below_offset` or earlier (a remote
        segment's, KIP-405) that this state does not know: a replica that restarted at the
        leader's local log start learns the producers whose last batches only the remote store
        holds (duplicates and fencing keep working after it becomes leader). Producers it
        knows keep their own, newer, entry. Returns how many were added."""
        offset, producers = self._parse_snapshot(text)
        if offset > below_offset:
            raise ValueError(f"snapshot at offset {offset} is past {below_offset}")
        added = 0
        for pid, entry in producers.items():
            if pid not in self.producers:
                self.producers[pid] = entry
                added += 1
        return added

    def _scan(self, lg: ScannableLog, start_offset: int) -> None:
        for seg in lg.segments:
            if seg.next_offset <= start_offset:
                continue
            position = 0
            if seg.base_offset < start_offset:
                found = seg.translate_offset(start_offset)
                if found is None:
                    continue
                position, _ = found
            try:
                for _, header in seg.scan_batches(position):
                    if header.producer_id >= 0 and header.base_sequence >= 0 and not header.is_control:
                        self._apply(
                            header.producer_id,
                            header.producer_epoch,
                            header.base_sequence,
                            header.last_sequence,
                            header.base_offset,
                            header.last_offset,
                            header.max_timestamp,
                        )
            except CorruptRecordError:
                continue

    # ------------------------------------------------------------------ appends

    def check(self, batches: list, entries: list[BatchEntry]) -> AppendInfo | None:
        """Validate the sequence numbers of a leader append ((position, raw header tuple)
        per batch, and the entries the log gave them). Returns the original AppendInfo for a
        duplicate, None to go ahead; raises for out-of-order or fenced producers."""
        pending: dict[int, tuple[int, int]] = {}
        duplicates: list[BatchMetadata] = []
        plain = False  # a batch without producer id / sequence in this request
        for (_, h), entry in zip(batches, entries):
            pid = h[H_PRODUCER_ID]
            seq = h[H_BASE_SEQUENCE]
            if pid < 0 or seq < 0 or h[H_ATTRIBUTES] & CONTROL_MASK:
                if duplicates:
                    raise OutOfOrderSequenceError(
                        "a request mixes already-appended idempotent batches with other batches: "
                        "resend each request exactly as it was first sent")
                plain = True
                continue
            epoch = h[H_PRODUCER_EPOCH]
            last_seq = last_sequence(seq, h[H_LAST_OFFSET_DELTA])
            known = self.producers.get(pid)
            current = pending.get(pid)
            if current is None and known is not None and known.batches:
                current = (known.producer_epoch, known.last_seq)
            elif current is None and known is not None:
                current = (known.producer_epoch, -1)
            if current is None:
                pending[pid] = (epoch, last_seq)
                continue
            current_epoch, current_last = current
            if epoch < current_epoch:
                raise InvalidProducerEpochError(
                    f"producer {pid} used epoch {epoch}, older than the current epoch {current_epoch}: "
                    f"it was fenced by a newer producer instance"
                )
            if epoch > current_epoch:
                if seq != 0:
                    raise OutOfOrderSequenceError(
                        f"producer {pid} started epoch {epoch} at sequence {seq}; a new epoch starts at 0"
                    )
                pending[pid] = (epoch, last_seq)
                continue
            if pid not in pending and known is not None:
                dup = known.find_duplicate(seq, last_seq)
                if dup is None and known.batches and known.start_seq <= seq <= last_seq <= known.last_seq:
                    dup = BatchMetadata(seq, last_seq, -1, -1, -1)  # appended before the cached window
                if dup is not None:
                    duplicates.append(dup)
                    continue
            if duplicates:
                raise OutOfOrderSequenceError(
                    f"producer {pid} sent new batches after already-appended ones in one request "
                    f"(sequence {seq} follows duplicates): send each batch exactly as it was first sent"
                )
            if current_last >= 0 and not in_sequence(current_last, seq):
                raise OutOfOrderSequenceError(
                    f"producer {pid} epoch {epoch} sent sequence {seq}, expected {(current_last + 1) & _SEQ_MASK}"
                )
            pending[pid] = (epoch, last_seq)
        if not duplicates:
            return None
        if pending or plain:
            raise OutOfOrderSequenceError(
                "a request mixes already-appended idempotent batches with new ones: "
                "resend each request exactly as it was first sent")
        return _duplicate_info(duplicates, sum(d.last_seq - d.first_seq + 1 for d in duplicates))

    def update(self, batches: list, entries: list[BatchEntry], now_ms: int) -> None:
        """Record the appended batches (leader or follower append)."""
        for (_, h), entry in zip(batches, entries):
            pid = h[H_PRODUCER_ID]
            seq = h[H_BASE_SEQUENCE]
            if pid < 0 or seq < 0 or h[H_ATTRIBUTES] & CONTROL_MASK:
                continue
            self._apply(pid, h[H_PRODUCER_EPOCH], seq, last_sequence(seq, h[H_LAST_OFFSET_DELTA]), entry.base_offset,
                        entry.next_offset - 1, entry.max_timestamp)

    def _apply(self, pid: int, epoch: int, first_seq: int, last_seq: int, first_offset: int, last_offset: int,
               max_ts: int) -> None:
        entry = self.producers.get(pid)
        if entry is None:
            entry = self.producers[pid] = ProducerStateEntry(pid, epoch, start_seq=first_seq)
        elif epoch != entry.producer_epoch:
            entry.producer_epoch = epoch
            entry.batches.clear()
            entry.start_seq = first_seq
        entry.batches.append(BatchMetadata(first_seq, last_seq, first_offset, last_offset, max_ts))
        entry.last_timestamp = max_ts

    # ------------------------------------------------------------------ queries, lifecycle

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers whose last batch is older than `expiration_ms` (Kafka's
        producer.id.expiration.ms); returns how many were removed."""
        expired = [pid for pid, e in self.producers.items() if now_ms - e.last_timestamp > expiration_ms]
        for pid in expired:
            del self.producers[pid]
        return len(expired)

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self.producers.get(producer_id)

    def __len__(self) -> int:
        return len(self.producers)

    def write_snapshot(self, offset: int) -> None:
        if self.path is None or not self.path.parent.exists():
            return
        body = {
            "offset": offset,
            "producers": [
                [e.producer_id, e.producer_epoch, e.last_timestamp, [list(b) for b in e.batches], e.start_seq]
                for e in self.producers.values()
            ],
        }
        write_checkpoint_file(self.path, [json.dumps(body, separators=(",", ":"))])

    def close(self, log_end_offset: int | None = None) -> None:
        if log_end_offset is not None:
            self.write_snapshot(log_end_offset)


__all__ = ["ProducerStateManager", "ProducerStateEntry", "BatchMetadata", "PRODUCER_STATE_SNAPSHOT", "last_sequence", "in_sequence"]
