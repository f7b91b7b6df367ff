"""One log segment: `<base_offset:020d>.log` plus its `.index` and `.timeindex`.

The `.log` file is a plain concatenation of record batches (the wire format). The segment
appends whole batches at the end (O_APPEND), reads whole batches from a position, keeps
the sparse indexes up to date and can rebuild them (`recover`) by scanning the file with
CRC validation, truncating at the first invalid batch.

Invariants: batches in the file have strictly increasing offsets, all >= base_offset
(`append` checks this, and that relative offsets fit: `partitions.invariants`);
`size` is the file length; `next_offset` is the offset after the last batch (base_offset
when empty); index entries point at batch starts inside [0, size).

Preallocation (`LogConfig.preallocate`): disk blocks are reserved ahead of the end of a
segment being written with fallocate(FALLOC_FL_KEEP_SIZE), growing with the segment (as
much as it holds, between `SEGMENT_PREALLOCATE_BYTES_MIN` and `SEGMENT_PREALLOCATE_BYTES_MAX`),
from the append that makes it hold `SEGMENT_PREALLOCATE_AFTER_BYTES` (64 KiB) on: the first
appends of a segment reserve nothing (issue 25: one fallocate per partition at its first
append, on the broker's event loop, held it for up to 3 s when 10,000 new partitions were
first written).
Appends into reserved blocks skip the filesystem's block allocation (ext4: ~30% less kernel
CPU per appended byte; bench/log_bench.py shows the log's append with and without it). The file length stays the data
length, so recovery and readers are unchanged; the reserve is released (ftruncate to the
length) when the segment is rolled, truncated or closed. Best effort: a filesystem without
fallocate, or a failing one (ENOSPC), just appends as before.

Open files (`SegmentFiles`, issue 25): a segment's `.log` descriptor is opened when the
segment is used and kept in one process-wide LRU of at most `open_segment_files_max`
descriptors (default: half of RLIMIT_NOFILE); the least recently used segment not in use
is closed when another one opens (its reserved blocks are released first). A broker can
host more partition replicas than it may open files (100,000 replicas, 20,000 descriptors
here; Kafka instead asks for a ulimit above the segment count). A segment is pinned while
it is used (an append, a read, a scan until its generator ends), so a descriptor is never
closed under a caller. Unsynced writes survive the close in the page cache; `flush`
reopens the file to fdatasync it (`_unsynced`).
"""
from __future__ import annotations

import ctypes
import logging
import os
import resource
import struct
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Iterator

from .config import LogConfig
from .errors import CorruptRecordError, LogClosedError
from .index import OFFSET_ENTRY_SIZE, TIME_ENTRY_SIZE, OffsetIndex, TimeIndex
from ..invariants import InvariantViolation
from .append import BatchEntry
from .record_batch import (
    H_BASE_OFFSET,
    H_BATCH_LENGTH,
    H_LAST_OFFSET_DELTA,
    H_LEADER_EPOCH,
    H_MAX_TIMESTAMP,
    HEADER_SIZE,
    LAST_OFFSET_DELTA_OFFSET,
    LOG_OVERHEAD,
    BatchHeader,
    decode_records,
    validate_batch_raw,
)

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"

_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
_LENGTH = struct.Struct(">qi")
_HEADER = struct.Struct(">qiibIhiqqqhii")
_LAST_DELTA = struct.Struct(">i")
_RECOVERY_READ_BYTES = 4 << 20
_SCAN_READ_BYTES = 64 << 10
_MAX_RELATIVE_OFFSET = 2**31 - 1
_fdatasync = getattr(os, "fdatasync", os.fsync)

SEGMENT_PREALLOCATE_BYTES_MIN = 64 << 10
SEGMENT_PREALLOCATE_BYTES_MAX = 4 << 20   # 1-4 MiB ahead gave all of the gain (bench: raw writes); at most this per written partition
# a segment reserves blocks once it holds this much: a partition written now and then (most
# of 10,000) never pays an fallocate on the append path, a busy one pays one per 64 KiB-4 MiB
SEGMENT_PREALLOCATE_AFTER_BYTES = 64 << 10
_FALLOC_FL_KEEP_SIZE = 1


def _default_open_segment_files_max() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 32768
    return max(64, soft // 2)


class SegmentFiles:
    """The process's open segment descriptors: at most `open_max`, least recently used
    closed first (see module docstring). Invariant: a segment with pins > 0 keeps its
    descriptor; every open pooled descriptor is in `_lru`. All under `_lock`."""

    def __init__(self, open_max: int) -> None:
        self.open_max = max(1, open_max)
        self._lock = threading.Lock()
        self._lru: OrderedDict = OrderedDict()   # LogSegment -> None, oldest first
        self.opens = 0        # descriptors opened (re-opens after eviction included)
        self.evictions = 0

    @property
    def open_count(self) -> int:
        return len(self._lru)

    def acquire(self, seg: "LogSegment", flags: int = 0) -> int:
        """Pin `seg` and return its descriptor, opening it (O_RDWR | O_APPEND | `flags`) if
        it was closed to stay under `open_max`. Raises LogClosedError for a closed segment."""
        with self._lock:
            fd = seg._fd
            if fd is None:
                if seg.closed:
                    raise LogClosedError(f"segment {seg.log_path} is closed")
                fd = seg._fd = os.open(seg.log_path, os.O_RDWR | os.O_APPEND | flags, 0o644)
                self.opens += 1
                self._lru[seg] = None
                seg._pins += 1   # before evicting: never the segment being opened
                if len(self._lru) > self.open_max:
                    self._evict()
                return fd
            if seg in self._lru:
                self._lru.move_to_end(seg)
            seg._pins += 1
            return fd

    def adopt(self, seg: "LogSegment", fd: int) -> None:
        """Keep `fd`, opened by the caller outside the lock (`LogSegment.create`: file
        creates of several threads overlap instead of queueing on this lock), as the
        descriptor of the new segment `seg`, unpinned."""
        with self._lock:
            seg._fd = fd
            self.opens += 1
            self._lru[seg] = None
            if len(self._lru) > self.open_max:
                self._evict()

    def release(self, seg: "LogSegment") -> None:
        with self._lock:
            seg._pins -= 1

    def forget(self, seg: "LogSegment") -> None:
        """`seg` closes its descriptor itself (close, delete)."""
        with self._lock:
            self._lru.pop(seg, None)

    def _evict(self) -> None:
        over = len(self._lru) - self.open_max
        victims = []
        for seg in self._lru:
            if over <= 0:
                break
            if seg._pins == 0:
                victims.append(seg)
                over -= 1
        for seg in victims:
            del self._lru[seg]
            fd, seg._fd = seg._fd, None
            try:
                if seg._reserved_end > seg.size:
                    os.ftruncate(fd, seg.size)
                    seg._reserved_end = 0
            except OSError:
                pass
            finally:
                os.close(fd)
            self.evictions += 1


SEGMENT_FILES = SegmentFiles(_default_open_segment_files_max())


def set_open_segment_files_max(open_max: int) -> None:
    """Bound the process's open segment descriptors (`open_segment_files_max`); lowering it
    closes the least recently used ones not in use at the next open."""
    SEGMENT_FILES.open_max = max(1, int(open_max))


def _load_fallocate():
    """libc's fallocate(2) (Linux), or None where there is none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


_fallocate = _load_fallocate()


def segment_file_name(base_offset: int, suffix: str = LOG_SUFFIX) -> str:
    return f"{base_offset:020d}{suffix}"


def parse_segment_base(name: str) -> int | None:
    """Base offset from `<20 digits>.log`, or None for any other name."""
    stem, dot, _ = name.partition(".")
    if len(stem) == 20 and stem.isdigit():
        return int(stem)
    return None


def scan_raw_batches(
    fd: int, start_position: int, end: int, *, base_offset: int | None = None, validate: bool = False,
    contiguous: bool = False,
) -> Iterator[tuple[int, tuple]]:
    """Walk the batches of a segment file from `start_position` to `end` (positions, not
    offsets), reading through `fd` with pread: yield (position, raw header tuple, see
    record_batch.H_*) per batch. Raises CorruptRecordError at the first torn or invalid batch,
    after yielding every batch before it. The one batch walker of a segment file:
    `LogSegment.scan_raw` (recovery, scans) and the record format upgrade
    (record_format.upgrade_segment_file) both use it.

    validate=True checks each batch (CRC, magic, codec, counts: `validate_batch_raw`) and that
    leader epochs never decrease. With `base_offset` (the segment's), batches below it or
    beyond its relative offsets are corrupt, and contiguous=True also requires each batch to
    start where the previous one ended (the first at `base_offset` when scanning from 0);
    None skips the offset checks."""
    pos = start_position
    buf = b""
    buf_start = pos
    read_bytes = _RECOVERY_READ_BYTES if validate else _SCAN_READ_BYTES
    expected = base_offset if (contiguous and start_position == 0) else None
    last_epoch = -1
    size = 0
    seg_base = base_offset
    unpack_length = _LENGTH.unpack_from
    unpack_header = _HEADER.unpack_from
    while pos < end:
        rel = pos - buf_start
        if len(buf) - rel < HEADER_SIZE:
            # header-only scans of large batches read just the next header
            want = HEADER_SIZE if (not validate and size > _SCAN_READ_BYTES // 4) else read_bytes
            buf = os.pread(fd, min(want, end - pos), pos)
            buf_start, rel = pos, 0
            if len(buf) < HEADER_SIZE:
                raise CorruptRecordError(f"torn batch header at position {pos} ({len(buf)} bytes left)")
        _, length = unpack_length(buf, rel)
        size = LOG_OVERHEAD + length
        if length < _MIN_BATCH_LENGTH or pos + size > end:
            raise CorruptRecordError(f"batch at position {pos} has length {length} beyond the file end {end}")
        if validate:
            if len(buf) - rel < size:
                buf = os.pread(fd, max(read_bytes, size), pos)
                buf_start, rel = pos, 0
            h = validate_batch_raw(buf, rel)
        else:
            h = unpack_header(buf, rel)
        if seg_base is not None:
            base = h[H_BASE_OFFSET]
            if base < seg_base or (expected is not None and base < expected):
                raise CorruptRecordError(
                    f"batch at position {pos} has base offset {base}, expected >= "
                    f"{expected if expected is not None else seg_base}"
                )
            if contiguous and expected is not None and base != expected:
                raise CorruptRecordError(f"batch at position {pos} has base offset {base}, expected {expected}")
            expected = base + h[H_LAST_OFFSET_DELTA] + 1
            if expected - 1 - seg_base > _MAX_RELATIVE_OFFSET:
                raise CorruptRecordError(f"batch at position {pos} overflows the segment's relative offsets")
        if validate:
            epoch = h[H_LEADER_EPOCH]
            if epoch < last_epoch:
                raise CorruptRecordError(
                    f"batch at position {pos} has leader epoch {epoch}, below the previous batch's {last_epoch}"
                )
            last_epoch = epoch
        yield pos, h
        pos += size


class LogSegment:
    """A segment file with its sparse offset and time indexes (see module docstring)."""

    def __init__(self, directory: str | Path, base_offset: int, config: LogConfig, now_ms: int, suffix: str = ""):
        self.dir = Path(directory)
        self.base_offset = base_offset
        self.config = config
        self.log_path = self.dir / (segment_file_name(base_offset, LOG_SUFFIX) + suffix)
        self.offset_index = OffsetIndex(
            self.dir / (segment_file_name(base_offset, INDEX_SUFFIX) + suffix),
            config.segment_index_bytes // OFFSET_ENTRY_SIZE,
        )
        self.time_index = TimeIndex(
            self.dir / (segment_file_name(base_offset, TIME_INDEX_SUFFIX) + suffix),
            config.segment_index_bytes // TIME_ENTRY_SIZE,
        )
        self._fd: int | None = None
        self._pins = 0            # callers using _fd now (SegmentFiles never closes it then)
        self._pooled = True       # False: a private read-only descriptor (open_read_only)
        self._unsynced = False    # written since the last fdatasync (flush reopens if evicted)
        self.size = 0
        self.next_offset = base_offset
        self.largest_timestamp = -1
        self.created_ms = now_ms
        self.rolling_timestamp: int | None = None  # max timestamp of the first batch
        self._bytes_since_last_index_entry = 0
        self._max_timestamp_so_far = -1
        self._reserved_end = 0  # blocks are reserved up to this file position (>= size when preallocating)
        self._preallocate = config.preallocate and _fallocate is not None
        self.closed = False

    # ------------------------------------------------------------------ opening

    @classmethod
    def create(
        cls, directory: str | Path, base_offset: int, config: LogConfig, now_ms: int, suffix: str = "",
        *, index_files: bool = True,
    ) -> "LogSegment":
        """A new empty segment (existing files with the same base are replaced). `suffix`
        (e.g. ".cleaned") is appended to every file name: a segment under construction.
        index_files=False (the first segment of a new log: no index file of this base on
        disk) creates only the `.log` file now; each index file is created by its first
        flush (issue 25: three file creates per partition, 30,000 per broker for 10,000
        partitions). The `.log` file is created here, off the append path, and its
        descriptor stays open for the first append."""
        seg = cls(directory, base_offset, config, now_ms, suffix)
        SEGMENT_FILES.adopt(seg, os.open(seg.log_path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644))
        seg.offset_index.reset(create_file=index_files)
        seg.time_index.reset(create_file=index_files)
        return seg

    @classmethod
    def load(
        cls,
        directory: str | Path,
        base_offset: int,
        config: LogConfig,
        now_ms: int,
        *,
        recover: bool,
        on_batch: Callable[[tuple], None] | None = None,
        contiguous: bool | None = None,
    ) -> tuple["LogSegment", int]:
        """Open an existing segment. recover=True rescans it with CRC validation (calling
        `on_batch` per valid batch) and truncates at the first invalid batch; otherwise the
        indexes are loaded and sanity-checked, and rebuilt (via recover) if they fail.
        `on_batch` gets each batch's raw header tuple (record_batch.H_*). Returns
        (segment, bytes truncated)."""
        seg = cls(directory, base_offset, config, now_ms)
        fd = SEGMENT_FILES.acquire(seg, os.O_CREAT)
        try:
            seg.size = os.fstat(fd).st_size
            if recover:
                return seg, seg.recover(on_batch, contiguous=contiguous)
            problem = seg._load_indexes()
            if problem is None:
                try:
                    seg._load_tail_state()
                except CorruptRecordError as exc:
                    problem = f"tail does not parse ({exc})"
            if problem is not None:
                log.warning("segment %s: %s; rebuilding it from the log", seg.log_path, problem)
                return seg, seg.recover(on_batch, contiguous=contiguous)
            return seg, 0
        finally:
            SEGMENT_FILES.release(seg)

    @classmethod
    def open_read_only(
        cls, directory: str | Path, base_offset: int, config: LogConfig, size: int, next_offset: int
    ) -> "LogSegment":
        """A reader of the first `size` bytes of an existing segment file through its own
        read-only descriptor, indexes not loaded (the log cleaner's worker uses it; it may
        run in another process). Only scan_batches/scan_raw/read_bytes/close are meant
        for it; a file truncated underneath makes the scan raise CorruptRecordError."""
        seg = cls(directory, base_offset, config, 0)
        seg._pooled = False
        seg._fd = os.open(seg.log_path, os.O_RDONLY)
        seg.size = size
        seg.next_offset = next_offset
        return seg

    def _load_indexes(self) -> str | None:
        """Load both indexes; a reason string if they cannot be trusted. An empty `.log`
        without index files (a new log's segment before its first flush, see `create`)
        has empty indexes."""
        if self.size == 0 and not self.offset_index.path.exists() and not self.time_index.path.exists():
            self.offset_index.reset(create_file=False)
            self.time_index.reset(create_file=False)
            return None
        if not self.offset_index.load():
            return f"offset index {self.offset_index.corrupt_reason}"
        if not self.time_index.load():
            return f"time index {self.time_index.corrupt_reason}"
        offsets, positions = self.offset_index.relative_offsets, self.offset_index.positions
        if offsets and (offsets[0] < 0 or positions[0] < 0 or positions[-1] >= self.size):
            return "offset index points outside the log file"
        if offsets:
            # the last entry must point at a batch starting at that offset
            head = os.pread(self._fd, LOG_OVERHEAD, positions[-1])
            if len(head) < LOG_OVERHEAD or _LENGTH.unpack(head)[H_BASE_OFFSET] != self.base_offset + offsets[-1]:
                return "offset index last entry does not point at its batch"
        if self.time_index.relative_offsets:
            rel = self.time_index.relative_offsets[-1]
            if self.time_index.relative_offsets[0] < 0 or (offsets and rel > offsets[-1]) or (not offsets):
                return "time index refers to offsets the offset index does not have"
        return None

    def _load_tail_state(self) -> None:
        """Derive next_offset, largest timestamp and index bookkeeping by scanning the
        batch headers after the last offset index entry (raises CorruptRecordError if the
        tail does not parse as whole batches)."""
        _, position = self.offset_index.last_entry()
        next_offset = self.base_offset
        max_ts, _ = self.time_index.last_entry()
        for _, header in self.scan_batches(position):
            next_offset = header.next_offset
            if header.max_timestamp > max_ts:
                max_ts = header.max_timestamp
        if position > 0 and next_offset == self.base_offset:
            raise CorruptRecordError("offset index entry beyond the last batch")
        self.next_offset = next_offset
        self.largest_timestamp = max_ts
        self._max_timestamp_so_far = max_ts
        self._bytes_since_last_index_entry = self.size - position
        self._load_rolling_timestamp()

    def _load_rolling_timestamp(self) -> None:
        self.rolling_timestamp = None
        if self.size >= HEADER_SIZE:
            try:
                fd = self._acquire()
                try:
                    self.rolling_timestamp = BatchHeader.parse(os.pread(fd, HEADER_SIZE, 0)).max_timestamp
                finally:
                    self._release()
            except CorruptRecordError:
                pass

    # ------------------------------------------------------------------ scanning

    def scan_batches(
        self, start_position: int = 0, *, validate: bool = False, contiguous: bool = False
    ) -> Iterator[tuple[int, BatchHeader]]:
        """Yield (position, header) for each batch from `start_position` to the end of the
        file. Raises CorruptRecordError at the first torn or invalid batch (after yielding
        every batch before it).

        validate=True checks CRCs and that leader epochs never decrease. Base offset and
        leader epoch are not covered by the CRC (Kafka's layout), so contiguous=True (logs
        that were never compacted) also requires every batch to start exactly where the
        previous one ended, the first one at the segment's base offset."""
        for pos, h in self.scan_raw(start_position, validate=validate, contiguous=contiguous):
            yield pos, BatchHeader(*h)

    def scan_raw(
        self, start_position: int = 0, *, validate: bool = False, contiguous: bool = False
    ) -> Iterator[tuple[int, tuple]]:
        """`scan_batches` yielding raw header tuples (see record_batch.H_*): the fast path
        used by recovery. The segment stays pinned until the generator ends."""
        fd = self._acquire()
        try:
            yield from scan_raw_batches(fd, start_position, self.size, base_offset=self.base_offset,
                                        validate=validate, contiguous=contiguous)
        finally:
            self._release()

    def recover(
        self, on_batch: Callable[[tuple], None] | None = None, *, contiguous: bool | None = None
    ) -> int:
        """Rebuild the indexes by scanning with validation; truncate at the first invalid
        batch. `contiguous` (default: the topic is not compacted) also treats a gap between
        batch offsets as corruption. Returns the number of bytes truncated."""
        if contiguous is None:
            contiguous = not self.config.compact
        self.offset_index.reset()
        self.time_index.reset()
        self.next_offset = self.base_offset
        self.largest_timestamp = -1
        self._max_timestamp_so_far = -1
        self._bytes_since_last_index_entry = 0
        valid_end = 0
        try:
            for pos, h in self.scan_raw(0, validate=True, contiguous=contiguous):
                base = h[H_BASE_OFFSET]
                size = LOG_OVERHEAD + h[H_BATCH_LENGTH]
                self._index_batch(pos, base, size, h[H_MAX_TIMESTAMP])
                self.next_offset = base + h[H_LAST_OFFSET_DELTA] + 1
                valid_end = pos + size
                if on_batch is not None:
                    on_batch(h)
        except CorruptRecordError as exc:
            log.warning(
                "segment %s: %s; truncating %d bytes at position %d",
                self.log_path, exc, self.size - valid_end, valid_end,
            )
        truncated = self.size - valid_end
        if truncated:
            fd = self._acquire()
            try:
                os.ftruncate(fd, valid_end)
            finally:
                self._release()
            self.size = valid_end
            self._unsynced = True
        self.largest_timestamp = self._max_timestamp_so_far
        self._load_rolling_timestamp()
        return truncated

    # ------------------------------------------------------------------ appending

    def _index_batch(self, position: int, base_offset: int, size: int, max_timestamp: int) -> None:
        if max_timestamp > self._max_timestamp_so_far:
            self._max_timestamp_so_far = max_timestamp
        if self._bytes_since_last_index_entry > self.config.index_interval_bytes or position == 0:
            rel = base_offset - self.base_offset
            offset_index = self.offset_index
            if len(offset_index) < offset_index.max_entries:
                offset_index.append(rel, position)
                time_index = self.time_index
                if len(time_index) < time_index.max_entries:
                    time_index.maybe_append(self._max_timestamp_so_far, rel)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += size

    def append(self, data, batches: list[BatchEntry]) -> None:
        """Append validated, offset-stamped batches: `data` is one buffer, or a list of
        buffers written with writev. `batches` has one entry per batch, in order (its
        position is within `data`)."""
        fd = self._acquire()
        try:
            self._append(fd, data, batches)
        finally:
            self._release()

    def _append(self, fd: int, data, batches: list[BatchEntry]) -> None:
        start = self.size
        first, last = batches[0], batches[-1]
        if not (self.next_offset <= first.base_offset < last.next_offset
                and last.next_offset - 1 - self.base_offset <= _MAX_RELATIVE_OFFSET):
            raise InvariantViolation(  # inline rather than invariant(): this runs on every append
                f"segment {self.base_offset}: appending offsets [{first.base_offset}, {last.next_offset}) after "
                f"next offset {self.next_offset}: offsets must increase and fit relative offsets")
        if isinstance(data, list):
            total = sum(map(len, data))
            if self._preallocate and start + total > self._reserved_end:
                self._reserve(fd, start + total)
            written = os.writev(fd, data)
            if written < total:  # rare (signals, huge writes): finish with plain writes
                rest = memoryview(b"".join(data))[written:]
                while rest:
                    rest = rest[os.write(fd, rest):]
        else:
            view = memoryview(data)
            total = len(view)
            if self._preallocate and start + total > self._reserved_end:
                self._reserve(fd, start + total)
            written = os.write(fd, view)
            while written < total:
                written += os.write(fd, view[written:])
        self._unsynced = True
        if self._bytes_since_last_index_entry + total > self.config.index_interval_bytes or start == 0:
            for rel_pos, base, _, size, max_ts in batches:
                self._index_batch(start + rel_pos, base, size, max_ts)
        else:  # no index entry can be due: only the bookkeeping
            self._bytes_since_last_index_entry += total
            max_ts = max(b.max_timestamp for b in batches)
            if max_ts > self._max_timestamp_so_far:
                self._max_timestamp_so_far = max_ts
        self.size = start + total
        self.next_offset = last.next_offset
        if self._max_timestamp_so_far > self.largest_timestamp:
            self.largest_timestamp = self._max_timestamp_so_far
        if self.rolling_timestamp is None:
            self.rolling_timestamp = first.max_timestamp

    def _reserve(self, fd: int, end: int) -> None:
        """Reserve blocks from the reserved end to past `end` (see module docstring), once
        the segment holds `SEGMENT_PREALLOCATE_AFTER_BYTES`."""
        if end < SEGMENT_PREALLOCATE_AFTER_BYTES:
            return
        ahead = min(SEGMENT_PREALLOCATE_BYTES_MAX, max(SEGMENT_PREALLOCATE_BYTES_MIN, end))
        new_end = max(end, min(end + ahead, self.config.segment_bytes))
        start = max(self._reserved_end, self.size)
        if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, start, new_end - start) != 0:
            self._preallocate = False  # unsupported or no space: plain appends decide
            log.debug("segment %s: preallocation off (errno %d)", self.log_path, ctypes.get_errno())
            return
        self._reserved_end = new_end

    def release_reserve(self) -> None:
        """Give back blocks reserved past the end of the file (on roll, truncation, close;
        an evicted descriptor released them when it was closed)."""
        if self._reserved_end > self.size and self._fd is not None:
            try:
                fd = self._acquire()
            except LogClosedError:
                fd = None
            if fd is not None:
                try:
                    os.ftruncate(fd, self.size)
                except OSError as exc:  # read-only descriptor or filesystem: the blocks stay reserved
                    log.debug("segment %s: could not release preallocated blocks: %s", self.log_path, exc)
                finally:
                    self._release()
        self._reserved_end = 0

    def should_roll(self, append_bytes: int, max_timestamp: int, last_offset: int, now_ms: int) -> bool:
        """Kafka's roll conditions: size, age (record time since the first batch, or wall
        time since creation), full index, or relative offset overflow."""
        if self.size == 0:
            return False
        if self.size + append_bytes > self.config.segment_bytes:
            return True
        if self.rolling_timestamp is not None and self.rolling_timestamp >= 0:
            waited = max_timestamp - self.rolling_timestamp
        else:
            waited = now_ms - self.created_ms
        if waited > self.config.segment_ms:
            return True
        if self.offset_index.is_full or self.time_index.is_full:
            return True
        return last_offset - self.base_offset > _MAX_RELATIVE_OFFSET

    # ------------------------------------------------------------------ reading

    def translate_offset(self, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch whose last offset >= `offset`, or None."""
        _, position = self.offset_index.lookup(offset - self.base_offset)
        try:
            for pos, header in self.scan_batches(position):
                if header.last_offset >= offset:
                    return pos, header
        except CorruptRecordError:
            return None
        return None

    def read(
        self, start_offset: int, max_bytes: int, max_offset: int | None = None, min_one_message: bool = True
    ) -> tuple[bytes, int, int] | None:
        """Whole batches from the one containing `start_offset`: (bytes, first batch base
        offset, next offset after the last batch). None if no batch here reaches
        `start_offset` or the first batch is at/after `max_offset`; empty bytes if the first
        batch does not fit `max_bytes` and not min_one_message."""
        found = self.translate_offset(start_offset)
        if found is None:
            return None
        position, first = found
        if max_offset is not None and first.base_offset >= max_offset:
            return b"", first.base_offset, start_offset
        fd = self._acquire()
        try:
            return self._read_from(fd, position, first, start_offset, max_bytes, max_offset, min_one_message)
        finally:
            self._release()

    def _read_from(self, fd: int, position: int, first: BatchHeader, start_offset: int, max_bytes: int,
                   max_offset: int | None, min_one_message: bool) -> tuple[bytes, int, int]:
        available = self.size - position
        buf = os.pread(fd, max(min(max_bytes, available), 0), position) if max_bytes > 0 else b""
        end = 0
        next_offset = start_offset
        n = len(buf)
        while end + HEADER_SIZE <= n:
            base, length = _LENGTH.unpack_from(buf, end)
            size = LOG_OVERHEAD + length
            if end + size > n or (max_offset is not None and base >= max_offset):
                break
            next_offset = base + _LAST_DELTA.unpack_from(buf, end + LAST_OFFSET_DELTA_OFFSET)[0] + 1
            end += size
        if end == 0:
            if not min_one_message:
                return b"", first.base_offset, start_offset
            return os.pread(fd, first.size, position), first.base_offset, first.next_offset
        return (buf if end == n else buf[:end]), first.base_offset, next_offset

    def read_bytes(self, position: int, size: int) -> bytes:
        fd = self._acquire()
        try:
            return os.pread(fd, size, position)
        finally:
            self._release()

    def find_offset_by_timestamp(self, timestamp: int, start_offset: int) -> int | None:
        """First offset >= start_offset whose record timestamp >= `timestamp`, or None."""
        if self.largest_timestamp < timestamp:
            return None
        _, rel = self.time_index.lookup_before(timestamp)
        position = 0
        if rel >= 0:
            _, position = self.offset_index.lookup(rel)
        found = self.translate_offset(max(start_offset, self.base_offset))
        if found is not None:
            found_position, _ = found
            position = max(position, found_position)
        try:
            for pos, header in self.scan_batches(position):
                if header.max_timestamp < timestamp or header.last_offset < start_offset:
                    continue
                for record in decode_records(self.read_bytes(pos, header.size), validate=False):
                    if record.offset >= start_offset and record.timestamp >= timestamp:
                        return record.offset
        except CorruptRecordError:
            return None
        return None

    # ------------------------------------------------------------------ truncation, lifecycle

    def truncate_to(self, offset: int) -> int:
        """Drop every batch whose last offset >= `offset` (a batch containing `offset` goes
        entirely). Returns bytes removed."""
        found = self.translate_offset(offset)
        if found is None:
            return 0
        position, first_removed = found
        removed = self.size - position
        self.offset_index.truncate_to_position(position)
        self.time_index.truncate_to_offset(first_removed.base_offset - self.base_offset)
        fd = self._acquire()
        try:
            os.ftruncate(fd, position)  # also frees any preallocated blocks
        finally:
            self._release()
        self._unsynced = True
        self.size = position
        self._reserved_end = 0
        self._load_tail_state()
        return removed

    def flush(self) -> None:
        """fsync the log and both indexes (re-opening an evicted log file only if it has
        writes not synced yet)."""
        if self.closed or (self._fd is None and not self._unsynced):
            return
        self._unsynced = False
        try:
            fd = self._acquire()
        except LogClosedError:
            return
        try:
            _fdatasync(fd)
        except BaseException:
            self._unsynced = True
            raise
        finally:
            self._release()
        self.offset_index.flush()
        self.time_index.flush()

    def close(self) -> None:
        self.release_reserve()
        self.closed = True
        if self._pooled:
            SEGMENT_FILES.forget(self)
        if self._fd is not None:
            try:
                os.close(self._fd)
            finally:
                self._fd = None
        self.offset_index.close()   # appends pending entries (no fsync)
        self.time_index.close()

    def delete(self) -> None:
        """Close and remove the segment's files (the log file first: a leftover index
        without its log is removed on the next open)."""
        self.close()
        for path in (self.log_path, self.offset_index.path, self.time_index.path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    def _acquire(self) -> int:
        """This segment's descriptor, pinned until `_release` (opened again if evicted)."""
        if not self._pooled:
            if self._fd is None:
                raise LogClosedError(f"segment {self.log_path} is closed")
            return self._fd
        return SEGMENT_FILES.acquire(self)

    def _release(self) -> None:
        if self._pooled:
            SEGMENT_FILES.release(self)

    @property
    def is_empty(self) -> bool:
        return self.size == 0

    def __repr__(self) -> str:
        return f"LogSegment(base={self.base_offset}, next={self.next_offset}, size={self.size})"
