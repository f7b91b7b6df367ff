"""`Log`: one partition replica's log, a list of segments plus its offsets.

Offsets: log_start_offset <= high_watermark <= log_end_offset, recovery_point <=
log_end_offset (checked with `partitions.invariants.invariant`, which survives `python -O`,
after every mutation; an append only raises the log end and its segment checks that offsets
increase). Batches are contiguous in offset order across segments; only the last
(active) segment is appended to. Retention deletes whole segments below the high watermark;
an expired active segment wholly below it is rolled first, then deleted (Kafka).

Threading: one owner thread appends, reads and truncates; `flush` may run in another
thread (group commit). `_lock` guards the segment list and counters; `_flush_lock` is
held while fsyncing so that segments are not closed under an fsync (operations that
close segments take `_flush_lock` first, then `_lock`).
"""
from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..clock import SYSTEM_CLOCK, Clock
from ..invariants import invariant
from .append import AppendInfo, BatchEntry
from .cleaner_checkpoint import truncate_cleaner_state
from .config import LogConfig
from .errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    InvalidRecordError,
    LogClosedError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from .leader_epoch_cache import LEADER_EPOCH_CHECKPOINT, LeaderEpochCache, fsync_dir
from .producer_state import ProducerStateManager
from .transactions import TransactionIndex
from .record_batch import (
    CONTROL_MASK,
    H_ATTRIBUTES,
    H_BASE_OFFSET,
    H_BATCH_LENGTH,
    H_LAST_OFFSET_DELTA,
    H_LEADER_EPOCH,
    H_MAX_TIMESTAMP,
    H_PRODUCER_ID,
    H_RECORD_COUNT,
    LOG_OVERHEAD,
    TRANSACTIONAL_MASK,
    decode_records,
    set_log_append_time,
    validate_batch_raw,
)
from .segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, LogSegment, parse_segment_base, segment_file_name

log = logging.getLogger(__name__)

_STAMP = struct.Struct(">qii")  # base_offset, batch_length, partition_leader_epoch: before the CRC
_MAX_WRITEV_BATCHES = 64  # 2 iovecs per batch, well under IOV_MAX (1024)
# BatchEntry(...) without the Python-level NamedTuple __new__ (half the cost, per batch appended)
_new_entry = tuple.__new__

LATEST_TIMESTAMP = -1  # offset_for_timestamp(-1) -> log end offset (Kafka ListOffsets LATEST)
EARLIEST_TIMESTAMP = -2  # offset_for_timestamp(-2) -> log start offset (EARLIEST)

# Files left behind by an interrupted operation; removed on open.
LEFTOVER_SUFFIXES = (".tmp", ".deleted", ".cleaned", ".swap")
# Present once offsets may have gaps between batches (compaction ran, or a follower copied
# a compacted leader): recovery then stops treating a gap as corruption.
OFFSET_GAPS_MARKER = "log-has-offset-gaps"


def has_flush_policy(config: LogConfig) -> bool:
    """flush.ms or flush.messages is set (both default to None: the OS decides when)."""
    return config.flush_ms is not None or config.flush_messages is not None


def parse_topic_partition(name: str) -> tuple[str, int]:
    """`orders-3` -> ("orders", 3). Raises ValueError for anything else."""
    topic, sep, part = name.rpartition("-")
    if not sep or not topic or not part.isdigit():
        raise ValueError(f"log directory name {name!r} is not <topic>-<partition>")
    return topic, int(part)


@dataclass(frozen=True, slots=True)
class FetchDataInfo:
    """Whole batches read from the log. `first_offset` is the base offset of the first
    batch (may be below the requested offset: the client skips those records);
    `next_offset` is the offset to fetch next. Empty records: first == next == start."""

    records: bytes
    first_offset: int
    next_offset: int
    high_watermark: int = 0
    log_start_offset: int = 0
    log_end_offset: int = 0


class Log:
    """One partition replica's log (see module docstring for invariants)."""

    def __init__(self) -> None:  # use Log.open
        raise TypeError("use Log.open(dir, config, ...)")

    # ================================================================== opening

    @classmethod
    def open(
        cls,
        dir: str | Path,
        config: LogConfig,
        *,
        recovery_point: int = 0,
        log_start_offset: int | None = None,
        high_watermark: int = 0,
        clean_shutdown: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> "Log":
        """Load (and, unless clean_shutdown, recover) the log in `dir`, creating it if
        missing. Corrupt or torn data is truncated with a warning, never raised."""
        self = object.__new__(cls)
        self._dir = Path(dir)
        try:
            os.mkdir(self._dir)
            created = True    # a dir we just made is empty: nothing to list, load or recover
        except FileExistsError:
            created = False
        except FileNotFoundError:   # (rare: the log dir itself was missing) the full load below
            self._dir.mkdir(parents=True, exist_ok=True)
            created = False
        try:
            self._topic, self._partition = parse_topic_partition(self._dir.name)
        except ValueError:
            self._topic, self._partition = self._dir.name, -1
        self._config = config
        self._clock = clock
        self._time_ms = clock.now_ms
        self._lock = threading.RLock()
        self._flush_lock = threading.RLock()
        # held while the cleaner's checkpoint files change (cleaner.py); truncation takes it
        # after _lock so that a pass never records offsets a truncation has removed
        self.cleaner_state_lock = threading.Lock()
        self._generation = 0  # bumped by every truncation: a cleaner pass planned before it is void
        self._closed = False
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []
        self._unflushed_messages = 0
        self._last_flush_ms = clock.now_ms()
        self._flush_policy = has_flush_policy(config)
        # the LogManager's indexes (issue 25: its periodic passes visit only the logs they can
        # act on): a log with a flush policy adds itself to `flush_candidates` when an append
        # leaves unflushed data; `on_config_change(log)` runs after every update_config
        self.flush_candidates: set | None = None
        self.on_config_change: Callable[["Log"], None] | None = None
        self.producer_state = None
        self.transactions: TransactionIndex | None = None
        # tiered storage: offsets below this are in the remote store (set by the remote log
        # manager, partitions/log/remote/); with remote.storage.enable only segments wholly
        # below it may be deleted by local retention. -1: nothing remote (yet)
        self.remote_copied_end_offset = -1
        # a new log's first segment file is in its dir entry only once the dir is fsynced:
        # the first flush that makes data durable does it (as Kafka's LocalLog.flush), not
        # Log.open, which costs one fsync per partition created (issue 25: 42 ms each on a
        # busy disk). Lost in a crash before that flush, the empty segment is created again.
        self._dir_unsynced = False
        self._max_recovery_point = 0   # the highest recovery point this log had (see _epoch_started)
        if created:
            self._load_created(recovery_point, log_start_offset)
        else:
            self._load(recovery_point, log_start_offset, high_watermark, clean_shutdown)
        return self

    def _load_created(self, recovery_point: int, log_start_offset: int | None) -> None:
        """`_load` for a dir `open` has just created: the state `_load` reaches for a dir
        without files (one empty segment at the log start, empty epoch cache, producer and
        transaction state), without listing the dir or looking for checkpoint, snapshot
        and index files one by one (issue 25: ~10 file-system calls and their path objects
        per partition, for each of 10,000 partitions created at once)."""
        start = log_start_offset if log_start_offset is not None else 0
        self.leader_epoch_cache = LeaderEpochCache(self._dir / LEADER_EPOCH_CHECKPOINT)
        self._offset_gaps = False
        seg = LogSegment.create(self._dir, start, self._config, self._time_ms(), index_files=False)
        self._segments = [seg]
        self._bases = [start]
        self._dir_unsynced = True   # fsynced by the first flush (see open)
        self._log_start_offset = start
        self._recovery_point = start
        self._high_watermark = start
        self._max_recovery_point = max(recovery_point, start)
        self.producer_state = ProducerStateManager(self._dir)
        self.transactions = TransactionIndex(self._dir)
        self._check_offsets()

    def _remove_leftovers(self) -> None:
        for path in self._dir.iterdir():
            name = path.name
            if name.endswith(LEFTOVER_SUFFIXES) and path.is_file():
                log.info("removing leftover file %s", path)
                path.unlink(missing_ok=True)

    def _load(self, recovery_point: int, log_start_offset: int | None, high_watermark: int, clean: bool) -> None:
        self._remove_leftovers()
        bases: list[int] = []
        for path in self._dir.iterdir():
            base = parse_segment_base(path.name)
            if base is None:
                continue
            if path.name.endswith(LOG_SUFFIX) and path.name.count(".") == 1 and path.is_file():
                bases.append(base)
        bases.sort()
        base_set = set(bases)
        for path in self._dir.iterdir():
            base = parse_segment_base(path.name)
            if (
                base is not None
                and path.name.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX))
                and base not in base_set
                and path.is_file()
            ):
                log.info("removing index %s without its segment", path)
                path.unlink(missing_ok=True)

        cache = LeaderEpochCache.load(self._dir / LEADER_EPOCH_CHECKPOINT)
        self.leader_epoch_cache = cache
        rebuild_cache = not cache.loaded_ok

        def on_batch(h: tuple) -> None:
            epoch = h[H_LEADER_EPOCH]
            if epoch >= 0 and epoch != cache.latest_epoch:
                cache.assign(epoch, h[H_BASE_OFFSET], persist=False)

        self._offset_gaps = (self._dir / OFFSET_GAPS_MARKER).exists()
        contiguous = not (self._config.compact or self._offset_gaps)
        recover_from = None
        if not clean:
            candidates = [b for b in bases if b <= recovery_point]
            recover_from = candidates[-1] if candidates else (bases[0] if bases else 0)
            if not rebuild_cache:
                # the epochs of the re-read batches are assigned again in order: entries from
                # there on (maybe never written, maybe stale) must not make an older epoch of
                # the re-read batches look like a conflict and move its start offset up
                cache.truncate_from_end(recover_from, persist=False)
        now = self._time_ms()
        corrupt_at: int | None = None
        recovered_any = False
        for base in bases:
            if corrupt_at is not None:
                log.warning(
                    "%s: deleting segment %d after the corrupt segment at %d", self._dir, base, corrupt_at
                )
                self._delete_segment_files(base)
                continue
            recover = recover_from is not None and base >= recover_from
            seg, truncated = LogSegment.load(
                self._dir, base, self._config, now, recover=recover, on_batch=on_batch, contiguous=contiguous
            )
            recovered_any = recovered_any or recover
            if self._segments and seg.base_offset < self._segments[-1].next_offset and (
                seg.next_offset <= self._segments[-1].next_offset
            ):
                # wholly covered by the previous segment: left over from an interrupted
                # cleaner swap (the cleaned segment replaced the first one it covers)
                log.info("%s: removing segment %d covered by the previous segment", self._dir, base)
                seg.delete()
                continue
            if self._segments and seg.base_offset < self._segments[-1].next_offset:
                log.warning(
                    "%s: segment %d overlaps the previous one (ends at %d); deleting it and the rest",
                    self._dir, base, self._segments[-1].next_offset,
                )
                seg.delete()
                corrupt_at = base
                continue
            if truncated:
                corrupt_at = base
                if seg.is_empty and self._segments and seg.base_offset > self._segments[-1].next_offset:
                    # nothing valid in it: drop it rather than let its base offset open a gap
                    seg.delete()
                    continue
            self._segments.append(seg)
        if not self._segments:
            start = log_start_offset if log_start_offset is not None else 0
            # index files are created by the first flush (segment.py, create): one file
            # create per new partition instead of three
            self._segments.append(LogSegment.create(self._dir, start, self._config, now, index_files=False))
            self._dir_unsynced = True   # fsynced by the first flush (see open)
        self._bases = [s.base_offset for s in self._segments]

        if rebuild_cache:
            cache.clear(persist=False)
            for seg in self._segments:
                try:
                    for _, h in seg.scan_raw(0):
                        on_batch(h)
                except CorruptRecordError:
                    pass

        self._log_start_offset = max(log_start_offset or 0, self._segments[0].base_offset)
        leo = self.log_end_offset
        if self._log_start_offset > leo:
            log.warning(
                "%s: log start offset %d is beyond the log end %d; starting an empty log there",
                self._dir, self._log_start_offset, leo,
            )
            self._truncate_fully(self._log_start_offset)
            leo = self.log_end_offset
        if recovered_any:
            for seg in self._segments:
                if recover_from is not None and seg.base_offset >= recover_from:
                    seg.flush()
            self._recovery_point = leo
        else:
            self._recovery_point = min(max(recovery_point, self._log_start_offset), leo)
        self._high_watermark = min(max(high_watermark, self._log_start_offset), leo)
        self._max_recovery_point = max(recovery_point, self._recovery_point)
        cache.truncate_from_end(leo, persist=False)
        cache.truncate_from_start(self._log_start_offset, persist=False)
        if cache.entries or (self._dir / LEADER_EPOCH_CHECKPOINT).exists():
            cache.persist()   # a new log's empty cache needs no file (missing = empty): 2 fsyncs saved
        self._rebuild_producer_state(clean_open=clean)
        self._check_offsets()

    def _rebuild_producer_state(self, clean_open: bool = False) -> None:
        """Idempotent producer state (producer_state.py) and transaction state
        (transactions.py: from its snapshot after a clean shutdown), rebuilt from the log."""
        self.producer_state = ProducerStateManager.rebuild(self)
        self.transactions = TransactionIndex.load(self._segments, self._log_start_offset, self._dir,
                                                  self._high_watermark, self.log_end_offset, clean_open)

    def last_stable_offset(self, high_watermark: int | None = None) -> int:
        """min(high watermark, first offset of the oldest open transaction) (Kafka's LSO)."""
        hw = self._high_watermark if high_watermark is None else high_watermark
        txn = self.transactions
        return hw if txn is None else txn.last_stable_offset(hw)

    def aborted_transactions(self, start: int, end: int) -> list:
        """Aborted transactions (transactions.AbortedTxn) with records in [start, end)."""
        with self._lock:
            txn = self.transactions
            return [] if txn is None else txn.aborted_in_range(start, end)

    def _delete_segment_files(self, base: int) -> None:
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            (self._dir / segment_file_name(base, suffix)).unlink(missing_ok=True)

    # ================================================================== properties

    @property
    def dir(self) -> Path:
        return self._dir

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def partition(self) -> int:
        return self._partition

    @property
    def config(self) -> LogConfig:
        return self._config

    def update_config(self, config: LogConfig) -> None:
        with self._lock:
            self._config = config
            self._flush_policy = has_flush_policy(config)
            for seg in self._segments:
                seg.config = config
            if self.policy_flush_pending and self.flush_candidates is not None:
                self.flush_candidates.add(self)
        hook = self.on_config_change
        if hook is not None:   # outside _lock: the hook takes its manager's lock
            hook(self)

    @property
    def lock(self) -> threading.RLock:
        """The lock guarding the segment list (held briefly; never across slow IO)."""
        return self._lock

    @property
    def generation(self) -> int:
        """Bumped by every truncation; the cleaner refuses to swap across a change."""
        return self._generation

    def producer_last_offsets(self) -> set[int]:
        """Last offset of the last batch of every live idempotent producer (the cleaner
        keeps those batches so producer state survives compaction)."""
        with self._lock:
            ps = self.producer_state
            if ps is None:
                return set()
            return {e.last_offset for e in ps.producers.values() if e.last_offset >= 0}

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def segments(self) -> list[LogSegment]:
        """A snapshot of the segments, oldest first (the last one is active)."""
        return list(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def latest_epoch(self) -> int:
        return self.leader_epoch_cache.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch (see LeaderEpochCache.end_offset_for_epoch)."""
        with self._lock:
            return self.leader_epoch_cache.end_offset_for_epoch(epoch, self.log_end_offset)

    @property
    def unflushed_messages(self) -> int:
        return self._unflushed_messages

    @property
    def policy_flush_pending(self) -> bool:
        """Unflushed data under a flush policy: a future `needs_flush` may say True."""
        return self._flush_policy and self._unflushed_messages > 0

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self._dir} is closed; reopen it through the LogManager")

    def __repr__(self) -> str:
        return (
            f"Log({self._dir.name}, start={self._log_start_offset}, hw={self._high_watermark}, "
            f"end={self.log_end_offset}, segments={len(self._segments)})"
        )

    # ================================================================== appends

    @staticmethod
    def _validate_all(data, max_batch_bytes: int | None) -> list[tuple[int, tuple]]:
        """(position, raw header tuple) of every batch; raises before anything is written."""
        batches = []
        pos = 0
        end = len(data)
        if end == 0:
            raise CorruptRecordError("no record batch to append: the request body is empty")
        while pos < end:
            h = validate_batch_raw(data, pos, max_batch_bytes)
            batches.append((pos, h))
            pos += LOG_OVERHEAD + h[H_BATCH_LENGTH]
        return batches

    @staticmethod
    def _check_keys(records, batches: list[tuple[int, tuple]]) -> None:
        """Compacted topics need a key on every record (Kafka's LogValidator rule)."""
        view = memoryview(records)
        for pos, h in batches:
            if h[H_ATTRIBUTES] & CONTROL_MASK:
                continue
            batch = view[pos : pos + LOG_OVERHEAD + h[H_BATCH_LENGTH]]
            for record in decode_records(batch, validate=False):
                if record.key is None:
                    raise InvalidRecordError(
                        f"record at offset delta {record.offset - h[H_BASE_OFFSET]} of the batch at position {pos} "
                        f"has no key: compacted topics (cleanup.policy=compact) need a key on every record"
                    )

    def append_as_leader(self, records: bytes | bytearray | memoryview, leader_epoch: int) -> AppendInfo:
        """Validate every batch (CRC, size <= max.message.bytes) before writing anything,
        stamp consecutive offsets and `leader_epoch` in place, append, roll if needed."""
        with self._lock:
            self._check_open()
            append_time = self._config.log_append_time
            batches = self._validate_all(records, self._config.max_message_bytes)
            if self._config.compact:
                self._check_keys(records, batches)
            latest_epoch = self.leader_epoch_cache.latest_epoch
            if leader_epoch < latest_epoch:
                raise FencedLeaderEpochError(leader_epoch, latest_epoch)
            now = self._time_ms()
            first_offset = offset = self.log_end_offset
            entries: list[BatchEntry] = []
            max_ts = -1
            num_records = 0
            idempotent = False
            # Stamping: few batches are written with writev as (new 16-byte prefix, rest of
            # the producer's bytes), no copy; otherwise (or for LogAppendTime, which changes
            # CRC-covered bytes) a copy is stamped in place.
            vectored = not append_time and len(batches) <= _MAX_WRITEV_BATCHES
            if vectored:
                view = memoryview(records)
                data: list | bytearray = []
                pack_prefix = _STAMP.pack
            else:
                data = bytearray(records)
                pack_into = _STAMP.pack_into
            for pos, h in batches:
                length = h[H_BATCH_LENGTH]
                if vectored:
                    data.append(pack_prefix(offset, length, leader_epoch))
                    data.append(view[pos + _STAMP.size : pos + LOG_OVERHEAD + length])
                    ts = h[H_MAX_TIMESTAMP]
                else:
                    pack_into(data, pos, offset, length, leader_epoch)
                    if append_time:
                        set_log_append_time(data, now, pos)
                        ts = now
                    else:
                        ts = h[H_MAX_TIMESTAMP]
                nxt = offset + h[H_LAST_OFFSET_DELTA] + 1
                entries.append(_new_entry(BatchEntry, (pos, offset, nxt, LOG_OVERHEAD + length, ts)))
                offset = nxt
                num_records += h[H_RECORD_COUNT]
                if ts > max_ts:
                    max_ts = ts
                if h[H_PRODUCER_ID] >= 0:
                    idempotent = True
            producer_state = self.producer_state if idempotent else None
            transactional = idempotent and self.transactions is not None and any(
                h[H_ATTRIBUTES] & TRANSACTIONAL_MASK for _, h in batches)
            if transactional:
                self.transactions.check_leader_append(batches)
            if producer_state is not None:
                duplicate = producer_state.check(batches, entries)
                if duplicate is not None:
                    return duplicate
            if leader_epoch != latest_epoch and self.leader_epoch_cache.assign(leader_epoch, first_offset,
                                                                                persist=False):
                self._epoch_started(first_offset)
            nbytes = len(records) if vectored else len(data)
            self._append(data, entries, max_ts, num_records, now, nbytes)
            if producer_state is not None:
                producer_state.update(batches, entries, now)
            if transactional:
                self.transactions.on_append(records, batches, [e.base_offset for e in entries],
                                            self._segments[-1].base_offset, self._high_watermark)
            return AppendInfo(first_offset, offset - 1, max_ts, now if append_time else -1, num_records, nbytes)

    def append_as_follower(self, records: bytes | bytearray | memoryview) -> AppendInfo:
        """Append batches that already carry the leader's offsets and epochs. The first
        batch must start at the log end offset (on compacted topics: at or after it)."""
        with self._lock:
            self._check_open()
            # bytes and memoryviews (a replica fetch answer's slices) are written as they are;
            # a bytearray is copied, its owner could change it after we validated it
            data = records if isinstance(records, (bytes, memoryview)) else bytes(records)
            batches = self._validate_all(data, None)
            leo = self.log_end_offset
            _, first_header = batches[0]
            first = first_header[H_BASE_OFFSET]
            if first != leo and not (self._config.compact and first > leo):
                raise OffsetMismatchError(leo, first)
            gaps = first != leo
            prev_next = leo
            max_ts = -1
            num_records = 0
            entries: list[BatchEntry] = []
            changed = False
            cache = self.leader_epoch_cache
            for pos, h in batches:
                base = h[H_BASE_OFFSET]
                if base < prev_next:
                    raise CorruptRecordError(
                        f"follower batches are not in offset order: base offset {base} after offset {prev_next - 1}"
                    )
                gaps = gaps or base != prev_next
                nxt = base + h[H_LAST_OFFSET_DELTA] + 1
                ts = h[H_MAX_TIMESTAMP]
                entries.append(_new_entry(BatchEntry, (pos, base, nxt, LOG_OVERHEAD + h[H_BATCH_LENGTH], ts)))
                prev_next = nxt
                num_records += h[H_RECORD_COUNT]
                if ts > max_ts:
                    max_ts = ts
            changed_at = None
            for _, h in batches:
                epoch = h[H_LEADER_EPOCH]
                if epoch >= 0 and epoch != cache.latest_epoch and cache.assign(epoch, h[H_BASE_OFFSET],
                                                                               persist=False):
                    changed_at = h[H_BASE_OFFSET] if changed_at is None else changed_at
            if changed_at is not None:
                self._epoch_started(changed_at)
            if gaps:
                self.mark_offset_gaps()
            now = self._time_ms()
            self._append(data, entries, max_ts, num_records, now, len(data))
            if self.producer_state is not None:
                self.producer_state.update(batches, entries, now)
            if self.transactions is not None and any(h[H_ATTRIBUTES] & TRANSACTIONAL_MASK for _, h in batches):
                self.transactions.on_append(data, batches, [e.base_offset for e in entries],
                                            self._segments[-1].base_offset, self._high_watermark)
            return AppendInfo(first, prev_next - 1, max_ts, -1, num_records, len(data))

    def _append(self, data, entries: list[BatchEntry], max_ts: int, num_records: int, now: int,
                nbytes: int) -> None:
        last_offset = entries[-1].next_offset - 1
        if self._segments[-1].should_roll(nbytes, max_ts, last_offset, now):
            self._roll(now)
        self._segments[-1].append(data, entries)
        self._unflushed_messages += num_records
        if self._flush_policy and self.flush_candidates is not None:
            self.flush_candidates.add(self)   # after the count: see LogManager.flush_needed
        # no _check_offsets() here: an append only raises the log end (the segment checks that
        # offsets increase), so log start <= HW <= LEO and recovery point <= LEO still hold

    def mark_offset_gaps(self) -> None:
        """Record (durably) that batches may no longer be contiguous in offsets."""
        if not self._offset_gaps:
            marker = self._dir / OFFSET_GAPS_MARKER
            with open(marker, "w") as f:
                f.write("offsets in this log may have gaps (compaction)\n")
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(self._dir)
            self._offset_gaps = True

    def replace_segments(self, old: list[LogSegment], new: LogSegment, generation: int | None = None) -> bool:
        """Swap consecutive segments `old` for `new` (the log cleaner's output, written
        with the ".cleaned" suffix and covering exactly old[0].base .. old[-1].next_offset).

        Crash-safe order: fsync `new`; remove old[0]'s indexes; rename new's log over
        old[0]'s (atomic); rename its indexes; delete old[1:]. A crash in between leaves
        either the old segments, or the new one plus old[1:] segments that it wholly
        covers, which open() deletes. Returns False (and deletes `new`) if the log changed
        meanwhile (a segment was deleted, truncated or closed, or `generation` is not the
        current one). `new` should already be fsynced (the cleaner's worker does it) so
        that the locks are held only for the renames."""
        new.flush()
        with self._flush_lock, self._lock:
            try:
                i = next(k for k, s in enumerate(self._segments) if s is old[0])
            except StopIteration:
                i = -1
            current = self._segments[i : i + len(old)] if i >= 0 else []
            if (
                self._closed
                or (generation is not None and generation != self._generation)
                or i < 0
                or len(current) != len(old)
                or any(a is not b for a, b in zip(current, old))
                or i + len(old) >= len(self._segments)  # never the active segment
                or new.next_offset != old[-1].next_offset
                or new.base_offset != old[0].base_offset
            ):
                new.delete()
                return False
            self.mark_offset_gaps()
            new.close()
            first = old[0]
            first.close()
            first.offset_index.delete()
            first.time_index.delete()
            fsync_dir(self._dir)
            os.replace(new.log_path, first.log_path)
            os.replace(new.offset_index.path, first.offset_index.path)
            os.replace(new.time_index.path, first.time_index.path)
            fsync_dir(self._dir)
            for seg in old[1:]:
                seg.delete()
            fsync_dir(self._dir)
            loaded, _ = LogSegment.load(
                self._dir, first.base_offset, self._config, self._time_ms(), recover=False, contiguous=False
            )
            self._segments[i : i + len(old)] = [loaded]
            self._bases = [s.base_offset for s in self._segments]
            txn = self.transactions
            if txn is not None and (txn.aborted or txn.ongoing or txn.epochs):  # merged segments: entries move
                self.transactions = TransactionIndex.rebuild(self._segments, self._log_start_offset, self._dir,
                                                             self._high_watermark)
            return True

    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset (no-op if the active one is empty)."""
        with self._lock:
            self._check_open()
            return self._roll(self._time_ms())

    def _roll(self, now: int) -> LogSegment:
        active = self._segments[-1]
        if active.is_empty:
            return active
        active.offset_index.flush(fsync=False)
        active.time_index.flush(fsync=False)
        active.release_reserve()
        seg = LogSegment.create(self._dir, active.next_offset, self._config, now)
        self._segments.append(seg)
        self._bases.append(seg.base_offset)
        fsync_dir(self._dir)
        return seg

    # ================================================================== reads

    def read(
        self,
        start_offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_message: bool = True,
    ) -> FetchDataInfo:
        """Whole batches from the one containing `start_offset`, up to `max_bytes` (at
        least one batch if min_one_message), none whose base offset >= `max_offset`."""
        with self._lock:
            self._check_open()
            leo = self.log_end_offset
            start = self._log_start_offset
            if start_offset < start or start_offset > leo:
                raise OffsetOutOfRangeError(start_offset, start, leo)
            hw = self._high_watermark
            if start_offset == leo or (max_offset is not None and start_offset >= max_offset):
                return FetchDataInfo(b"", start_offset, start_offset, hw, start, leo)
            i = max(bisect_right(self._bases, start_offset) - 1, 0)
            chunks: list[bytes] = []
            remaining = max_bytes
            first_offset = None
            next_offset = start_offset
            min_one = min_one_message
            while i < len(self._segments):
                seg = self._segments[i]
                result = seg.read(next_offset, remaining, max_offset, min_one)
                i += 1
                if result is None:
                    continue
                data, first, nxt = result
                if not data:
                    break
                chunks.append(data)
                if first_offset is None:
                    first_offset = first
                next_offset = nxt
                remaining -= len(data)
                min_one = False
                if remaining <= 0 or nxt < seg.next_offset:
                    break
            if first_offset is None:
                return FetchDataInfo(b"", start_offset, start_offset, hw, start, leo)
            records = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            return FetchDataInfo(records, first_offset, next_offset, hw, start, leo)

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """First offset whose record timestamp >= `timestamp_ms` (None if none). Kafka's
        special values: -1 (LATEST) -> log end offset, -2 (EARLIEST) -> log start offset."""
        with self._lock:
            self._check_open()
            if timestamp_ms == LATEST_TIMESTAMP:
                return self.log_end_offset
            if timestamp_ms == EARLIEST_TIMESTAMP:
                return self._log_start_offset
            for seg in self._segments:
                if seg.largest_timestamp < timestamp_ms or seg.next_offset <= self._log_start_offset:
                    continue
                found = seg.find_offset_by_timestamp(timestamp_ms, self._log_start_offset)
                if found is not None:
                    return found
            return None

    # ================================================================== offsets

    def _check_offsets(self) -> None:
        """After every mutation but an append: log_start <= HW <= LEO, recovery point <= LEO."""
        leo = self._segments[-1].next_offset
        invariant(self._log_start_offset <= self._high_watermark <= leo and self._recovery_point <= leo,
                  "%s: offsets out of order: log start %d, high watermark %d, log end %d, recovery point %d",
                  self._dir, self._log_start_offset, self._high_watermark, leo, self._recovery_point)

    def update_high_watermark(self, offset: int) -> int:
        """Move the high watermark forward to `offset`, clamped to [log start, log end]."""
        with self._lock:
            offset = min(max(offset, self._log_start_offset), self.log_end_offset)
            if offset > self._high_watermark:
                self._high_watermark = offset
            self._check_offsets()
            return self._high_watermark

    def truncate_to(self, offset: int) -> bool:
        """Drop every batch whose last offset >= `offset` (a batch containing `offset` is
        dropped whole, so the new log end may be below `offset`). Lowers the high watermark
        and recovery point if needed; truncates the leader epoch cache. True if anything
        was removed."""
        with self._flush_lock, self._lock:
            self._check_open()
            if offset < 0:
                raise ValueError(f"cannot truncate to negative offset {offset}")
            if offset >= self.log_end_offset:
                return False
            if offset < self._log_start_offset:
                self._truncate_fully(offset)
                return True
            while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
                seg = self._segments.pop()
                self._bases.pop()
                seg.delete()
            self._segments[-1].truncate_to(offset)
            leo = self.log_end_offset
            if leo < self._log_start_offset:
                self._truncate_fully(self._log_start_offset)
                return True
            self._after_truncation(leo)
            return True

    def _epoch_started(self, start_offset: int) -> None:
        """A new epoch entry starting at `start_offset` was appended to the cache. It is
        written by the next flush (synced, before the recovery point passes it), not here
        (issue 25: a file create + rename per partition on the event loop): until then an
        unclean open re-reads it from the batches above the recovery point, as long as no
        recovery point this log ever had, and so none a checkpoint file may still hold, is
        above it. After a truncation below such a point the file is written at once
        (without fsync) so that a crash cannot lose the entry."""
        cache = self.leader_epoch_cache
        if start_offset >= self._max_recovery_point:
            cache.unsynced = True
        else:
            cache.persist(sync=False)   # fsync'd by the next flush

    def _after_truncation(self, leo: int) -> None:
        self._generation += 1
        self._truncate_cleaner_state(leo)
        self._high_watermark = min(self._high_watermark, leo)
        self._recovery_point = min(self._recovery_point, leo)
        # written without fsync (the file matches the log after a process crash); the next
        # flush makes it durable before the recovery point moves past `leo` again, and an
        # unclean open re-reads the epochs of the batches above the recovery point (issue 25:
        # two fsyncs per truncated partition on the event loop stalled brokers for seconds)
        if self.leader_epoch_cache.truncate_from_end(leo, persist=False):
            self.leader_epoch_cache.persist(sync=False)
        if self.producer_state is not None:
            self._rebuild_producer_state()
        self._check_offsets()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete everything and continue with an empty log starting at `offset`."""
        with self._flush_lock, self._lock:
            self._check_open()
            self._truncate_fully(offset)

    def _truncate_cleaner_state(self, leo: int | None) -> None:
        with self.cleaner_state_lock:
            truncate_cleaner_state(self._dir, leo)

    def _truncate_fully(self, offset: int) -> None:
        self._generation += 1
        self._truncate_cleaner_state(None)
        for seg in self._segments:
            seg.delete()
        seg = LogSegment.create(self._dir, offset, self._config, self._time_ms())
        fsync_dir(self._dir)
        self._segments = [seg]
        self._bases = [offset]
        self._log_start_offset = offset
        self._high_watermark = offset
        self._recovery_point = offset
        self._max_recovery_point = max(self._max_recovery_point, offset)
        self._unflushed_messages = 0
        self.leader_epoch_cache.clear()
        if self.producer_state is not None:
            self._rebuild_producer_state()
        self._check_offsets()

    def delete_records(self, before_offset: int) -> int:
        """DeleteRecords: advance the log start offset to `before_offset` (at most the high
        watermark) and delete segments entirely below it. Returns the new log start."""
        with self._flush_lock, self._lock:
            self._check_open()
            if before_offset > self._high_watermark or before_offset < 0:
                raise OffsetOutOfRangeError(
                    before_offset,
                    self._log_start_offset,
                    self._high_watermark,
                    f"cannot delete records before offset {before_offset}: it must be in "
                    f"[0, high watermark {self._high_watermark}]",
                )
            if before_offset <= self._log_start_offset:
                return self._log_start_offset
            self._log_start_offset = before_offset
            self._delete_segments_below_log_start()
            self.leader_epoch_cache.truncate_from_start(before_offset)
            self._check_offsets()
            return self._log_start_offset

    def _delete_segments_below_log_start(self) -> int:
        active = self._segments[-1]
        if not active.is_empty and active.next_offset <= self._log_start_offset:
            self._roll(self._time_ms())
        deleted = 0
        while len(self._segments) > 1 and self._segments[0].next_offset <= self._log_start_offset and (
            self._segments[1].base_offset <= self._log_start_offset
        ):
            self._delete_first_segment()
            deleted += 1
        return deleted

    def _delete_first_segment(self) -> None:
        seg = self._segments.pop(0)
        self._bases.pop(0)
        seg.delete()
        if self.transactions is not None:
            self.transactions.drop_segment(seg.base_offset)
        if self._segments[0].base_offset > self._log_start_offset:
            self._log_start_offset = self._segments[0].base_offset

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Delete segments past retention.ms (by largest timestamp) or while the log is
        larger than retention.bytes, and segments below the log start offset; only
        segments wholly below the high watermark. An expired active segment is rolled
        first (as Kafka does), so a quiet topic's data does expire: the log is then
        empty, starting at its end offset. Returns the number of segments deleted."""
        with self._flush_lock, self._lock:
            self._check_open()
            deleted = self._delete_segments_below_log_start()
            if not self._config.delete:
                return deleted
            now = self._time_ms() if now_ms is None else now_ms
            hw = self._high_watermark

            def deletable() -> bool:
                if len(self._segments) > 1:
                    return self._segments[1].base_offset <= hw
                active = self._segments[0]
                return not active.is_empty and active.next_offset <= hw

            def delete_first() -> None:
                if len(self._segments) == 1:
                    self._roll(now)
                self._delete_first_segment()

            retention_ms = self._config.retention_ms
            retention_bytes = self._config.retention_bytes
            if self._config.remote_storage_enable:
                # two tiers (KIP-405): the local tail keeps local.retention.*, and only a
                # segment already in the remote store may go (the total is the remote log
                # manager's job)
                retention_ms = self._config.effective_local_retention_ms
                retention_bytes = self._config.effective_local_retention_bytes
                plain_deletable = deletable

                def deletable() -> bool:
                    return plain_deletable() and self._segments[0].next_offset <= self.remote_copied_end_offset
            if retention_ms >= 0:
                while deletable() and now - self._segments[0].largest_timestamp > retention_ms:
                    delete_first()
                    deleted += 1
            if retention_bytes >= 0:
                total = self.size_bytes
                while deletable() and total - self._segments[0].size >= retention_bytes:
                    total -= self._segments[0].size
                    delete_first()
                    deleted += 1
            if deleted:
                self.leader_epoch_cache.truncate_from_start(self._log_start_offset)
                self._recovery_point = max(self._recovery_point, self._log_start_offset)
                self._max_recovery_point = max(self._max_recovery_point, self._recovery_point)
            self._check_offsets()
            return deleted

    def remove_expired_producers(self, now_ms: int | None = None, expiration_ms: int = 86_400_000) -> int:
        """Forget idempotent producers idle for longer than `expiration_ms` (Kafka's
        producer.id.expiration.ms, default 1 day); their next batch is accepted with any
        sequence. Returns how many were removed."""
        with self._lock:
            if self.producer_state is None:
                return 0
            now = self._time_ms() if now_ms is None else now_ms
            return self.producer_state.remove_expired(now, expiration_ms)

    # ================================================================== durability

    def needs_flush(self, now_ms: int | None = None) -> bool:
        """True when flush.messages or flush.ms says unflushed data must be fsynced."""
        unflushed = self._unflushed_messages
        if unflushed <= 0:
            return False
        cfg = self._config
        if cfg.flush_messages is not None and unflushed >= cfg.flush_messages:
            return True
        if cfg.flush_ms is not None:
            now = self._time_ms() if now_ms is None else now_ms
            if now - self._last_flush_ms >= cfg.flush_ms:
                return True
        return False

    def flush(self, up_to_offset: int | None = None) -> None:
        """fsync the segments holding offsets [recovery_point, up_to_offset) (default: the
        log end) and advance the recovery point. Safe to call from a worker thread while
        the owner thread appends."""
        with self._flush_lock:
            with self._lock:
                if self._closed:
                    return
                leo = self.log_end_offset
                target = leo if up_to_offset is None else min(up_to_offset, leo)
                rp = self._recovery_point
                if target <= rp and not (target == leo and self._unflushed_messages) and not (
                    self.leader_epoch_cache.unsynced
                ):
                    return
                segments = [s for s in self._segments if s.next_offset > rp and s.base_offset < target]
                if not segments:
                    segments = [self._segments[-1]]
                flushed_messages = self._unflushed_messages if target == leo else 0
            for seg in segments:
                seg.flush()
            if self._dir_unsynced:   # the new segment's dir entry, before the recovery point moves
                self._dir_unsynced = False
                try:
                    fsync_dir(self._dir)
                except OSError:
                    self._dir_unsynced = True
                    raise
            with self._lock:   # the epochs of the flushed batches are durable before the recovery point moves
                cache = self.leader_epoch_cache
                epoch_lines = cache.lines() if cache.unsynced else None
                cache.unsynced = False
            if epoch_lines is not None:
                try:
                    cache.write_synced(epoch_lines)
                except OSError:
                    cache.unsynced = True   # the next flush tries again
                    raise
            with self._lock:
                if target > self._recovery_point:
                    self._recovery_point = target
                    self._max_recovery_point = max(self._max_recovery_point, target)
                self._check_offsets()
                self._unflushed_messages = max(0, self._unflushed_messages - flushed_messages)
                self._last_flush_ms = self._time_ms()

    def maybe_flush(self) -> bool:
        if self.needs_flush():
            self.flush()
            return True
        return False

    def close(self) -> None:
        """Flush and close every file. Further calls raise LogClosedError."""
        with self._flush_lock, self._lock:
            if self._closed:
                return
            self.flush()
            for seg in self._segments:
                seg.close()
            self.leader_epoch_cache.persist()
            if self.producer_state is not None:
                self.producer_state.close(self.log_end_offset)
            if self.transactions is not None:
                self.transactions.write_snapshot(self.log_end_offset)
            self._closed = True

    def close_without_flush(self) -> None:
        """Close file handles without fsync (tests simulate a crash with this)."""
        with self._flush_lock, self._lock:
            for seg in self._segments:
                seg.close()
            self._closed = True

    def delete(self) -> None:
        """Close and remove the whole log directory."""
        with self._flush_lock, self._lock:
            for seg in self._segments:
                seg.close()
            self._closed = True
            shutil.rmtree(self._dir, ignore_errors=True)


__all__ = [
    "Log",
    "AppendInfo",
    "FetchDataInfo",
    "parse_topic_partition",
    "LATEST_TIMESTAMP",
    "EARLIEST_TIMESTAMP",
    "RecordTooLargeError",
]
