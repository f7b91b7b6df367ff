"""A small in-memory Log/LogManager with the storage engine's interface, for replica
manager unit tests (keeps them independent of segment files)."""
from __future__ import annotations

from dataclasses import dataclass

from partitions.log import record_batch as rb
from partitions.log.errors import OffsetOutOfRangeError


@dataclass
class AppendInfo:
    first_offset: int
    last_offset: int
    log_append_time_ms: int = -1


@dataclass
class FetchDataInfo:
    records: bytes


class MemoryLog:
    def __init__(self) -> None:
        self.batches: list[tuple[int, int, bytes]] = []  # (base, next, bytes)
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.high_watermark = 0

    def append_as_leader(self, batches: bytes, leader_epoch: int) -> AppendInfo:
        first = self.log_end_offset
        for header, batch in rb.iter_batches(batches):
            buf = bytearray(batch)
            rb.stamp_batch(buf, self.log_end_offset, leader_epoch)
            nxt = self.log_end_offset + header.last_offset_delta + 1
            self.batches.append((self.log_end_offset, nxt, bytes(buf)))
            self.log_end_offset = nxt
        return AppendInfo(first, self.log_end_offset - 1)

    def update_high_watermark(self, hw: int) -> None:
        self.high_watermark = hw

    def read(self, start_offset, max_bytes, *, max_offset=None, min_one_message=True):
        if start_offset < self.log_start_offset or start_offset > self.log_end_offset:
            raise OffsetOutOfRangeError(start_offset, self.log_start_offset, self.log_end_offset)
        out = []
        size = 0
        for base, nxt, data in self.batches:
            if nxt <= start_offset or (max_offset is not None and base >= max_offset):
                continue
            if out and size + len(data) > max_bytes:
                break
            if not out and len(data) > max_bytes and not min_one_message:
                break
            out.append(data)
            size += len(data)
        return FetchDataInfo(b"".join(out))

    def offset_for_timestamp(self, ts):
        for r in rb.decode_batches(b"".join(d for _, _, d in self.batches)):
            if r.timestamp >= ts:
                return r.offset
        return None

    def delete_records(self, before):
        self.log_start_offset = max(self.log_start_offset, before)
        self.batches = [b for b in self.batches if b[1] > before]


class MemoryLogManager:
    def __init__(self) -> None:
        self.logs: dict[tuple[str, int], MemoryLog] = {}
        self.deleted: list[tuple[str, int]] = []

    def get(self, topic, p):
        return self.logs.get((topic, p))

    def get_or_create(self, topic, p, config):
        return self.logs.setdefault((topic, p), MemoryLog())

    def partitions(self):
        return sorted(self.logs)

    def delete_log(self, topic, p):
        self.logs.pop((topic, p), None)
        self.deleted.append((topic, p))
