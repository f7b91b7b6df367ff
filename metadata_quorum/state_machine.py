"""MetadataStateMachine: the replicated state of the metadata quorum.

It is the raft `StateMachine`: `apply(entries)` runs on the raft thread, in commit order,
on every controller. An entry is plain data:

    {"request_id": str | None, "controller_epoch": int, "records": [items]}

where an item is a record's plain data (records.record_to_dict) or a run of consecutive
partition records of one topic as columns {"run": ...} (records.entry_items: a fencing at
100,000 partitions is 33,335 records, and the active controller no longer builds, pickles,
and every controller no longer unpickles and decodes, a dict per record). The entry is
applied atomically or not at all. It is rejected (on every node alike) when

- its `controller_epoch` is not the current one (a deposed controller's late proposal),
  except a batch starting with a LeaderChangeRecord of a higher epoch;
- its request id was already applied (an idempotent retry: answered "duplicate");
- `MetadataImage.check_batch` finds a conflict (decided on a stale view).

Besides the image it keeps the most recent records with their offsets (the feed brokers
long-poll), the recent request ids, and the controller registrations of the quorum: an
entry {"controller_epoch", "quorum": op} changes those (metadata_quorum/quorum_membership.py;
pysyncobj's own membership entries never reach `apply`) and moves no metadata offset.
Everything crossing threads goes through `lock`: the event loop holds it while reading the
image or deciding.
"""
from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import gc
import json
import logging
import threading
from typing import Any, Callable, Optional

from metadata_quorum import quorum_membership
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import (LeaderChangeRecord, RegisterBrokerRecord,
                                     compact_partition_record, entry_record_count, entry_records, group_runs,
                                     record_to_dict, run_of)

log = logging.getLogger(__name__)

# Applying at least this many records at once (a 10,000-partition CreateTopics, a broker's
# fencing batch, a snapshot restore): no full (generation 2) garbage collection during the
# apply, then gc.freeze() moves the image out of later full collections. The apply runs on
# the raft thread and a full collection walks every object of the process with the GIL
# held: the raft thread neither ticks nor sends heartbeats meanwhile (raft/README.md).
GC_FREEZE_MIN_RECORDS_DEFAULT = 1000

# The feed's newest records keep their JSON text (`records_since_json`): every broker (and
# every retry) reads the same records, and each is encoded once instead of once per reader.
FEED_ENCODED_RECORDS_DEFAULT = 20_000
# A feed snapshot's partitions are encoded this many per json.dumps call: one call for a
# 100,000-partition snapshot (3.8 MB) held the GIL against the raft thread throughout.
SNAPSHOT_ENCODE_CHUNK_PARTITIONS = 2000
# feed pages encoded with runs (`feed_runs`) kept for the next reader: brokers read the
# same pages of a large change one after the other
FEED_RUN_PAGES_CACHED = 16


_STRING_TEXTS_MAX = 10_000
_string_texts: dict = {}   # str -> its JSON text (topic names and ids: few, repeated per partition)


def _string_text(value: str) -> str:
    text = _string_texts.get(value)
    if text is None:
        if len(_string_texts) >= _STRING_TEXTS_MAX:
            _string_texts.clear()
        text = _string_texts[value] = json.dumps(value)
    return text


def _int_tuple_text(values: Any) -> Optional[str]:
    """json.dumps of a record's replica or ISR tuple of plain ints (its list's repr: "[1, 2, 3]"),
    None for anything else."""
    if type(values) is not tuple:
        return None
    for v in values:
        if type(v) is not int:
            return None
    return repr(list(values))


def record_item_text(offset: int, record: Any) -> str:
    """Exactly `json.dumps({"offset": offset, "record": record_to_dict(record)})` of a record
    object (the feed's tail holds records, not their plain data). A compact partition
    record (every record of a topic create and of a broker fencing) of plain ints and
    strings is formatted directly, 2.5x cheaper than the encoder's call (the active
    controller encodes each of a fencing's 33,334 records at 100,000 partitions); any other
    record goes through json.dumps."""
    if compact_partition_record(record):
        topic, topic_id, partition, leader = record.topic, record.topic_id, record.partition, record.leader
        leader_epoch, partition_epoch = record.leader_epoch, record.partition_epoch
        replicas, isr = _int_tuple_text(record.replicas), _int_tuple_text(record.isr)
        if (type(offset) is int and type(topic) is str and type(topic_id) is str and type(partition) is int
                and type(leader) is int and type(leader_epoch) is int and type(partition_epoch) is int
                and replicas is not None and isr is not None):
            return (f'{{"offset": {offset}, "record": {{"type": "{record.TYPE}", "topic": {_string_text(topic)}, '
                    f'"topic_id": {_string_text(topic_id)}, "partition": {partition}, "replicas": {replicas}, '
                    f'"isr": {isr}, "leader": {leader}, "leader_epoch": {leader_epoch}, '
                    f'"partition_epoch": {partition_epoch}}}}}')
    return json.dumps({"offset": offset, "record": record_to_dict(record)})


def feed_runs(page: list, record_text: Callable[[int, Any], str], singles_max: Optional[int] = None) -> tuple:
    """(the feed item texts of `page` [(offset, record)], how many of its records they hold)
    with each stretch of consecutive compact partition records of one type and topic
    (records.group_runs) as one item {"offset": the first, "run": {"type", "topic",
    "topic_id", a list per records.RUN_COLUMNS}} (records.records_of_run reads it); any
    other record is `record_text(offset, record)`. The texts end before the record that
    would be the `singles_max`+1-th outside a run (None: no limit). A fencing at 100,000
    partitions: 7.7 MB of items -> about 1 MB."""
    out: list = []
    i = singles = 0
    for key, stretch in group_runs([r for _, r in page]):
        offset = page[i][0]
        if key is None:
            singles += 1
            if singles_max is not None and singles > singles_max:
                break
            out.append(record_text(offset, stretch[0]))
        else:
            out.append(f'{{"offset": {offset}, "run": {json.dumps(run_of(key, stretch))}}}')
        i += len(stretch)
    return out, i


class FullCollectionHold:
    """Holds off full (generation 2) garbage collections while a large metadata change is
    built, then moves what it built out of later full collections (gc.freeze()). A full
    collection walks every tracked object of the process with the GIL held, and a change of
    tens of thousands of records allocates enough to trigger several. Used by the state
    machine's apply (raft thread), the active controller's write (event loop: decide and
    the entry's plain data) and the broker's MetadataFollower (event loop; a change spans
    several feed answers, so `hold` and `release` are separate calls). Not re-entrant:
    `hold` while held does nothing. Holds of several instances (threads) overlap safely:
    the first hold of the process saves the thresholds, the last release restores them (a
    raft-thread apply released after an event-loop write would otherwise restore the
    write's held threshold and leave full collections off for good)."""

    _lock = threading.Lock()
    _holders = 0
    _saved_process: Optional[tuple] = None

    def __init__(self) -> None:
        self._saved: Optional[tuple] = None
        self.freezes = 0

    @property
    def held(self) -> bool:
        return self._saved is not None

    def hold(self) -> None:
        if self._saved is not None:
            return
        cls = FullCollectionHold
        with cls._lock:
            if cls._holders == 0:
                cls._saved_process = gc.get_threshold()
                gc.set_threshold(cls._saved_process[0], cls._saved_process[1], 1 << 30)
            cls._holders += 1
            self._saved = cls._saved_process

    def release(self, freeze: bool) -> None:
        if self._saved is None:
            return
        if freeze:
            gc.freeze()
            self.freezes += 1
        cls = FullCollectionHold
        with cls._lock:
            cls._holders -= 1
            if cls._holders == 0:
                gc.set_threshold(*cls._saved_process)
                cls._saved_process = None
        self._saved = None


@contextlib.contextmanager
def _full_collections_held(freeze: bool):
    """No full collection inside; `gc.freeze()` after it when `freeze` (FullCollectionHold)."""
    hold = FullCollectionHold()
    hold.hold()
    try:
        yield
    finally:
        hold.release(freeze=freeze)


class MetadataStateMachine:
    """Image + feed tail + applied request ids. Invariants: tail holds records with offsets
    [tail_start, feed_end) contiguously; `feed_end` is `image.offset` between entries (an
    entry's records join the tail when its apply is done); `batch_ends` holds, ascending,
    the offset after the last record of every applied entry whose records are in the tail
    (the feed's batch boundaries: a reader may publish up to any of them without seeing
    half an entry).

    Two locks: `lock` guards the image and is held by the raft thread for a whole apply
    (1-2 s for a 50,000-record entry at 100,000 partitions); `feed_lock` guards only the
    tail, `feed_end` and `batch_ends` and is held for moments, so the feed's readers
    (`feed_page`) never wait for an apply (issue 25: the pages of a fencing waited behind
    the applies of its follow-up entries, and the survivors had it 2 s after its commit).
    Lock order: `lock`, then `feed_lock`."""

    def __init__(self, cluster_id: str = "", feed_retained_records: int = 100_000,
                 request_ids_retained: int = 10_000, gc_freeze_min_records: int = 0,
                 feed_encoded_records: int = FEED_ENCODED_RECORDS_DEFAULT):
        self.cluster_id = cluster_id
        # offset -> JSON text of the feed item {"offset", "record"} (the newest
        # `feed_encoded_records` or so; see records_since_json)
        self.feed_encoded_records = feed_encoded_records
        self._encoded: dict[int, str] = {}
        self._runs_encoded: dict[tuple, tuple] = {}   # (offset, records, singles_max) -> feed_runs, oldest first
        self._snapshot_text: tuple = (-1, "")   # (image offset, JSON text) of the last feed snapshot
        self.snapshots_encoded = 0
        self.records_encoded = 0   # feed items encoded so far (each once while cached)
        # 0: never touch the collector (in-process tests); the controller passes
        # GC_FREEZE_MIN_RECORDS_DEFAULT
        self.gc_freeze_min_records = gc_freeze_min_records
        self.gc_freezes = 0
        self.feed_retained_records = feed_retained_records
        self.request_ids_retained = request_ids_retained
        self.lock = threading.RLock()
        self.feed_lock = threading.Lock()
        self.image = MetadataImage(cluster_id)
        self.tail: list[tuple[int, Any]] = []   # (offset, record object): records are immutable
        self.tail_start = 0
        self.feed_end = 0
        self.batch_ends: list[int] = []
        self.request_ids: "collections.OrderedDict[str, int]" = collections.OrderedDict()
        self.applied_batches = 0
        self.rejected_batches = 0
        self.controllers: dict = {}                 # node id -> registration (quorum_membership.py)
        self.quorum_change: Optional[dict] = None   # the controller quorum change in flight

    # ------------------------------------------------------------ raft StateMachine
    def apply(self, entries: list) -> Any:
        size = sum(entry_record_count(e.get("records")) for e in entries if isinstance(e, dict))
        with self._gc_held(size):
            results = []
            with self.lock:
                for entry in entries:
                    try:
                        results.append(self._apply_entry(entry))
                    except Exception as exc:  # deterministic: same on every node
                        log.exception("metadata entry rejected")
                        self.rejected_batches += 1
                        results.append({"ok": False, "reason": f"malformed entry: {exc!r}"})
            return results

    @contextlib.contextmanager
    def large_command_hold(self):
        """The raft layer unpickles and applies a large committed command inside this
        (raft/syncobj_log.py `install_command_hold`): full collections off from before the
        unpickle (which allocates the entry's 33,334 record dicts at 100,000 partitions)
        until `apply` has frozen what it built. Does nothing when this state machine never
        touches the collector (gc_freeze_min_records 0)."""
        if not self.gc_freeze_min_records:
            yield
            return
        with _full_collections_held(freeze=False):   # a large apply froze the image and the entry already
            yield

    @contextlib.contextmanager
    def _gc_held(self, records: int):
        """Around a large apply: no full collection inside it, gc.freeze() after it."""
        if not self.gc_freeze_min_records or records < self.gc_freeze_min_records:
            yield
            return
        try:
            with _full_collections_held(freeze=True):   # the image is long-lived: later full collections skip it
                yield
        finally:
            self.gc_freezes += 1

    def _apply_entry(self, entry: dict) -> dict:
        if "quorum" in entry:
            epoch = entry.get("controller_epoch", 0)
            self.quorum_change, result = quorum_membership.apply_op(
                self.controllers, self.quorum_change, entry["quorum"], epoch == self.image.controller_epoch, epoch)
            return result
        image = self.image
        request_id = entry.get("request_id")
        if request_id is not None and request_id in self.request_ids:
            return {"ok": True, "duplicate": True, "base_offset": self.request_ids[request_id],
                    "offset": image.offset}
        records = entry_records(entry["records"])
        epoch = entry.get("controller_epoch", 0)
        if records and isinstance(records[0], LeaderChangeRecord):
            if records[0].epoch <= image.controller_epoch:
                self.rejected_batches += 1
                return {"ok": False, "stale_epoch": True,
                        "reason": f"leader change to epoch {records[0].epoch} is not newer than {image.controller_epoch}"}
        elif epoch != image.controller_epoch:
            self.rejected_batches += 1
            return {"ok": False, "stale_epoch": True,
                    "reason": f"controller epoch {epoch} is not the current {image.controller_epoch}"}
        conflict = image.check_batch(records)
        if conflict is not None:
            self.rejected_batches += 1
            return {"ok": False, "conflict": True, "reason": conflict}
        base = image.offset
        added = []
        for record in records:
            offset = image.offset
            if isinstance(record, RegisterBrokerRecord):
                record = dataclasses.replace(record, broker_epoch=offset)
            image.replay(record)
            added.append((offset, record))
        with self.feed_lock:   # the whole entry joins the feed at once
            self.tail.extend(added)
            if image.offset > base:
                self.batch_ends.append(image.offset)
            if len(self.tail) > 2 * self.feed_retained_records:
                drop = len(self.tail) - self.feed_retained_records
                del self.tail[:drop]
                self.tail_start = self.tail[0][0]
                del self.batch_ends[:bisect.bisect_right(self.batch_ends, self.tail_start)]
            self.feed_end = image.offset
        if request_id is not None:
            self.request_ids[request_id] = base
            while len(self.request_ids) > self.request_ids_retained:
                self.request_ids.popitem(last=False)
        self.applied_batches += 1
        return {"ok": True, "base_offset": base, "offset": image.offset}

    def snapshot(self) -> dict:
        with self.lock:
            return self.snapshot_unlocked()

    def snapshot_unlocked(self) -> dict:
        """`snapshot` without the lock: for the raft thread's forked dump child only
        (raft/syncobj_log.py SnapshotWhenPickled), where no other thread exists."""
        return {
            "image": self.image.to_snapshot(),
            "request_ids": list(self.request_ids.items()),
            "controllers": {nid: dict(c) for nid, c in self.controllers.items()},
            "quorum_change": dict(self.quorum_change) if self.quorum_change else None,
        }

    def restore(self, data: dict) -> None:
        partitions = sum(len(t.get("partitions") or ()) for t in (data.get("image") or {}).get("topics") or ())
        with self._gc_held(partitions), self.lock:
            self.image = MetadataImage.from_snapshot(data["image"])
            if self.cluster_id:
                self.image.cluster_id = self.cluster_id
            self.request_ids = collections.OrderedDict((k, v) for k, v in data.get("request_ids", []))
            self.controllers = {nid: dict(c) for nid, c in (data.get("controllers") or {}).items()}
            self.quorum_change = dict(data["quorum_change"]) if data.get("quorum_change") else None
            with self.feed_lock:
                self.tail = []
                self.tail_start = self.feed_end = self.image.offset
                self.batch_ends = []
                self._encoded = {}

    # ------------------------------------------------------------ readers (any thread)
    def seen_request(self, request_id: Optional[str]) -> bool:
        with self.lock:
            return request_id is not None and request_id in self.request_ids

    def records_since(self, offset: int, max_records: int) -> Optional[list]:
        """Records with offsets >= `offset` (at most max_records), or None when `offset`
        is older than the retained tail (the caller needs a snapshot)."""
        with self.feed_lock:
            if offset < self.tail_start:
                return None
            start = offset - self.tail_start
            page = self.tail[start:start + max_records]
        return [{"offset": o, "record": record_to_dict(r)} for o, r in page]

    def snapshot_json(self) -> tuple:
        """(metadata offset, JSON text of `image.to_snapshot()`) for the feed's snapshot answer.
        Built under the lock (one offset), encoded outside it in chunks of
        SNAPSHOT_ENCODE_CHUNK_PARTITIONS partitions (the raft thread gets the GIL between
        them), and reused while the image has not moved (brokers far behind ask together)."""
        with self.lock:
            offset = self.image.offset
            cached = self._snapshot_text
            if cached[0] == offset:
                return cached
            snap = self.image.to_snapshot()
        topics = snap.pop("topics")
        parts = []
        for t in topics:
            partitions = t.pop("partitions")
            chunks = [json.dumps(partitions[i:i + SNAPSHOT_ENCODE_CHUNK_PARTITIONS])[1:-1]
                      for i in range(0, len(partitions), SNAPSHOT_ENCODE_CHUNK_PARTITIONS)]
            parts.append(f'{json.dumps(t)[:-1]}, "partitions": [{", ".join(chunks)}]}}')
        head = json.dumps(snap)
        text = f'{head[:-1]}, "topics": [{", ".join(parts)}]}}'
        self.snapshots_encoded += 1
        with self.lock:
            if self.image.offset == offset:
                self._snapshot_text = (offset, text)
        return offset, text

    def batch_ends_in(self, after: int, until: int) -> list:
        """The batch boundaries (see the class docstring) in (after, until], ascending."""
        with self.feed_lock:
            ends = self.batch_ends
            return ends[bisect.bisect_right(ends, after):bisect.bisect_right(ends, until)]

    def records_since_json(self, offset: int, max_records: int) -> Optional[list]:
        """`records_since` as JSON texts (one per item, as `json.dumps` writes it), or None."""
        page = self.feed_page(offset, max_records)
        return None if page is None else page[0]

    def feed_page(self, offset: int, max_records: int, runs: bool = False,
                  singles_max: Optional[int] = None) -> Optional[tuple]:
        """One answer of the feed: (the JSON texts of the records from `offset`, at most
        `max_records`; `feed_end`, which ends them or lies beyond; the batch boundaries
        within them), or None when `offset` is older than the tail (the reader needs a
        snapshot). Read under `feed_lock` only: never waits for an apply in progress.
        Encoded outside the lock and cached by offset (a committed offset's record never
        changes), so brokers reading the same records share one encoding, and no single
        encode holds the GIL for a whole page. `runs`: consecutive compact partition records
        of one topic go as one item {"offset", "run"} (`feed_runs`; the reader asked for
        them), each other record as {"offset", "record"}, at most `singles_max` of those
        (the page then ends before the next one)."""
        with self.feed_lock:
            if offset < self.tail_start:
                return None
            start = offset - self.tail_start
            page = self.tail[start:start + max_records]
            end = self.feed_end
            ends = self.batch_ends
            ends = ends[bisect.bisect_right(ends, offset):bisect.bisect_right(ends, offset + len(page))]
            cache = self._encoded
        if runs:
            key = (offset, len(page), singles_max)
            cached = self._runs_encoded.get(key)
            if cached is None:
                cached = feed_runs(page, lambda o, r: self._record_text(o, r, cache), singles_max)
                if len(self._runs_encoded) >= FEED_RUN_PAGES_CACHED:
                    self._runs_encoded.pop(next(iter(self._runs_encoded)))
                self._runs_encoded[key] = cached
            out, covered = cached
            if covered < len(page):   # cut at singles_max: the batch ends up to where it stops
                ends = ends[:bisect.bisect_right(ends, offset + covered)]
        else:
            out = [self._record_text(o, r, cache) for o, r in page]
        keep = self.feed_encoded_records
        if len(cache) > 2 * keep:   # amortised: drop all but the newest `keep` offsets
            newest = end - keep
            with self.feed_lock:
                if cache is self._encoded:
                    self._encoded = {o: t for o, t in cache.items() if o >= newest}
        return out, end, ends

    def _record_text(self, offset: int, record: Any, cache: dict) -> str:
        """The feed item text of one record, encoded once while in `cache` (`feed_page`)."""
        text = cache.get(offset)
        if text is None:
            text = cache[offset] = record_item_text(offset, record)
            self.records_encoded += 1
        return text
