"""Log cleaner: compaction for topics with `cleanup.policy` containing `compact`.

One pass over a Log (`LogCleaner.clean`), Kafka's algorithm:

1. Cleanable range [first_dirty, first_uncleanable): first_dirty comes from the log's
   `cleaner-offset-checkpoint` (the end of the previous pass; log start if none);
   first_uncleanable = min(active segment base, high watermark, base of the first segment
   with records younger than min.compaction.lag.ms).
2. Offset map: key -> offset of its latest record in the dirty range (at most
   `max_map_keys` keys; a pass that fills the map ends early and the next pass continues).
3. Every closed segment below first_uncleanable is rewritten, in groups whose total size
   fits segment.bytes, keeping a record unless a later record with the same key is in the
   map, or it is a tombstone (value None) older than delete.retention.ms (by its record
   timestamp) in the cleaned range. Keyless and control records are kept. A batch whose
   records all survive is copied byte for byte; otherwise it is re-encoded with the same
   base offset, offset span, producer fields, epoch and codec; a batch left with no record
   disappears, except that each group ends with an empty batch if needed so the cleaned
   segment covers exactly the offsets of the group (crash-safe swap, see
   Log.replace_segments).
4. The cleaned segment (`.cleaned` files) replaces its group; the checkpoint advances.

Pure with respect to IO frameworks; the broker shell runs it in a worker thread.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .errors import CorruptRecordError, LogClosedError
from .leader_epoch_cache import write_checkpoint_file
from .record_batch import (
    BatchHeader,
    build_batch,
    build_empty_batch,
    decode_records,
)
from .segment import LogSegment

if TYPE_CHECKING:  # pragma: no cover
    from .log import Log

log = logging.getLogger(__name__)

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
CLEANED_SUFFIX = ".cleaned"


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class CleanerStats:
    """What one cleaning pass did."""

    first_dirty_offset: int
    end_offset: int
    segments_cleaned: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_retained: int = 0
    tombstones_removed: int = 0
    elapsed_s: float = 0.0
    aborted: bool = False


def read_cleaner_checkpoint(log_dir: Path) -> int | None:
    try:
        lines = (Path(log_dir) / CLEANER_CHECKPOINT).read_text().split()
        if len(lines) == 2 and lines[0] == "0":
            return int(lines[1])
    except (OSError, ValueError):
        pass
    return None


def write_cleaner_checkpoint(log_dir: Path, offset: int) -> None:
    write_checkpoint_file(Path(log_dir) / CLEANER_CHECKPOINT, ["0", str(offset)])


class LogCleaner:
    """Compacts logs (see module docstring). Stateless between passes apart from each
    log's checkpoint file."""

    def __init__(self, *, max_map_keys: int = 1_000_000, time_ms: Callable[[], int] = _wall_clock_ms):
        self.max_map_keys = max(1, max_map_keys)
        self._time_ms = time_ms

    # ------------------------------------------------------------------ planning

    def first_dirty_offset(self, lg: "Log") -> int:
        offset = read_cleaner_checkpoint(lg.dir)
        if offset is None:
            return lg.log_start_offset
        return min(max(offset, lg.log_start_offset), lg.log_end_offset)

    def cleanable_range(self, lg: "Log", now_ms: int | None = None) -> tuple[int, int]:
        """(first dirty offset, first uncleanable offset)."""
        now = self._time_ms() if now_ms is None else now_ms
        segments = lg.segments
        end = min(segments[-1].base_offset, lg.high_watermark)
        lag = lg.config.min_compaction_lag_ms
        if lag > 0:
            for seg in segments[:-1]:
                if seg.largest_timestamp > now - lag:
                    end = min(end, seg.base_offset)
                    break
        first_dirty = self.first_dirty_offset(lg)
        return first_dirty, max(end, first_dirty)

    def dirty_ratio(self, lg: "Log", now_ms: int | None = None) -> float:
        """Dirty bytes / cleanable bytes, by whole segments (Kafka's cleanable ratio)."""
        first_dirty, end = self.cleanable_range(lg, now_ms)
        clean = dirty = 0
        for seg in lg.segments[:-1]:
            if seg.base_offset >= end:
                break
            if seg.next_offset <= first_dirty:
                clean += seg.size
            else:
                dirty += seg.size
        total = clean + dirty
        return dirty / total if total else 0.0

    def needs_cleaning(self, lg: "Log", now_ms: int | None = None) -> bool:
        """Compacted topic with a dirty ratio >= min.cleanable.dirty.ratio, or a dirty
        segment older than max.compaction.lag.ms."""
        cfg = lg.config
        if not cfg.compact:
            return False
        now = self._time_ms() if now_ms is None else now_ms
        first_dirty, end = self.cleanable_range(lg, now)
        if first_dirty >= end:
            return False
        if cfg.max_compaction_lag_ms is not None:
            for seg in lg.segments[:-1]:
                if seg.next_offset > first_dirty and seg.base_offset < end:
                    ts = seg.rolling_timestamp
                    if ts is not None and ts >= 0 and now - ts > cfg.max_compaction_lag_ms:
                        return True
                    break
        ratio = self.dirty_ratio(lg, now)
        return ratio > 0 and ratio >= cfg.min_cleanable_dirty_ratio

    # ------------------------------------------------------------------ cleaning

    def clean(self, lg: "Log", now_ms: int | None = None) -> CleanerStats | None:
        """One compaction pass over `lg`; None if there is nothing to clean."""
        started = time.monotonic()
        now = self._time_ms() if now_ms is None else now_ms
        first_dirty, end = self.cleanable_range(lg, now)
        if first_dirty >= end:
            return None
        stats = CleanerStats(first_dirty, end)
        try:
            offset_map, end = self._build_offset_map(lg, first_dirty, end, stats)
            stats.end_offset = end
            segments = [s for s in lg.segments[:-1] if s.base_offset < end]
            for group in self._group(segments, lg.config.segment_bytes):
                cleaned = self._clean_group(lg, group, offset_map, end, now, stats)
                if not lg.replace_segments(group, cleaned):
                    stats.aborted = True
                    break
                stats.segments_cleaned += len(group)
        except (LogClosedError, OSError, CorruptRecordError) as exc:
            log.warning("cleaning %s aborted: %s", lg.dir, exc)
            stats.aborted = True
        if not stats.aborted:
            write_cleaner_checkpoint(lg.dir, end)
        stats.elapsed_s = time.monotonic() - started
        return stats

    def _iter_batches(self, seg: LogSegment, start_offset: int = -1):
        position = 0
        if start_offset > seg.base_offset:
            found = seg.translate_offset(start_offset)
            if found is None:
                return
            position = found[0]
        for pos, header in seg.scan_batches(position):
            yield header, seg.read_bytes(pos, header.size)

    def _build_offset_map(
        self, lg: "Log", first_dirty: int, end: int, stats: CleanerStats
    ) -> tuple[dict[bytes, int], int]:
        offset_map: dict[bytes, int] = {}
        for seg in lg.segments[:-1]:
            if seg.next_offset <= first_dirty:
                continue
            if seg.base_offset >= end:
                break
            for header, raw in self._iter_batches(seg, first_dirty):
                if header.base_offset >= end:
                    return offset_map, end
                if header.is_control:
                    continue
                for record in decode_records(raw, validate=False):
                    if record.key is not None and first_dirty <= record.offset < end:
                        offset_map[record.key] = record.offset
                if len(offset_map) >= self.max_map_keys:
                    return offset_map, min(end, header.next_offset)
        return offset_map, end

    @staticmethod
    def _group(segments: list[LogSegment], max_bytes: int) -> list[list[LogSegment]]:
        groups: list[list[LogSegment]] = []
        current: list[LogSegment] = []
        size = 0
        for seg in segments:
            if current and size + seg.size > max_bytes:
                groups.append(current)
                current, size = [], 0
            current.append(seg)
            size += seg.size
        if current:
            groups.append(current)
        return groups

    def _clean_group(
        self,
        lg: "Log",
        group: list[LogSegment],
        offset_map: dict[bytes, int],
        end: int,
        now: int,
        stats: CleanerStats,
    ) -> LogSegment:
        cfg = lg.config
        horizon = now - cfg.delete_retention_ms
        cleaned = LogSegment.create(lg.dir, group[0].base_offset, cfg, now, suffix=CLEANED_SUFFIX)
        last_dropped: BatchHeader | None = None
        last_epoch = -1
        for seg in group:
            for header, raw in self._iter_batches(seg):
                stats.bytes_read += len(raw)
                last_epoch = max(last_epoch, header.partition_leader_epoch)
                if header.is_control or header.record_count == 0:
                    self._append(cleaned, raw, header)
                    last_dropped = None
                    continue
                records = decode_records(raw, validate=False)
                stats.records_read += len(records)
                kept = []
                for r in records:
                    if r.key is not None:
                        latest = offset_map.get(r.key)
                        if latest is not None and r.offset < latest:
                            continue
                        if r.value is None and r.offset < end and r.timestamp <= horizon:
                            stats.tombstones_removed += 1
                            continue
                    kept.append(r)
                stats.records_retained += len(kept)
                if len(kept) == len(records):
                    self._append(cleaned, raw, header)
                    last_dropped = None
                elif kept:
                    batch = build_batch(
                        kept,
                        compression=header.compression,
                        base_offset=header.base_offset,
                        producer_id=header.producer_id,
                        producer_epoch=header.producer_epoch,
                        base_sequence=header.base_sequence,
                        timestamp_type=header.timestamp_type,
                        partition_leader_epoch=header.partition_leader_epoch,
                        offset_deltas=[r.offset - header.base_offset for r in kept],
                        last_offset_delta=header.last_offset_delta,
                        is_transactional=header.is_transactional,
                    )
                    self._append(cleaned, batch, BatchHeader.parse(batch))
                    last_dropped = None
                else:
                    last_dropped = header
        group_end = group[-1].next_offset
        if cleaned.next_offset < group_end:
            # keep the group's offset span: an empty batch up to its last offset
            base = max(cleaned.next_offset, group[0].base_offset)
            ref = last_dropped
            empty = build_empty_batch(
                base_offset=base,
                last_offset_delta=group_end - 1 - base,
                first_timestamp=ref.first_timestamp if ref else -1,
                max_timestamp=ref.max_timestamp if ref else -1,
                partition_leader_epoch=last_epoch,
            )
            self._append(cleaned, empty, BatchHeader.parse(empty))
        stats.bytes_written += cleaned.size
        return cleaned

    @staticmethod
    def _append(seg: LogSegment, raw: bytes, header: BatchHeader) -> None:
        seg.append(raw, [(0, header.base_offset, header.next_offset, header.size, header.max_timestamp)])


__all__ = ["LogCleaner", "CleanerStats", "CLEANER_CHECKPOINT", "read_cleaner_checkpoint", "write_cleaner_checkpoint"]
