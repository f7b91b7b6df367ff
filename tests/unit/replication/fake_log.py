"""A small in-memory `PartitionLog` / `LogDirectory` (partitions/log/protocols.py) for replica
manager unit tests: keeps them independent of segment files. It follows the storage engine's
offset rules (log_start <= HW <= LEO, the HW only moves forward except by truncation);
tests/unit/replication/test_protocols.py checks it has the same interface as `Log`."""
from __future__ import annotations

from dataclasses import dataclass

from partitions.log import record_batch as rb
from partitions.log.errors import OffsetOutOfRangeError


@dataclass
class AppendInfo:
    first_offset: int
    last_offset: int
    log_append_time_ms: int = -1
    duplicate: bool = False


@dataclass
class FetchDataInfo:
    records: bytes
    next_offset: int


class MemoryLog:
    def __init__(self) -> None:
        self.batches: list[tuple[int, int, bytes]] = []  # (base, next, bytes)
        self.epochs: list[tuple[int, int]] = []          # (leader epoch, start offset)
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.high_watermark = 0
        self.recovery_point = 0
        self.closed = False
        self.flushes = 0

    @property
    def latest_epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else -1

    def _add(self, base: int, nxt: int, data: bytes, epoch: int) -> None:
        if not self.epochs or self.epochs[-1][0] < epoch:
            self.epochs.append((epoch, base))
        self.batches.append((base, nxt, data))
        self.log_end_offset = nxt

    def append_as_leader(self, records, leader_epoch: int) -> AppendInfo:
        first = self.log_end_offset
        for header, batch in rb.iter_batches(bytes(records)):
            buf = bytearray(batch)
            rb.stamp_batch(buf, self.log_end_offset, leader_epoch)
            self._add(self.log_end_offset, self.log_end_offset + header.last_offset_delta + 1, bytes(buf),
                      leader_epoch)
        return AppendInfo(first, self.log_end_offset - 1)

    def append_as_follower(self, records) -> AppendInfo:
        first = self.log_end_offset
        for header, batch in rb.iter_batches(bytes(records)):
            self._add(header.base_offset, header.next_offset, bytes(batch), header.partition_leader_epoch)
        return AppendInfo(first, self.log_end_offset - 1)

    def update_high_watermark(self, offset: int) -> int:
        offset = min(max(offset, self.log_start_offset), self.log_end_offset)
        self.high_watermark = max(self.high_watermark, offset)
        return self.high_watermark

    def read(self, start_offset: int, max_bytes: int, *, max_offset: int | None = None,
             min_one_message: bool = True) -> FetchDataInfo:
        if start_offset < self.log_start_offset or start_offset > self.log_end_offset:
            raise OffsetOutOfRangeError(start_offset, self.log_start_offset, self.log_end_offset)
        out = []
        size = 0
        nxt_offset = start_offset
        for base, nxt, data in self.batches:
            if nxt <= start_offset or (max_offset is not None and base >= max_offset):
                continue
            if out and size + len(data) > max_bytes:
                break
            if not out and len(data) > max_bytes and not min_one_message:
                break
            out.append(data)
            size += len(data)
            nxt_offset = nxt
        return FetchDataInfo(b"".join(out), nxt_offset)

    def truncate_to(self, offset: int) -> bool:
        if offset >= self.log_end_offset:
            return False
        self.batches = [b for b in self.batches if b[1] <= offset]
        self.log_end_offset = self.batches[-1][1] if self.batches else max(self.log_start_offset, 0)
        if self.log_end_offset < self.log_start_offset:
            self.truncate_fully_and_start_at(self.log_start_offset)
            return True
        self.epochs = [e for e in self.epochs if e[1] < self.log_end_offset]
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        self.recovery_point = min(self.recovery_point, self.log_end_offset)
        return True

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.batches, self.epochs = [], []
        self.log_start_offset = self.log_end_offset = self.high_watermark = self.recovery_point = offset

    def delete_records(self, before_offset: int) -> int:
        if before_offset > self.high_watermark or before_offset < 0:
            raise OffsetOutOfRangeError(before_offset, self.log_start_offset, self.high_watermark)
        self.log_start_offset = max(self.log_start_offset, before_offset)
        self.batches = [b for b in self.batches if b[1] > before_offset]
        return self.log_start_offset

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        found = [i for i, (e, _) in enumerate(self.epochs) if e <= epoch]
        if not found:
            return -1, -1
        i = found[-1]
        end = self.epochs[i + 1][1] if i + 1 < len(self.epochs) else self.log_end_offset
        return self.epochs[i][0], end

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        for r in rb.decode_batches(b"".join(d for _, _, d in self.batches)):
            if r.timestamp >= timestamp_ms:
                return r.offset
        return None

    def needs_flush(self, now_ms: int | None = None) -> bool:
        return False

    def flush(self, up_to_offset: int | None = None) -> None:
        self.flushes += 1
        self.recovery_point = self.log_end_offset if up_to_offset is None else min(up_to_offset,
                                                                                    self.log_end_offset)


class MemoryLogManager:
    def __init__(self) -> None:
        self.logs: dict[tuple[str, int], MemoryLog] = {}
        self.deleted: list[tuple[str, int]] = []
        self.configs: dict[str, object] = {}

    def get(self, topic: str, partition: int) -> MemoryLog | None:
        return self.logs.get((topic, partition))

    def get_or_create(self, topic: str, partition: int, config=None) -> MemoryLog:
        return self.logs.setdefault((topic, partition), MemoryLog())

    def partitions(self) -> list[tuple[str, int]]:
        return sorted(self.logs)

    def update_config(self, topic: str, config) -> None:
        self.configs[topic] = config

    def delete_log(self, topic: str, partition: int) -> bool:
        lg = self.logs.pop((topic, partition), None)
        self.deleted.append((topic, partition))
        if lg is not None:
            lg.closed = True
        return lg is not None


class ReplicaBroker:
    """One broker's replica state (min.insync.replicas 2) holding one `MemoryLog` replica of
    `tp`: the broker side of ISR unit tests that drive leaders and followers by hand."""

    def __init__(self, broker_id: int, tp) -> None:
        from partitions.replication.replica_state import ReplicaState
        self.id = broker_id
        self.core = ReplicaState(broker_id, min_isr_for=lambda topic: 2)
        self.log = MemoryLog()
        self.part = self.core.add_replica(tp, self.log)
