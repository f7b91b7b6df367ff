"""`RemoteLogManager`: a broker's tiered storage work (KIP-405's RemoteLogManager).

One background thread ("remote-log-manager") runs a pass every
`remote_log_manager_task_interval_ms` over the local logs of `remote.storage.enable` topics:

- leader of the partition: on taking the leadership (or a new leader epoch) it lists the
  partition's remote segments (`RemoteLogMetadataManager`), deletes the orphans of a dead
  leader (COPY_SEGMENT_STARTED, or a second finished copy of the same offsets), then copies
  every closed segment wholly below the high watermark, oldest first (COPY_SEGMENT_STARTED,
  the six files, COPY_SEGMENT_FINISHED); then it applies total retention
  (retention.ms / retention.bytes over both tiers) by deleting the oldest remote segments
  (DELETE_SEGMENT_STARTED, the files, DELETE_SEGMENT_FINISHED);
- follower: it refreshes the remote segment list now and then (never copies), so that its
  local retention, too, removes only segments the store holds;
- in both roles it sets `Log.remote_copied_end_offset`, which gates local retention
  (partitions/log/log.py: only copied segments may go);
- a failed store call backs off exponentially per partition (up to
  `remote_log_copy_backoff_max_ms`); produce never waits for any of this.

Remote reads (`read`) run in their own thread pool (`remote_fetch_threads`): range reads of
whole chunks through the on-disk `ChunkCache`, offset indexes of remote segments in an LRU
cache. Topic deletion deletes the topic's remote objects (`on_metadata`).

Threads only: the caller's event loop is never blocked (http_api/broker/tiering.py awaits
reads with run_in_executor and a deadline).
"""
from __future__ import annotations

import bisect
import json
import logging
import struct
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..index import OFFSET_ENTRY_SIZE, TIME_ENTRY_SIZE
from ..record_batch import HEADER_SIZE, LAST_OFFSET_DELTA_OFFSET, LOG_OVERHEAD, decode_batches
from .chunk_cache import ChunkCache
from .config import RemoteStorageConfig
from .metadata import (
    FINISHED,
    STARTED,
    RemoteLogSegmentMetadata,
    RemoteLogSegments,
    RemoteLogSegmentState,
    new_segment_id,
    next_segments_to_copy,
    remote_segments_to_delete,
)
from ..transactions import AbortedTxn, decode_txn_index, encode_txn_index
from .storage import (OFFSET_INDEX, PRODUCER_SNAPSHOT, SEGMENT, TIME_INDEX, TXN_INDEX, LogSegmentData,
                      RemoteResourceNotFoundError, RemoteStorageError)

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">qi")
_DELTA = struct.Struct(">i")
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
FOLLOWER_REFRESH_PASSES = 5  # a follower re-lists the remote segments every this many passes
# the leader re-lists too (a write that timed out may land in the store later: its orphan
# is found and removed); only changed metadata objects are read again (ETags)
LEADER_REFRESH_PASSES = 10
BACKOFF_INITIAL_MS = 200


@dataclass
class Leadership:
    """What the copier needs to know about one local replica (from the replica manager)."""

    is_leader: bool
    leader_epoch: int
    high_watermark: int
    topic_id: str


@dataclass
class RemoteRead:
    """Whole batches read from one remote segment (shape of a local fetch result)."""

    records: bytes
    first_offset: int
    next_offset: int


@dataclass
class _PartitionState:
    segments: RemoteLogSegments = field(default_factory=RemoteLogSegments)
    loaded_epoch: int | None = None       # leader epoch the list was loaded for (None: not loaded)
    role_leader: bool = False
    passes_since_refresh: int = 0
    failures: int = 0
    retry_at: float = 0.0                 # monotonic seconds
    topic_id: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


class RemoteLogMetrics:
    """Counters and gauges for /metrics (read without IO)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.copied_bytes_total = 0
        self.copied_segments_total = 0
        self.copy_errors_total = 0
        self.deleted_segments_total = 0
        self.delete_errors_total = 0
        self.fetch_requests_total = 0
        self.fetch_bytes_total = 0
        self.fetch_errors_total = 0
        self.copy_lag_segments: dict[tuple[str, int], int] = {}
        self.copy_lag_bytes: dict[tuple[str, int], int] = {}

    def add(self, **counters: int) -> None:
        with self._lock:
            for k, v in counters.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> dict:
        with self._lock:
            out = {k: v for k, v in self.__dict__.items() if not k.startswith("_") and not k.startswith("copy_lag")}
            out["copy_lag_segments"] = dict(self.copy_lag_segments)
            out["copy_lag_bytes"] = dict(self.copy_lag_bytes)
            return out


class RemoteLogManager:
    """See the module docstring. `leadership(topic, partition)` -> `Leadership` or None
    (no local replica); `storage` implements both RemoteStorageManager and
    RemoteLogMetadataManager (partitions/log/remote/s3.py)."""

    def __init__(self, cfg: RemoteStorageConfig, storage: Any, log_manager: Any, broker_id: int,
                 cache_dir: str | Path, leadership: Callable[[str, int], Leadership | None]) -> None:
        self.cfg = cfg
        self.storage = storage
        self.log_manager = log_manager
        self.broker_id = broker_id
        self.leadership = leadership
        self.metrics = RemoteLogMetrics()
        self.cache = ChunkCache(cache_dir, chunk_bytes=cfg.remote_fetch_chunk_bytes,
                                max_bytes=cfg.remote_fetch_cache_max_bytes)
        self.read_pool = ThreadPoolExecutor(max_workers=cfg.remote_fetch_threads, thread_name_prefix="remote-fetch")
        self._states: dict[tuple[str, int], _PartitionState] = {}
        self._states_lock = threading.Lock()
        self._index_cache: OrderedDict[str, tuple[list[int], list[int]]] = OrderedDict()
        self._index_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._tiered_topics: dict[str, str] = {}     # topic -> topic id, of tiered topics seen in metadata
        self._doomed_topics: list[tuple[str, str]] = []  # (topic, topic id) whose remote data goes
        self._doomed_lock = threading.Lock()
        self.store_available = True

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="remote-log-manager", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self.read_pool.shutdown(wait=False, cancel_futures=True)

    def wake(self) -> None:
        """Run a pass now (tests, a segment just rolled)."""
        self._wake.set()

    def _loop(self) -> None:
        interval = self.cfg.remote_log_manager_task_interval_ms / 1000
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - one bad pass must not end the thread
                log.exception("remote log manager pass failed")
            self._wake.wait(interval)
            self._wake.clear()

    # ------------------------------------------------------------------ metadata

    def on_metadata(self, image: Any) -> None:
        """Called with each new metadata image: topics with remote.storage.enable that are gone
        (or re-created under a new id) have their remote data deleted by the next pass."""
        current = {}
        for name, topic in image.topics.items():
            enabled = str(dict(topic.configs).get("remote.storage.enable", "false")).lower() == "true"
            if enabled:
                current[name] = topic.topic_id
        with self._doomed_lock:
            for name, tid in self._tiered_topics.items():
                topic = image.topics.get(name)
                if topic is None or topic.topic_id != tid:
                    self._doomed_topics.append((name, tid))
                elif name not in current:
                    current[name] = tid   # tiering turned off: its remote data still goes with the topic
            self._tiered_topics = current
        if self._doomed_topics:
            self._wake.set()

    def _state(self, tp: tuple[str, int]) -> _PartitionState:
        with self._states_lock:
            st = self._states.get(tp)
            if st is None:
                st = self._states[tp] = _PartitionState()
            return st

    def remote_segments(self, topic: str, partition: int) -> list[RemoteLogSegmentMetadata]:
        st = self._states.get((topic, partition))
        return st.segments.readable() if st is not None else []

    def remote_log_start_offset(self, topic: str, partition: int) -> int | None:
        st = self._states.get((topic, partition))
        return st.segments.log_start_offset() if st is not None and st.loaded_epoch is not None else None

    # ------------------------------------------------------------------ one pass

    def run_once(self) -> None:
        self._delete_doomed_topics()
        live = set()
        for lg in self.log_manager.all_logs():
            if lg.closed or not lg.config.remote_storage_enable:
                continue
            tp = (lg.topic, lg.partition)
            live.add(tp)
            info = self.leadership(*tp)
            if info is None or not info.topic_id:
                continue
            st = self._state(tp)
            if time.monotonic() < st.retry_at:
                continue
            try:
                with st.lock:
                    self._pass_one(lg, tp, st, info)
                st.failures = 0
                self.store_available = True
            except RemoteStorageError as exc:
                # a request that timed out may still happen in the store: list it again
                # before the next copy (and remove what such a write left)
                st.loaded_epoch = None
                st.failures += 1
                self.store_available = False
                backoff = min(BACKOFF_INITIAL_MS * (2 ** min(st.failures - 1, 16)), self.cfg.remote_log_copy_backoff_max_ms)
                st.retry_at = time.monotonic() + backoff / 1000
                self.metrics.add(copy_errors_total=1)
                log.warning("tiered storage for %s-%d failed (%s); retrying in %d ms", tp[0], tp[1], exc, backoff)
            except Exception as exc:  # noqa: BLE001 - e.g. the log closed meanwhile
                if not lg.closed:
                    log.warning("tiered storage pass for %s-%d failed: %s", tp[0], tp[1], exc)
        with self._states_lock:
            for tp in [tp for tp in self._states if tp not in live]:
                del self._states[tp]
                self.metrics.copy_lag_segments.pop(tp, None)
                self.metrics.copy_lag_bytes.pop(tp, None)

    def _pass_one(self, lg: Any, tp: tuple[str, int], st: _PartitionState, info: Leadership) -> None:
        if st.topic_id != info.topic_id:
            st.segments, st.loaded_epoch, st.topic_id = RemoteLogSegments(), None, info.topic_id
        if info.is_leader:
            st.passes_since_refresh += 1
            if (st.loaded_epoch != info.leader_epoch or not st.role_leader
                    or st.passes_since_refresh >= LEADER_REFRESH_PASSES):
                self._load(tp, st)
                st.loaded_epoch, st.role_leader, st.passes_since_refresh = info.leader_epoch, True, 0
            # a dead leader's leftovers, and our own copies or deletions that failed midway
            # (the copier is this one thread: nothing of ours is in flight now)
            self._clean_orphans(st, info.leader_epoch)
            if self._copy(lg, tp, st, info):
                # what was just copied may leave the local tail now, not at the next retention
                # check (log_retention_check_interval_ms, 5 min by default)
                lg.apply_retention()
            self._apply_total_retention(lg, st)
        else:
            st.passes_since_refresh += 1
            if st.role_leader or st.loaded_epoch is None or st.passes_since_refresh >= FOLLOWER_REFRESH_PASSES:
                self._load(tp, st)
                st.loaded_epoch, st.role_leader, st.passes_since_refresh = info.leader_epoch, False, 0
                before = lg.remote_copied_end_offset
                lg.remote_copied_end_offset = st.segments.copied_end_offset()
                if lg.remote_copied_end_offset > before:
                    lg.apply_retention()   # the follower's local tail follows the leader's copies
        lg.remote_copied_end_offset = st.segments.copied_end_offset()

    def _load(self, tp: tuple[str, int], st: _PartitionState) -> None:
        floor = self.storage.log_start_floor(tp[0], st.topic_id, tp[1])
        st.segments = RemoteLogSegments(self.storage.list_segments(tp[0], st.topic_id, tp[1]),
                                        log_start_floor=max(floor, st.segments.log_start_floor))

    def delete_records(self, topic: str, partition: int, topic_id: str, before_offset: int) -> int | None:
        """DeleteRecords on a tiered partition (leader): record the floor in the store first
        (every replica and a later leader honour it), so no remote offset below it is read
        again; the next pass deletes the remote segments wholly below it. Returns the remote
        log start after it (None when nothing remote is readable)."""
        self.ensure_loaded(topic, partition, topic_id)
        st = self._state((topic, partition))
        with st.lock:
            if before_offset > st.segments.log_start_floor:
                self.storage.put_log_start_floor(topic, st.topic_id or topic_id, partition, before_offset)
                st.segments.log_start_floor = before_offset
        self._wake.set()
        return st.segments.log_start_offset()

    def _clean_orphans(self, st: _PartitionState, leader_epoch: int) -> None:
        """A new leader removes what a dead leader left: unfinished uploads, second copies,
        and deletions it did not finish. Never an upload of a later leader epoch (we may be
        a zombie leader: the new leader's copy in flight is not ours to remove)."""
        unfinished = [md for md in st.segments.in_state(STARTED, RemoteLogSegmentState.DELETE_SEGMENT_STARTED)
                      if md.leader_epoch <= leader_epoch]
        doomed = unfinished + st.segments.duplicates()
        for md in doomed:
            log.info("removing orphaned remote segment %s [%d, %d] of %s-%d (%s)", md.segment_id, md.base_offset,
                     md.end_offset, md.topic, md.partition, md.state.value)
            self._delete_segment(st, md)

    # ------------------------------------------------------------------ copy

    def _copy(self, lg: Any, tp: tuple[str, int], st: _PartitionState, info: Leadership) -> int:
        """Copy what is due (see next_segments_to_copy); returns how many segments were copied."""
        with lg.lock:
            segs = lg.segments[:-1]  # never the active segment
            closed = [(s.base_offset, s.next_offset) for s in segs]
            by_base = {s.base_offset: s for s in segs}
        todo = next_segments_to_copy(closed, st.segments.copied_end_offset(), info.high_watermark)
        self.metrics.copy_lag_segments[tp] = len(todo)
        self.metrics.copy_lag_bytes[tp] = sum(by_base[b].size for b, _ in todo)
        copied = 0
        for base, nxt in todo:
            if self._stop.is_set():
                return copied
            seg = by_base[base]
            data = self._segment_data(lg, seg, nxt)
            if data is None:
                continue  # deleted meanwhile (total retention)
            md = RemoteLogSegmentMetadata(
                topic=tp[0], topic_id=st.topic_id, partition=tp[1], segment_id=new_segment_id(),
                base_offset=base, end_offset=nxt - 1, max_timestamp_ms=seg.largest_timestamp,
                size_bytes=len(data.segment), leader_epoch=info.leader_epoch, broker_id=self.broker_id,
                state=STARTED, segment_leader_epochs=self._segment_epochs(lg, base, nxt),
                event_timestamp_ms=int(time.time() * 1000))
            started = time.monotonic()
            st.segments.put(md)   # first: if the put fails it is an orphan of ours, removed next pass
            self.storage.put_segment_metadata(md)
            n = self.storage.copy_log_segment_data(md, data)
            done = md.with_state(FINISHED, int(time.time() * 1000))
            self.storage.put_segment_metadata(done)
            st.segments.put(done)
            lg.remote_copied_end_offset = st.segments.copied_end_offset()
            self.metrics.add(copied_bytes_total=n, copied_segments_total=1)
            self.metrics.copy_lag_segments[tp] = max(0, self.metrics.copy_lag_segments.get(tp, 1) - 1)
            self.metrics.copy_lag_bytes[tp] = max(0, self.metrics.copy_lag_bytes.get(tp, 0) - seg.size)
            log.debug("copied %s-%d segment [%d, %d] (%d bytes) in %.0f ms", tp[0], tp[1], base, nxt - 1, n,
                      (time.monotonic() - started) * 1000)
            copied += 1
        return copied

    @staticmethod
    def _read_file(path: Path, size: int | None = None) -> bytes:
        with open(path, "rb") as f:
            return f.read() if size is None else f.read(size)

    def _segment_data(self, lg: Any, seg: Any, next_offset: int) -> LogSegmentData | None:
        try:
            segment = self._read_file(seg.log_path, seg.size)
            index = self._read_file(seg.offset_index.path)
            tindex = self._read_file(seg.time_index.path)
        except FileNotFoundError:
            return None
        index = index[: len(index) // OFFSET_ENTRY_SIZE * OFFSET_ENTRY_SIZE]
        tindex = tindex[: len(tindex) // TIME_ENTRY_SIZE * TIME_ENTRY_SIZE]
        epochs = [(e, o) for e, o in lg.leader_epoch_cache.entries if o < next_offset]
        checkpoint = "\n".join(["0", str(len(epochs))] + [f"{e} {o}" for e, o in epochs]) + "\n"
        txn = getattr(lg, "transactions", None)
        with lg.lock:
            aborted = txn.aborted_in_segment(seg.base_offset) if txn is not None else []
        return LogSegmentData(segment=segment, offset_index=index, time_index=tindex,
                              leader_epoch_checkpoint=checkpoint.encode(),
                              producer_snapshot=self._producer_snapshot(lg, next_offset),
                              transaction_index=encode_txn_index(aborted))

    @staticmethod
    def _segment_epochs(lg: Any, base: int, next_offset: int) -> tuple[tuple[int, int], ...]:
        entries = list(lg.leader_epoch_cache.entries)
        out = []
        for i, (epoch, start) in enumerate(entries):
            end = entries[i + 1][1] if i + 1 < len(entries) else None
            if start < next_offset and (end is None or end > base):
                out.append((epoch, max(start, base)))
        return tuple(out)

    @staticmethod
    def _producer_snapshot(lg: Any, next_offset: int) -> bytes:
        """The idempotent producers' last batches below the segment end (JSON)."""
        ps = getattr(lg, "producer_state", None)
        producers = []
        if ps is not None:
            with lg.lock:
                for entry in list(ps.producers.values()):
                    batches = [list(b) for b in entry.batches if b.last_offset < next_offset]
                    if batches:
                        producers.append([entry.producer_id, entry.producer_epoch, entry.last_timestamp, batches,
                                          entry.start_seq])
        return json.dumps({"offset": next_offset, "producers": producers}).encode()

    # ------------------------------------------------------------------ retention

    def _apply_total_retention(self, lg: Any, st: _PartitionState) -> None:
        cfg = lg.config
        if not cfg.delete:
            return
        doomed = remote_segments_to_delete(
            st.segments, local_size_bytes=lg.size_bytes, local_start_offset=lg.log_start_offset,
            retention_ms=cfg.retention_ms, retention_bytes=cfg.retention_bytes, now_ms=int(time.time() * 1000))
        for md in doomed:
            self._delete_segment(st, md)
        for md in st.segments.duplicates():
            self._delete_segment(st, md)

    def _delete_segment(self, st: _PartitionState, md: RemoteLogSegmentMetadata) -> None:
        now = int(time.time() * 1000)
        started = md.with_state(RemoteLogSegmentState.DELETE_SEGMENT_STARTED, now)
        self.storage.put_segment_metadata(started)
        st.segments.put(started)
        self.storage.delete_log_segment_data(md)
        finished = md.with_state(RemoteLogSegmentState.DELETE_SEGMENT_FINISHED, now)
        self.storage.put_segment_metadata(finished)
        st.segments.put(finished)
        self.cache.evict_segment(md.segment_id)
        with self._index_lock:
            self._index_cache.pop(md.segment_id, None)
            self._index_cache.pop(md.segment_id + "/txn", None)
        self.metrics.add(deleted_segments_total=1)

    def _delete_doomed_topics(self) -> None:
        with self._doomed_lock:
            doomed, self._doomed_topics = self._doomed_topics, []
        for i, (name, tid) in enumerate(doomed):
            try:
                n = self.storage.delete_partition_data(name, tid)
                log.info("topic %s (id %s) deleted: removed its %d remote objects", name, tid, n)
            except RemoteStorageError as exc:
                log.warning("deleting the remote data of deleted topic %s failed (%s); retrying", name, exc)
                self.metrics.add(delete_errors_total=1)
                with self._doomed_lock:
                    self._doomed_topics.extend(doomed[i:])
                return

    # ------------------------------------------------------------------ reads

    def _offset_index(self, md: RemoteLogSegmentMetadata) -> tuple[list[int], list[int]]:
        with self._index_lock:
            hit = self._index_cache.get(md.segment_id)
            if hit is not None:
                self._index_cache.move_to_end(md.segment_id)
                return hit
        data = self.storage.fetch(md, OFFSET_INDEX, 0) if md.size_bytes else b""
        rel, pos = [], []
        for i in range(0, len(data) - OFFSET_ENTRY_SIZE + 1, OFFSET_ENTRY_SIZE):
            r, p = _OFFSET_ENTRY.unpack_from(data, i)
            rel.append(r)
            pos.append(p)
        with self._index_lock:
            self._index_cache[md.segment_id] = (rel, pos)
            while len(self._index_cache) > self.cfg.remote_index_cache_entries:
                self._index_cache.popitem(last=False)
        return rel, pos

    def ensure_loaded(self, topic: str, partition: int, topic_id: str) -> None:
        """List the remote segments of a partition not loaded yet (a read before the first pass)."""
        st = self._state((topic, partition))
        if st.loaded_epoch is None:
            with st.lock:
                if st.loaded_epoch is None:
                    st.topic_id = topic_id
                    self._load((topic, partition), st)
                    st.loaded_epoch = -1

    def restore_follower_state(self, topic: str, partition: int, topic_id: str, start_offset: int) -> int:
        """A follower restarted empty at the leader's local log start `start_offset`: learn the
        idempotent producers from the producer snapshot of the remote segment just below it
        (KIP-405: a replica builds its state from remote data, fetching only the local tail).
        Returns how many producers were added; 0 when nothing remote is below the offset."""
        if start_offset <= 0:
            return 0
        self.ensure_loaded(topic, partition, topic_id)
        st = self._states.get((topic, partition))
        # the last remote segment that ends at or below the offset (its snapshot names no
        # batch the follower will fetch itself)
        below = [s for s in (st.segments.readable() if st is not None else []) if s.next_offset <= start_offset]
        md = below[-1] if below else None
        lg = self.log_manager.get(topic, partition)
        if md is None or lg is None:
            return 0
        snapshot = self.storage.fetch(md, PRODUCER_SNAPSHOT, 0)
        with lg.lock:
            added = lg.producer_state.merge_snapshot(snapshot, start_offset)
        log.info("%s-%d: %d idempotent producers restored from the remote segment [%d, %d] below the local "
                 "log start %d", topic, partition, added, md.base_offset, md.end_offset, start_offset)
        return added

    def _txn_index(self, md: RemoteLogSegmentMetadata) -> list[AbortedTxn]:
        key = md.segment_id + "/txn"
        with self._index_lock:
            hit = self._index_cache.get(key)
            if hit is not None:
                self._index_cache.move_to_end(key)
                return hit
        try:
            entries = decode_txn_index(self.storage.fetch(md, TXN_INDEX, 0))
        except RemoteResourceNotFoundError:
            entries = []   # copied before transaction indexes were uploaded
        with self._index_lock:
            self._index_cache[key] = entries
            while len(self._index_cache) > self.cfg.remote_index_cache_entries:
                self._index_cache.popitem(last=False)
        return entries

    def aborted_transactions(self, topic: str, partition: int, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with records in [start, end) that the remote segments' transaction
        indexes hold (a read_committed read of remote data drops their records). An entry sits
        with its ABORT marker, which may be in a later segment than its records: later segments
        are searched until an entry completed with a last stable offset past `end` (Kafka's
        rule: no transaction open before `end` can be aborted after it)."""
        st = self._states.get((topic, partition))
        out: list[AbortedTxn] = []
        for md in (st.segments.readable() if st is not None else []):
            if md.end_offset < start:
                continue
            for a in self._txn_index(md):
                if a.last_offset >= start and a.first_offset < end:
                    out.append(a)
                if a.last_stable_offset > end:
                    return out
        return out

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """First remote offset whose record timestamp >= `timestamp_ms` (Kafka's ListOffsets by
        time over the remote tier), None when no remote record is that late. The segment's time
        index (fetched once, small) gives where to start; the batches from there are read
        through the chunk cache like a fetch."""
        st = self._states.get((topic, partition))
        if st is None:
            return None
        floor = st.segments.log_start_floor
        for md in st.segments.readable():
            if md.end_offset < floor or md.max_timestamp_ms < timestamp_ms:
                continue
            start = max(md.base_offset, floor)
            tindex = self.storage.fetch(md, TIME_INDEX, 0) if md.size_bytes else b""
            for i in range(0, len(tindex) - TIME_ENTRY_SIZE + 1, TIME_ENTRY_SIZE):
                ts, rel = _TIME_ENTRY.unpack_from(tindex, i)
                if ts >= timestamp_ms:
                    break
                start = max(start, md.base_offset + rel)   # every record before it is earlier
            offset = start
            while offset <= md.end_offset:
                got = self.read(topic, partition, offset, self.cfg.remote_fetch_chunk_bytes)
                if got is None or not got.records:
                    break
                for r in decode_batches(got.records, skip_control=True):
                    if r.offset >= start and r.timestamp is not None and r.timestamp >= timestamp_ms:
                        return r.offset
                offset = got.next_offset
        return None

    def read(self, topic: str, partition: int, offset: int, max_bytes: int) -> RemoteRead | None:
        """Whole batches from the remote segment holding `offset` (the first batch may start
        below it), up to `max_bytes` but at least one batch; None if no remote segment holds it."""
        st = self._states.get((topic, partition))
        md = st.segments.find(offset) if st is not None else None
        if md is None:
            return None
        self.metrics.add(fetch_requests_total=1)
        try:
            rel, pos = self._offset_index(md)
            i = bisect.bisect_right(rel, offset - md.base_offset) - 1
            position = pos[i] if i >= 0 else 0

            def load(start: int, end: int) -> bytes:
                return self.storage.fetch(md, SEGMENT, start, min(end, md.size_bytes - 1))

            want = max(max_bytes, HEADER_SIZE)
            buf = self.cache.read(md.segment_id, SEGMENT, position, want + self.cfg.remote_fetch_chunk_bytes,
                                  md.size_bytes, load)
            out_start = out_end = None
            first_offset = next_offset = None
            at = 0
            while True:
                if at + HEADER_SIZE > len(buf):
                    if out_start is None and position + at < md.size_bytes:
                        buf += self.cache.read(md.segment_id, SEGMENT, position + len(buf), want,
                                               md.size_bytes, load)
                        continue
                    break
                base, length = _LENGTH.unpack_from(buf, at)
                size = LOG_OVERHEAD + length
                if at + size > len(buf):
                    if out_start is None:   # the first batch must be returned whole
                        buf += self.cache.read(md.segment_id, SEGMENT, position + len(buf), at + size - len(buf),
                                               md.size_bytes, load)
                        continue
                    break
                last = base + _DELTA.unpack_from(buf, at + LAST_OFFSET_DELTA_OFFSET)[0]
                if last >= offset:
                    if out_start is None:
                        out_start, first_offset = at, base
                    elif at + size - out_start > max_bytes:
                        break
                    out_end, next_offset = at + size, last + 1
                at += size
                if out_end is not None and out_end - out_start >= max_bytes:
                    break
            if out_start is None:
                return RemoteRead(b"", offset, md.next_offset)  # nothing at/after offset in it: skip on
            records = bytes(buf[out_start:out_end])
            self.metrics.add(fetch_bytes_total=len(records))
            return RemoteRead(records, first_offset, next_offset)
        except RemoteStorageError:
            self.metrics.add(fetch_errors_total=1)
            raise


__all__ = ["RemoteLogManager", "RemoteLogMetrics", "Leadership", "RemoteRead"]
