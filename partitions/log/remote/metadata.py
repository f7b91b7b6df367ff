"""Remote log segment metadata (KIP-405's RemoteLogSegmentMetadata) and a partition's view
of its remote segments. Pure: no IO.

A remote segment moves through COPY_STARTED -> COPY_FINISHED -> DELETE_STARTED ->
DELETE_FINISHED. Only COPY_FINISHED segments are readable and count for the remote log
start offset; a COPY_STARTED segment left behind by a leader that died mid-copy is an
orphan: the next leader deletes its objects (and may copy the same offsets again under a
new segment id).

Leaders do not share segment boundaries (a follower rolls its own segments), so a new
leader may copy a segment that overlaps what its predecessor copied, e.g. [0, 4499] over
[0, 3999]. Overlap is allowed (the offsets below the high watermark hold the same records on
every replica); what is never allowed is to treat a copy that holds offsets no other copy
holds as redundant.

Invariants of `RemoteLogSegments.readable()`: sorted by base offset, base and end offsets
both strictly increasing (so `find` is a bisection); a finished copy is in `duplicates()`
(to delete) only when one readable copy holds all of its offsets; two copies of the same
span keep the one with the lower (leader epoch, segment id).
"""
from __future__ import annotations

import enum
import json
import uuid
from bisect import bisect_right
from dataclasses import asdict, dataclass, field, replace


class RemoteLogSegmentState(str, enum.Enum):
    COPY_SEGMENT_STARTED = "COPY_SEGMENT_STARTED"
    COPY_SEGMENT_FINISHED = "COPY_SEGMENT_FINISHED"
    DELETE_SEGMENT_STARTED = "DELETE_SEGMENT_STARTED"
    DELETE_SEGMENT_FINISHED = "DELETE_SEGMENT_FINISHED"


def new_segment_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class RemoteLogSegmentMetadata:
    """One segment in the remote store. `end_offset` is its last offset (inclusive, as
    Kafka); `segment_leader_epochs` maps each leader epoch in it to its first offset;
    `size_bytes` is the `.log` object's size; `broker_id` / `leader_epoch` name the leader
    that copied it (fencing of a zombie leader's copies)."""

    topic: str
    topic_id: str
    partition: int
    segment_id: str
    base_offset: int
    end_offset: int
    max_timestamp_ms: int
    size_bytes: int
    leader_epoch: int
    broker_id: int
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED
    segment_leader_epochs: tuple[tuple[int, int], ...] = field(default_factory=tuple)
    event_timestamp_ms: int = 0

    def __post_init__(self) -> None:
        if self.end_offset < self.base_offset:
            raise ValueError(f"remote segment {self.segment_id}: end offset {self.end_offset} < base {self.base_offset}")

    @property
    def next_offset(self) -> int:
        return self.end_offset + 1

    def with_state(self, state: RemoteLogSegmentState, now_ms: int) -> "RemoteLogSegmentMetadata":
        return replace(self, state=state, event_timestamp_ms=now_ms)

    def to_json(self) -> bytes:
        doc = asdict(self)
        doc["state"] = self.state.value
        doc["segment_leader_epochs"] = [list(e) for e in self.segment_leader_epochs]
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "RemoteLogSegmentMetadata":
        doc = json.loads(data)
        doc["state"] = RemoteLogSegmentState(doc["state"])
        doc["segment_leader_epochs"] = tuple((int(e), int(o)) for e, o in doc.get("segment_leader_epochs", ()))
        return cls(**doc)


FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED


class RemoteLogSegments:
    """A partition's remote segments by id (latest state of each) with the derived views
    the copier, retention and reads need."""

    def __init__(self, segments: list[RemoteLogSegmentMetadata] | None = None, log_start_floor: int = 0) -> None:
        # DeleteRecords below the local log start: no offset under it is readable, and the
        # remote segments wholly under it are deleted by the leader (remote_segments_to_delete)
        self.log_start_floor = log_start_floor
        self._by_id: dict[str, RemoteLogSegmentMetadata] = {}
        self._readable: list[RemoteLogSegmentMetadata] | None = None
        self._duplicates: list[RemoteLogSegmentMetadata] = []
        for s in segments or ():
            self.put(s)

    def put(self, md: RemoteLogSegmentMetadata) -> None:
        if md.state == RemoteLogSegmentState.DELETE_SEGMENT_FINISHED:
            self._by_id.pop(md.segment_id, None)
        else:
            self._by_id[md.segment_id] = md
        self._readable = None

    def remove(self, segment_id: str) -> None:
        self._by_id.pop(segment_id, None)
        self._readable = None

    def all(self) -> list[RemoteLogSegmentMetadata]:
        return sorted(self._by_id.values(), key=lambda s: (s.base_offset, s.segment_id))

    def _build(self) -> None:
        # same base: the longest copy first, so a shorter one of the same start is covered
        done = sorted((s for s in self._by_id.values() if s.state == FINISHED),
                      key=lambda s: (s.base_offset, -s.end_offset, s.leader_epoch, s.segment_id))
        readable: list[RemoteLogSegmentMetadata] = []
        dups: list[RemoteLogSegmentMetadata] = []
        for s in done:
            if readable and s.end_offset <= readable[-1].end_offset:
                dups.append(s)  # every offset of it is in the readable copy before it
            else:
                readable.append(s)
        self._readable, self._duplicates = readable, dups

    def readable(self) -> list[RemoteLogSegmentMetadata]:
        """COPY_FINISHED segments, sorted, non-overlapping (see module docstring)."""
        if self._readable is None:
            self._build()
        return list(self._readable or [])

    def duplicates(self) -> list[RemoteLogSegmentMetadata]:
        """Finished copies whose every offset one readable copy holds (to delete)."""
        if self._readable is None:
            self._build()
        return list(self._duplicates)

    def in_state(self, *states: RemoteLogSegmentState) -> list[RemoteLogSegmentMetadata]:
        return [s for s in self.all() if s.state in states]

    def copied_end_offset(self) -> int:
        """The offset after the last remote offset with no gap from the first remote
        segment (KIP-405's highest offset in remote storage + 1); -1 when nothing is remote."""
        segs = self.readable()
        if not segs:
            return -1
        end = segs[0].next_offset
        for s in segs[1:]:
            if s.base_offset > end:
                break
            end = max(end, s.next_offset)
        return end

    def log_start_offset(self) -> int | None:
        """The first readable remote offset (the floor set by DeleteRecords counts); None when
        nothing remote is readable."""
        segs = self.readable()
        if not segs:
            return None
        start = max(segs[0].base_offset, self.log_start_floor)
        return start if start < self.copied_end_offset() else None

    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.readable())

    def find(self, offset: int) -> RemoteLogSegmentMetadata | None:
        """The readable segment holding `offset`, or None (also below the log start floor)."""
        if offset < self.log_start_floor:
            return None
        segs = self.readable()
        i = bisect_right([s.base_offset for s in segs], offset) - 1
        if i >= 0 and segs[i].end_offset >= offset:
            return segs[i]
        return None

    def first_at_or_after(self, offset: int) -> RemoteLogSegmentMetadata | None:
        for s in self.readable():
            if s.end_offset >= offset:
                return s
        return None

    def __len__(self) -> int:
        return len(self._by_id)


def next_segments_to_copy(closed_segments: list[tuple[int, int]], copied_end_offset: int,
                          high_watermark: int) -> list[tuple[int, int]]:
    """Which closed local segments (base offset, next offset) the leader copies next, in
    order: those holding offsets at or past the copied end offset, wholly below the high
    watermark (KIP-405: never copy what may be truncated). A segment that straddles the copied
    end (a new leader's boundaries differ from its predecessor's) is copied whole: the
    overlap is allowed (module docstring)."""
    out = []
    for base, nxt in closed_segments:
        if nxt <= copied_end_offset or nxt > high_watermark:
            if nxt > high_watermark:
                break
            continue
        out.append((base, nxt))
    return out


def remote_segments_to_delete(segments: RemoteLogSegments, *, local_size_bytes: int, local_start_offset: int,
                              retention_ms: int, retention_bytes: int, now_ms: int) -> list[RemoteLogSegmentMetadata]:
    """Total retention over both tiers (Kafka's retention.ms / retention.bytes with
    remote.storage.enable): the oldest remote segments past retention.ms, or while the
    whole log (remote segments below the local log start + the local log) is larger
    than retention.bytes, and every segment wholly below the log start floor (DeleteRecords).
    Never a segment that would leave a gap below the local log."""
    readable = segments.readable()
    remote_only = [s for s in readable if s.base_offset < local_start_offset]
    total = local_size_bytes + sum(s.size_bytes for s in remote_only)
    doomed = []
    for s in readable:
        if s.next_offset <= segments.log_start_floor:   # records deleted by DeleteRecords
            doomed.append(s)
            if s in remote_only:
                total -= s.size_bytes
            continue
        expired = retention_ms >= 0 and now_ms - s.max_timestamp_ms > retention_ms
        too_big = retention_bytes >= 0 and total - s.size_bytes >= retention_bytes and s in remote_only
        if not (expired or too_big):
            break
        if s.next_offset > local_start_offset and not expired:
            break
        doomed.append(s)
        if s in remote_only:
            total -= s.size_bytes
    return doomed


__all__ = ["RemoteLogSegmentState", "RemoteLogSegmentMetadata", "RemoteLogSegments", "new_segment_id",
           "next_segments_to_copy", "remote_segments_to_delete", "FINISHED", "STARTED"]
