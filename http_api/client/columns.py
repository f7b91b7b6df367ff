"""`RecordColumns`: the records of one record batch that a poll returned, as columns
(offsets, timestamps, keys, values, headers) instead of one `ConsumerRecord` per record, and
`decode_columns`, which reads them from fetched batches. For kraftlog's columnar records
sections (partitions/log/record_batch.py's layout: the value lengths are one int32 array,
the values one run of bytes) nothing is made per record: values and keys are `BytesColumn`s,
views of the batch's bytes that slice a record's bytes only when it is read.

Invariant: every column has one entry per record, in offset order, and only records at or
after the position the fetch started from (a batch that starts before it is cut).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass
from itertools import accumulate
from typing import Iterator, Sequence

from partitions.log.errors import CorruptRecordError
from partitions.log import record_batch as rb

# the columnar records section's flags (record_batch.py module docstring)
_F_OFFSETS = 0x01
_F_TIMESTAMPS = 0x02
_F_KEYS = 0x04
_F_HEADERS = 0x08
_NATIVE_LITTLE = array("i", [1]).tobytes()[0] == 1


class BytesColumn(Sequence):
    """Byte strings (or None) of consecutive records, stored as Arrow stores a binary
    column: `buffer` (the records' bytes back to back, a memoryview of the fetched batch)
    and `lengths` (array of int32, -1 = None). `col[i]`, iteration and `tolist()` make the
    bytes objects; code that can read `buffer` and `lengths` makes none."""

    __slots__ = ("buffer", "lengths", "_ends")

    def __init__(self, buffer, lengths: array) -> None:
        self.buffer = buffer
        self.lengths = lengths
        self._ends: list | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    def _positions(self) -> list:
        if self._ends is None:
            self._ends = list(accumulate((n if n > 0 else 0 for n in self.lengths), initial=0)
                              if self.lengths and min(self.lengths) < 0 else accumulate(self.lengths, initial=0))
        return self._ends

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.tolist()[i]
        n = self.lengths[i]
        if n < 0:
            return None
        if i < 0:
            i += len(self.lengths)
        start = self._positions()[i]
        return bytes(self.buffer[start:start + n])

    def tolist(self) -> list:
        """Every record's bytes (None for a -1 length) as a list."""
        ends = self._positions()
        data = bytes(self.buffer)
        out = list(map(data.__getitem__, map(slice, ends, ends[1:])))
        if self.lengths and min(self.lengths) < 0:
            for i, n in enumerate(self.lengths):
                if n < 0:
                    out[i] = None
        return out

    def __iter__(self) -> Iterator:
        return iter(self.tolist())

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"BytesColumn({len(self)} records, {len(self.buffer)} bytes)"


@dataclass(slots=True)
class RecordColumns:
    """The records of one batch of one partition: `offsets[i]`, `timestamps[i]`, `keys[i]`,
    `values[i]` and `headers[i]` belong to one record. keys and values are `BytesColumn`s
    (or lists, for batches in Kafka's record format); `next_offset` is the offset after the
    batch (records not returned, e.g. removed by compaction, included)."""

    topic: str
    partition: int
    offsets: Sequence[int]
    timestamps: Sequence[int]
    keys: Sequence
    values: Sequence
    headers: Sequence[tuple]
    next_offset: int

    def __len__(self) -> int:
        return len(self.offsets)

    def __iter__(self) -> Iterator[tuple]:
        """(offset, key, value) per record."""
        return zip(self.offsets, self.keys, self.values)


def _ints(code: str, data: bytes, pos: int, n: int) -> tuple[array, int]:
    end = pos + (4 if code == "i" else 8) * n
    if end > len(data):
        raise CorruptRecordError("records section is truncated")
    arr = array(code)
    arr.frombytes(data[pos:end])
    if not _NATIVE_LITTLE:
        arr.byteswap()
    return arr, end


def _column(data, lens: array, pos: int) -> tuple[BytesColumn, int]:
    """The BytesColumn of `lens` records at `pos` of `data`; -> (it, position after it)."""
    low = min(lens)
    if low < -1:
        raise CorruptRecordError(f"negative length {low} in records section")
    total = sum(lens) + lens.count(-1) if low < 0 else sum(lens)
    end = pos + total
    if end > len(data):
        raise CorruptRecordError("records section is truncated")
    return BytesColumn(memoryview(data)[pos:end], lens), end


def _columnar(topic: str, partition: int, header: rb.BatchHeader, batch, data) -> RecordColumns:
    n = header.record_count
    flags = data[0]
    pos = 1
    offsets: Sequence[int]
    if flags & _F_OFFSETS:
        deltas, pos = _ints("i", data, pos, n)
        offsets = array("q", map(header.base_offset.__add__, deltas))
    else:
        offsets = range(header.base_offset, header.base_offset + n)
    timestamps: Sequence[int]
    if header.attributes & rb.TIMESTAMP_TYPE_MASK:
        pos += 8 * n if flags & _F_TIMESTAMPS else 0
        timestamps = [header.max_timestamp] * n
    elif flags & _F_TIMESTAMPS:
        ts, pos = _ints("q", data, pos, n)
        timestamps = array("q", map(header.first_timestamp.__add__, ts))
    else:
        timestamps = [header.first_timestamp] * n
    key_lens = header_counts = None
    if flags & _F_KEYS:
        key_lens, pos = _ints("i", data, pos, n)
    value_lens, pos = _ints("i", data, pos, n)
    if flags & _F_HEADERS:
        header_counts, pos = _ints("i", data, pos, n)
    keys: Sequence = [None] * n
    if key_lens is not None:
        keys, pos = _column(data, key_lens, pos)
    values, pos = _column(data, value_lens, pos)
    headers: Sequence[tuple] = [()] * n
    if header_counts is not None:   # headers are rare: the record decoder reads them
        headers = [r.headers for r in rb.decode_records(batch, validate=False)]
    elif pos != len(data):
        raise CorruptRecordError(f"records section has {len(data) - pos} unexpected trailing bytes")
    return RecordColumns(topic, partition, offsets, timestamps, keys, values, headers, header.next_offset)


def _cut(cols: RecordColumns, k: int) -> RecordColumns:
    """`cols` without its first k records."""
    def rest(col):
        if isinstance(col, BytesColumn):
            skipped = sum(n for n in col.lengths[:k] if n > 0)
            return BytesColumn(col.buffer[skipped:], col.lengths[k:])
        return col[k:]
    return RecordColumns(cols.topic, cols.partition, rest(cols.offsets), rest(cols.timestamps), rest(cols.keys),
                         rest(cols.values), rest(cols.headers), cols.next_offset)


def decode_columns(topic: str, partition: int, body, position: int) -> tuple[list[RecordColumns], int]:
    """The batches fetched in `body` as RecordColumns, records before `position` left out
    (control batches, i.e. transaction markers, skipped); -> (them, the offset after the
    last batch). Kafka-format batches (written through the Kafka listener) are decoded per
    record into lists."""
    out: list[RecordColumns] = []
    nxt = position
    for header, batch in rb.iter_batches(body, validate=False):
        nxt = max(nxt, header.next_offset)
        if header.is_control or header.record_count == 0:
            continue
        try:
            if header.is_columnar:
                codec = header.attributes & rb.CODEC_MASK
                section = batch[rb.HEADER_SIZE:header.size]
                data = section if codec == rb.Compression.NONE else rb._decompress(codec, section)   # no copy
                if not data:
                    raise CorruptRecordError("records section is empty")
                cols = _columnar(topic, partition, header, batch, data)
            else:
                rs = rb.decode_records(batch, validate=False)
                cols = RecordColumns(topic, partition, [r.offset for r in rs], [r.timestamp for r in rs],
                                     [r.key for r in rs], [r.value for r in rs], [r.headers for r in rs],
                                     header.next_offset)
        except (ValueError, IndexError) as e:
            if isinstance(e, CorruptRecordError):
                raise
            raise CorruptRecordError(f"batch at base offset {header.base_offset}: {e}") from e
        if header.base_offset < position:   # a batch that starts before the position: cut it
            k = 0
            while k < len(cols.offsets) and cols.offsets[k] < position:
                k += 1
            cols = _cut(cols, k)
        if len(cols):
            out.append(cols)
    return out, nxt
