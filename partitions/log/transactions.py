"""Transactions on one partition log (Kafka KIP-98, the partition side).

- Transactional batches carry a producer id/epoch and the transactional attribute bit
  (0x10). A producer's transaction on this partition opens with its first transactional
  batch and ends with a control batch (bits 0x10 | 0x20) holding one control record, in
  Kafka's layout: key = int16 version (0) + int16 type (0 ABORT, 1 COMMIT), value = int16
  version (0) + int32 coordinator epoch.
- `TransactionIndex` tracks the open transactions (producer id -> first offset), the
  first unstable offset (the lowest first offset of an open transaction) and the aborted
  transactions. Each aborted transaction is one entry of the `.txnindex` file of the
  segment holding its ABORT marker (Kafka's layout: 34 bytes, int16 version, int64
  producer id, first offset, last offset, last stable offset). After a clean shutdown the
  state comes from `transaction-state-snapshot` (open transactions and epochs, written at
  close, deleted once read) plus the `.txnindex` files; otherwise (recovery, no or stale
  snapshot, a torn index) and after truncation or compaction it is rebuilt from the batch
  headers of the log, and an index file that is missing, torn or disagrees with the log is
  rewritten (a warning says so).
- The last stable offset (LSO) = min(high watermark, first unstable offset).
  `filter_read_committed` turns fetched batches into what a read_committed consumer sees:
  batches below the LSO, without control batches and without aborted transactions.

Invariants: every open transaction's first offset is < log end; aborted entries are
ordered by their marker offset; a transactional batch with an epoch older than the
partition's known epoch of its producer is refused (zombie fencing at the partition).

Pure with respect to IO frameworks (files only).
"""
from __future__ import annotations

import json
import logging
import os
import struct
from bisect import bisect_left
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

from .errors import CorruptRecordError, InvalidProducerEpochError
from .leader_epoch_cache import fsync_dir
from .record_batch import (
    CONTROL_MASK,
    H_ATTRIBUTES,
    H_BATCH_LENGTH,
    H_PRODUCER_EPOCH,
    H_PRODUCER_ID,
    LOG_OVERHEAD,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Record,
    build_batch,
    decode_records,
    iter_batches,
)
from .segment import parse_segment_base, segment_file_name

log = logging.getLogger(__name__)

TXN_INDEX_SUFFIX = ".txnindex"
TRANSACTION_STATE_SNAPSHOT = "transaction-state-snapshot"
CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")
_ENTRY = struct.Struct(">hqqqq")
TXN_INDEX_ENTRY_SIZE = _ENTRY.size  # 34
TXN_INDEX_VERSION = 0
_TXN_CONTROL = TRANSACTIONAL_MASK | CONTROL_MASK

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)


def parse_isolation_level(value: str | None) -> str:
    """`read_committed` / `read_uncommitted` (default: read_uncommitted, Kafka's consumer
    default); ValueError naming the choices otherwise."""
    if value is None or value == "":
        return READ_UNCOMMITTED
    v = str(value).strip().lower()
    if v not in ISOLATION_LEVELS:
        raise ValueError(f"isolation_level={value!r} is not valid; use read_committed or read_uncommitted")
    return v


# ---------------------------------------------------------------- control records


def control_record_key(control_type: int) -> bytes:
    return _CONTROL_KEY.pack(0, control_type)


def control_record_value(coordinator_epoch: int) -> bytes:
    return _CONTROL_VALUE.pack(0, coordinator_epoch)


def parse_control_type(key: bytes | None) -> int:
    """The control type (CONTROL_ABORT / CONTROL_COMMIT) of a control record key."""
    if key is None or len(key) < _CONTROL_KEY.size:
        raise CorruptRecordError(f"control record key {key!r} is not int16 version + int16 type")
    version, ctype = _CONTROL_KEY.unpack_from(key, 0)
    if version != 0:
        raise CorruptRecordError(f"control record key version {version} is not supported (only 0)")
    return ctype


def build_marker_batch(producer_id: int, producer_epoch: int, commit: bool, *, coordinator_epoch: int = 0,
                       now_ms: int | None = None) -> bytes:
    """A COMMIT or ABORT marker (one control record) ending `producer_id`'s transaction."""
    ctype = CONTROL_COMMIT if commit else CONTROL_ABORT
    return build_batch([Record(control_record_key(ctype), control_record_value(coordinator_epoch))],
                       producer_id=producer_id, producer_epoch=producer_epoch, is_control=True,
                       is_transactional=True, now_ms=now_ms)


def build_transactional_batch(records: Sequence[Record], producer_id: int, producer_epoch: int, **kw) -> bytes:
    """Records written inside `producer_id`'s transaction (transactional attribute set)."""
    return build_batch(records, producer_id=producer_id, producer_epoch=producer_epoch, is_transactional=True, **kw)


def marker_type(batch) -> int:
    """CONTROL_COMMIT / CONTROL_ABORT of the control batch at byte 0 of `batch`."""
    records = decode_records(batch, validate=False)
    if not records:
        raise CorruptRecordError("control batch holds no control record")
    return parse_control_type(records[0].key)


# ---------------------------------------------------------------- aborted transactions


class AbortedTxn(NamedTuple):
    """One aborted transaction: its records lie in [first_offset, last_offset] (the last
    offset is the ABORT marker's); `last_stable_offset` is the LSO once it completed."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode_txn_index(entries: Iterable[AbortedTxn]) -> bytes:
    return b"".join(_ENTRY.pack(TXN_INDEX_VERSION, *e) for e in entries)


def decode_txn_index(data: bytes) -> list[AbortedTxn]:
    """Entries of a `.txnindex` file; CorruptRecordError if torn or of an unknown version."""
    if len(data) % TXN_INDEX_ENTRY_SIZE:
        raise CorruptRecordError(f"transaction index of {len(data)} bytes is torn "
                                 f"(entries are {TXN_INDEX_ENTRY_SIZE} bytes)")
    out = []
    for pos in range(0, len(data), TXN_INDEX_ENTRY_SIZE):
        version, *fields = _ENTRY.unpack_from(data, pos)
        if version != TXN_INDEX_VERSION:
            raise CorruptRecordError(f"transaction index entry at {pos} has version {version}")
        out.append(AbortedTxn(*fields))
    return out


def filter_read_committed(records, fetch_offset: int, last_stable_offset: int,
                          aborted: Sequence[AbortedTxn]) -> tuple[bytes, int]:
    """What a read_committed consumer gets of fetched batches: (batches, next offset).

    Batches at or above the LSO are left out (and not passed); control batches and the
    batches of aborted transactions are passed over. The next offset is past the last batch
    kept or passed over (`fetch_offset` when none), so consumers move past markers and
    aborted data without seeing them."""
    aborted_by_pid: dict[int, list[AbortedTxn]] = {}
    for a in aborted:
        aborted_by_pid.setdefault(a.producer_id, []).append(a)
    kept: list = []
    next_offset = fetch_offset
    for header, batch in iter_batches(records, validate=False):
        if header.base_offset >= last_stable_offset:
            break
        next_offset = max(next_offset, header.next_offset)
        attrs = header.attributes
        if attrs & CONTROL_MASK:
            continue
        if attrs & TRANSACTIONAL_MASK and header.producer_id in aborted_by_pid and any(
                a.first_offset <= header.base_offset <= a.last_offset for a in aborted_by_pid[header.producer_id]):
            continue
        kept.append(batch)
    return b"".join(kept), next_offset


# ---------------------------------------------------------------- per-log state


class TransactionIndex:
    """Open and aborted transactions of one partition log (see the module docstring)."""

    def __init__(self, log_dir: str | Path | None):
        self.dir = Path(log_dir) if log_dir is not None else None
        self.ongoing: dict[int, int] = {}      # producer id -> first offset of its open transaction
        self.epochs: dict[int, int] = {}       # producer id -> latest transactional epoch seen
        self.aborted: list[AbortedTxn] = []    # ordered by last_offset (the marker's offset)
        self._segment_of: list[int] = []       # segment base holding each aborted entry's marker
        self.rewritten_files = 0               # index files rebuilt by the last rebuild (tests, logs)
        self.markers_seen = 0                  # control batches applied to this index object
        self.last_marker: dict[int, int] = {}  # producer id -> markers_seen at its latest marker
        self.loaded_from_snapshot = False

    # ------------------------------------------------------------------ queries

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction (None: none open)."""
        return min(self.ongoing.values()) if self.ongoing else None

    def last_stable_offset(self, high_watermark: int) -> int:
        fuo = self.first_unstable_offset
        return high_watermark if fuo is None else min(high_watermark, fuo)

    def aborted_in_segment(self, base: int) -> list[AbortedTxn]:
        """The aborted transactions whose ABORT marker is in the segment at `base` (what its
        `.txnindex` holds; tiered storage uploads it with the segment)."""
        return [a for a, b in zip(self.aborted, self._segment_of) if b == base]

    def aborted_in_range(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with records in [start, end)."""
        i = bisect_left([a.last_offset for a in self.aborted], start)
        return [a for a in self.aborted[i:] if a.first_offset < end]

    def marker_token(self, producer_id: int) -> int:
        """Changes whenever a marker of `producer_id` is applied to this index object
        (transaction verification, partitions/transactions/verification.py: a marker
        between a verification and its append makes the verification stale)."""
        return self.last_marker.get(producer_id, 0)

    def clean_bound(self, first_dirty: int) -> int | None:
        """The log cleaner stays below this offset: the first unstable offset (an open
        transaction is never cleaned; aborted ones are, cleaner.py drops their records)."""
        return self.first_unstable_offset

    # ------------------------------------------------------------------ appends

    def check_leader_append(self, batches: list[tuple[int, tuple]]) -> None:
        """Refuse a transactional batch whose epoch is older than its producer's (fenced)."""
        for _, h in batches:
            if h[H_ATTRIBUTES] & TRANSACTIONAL_MASK and h[H_PRODUCER_ID] >= 0:
                known = self.epochs.get(h[H_PRODUCER_ID])
                if known is not None and h[H_PRODUCER_EPOCH] < known:
                    raise InvalidProducerEpochError(
                        f"producer {h[H_PRODUCER_ID]} wrote transactional data with epoch {h[H_PRODUCER_EPOCH]}, "
                        f"older than its current epoch {known} on this partition: it was fenced; "
                        f"initialise the transactional id again")

    def on_append(self, data, batches: list[tuple[int, tuple]], base_offsets: Sequence[int],
                  segment_base: int, high_watermark: int) -> None:
        """Account for appended batches (leader or follower): `data` holds them at the
        positions of `batches`; `base_offsets` are their offsets in the log."""
        view = memoryview(data)
        for (pos, h), base in zip(batches, base_offsets):
            attrs = h[H_ATTRIBUTES]
            if not attrs & TRANSACTIONAL_MASK:
                continue
            batch = view[pos: pos + LOG_OVERHEAD + h[H_BATCH_LENGTH]]
            self._apply(h[H_PRODUCER_ID], h[H_PRODUCER_EPOCH], attrs, base, batch, segment_base, high_watermark,
                        write=True)

    def _apply(self, pid: int, epoch: int, attrs: int, base: int, batch, segment_base: int, hw: int,
               write: bool) -> None:
        if epoch > self.epochs.get(pid, -1):
            self.epochs[pid] = epoch
        if attrs & _TXN_CONTROL != _TXN_CONTROL:
            self.ongoing.setdefault(pid, base)
            return
        self.markers_seen += 1
        self.last_marker[pid] = self.markers_seen
        first = self.ongoing.pop(pid, None)
        if first is None:
            return  # a marker with nothing open here (a retried marker): nothing to end
        if marker_type(batch) == CONTROL_ABORT:
            entry = AbortedTxn(pid, first, base, self.last_stable_offset(base + 1))  # deterministic: rebuilds agree
            self.aborted.append(entry)
            self._segment_of.append(segment_base)
            if write and self.dir is not None:
                path = self.dir / segment_file_name(segment_base, TXN_INDEX_SUFFIX)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                try:
                    os.write(fd, encode_txn_index([entry]))
                finally:
                    os.close(fd)

    # ------------------------------------------------------------------ snapshot

    def write_snapshot(self, log_end_offset: int) -> None:
        """Open transactions and epochs as of `log_end_offset` (a clean close)."""
        if self.dir is None or not self.dir.exists():
            return
        path = self.dir / TRANSACTION_STATE_SNAPSHOT
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"offset": log_end_offset, "ongoing": sorted(self.ongoing.items()),
                       "epochs": sorted(self.epochs.items())}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    @classmethod
    def load(cls, segments: Sequence, log_start_offset: int, log_dir: str | Path | None, high_watermark: int,
             log_end_offset: int, clean: bool) -> "TransactionIndex":
        """After a clean shutdown: the snapshot (if it is for `log_end_offset`) and the
        `.txnindex` files; otherwise, or when any of them is unreadable, `rebuild`."""
        path = Path(log_dir) / TRANSACTION_STATE_SNAPSHOT if log_dir is not None else None
        doc = None
        if path is not None and path.exists():
            try:
                doc = json.loads(path.read_text())
                if not clean or int(doc["offset"]) != log_end_offset:
                    doc = None
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring unreadable transaction state snapshot %s: %s", path, exc)
                doc = None
            path.unlink(missing_ok=True)   # consumed: never used after a later crash
        if doc is None:
            return cls.rebuild(segments, log_start_offset, log_dir, high_watermark)
        idx = cls(log_dir)
        try:
            idx.ongoing = {int(p): int(o) for p, o in doc["ongoing"]}
            idx.epochs = {int(p): int(e) for p, e in doc["epochs"]}
            live = set()
            for seg in segments:
                live.add(seg.base_offset)
                f = idx.dir / segment_file_name(seg.base_offset, TXN_INDEX_SUFFIX)
                if f.exists():
                    for entry in decode_txn_index(f.read_bytes()):
                        idx.aborted.append(entry)
                        idx._segment_of.append(seg.base_offset)
        except (OSError, ValueError, TypeError, CorruptRecordError) as exc:
            log.warning("%s: transaction state unreadable (%s); rebuilding it from the log", log_dir, exc)
            return cls.rebuild(segments, log_start_offset, log_dir, high_watermark)
        for f in idx.dir.iterdir():
            if f.name.endswith(TXN_INDEX_SUFFIX) and parse_segment_base(f.name) not in live:
                f.unlink(missing_ok=True)
        idx.loaded_from_snapshot = True
        return idx

    # ------------------------------------------------------------------ rebuild

    @classmethod
    def rebuild(cls, segments: Sequence, log_start_offset: int, log_dir: str | Path | None,
                high_watermark: int = 0) -> "TransactionIndex":
        """State from a header scan of `segments` (LogSegments, oldest first); every
        segment's `.txnindex` is checked against it and rewritten when missing, torn or
        different; index files of segments that are gone are deleted."""
        idx = cls(log_dir)
        for seg in segments:
            try:
                for pos, h in seg.scan_raw(0):
                    attrs = h[H_ATTRIBUTES]
                    if not attrs & TRANSACTIONAL_MASK or h[H_PRODUCER_ID] < 0:
                        continue
                    batch = b""
                    if attrs & CONTROL_MASK:
                        batch = seg.read_bytes(pos, LOG_OVERHEAD + h[H_BATCH_LENGTH])
                    idx._apply(h[H_PRODUCER_ID], h[H_PRODUCER_EPOCH], attrs, h[0], batch, seg.base_offset,
                               max(high_watermark, h[0] + 1), write=False)
            except CorruptRecordError:
                continue
        if idx.dir is not None:
            idx._sync_files([s.base_offset for s in segments])
        return idx

    def _sync_files(self, bases: list[int]) -> None:
        by_segment: dict[int, list[AbortedTxn]] = {}
        for entry, base in zip(self.aborted, self._segment_of):
            by_segment.setdefault(base, []).append(entry)
        live = set(bases)
        changed = False
        for path in self.dir.iterdir():
            if path.name.endswith(TXN_INDEX_SUFFIX) and parse_segment_base(path.name) not in live:
                path.unlink(missing_ok=True)
                changed = True
        for base in bases:
            path = self.dir / segment_file_name(base, TXN_INDEX_SUFFIX)
            want = by_segment.get(base, [])
            try:
                have = decode_txn_index(path.read_bytes())
            except FileNotFoundError:
                have = [] if not want else None
            except CorruptRecordError as exc:
                log.warning("%s: %s; rebuilding it from the log", path, exc)
                have = None
            if have == want:
                continue
            known = {(a.producer_id, a.last_offset) for a in have or ()}
            if have is None or any((a.producer_id, a.last_offset) not in known for a in want):
                log.warning("%s: transaction index disagrees with the log (missing or stale); rebuilt", path)
            else:   # entries gone or shortened: the cleaner removed aborted records
                log.debug("%s: transaction index follows the cleaned segment", path)
            self.rewritten_files += 1
            if not want:
                path.unlink(missing_ok=True)
            else:
                tmp = path.with_name(path.name + ".tmp")
                with open(tmp, "wb") as f:
                    f.write(encode_txn_index(want))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            changed = True
        if changed:
            fsync_dir(self.dir)

    def drop_segment(self, base: int) -> None:
        """Retention deleted the segment at `base`: forget its entries and its index file
        (an aborted transaction's records all precede its marker, so they went with it)."""
        keep = [(a, b) for a, b in zip(self.aborted, self._segment_of) if b != base]
        self.aborted = [a for a, _ in keep]
        self._segment_of = [b for _, b in keep]
        if self.dir is not None:
            (self.dir / segment_file_name(base, TXN_INDEX_SUFFIX)).unlink(missing_ok=True)


__all__ = [
    "TransactionIndex", "AbortedTxn", "filter_read_committed", "build_marker_batch", "build_transactional_batch",
    "marker_type", "parse_control_type", "control_record_key", "control_record_value", "encode_txn_index",
    "decode_txn_index", "parse_isolation_level", "CONTROL_ABORT", "CONTROL_COMMIT", "TXN_INDEX_SUFFIX",
    "READ_COMMITTED", "READ_UNCOMMITTED", "BatchHeader",
]
