"""Log cleaner: compaction for topics with `cleanup.policy` containing `compact`.

One pass over a Log (`LogCleaner.clean`), Kafka's algorithm:

1. Plan (under the log's lock, a snapshot): cleanable range [first_dirty,
   first_uncleanable): first_dirty comes from the log's `cleaner-offset-checkpoint` (the
   end of the previous pass; log start if none); first_uncleanable = min(active segment
   base, high watermark, base of the first segment with records younger than
   min.compaction.lag.ms). The active segment is never part of a plan.
2. Offset map: key -> offset of its latest record in the dirty range, bounded by
   `dedupe_buffer_size_bytes` (Kafka's log.cleaner.dedupe.buffer.size; each entry costs
   its key length + MAP_ENTRY_OVERHEAD_BYTES): a pass that fills the map ends early and
   the next pass continues from there.
3. Every closed segment below the end of the map is rewritten, in groups whose total size
   fits segment.bytes, keeping a record unless a later record with the same key is in the
   map, or it is a tombstone (value None) whose delete horizon has passed. Keyless and
   control records are kept; so is the last batch of every live idempotent producer (as
   an empty batch carrying its producer id, epoch and sequences if all its records went),
   so producer state rebuilt from the log still recognises retries. A batch whose records
   all survive is copied byte for byte; otherwise it is re-encoded with the same base
   offset, offset span, producer fields, epoch and codec; each group ends with an empty
   batch if needed so the cleaned segment covers exactly the offsets of the group
   (crash-safe swap, see Log.replace_segments).
4. The cleaned segment (`.cleaned` files, fsynced by the worker) replaces its group under
   the log's locks; the swap is refused if the log was truncated or its segments changed
   meanwhile. Then `cleaner-tombstone-horizons` and the checkpoint advance.

Transactions (Kafka's CleanedTransactionMetadata): the cleanable range stops at the first
unstable offset (an open transaction is never cleaned). The records of aborted transactions
(the log's aborted-transaction index, those whose ABORT marker is below the high watermark) are
neither put in the offset map nor kept: an aborted value never shadows a committed one, and
read_committed answers are the same before and after. A control batch (COMMIT or ABORT
marker) is removed once no batch of its transaction is kept in front of it (the pass walks
every segment from the log start, so "not kept" means gone from the log) and
delete.retention.ms has passed since the first pass that found it so:
`cleaner-marker-horizons` lists (marker offset, producer id, that pass's time). A batch kept
as producer state (see 3.) keeps its transaction's marker. After each swap the log rebuilds
its transaction state and `.txnindex` files from the cleaned segments (log.py), so the index
holds exactly the aborted transactions that still have records.

Tombstones (KIP-534 semantics, kept in a side file instead of the batch header): a
tombstone is kept for delete.retention.ms after the first pass that cleaned past it.
`cleaner-tombstone-horizons` lists (end offset, time) of each pass that kept tombstones
of its dirty range; a tombstone at offset o is removable once o is below the first dirty
offset and the first entry with end > o is older than delete.retention.ms.

Steps 2-3 run in a `CleanerWorker`, which reads the segment files through its own
read-only descriptors and writes only `.cleaned` files: in the calling thread, or in a
cleaner process (log_scheduler.py) so that compaction does not compete with the broker
for the GIL. Pure with respect to IO frameworks.
"""
from __future__ import annotations

import logging
import os
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..clock import SYSTEM_CLOCK, Clock
from .append import BatchEntry
from .cleaner_checkpoint import (
    CLEANER_CHECKPOINT,
    TOMBSTONE_HORIZONS,
    TombstoneHorizon,
    read_cleaner_checkpoint,
    read_tombstone_horizons,
    truncate_cleaner_state,
    write_cleaner_checkpoint,
    write_tombstone_horizons,
)
from .config import LogConfig
from .errors import CorruptRecordError, LogClosedError
from .leader_epoch_cache import write_checkpoint_file
from .log import Log
from .record_batch import (
    BatchHeader,
    build_batch,
    build_empty_batch,
    decode_keys,
    decode_records,
)
from .segment import LogSegment
from .throttler import Throttler

log = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
MARKER_HORIZONS = "cleaner-marker-horizons"
MiB = 1 << 20
DEFAULT_DEDUPE_BUFFER_SIZE_BYTES = 128 * MiB  # Kafka's log.cleaner.dedupe.buffer.size
MAP_ENTRY_OVERHEAD_BYTES = 100  # dict slot + bytes and int objects, per key (CPython, measured ~95)


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
    aborted_records_removed: int = 0   # records of aborted transactions
    markers_removed: int = 0           # control batches whose transaction is gone, past delete.retention.ms
    map_keys: int = 0
    map_bytes: int = 0
    elapsed_s: float = 0.0
    throttled_s: float = 0.0   # slept to stay under io_max_bytes_per_second
    aborted: bool = False

    def to_dict(self) -> dict:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


# ---------------------------------------------------------------------- side files


def read_marker_horizons(log_dir) -> dict[tuple[int, int], int]:
    """{(marker offset, producer id): time ms of the first pass that found its transaction
    gone}; empty if the file is missing or unreadable (the markers then wait once more)."""
    try:
        lines = (Path(log_dir) / MARKER_HORIZONS).read_text().split("\n")
        if lines[0] != "0":
            return {}
        out = {}
        for line in lines[2: 2 + int(lines[1])]:
            o, pid, t = line.split()
            out[(int(o), int(pid))] = int(t)
        return out
    except (OSError, ValueError, IndexError):
        return {}


def write_marker_horizons(log_dir, horizons: dict[tuple[int, int], int]) -> None:
    write_checkpoint_file(Path(log_dir) / MARKER_HORIZONS,
                          ["0", str(len(horizons))] + [f"{o} {pid} {t}" for (o, pid), t in sorted(horizons.items())])


# ---------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class SegmentRef:
    """A closed segment as the planner saw it (the worker reads at most `size` bytes)."""

    base_offset: int
    size: int
    next_offset: int


@dataclass(frozen=True)
class CleaningPlan:
    """Everything a worker needs to clean one log (picklable: it may cross to a process)."""

    dir: str
    config: LogConfig
    segments: tuple[SegmentRef, ...]  # closed segments with base < end, oldest first
    first_dirty: int
    end: int
    now_ms: int
    horizons: tuple[TombstoneHorizon, ...]
    producer_last_offsets: frozenset = frozenset()
    dedupe_buffer_size_bytes: int = DEFAULT_DEDUPE_BUFFER_SIZE_BYTES
    max_map_keys: int | None = None
    generation: int = 0
    io_max_bytes_per_second: float = -1   # read + write bytes of the worker; <= 0: no limit
    aborted: tuple = ()                   # AbortedTxn of the log whose ABORT marker is below the HW
    marker_horizons: tuple[tuple[int, int, int], ...] = ()   # (marker offset, producer id, time ms)


@dataclass
class GroupResult:
    """A cleaned group written as `.cleaned` files (fsynced, closed)."""

    base_offset: int
    next_offset: int
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_retained: int = 0
    tombstones_removed: int = 0
    dirty_tombstones_kept: int = 0
    aborted_records_removed: int = 0
    markers_removed: int = 0
    marker_horizons: dict = field(default_factory=dict)   # markers of the group whose transaction is gone
    throttled_s: float = 0.0   # the worker's total so far (map building included)


@dataclass
class MapResult:
    end: int
    keys: int
    map_bytes: int


class CleanerWorker:
    """Steps 2-3 of a pass for one plan: builds the key -> latest offset map, then writes
    cleaned groups. Touches only its own read-only descriptors and `.cleaned` files, so it
    can run in any thread or process; the caller swaps the results in."""

    def __init__(self, plan: CleaningPlan):
        self.plan = plan
        self.offset_map: dict[bytes, int] = {}
        self.end = plan.end
        self._h_ends = [h.end_offset for h in plan.horizons]
        self._h_times = [h.time_ms for h in plan.horizons]
        self.throttler = Throttler(plan.io_max_bytes_per_second)
        self._aborted: dict[int, list[tuple[int, int]]] = {}   # producer id -> [(first, last offset)]
        for a in plan.aborted:
            self._aborted.setdefault(a.producer_id, []).append((a.first_offset, a.last_offset))
        self._marker_horizons = {(o, pid): t for o, pid, t in plan.marker_horizons}
        # producers with a batch of their current transaction kept by this pass (groups in order)
        self._txn_kept: set[int] = set()

    def _in_aborted(self, header: BatchHeader) -> bool:
        """A transactional data batch of an aborted transaction."""
        spans = self._aborted.get(header.producer_id) if header.is_transactional else None
        return bool(spans) and any(first <= header.base_offset <= last for first, last in spans)

    def _marker_removable(self, header: BatchHeader, result: GroupResult) -> bool:
        """A control batch goes once nothing of its transaction is kept in front of it and
        delete.retention.ms has passed since a pass first found that."""
        pid = header.producer_id
        kept = pid in self._txn_kept
        self._txn_kept.discard(pid)   # the transaction ends here
        if kept or header.base_offset >= self.end:
            return False
        key = (header.base_offset, pid)
        since = self._marker_horizons.get(key)
        if since is not None and since + self.plan.config.delete_retention_ms <= self.plan.now_ms:
            return True
        result.marker_horizons[key] = self.plan.now_ms if since is None else since
        return False

    def _open(self, ref: SegmentRef) -> LogSegment:
        return LogSegment.open_read_only(self.plan.dir, ref.base_offset, self.plan.config, ref.size, ref.next_offset)

    def _batches(self, ref: SegmentRef, skip_below: int = -1):
        seg = self._open(ref)
        try:
            for pos, header in seg.scan_batches(0):
                if header.next_offset <= skip_below:
                    continue
                self.throttler.maybe_throttle(header.size)
                yield header, seg.read_bytes(pos, header.size)
        finally:
            seg.close()

    def build_offset_map(self) -> MapResult:
        plan = self.plan
        first_dirty, end = plan.first_dirty, plan.end
        limit_bytes = max(1, plan.dedupe_buffer_size_bytes)
        limit_keys = plan.max_map_keys
        offset_map = self.offset_map
        map_bytes = 0
        done = False
        for ref in plan.segments:
            if done or ref.base_offset >= end:
                break
            if ref.next_offset <= first_dirty:
                continue
            for header, raw in self._batches(ref, first_dirty):
                if header.base_offset >= end:
                    done = True
                    break
                if header.is_control or self._in_aborted(header):
                    continue   # an aborted value must not shadow a committed one
                offsets, keys, _ = decode_keys(raw)
                if not offsets:
                    continue
                if first_dirty <= offsets[0] and offsets[-1] < end and None not in keys:
                    # the common case, at C speed: the whole batch is dirty and keyed
                    before = len(offset_map)
                    offset_map.update(zip(keys, offsets))
                    added = len(offset_map) - before
                    if added:
                        map_bytes += added * (sum(map(len, keys)) // len(keys) + MAP_ENTRY_OVERHEAD_BYTES)
                else:
                    for key, offset in zip(keys, offsets):
                        if key is not None and first_dirty <= offset < end:
                            if key not in offset_map:
                                map_bytes += len(key) + MAP_ENTRY_OVERHEAD_BYTES
                            offset_map[key] = offset
                if map_bytes >= limit_bytes or (limit_keys is not None and len(offset_map) >= limit_keys):
                    end = min(end, header.next_offset)
                    done = True
                    break
        self.end = end
        return MapResult(end, len(offset_map), map_bytes)

    def _tombstone_removable(self, offset: int) -> bool:
        if offset >= self.plan.first_dirty:
            return False  # this pass is the first to pass it
        i = bisect_right(self._h_ends, offset)
        if i == len(self._h_ends):
            return True  # no pass on record kept tombstones here: long expired
        return self._h_times[i] + self.plan.config.delete_retention_ms <= self.plan.now_ms

    def clean_group(self, refs: list[SegmentRef]) -> GroupResult:
        plan = self.plan
        cfg = plan.config
        end = self.end
        first_dirty = plan.first_dirty
        offset_map = self.offset_map
        keep_producer_batches = plan.producer_last_offsets
        result = GroupResult(refs[0].base_offset, refs[-1].next_offset)
        cleaned = LogSegment.create(plan.dir, refs[0].base_offset, cfg, plan.now_ms, suffix=CLEANED_SUFFIX)
        try:
            last_dropped: BatchHeader | None = None
            last_epoch = -1
            for ref in refs:
                for header, raw in self._batches(ref):
                    result.bytes_read += len(raw)
                    last_epoch = max(last_epoch, header.partition_leader_epoch)
                    if header.is_control and header.is_transactional and header.producer_id >= 0:
                        if self._marker_removable(header, result):
                            result.markers_removed += 1
                            last_dropped = header
                        else:
                            self._write(cleaned, raw, header)
                            last_dropped = None
                        continue
                    if header.record_count and self._in_aborted(header):
                        result.records_read += header.record_count
                        result.aborted_records_removed += header.record_count
                        if header.producer_id >= 0 and header.last_offset in keep_producer_batches:
                            self._write_producer_batch(cleaned, header)
                            last_dropped = None
                        else:
                            last_dropped = header
                        continue
                    if header.is_control or header.record_count == 0:
                        self._write(cleaned, raw, header)
                        last_dropped = None
                        continue
                    offsets, keys, value_lens = decode_keys(raw)
                    n = len(keys)
                    result.records_read += n
                    get = offset_map.get
                    keep = [
                        i for i, (o, k) in enumerate(zip(offsets, keys)) if k is None or get(k, -1) <= o
                    ]
                    if keep and min(value_lens[i] for i in keep) < 0:  # tombstones among survivors
                        survivors = []
                        for i in keep:
                            o = offsets[i]
                            if value_lens[i] < 0 and keys[i] is not None and o < end:
                                if self._tombstone_removable(o):
                                    result.tombstones_removed += 1
                                    continue
                                if o >= first_dirty:
                                    result.dirty_tombstones_kept += 1
                            survivors.append(i)
                        keep = survivors
                    records = decode_records(raw, validate=False) if 0 < len(keep) < n else ()
                    kept = [records[i] for i in keep] if records else keep
                    result.records_retained += len(kept)
                    if len(kept) == n:
                        self._write(cleaned, raw, header)
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
                        self._write(cleaned, batch, BatchHeader.parse(batch))
                        last_dropped = None
                    elif header.producer_id >= 0 and header.last_offset in keep_producer_batches:
                        self._write_producer_batch(cleaned, header)
                        last_dropped = None
                    else:
                        last_dropped = header
            group_end = refs[-1].next_offset
            if cleaned.next_offset < group_end:
                # keep the group's offset span: an empty batch up to its last offset. It
                # covers the last dropped batch only, never several: a follower's log ends
                # on one of the leader's batch boundaries, and a batch spanning that
                # boundary could never be appended there (issue 24); the offsets before
                # it are a gap, as anywhere in a cleaned log
                base = max(cleaned.next_offset, refs[0].base_offset,
                           last_dropped.base_offset if last_dropped is not None else -1)
                ref_h = last_dropped
                empty = build_empty_batch(
                    base_offset=base,
                    last_offset_delta=group_end - 1 - base,
                    first_timestamp=ref_h.first_timestamp if ref_h else -1,
                    max_timestamp=ref_h.max_timestamp if ref_h else -1,
                    partition_leader_epoch=last_epoch,
                )
                self._write(cleaned, empty, BatchHeader.parse(empty))
            cleaned.offset_index.flush(fsync=False)
            cleaned.time_index.flush(fsync=False)
            cleaned.flush()
            result.bytes_written = cleaned.size
            result.next_offset = cleaned.next_offset
            result.throttled_s = self.throttler.throttled_s
        except BaseException:
            cleaned.delete()
            raise
        cleaned.close()
        return result

    def _write_producer_batch(self, cleaned: LogSegment, header: BatchHeader) -> None:
        """The producer's last batch, all records gone: keep its header (an empty batch) so
        its state survives."""
        empty = build_empty_batch(
            base_offset=header.base_offset,
            last_offset_delta=header.last_offset_delta,
            first_timestamp=header.first_timestamp,
            max_timestamp=header.max_timestamp,
            partition_leader_epoch=header.partition_leader_epoch,
            producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
            attributes=header.attributes,
        )
        self._write(cleaned, empty, BatchHeader.parse(empty))

    def _write(self, cleaned: LogSegment, raw: bytes, header: BatchHeader) -> None:
        self.throttler.maybe_throttle(len(raw))
        if header.is_transactional and not header.is_control and header.producer_id >= 0:
            self._txn_kept.add(header.producer_id)
        _append(cleaned, raw, header)

    def close(self) -> None:
        self.offset_map = {}


def _append(seg: LogSegment, raw: bytes, header: BatchHeader) -> None:
    seg.append(raw, [BatchEntry(0, header.base_offset, header.next_offset, header.size, header.max_timestamp)])


class LocalCleanerRunner:
    """Runs a CleanerWorker in the calling thread."""

    def start(self, plan: CleaningPlan) -> CleanerWorker:
        return CleanerWorker(plan)


# ---------------------------------------------------------------------- the cleaner


class LogCleaner:
    """Compacts logs (see module docstring). Stateless between passes apart from each
    log's checkpoint and horizon files. `runner` decides where workers run (default: the
    calling thread)."""

    def __init__(
        self,
        *,
        dedupe_buffer_size_bytes: int = DEFAULT_DEDUPE_BUFFER_SIZE_BYTES,
        max_map_keys: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
        runner=None,
        io_max_bytes_per_second: float = -1,
    ):
        self.io_max_bytes_per_second = io_max_bytes_per_second   # Kafka's log.cleaner.io.max.bytes.per.second
        self.dedupe_buffer_size_bytes = max(1, dedupe_buffer_size_bytes)
        self.max_map_keys = None if max_map_keys is None else max(1, max_map_keys)
        self._clock = clock
        self._time_ms = clock.now_ms
        self.runner = runner or LocalCleanerRunner()

    # ------------------------------------------------------------------ planning

    def first_dirty_offset(self, lg: Log) -> int:
        offset = read_cleaner_checkpoint(lg.dir)
        if offset is None:
            return lg.log_start_offset
        return min(max(offset, lg.log_start_offset), lg.log_end_offset)

    def cleanable_range(self, lg: Log, now_ms: int | None = None) -> tuple[int, int]:
        """(first dirty offset, first uncleanable offset); first dirty <= first uncleanable."""
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
        txn = getattr(lg, "transactions", None)
        bound = txn.clean_bound(first_dirty) if txn is not None else None
        if bound is not None:
            end = min(end, bound)   # transactions: never past an open one (transactions.py)
        return min(first_dirty, end), end

    def dirty_ratio(self, lg: Log, now_ms: int | None = None) -> float:
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

    def _horizons(self, lg: Log, first_dirty: int, now: int) -> list[TombstoneHorizon]:
        horizons = read_tombstone_horizons(lg.dir)
        if horizons is None:
            # cleaned before horizons were recorded: treat the clean part as passed now
            cp = read_cleaner_checkpoint(lg.dir)
            horizons = [TombstoneHorizon(first_dirty, now)] if cp is not None and first_dirty > lg.log_start_offset else []
        return horizons

    def tombstones_due(self, lg: Log, now_ms: int | None = None) -> bool:
        """True when tombstones kept by an earlier pass have reached their delete horizon."""
        now = self._time_ms() if now_ms is None else now_ms
        horizons = read_tombstone_horizons(lg.dir) or []
        retention = lg.config.delete_retention_ms
        return any(h.time_ms + retention <= now for h in horizons) or self.markers_due(lg, now)

    def markers_due(self, lg: Log, now_ms: int | None = None) -> bool:
        """True when markers whose transaction is gone have reached their delete horizon."""
        now = self._time_ms() if now_ms is None else now_ms
        retention = lg.config.delete_retention_ms
        return any(t + retention <= now for t in read_marker_horizons(lg.dir).values())

    def needs_cleaning(self, lg: Log, now_ms: int | None = None) -> bool:
        """Compacted topic with a dirty ratio >= min.cleanable.dirty.ratio, or a dirty
        segment older than max.compaction.lag.ms, or tombstones past their horizon."""
        cfg = lg.config
        if not cfg.compact or lg.closed:
            return False
        now = self._time_ms() if now_ms is None else now_ms
        first_dirty, end = self.cleanable_range(lg, now)
        if first_dirty >= end:
            return self.tombstones_due(lg, now)
        if cfg.max_compaction_lag_ms is not None:
            for seg in lg.segments[:-1]:
                if seg.next_offset > first_dirty and seg.base_offset < end:
                    ts = seg.rolling_timestamp
                    if ts is not None and ts >= 0 and now - ts > cfg.max_compaction_lag_ms:
                        return True
                    break
        ratio = self.dirty_ratio(lg, now)
        if ratio > 0 and ratio >= cfg.min_cleanable_dirty_ratio:
            return True
        return self.tombstones_due(lg, now)

    def plan(self, lg: Log, now_ms: int | None = None) -> tuple[CleaningPlan, list[LogSegment]] | None:
        """A snapshot of what to clean (taken under the log's lock), or None."""
        now = self._time_ms() if now_ms is None else now_ms
        with lg.lock:
            if lg.closed:
                return None
            first_dirty, end = self.cleanable_range(lg, now)
            horizons = self._horizons(lg, first_dirty, now)
            retention = lg.config.delete_retention_ms
            if first_dirty >= end and not any(h.time_ms + retention <= now for h in horizons) \
                    and not self.markers_due(lg, now):
                return None
            segments = [s for s in lg.segments[:-1] if s.base_offset < end]
            if not segments:
                return None
            plan = CleaningPlan(
                dir=str(lg.dir),
                config=lg.config,
                segments=tuple(SegmentRef(s.base_offset, s.size, s.next_offset) for s in segments),
                first_dirty=first_dirty,
                end=end,
                now_ms=now,
                horizons=tuple(horizons),
                producer_last_offsets=frozenset(lg.producer_last_offsets()),
                dedupe_buffer_size_bytes=self.dedupe_buffer_size_bytes,
                max_map_keys=self.max_map_keys,
                generation=lg.generation,
                io_max_bytes_per_second=self.io_max_bytes_per_second,
                aborted=self._aborted_below(lg),
                marker_horizons=tuple((o, pid, t) for (o, pid), t in read_marker_horizons(lg.dir).items()),
            )
            return plan, segments

    @staticmethod
    def _aborted_below(lg: Log) -> tuple:
        """The aborted transactions whose ABORT marker is below the high watermark (the
        marker is replicated: the abort is final, even if the marker itself is not in
        the cleanable range)."""
        txn = getattr(lg, "transactions", None)
        hw = lg.high_watermark
        return tuple(a for a in txn.aborted if a.last_offset < hw) if txn is not None else ()

    # ------------------------------------------------------------------ cleaning

    def clean(
        self, lg: Log, now_ms: int | None = None, *, should_abort: Callable[[], bool] | None = None
    ) -> CleanerStats | None:
        """One compaction pass over `lg`; None if there is nothing to clean."""
        started = time.monotonic()
        planned = self.plan(lg, now_ms)
        if planned is None:
            return None
        plan, segments = planned
        stats = CleanerStats(plan.first_dirty, plan.end)
        kept_dirty_tombstones = 0
        marker_horizons: dict[tuple[int, int], int] = {}
        worker = None
        try:
            worker = self.runner.start(plan)
            mapped = worker.build_offset_map()
            end = stats.end_offset = mapped.end
            stats.map_keys, stats.map_bytes = mapped.keys, mapped.map_bytes
            for group in self._group([s for s in segments if s.base_offset < end], plan.config.segment_bytes):
                if should_abort is not None and should_abort():
                    stats.aborted = True
                    break
                refs = [SegmentRef(s.base_offset, s.size, s.next_offset) for s in group]
                res = worker.clean_group(refs)
                stats.bytes_read += res.bytes_read
                stats.bytes_written += res.bytes_written
                stats.records_read += res.records_read
                stats.records_retained += res.records_retained
                stats.tombstones_removed += res.tombstones_removed
                stats.aborted_records_removed += res.aborted_records_removed
                stats.markers_removed += res.markers_removed
                marker_horizons.update(res.marker_horizons)
                stats.throttled_s = res.throttled_s
                kept_dirty_tombstones += res.dirty_tombstones_kept
                new = LogSegment(plan.dir, res.base_offset, plan.config, plan.now_ms, suffix=CLEANED_SUFFIX)
                new.next_offset = res.next_offset
                if not lg.replace_segments(group, new, generation=plan.generation):
                    stats.aborted = True
                    break
                stats.segments_cleaned += len(group)
        except (LogClosedError, OSError, CorruptRecordError) as exc:
            log.warning("cleaning %s aborted: %s", lg.dir, exc)
            stats.aborted = True
        finally:
            if worker is not None:
                try:
                    worker.close()
                except Exception:  # noqa: BLE001 - a dead worker process has nothing to free
                    pass
        if not stats.aborted:
            try:
                with lg.cleaner_state_lock:  # not lg.lock: appends must not wait for these fsyncs
                    if lg.closed or lg.generation != plan.generation:
                        stats.aborted = True
                    else:
                        retention = plan.config.delete_retention_ms
                        horizons = [h for h in plan.horizons if h.time_ms + retention > plan.now_ms]
                        if kept_dirty_tombstones:
                            # bound the file: a recent entry's tombstones take the new, later
                            # time (kept at most 1% of delete.retention.ms longer, never shorter)
                            while horizons and plan.now_ms - horizons[-1].time_ms < max(1, retention // 100):
                                horizons.pop()
                            horizons.append(TombstoneHorizon(stats.end_offset, plan.now_ms))
                        if horizons != list(plan.horizons) or read_tombstone_horizons(lg.dir) is None:
                            write_tombstone_horizons(lg.dir, horizons)
                        # markers of the cleaned range: this pass's view; beyond it: kept as they were
                        marker_horizons.update({(o, pid): t for o, pid, t in plan.marker_horizons
                                                if o >= stats.end_offset})
                        if marker_horizons != {(o, pid): t for o, pid, t in plan.marker_horizons}:
                            write_marker_horizons(lg.dir, marker_horizons)
                        write_cleaner_checkpoint(lg.dir, stats.end_offset)
            except OSError as exc:
                log.warning("cleaning %s: writing its checkpoint failed: %s", lg.dir, exc)
                stats.aborted = True
        stats.elapsed_s = time.monotonic() - started
        return stats

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


__all__ = [
    "LogCleaner",
    "CleanerStats",
    "CleanerWorker",
    "CleaningPlan",
    "SegmentRef",
    "LocalCleanerRunner",
    "CLEANER_CHECKPOINT",
    "TOMBSTONE_HORIZONS",
    "MARKER_HORIZONS",
    "read_marker_horizons",
    "DEFAULT_DEDUPE_BUFFER_SIZE_BYTES",
    "read_cleaner_checkpoint",
    "write_cleaner_checkpoint",
    "read_tombstone_horizons",
    "truncate_cleaner_state",
]
