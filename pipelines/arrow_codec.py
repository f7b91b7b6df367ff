"""Record batches <-> Arrow columns, without a Python object per record.

The shared codec (`partitions/log/record_batch.py`) stores the records section as columns:
int32 length arrays followed by the concatenated key and value bytes. That is almost the
Arrow binary layout already, so decoding is: numpy view of the lengths, a cumulative sum for
the Arrow offsets, and a zero-copy slice of the fetched buffer for the data. Encoding from
Arrow is the reverse. Both paths are checked against the reference codec
(`decode_batches` / `build_batch`) in tests/spark/test_spark_options.py.

Headers (rare) are decoded record by record with the reference decoder, and so are batches
in Kafka's varint format (attribute bit 7 clear: produced by a Kafka client and stored as
sent): a Python loop per record, paid only on Kafka-written data.
"""
from __future__ import annotations

import struct
import time

import numpy as np
import pyarrow as pa

from partitions.log import record_batch as rb

_F_OFFSETS = 0x01
_F_TIMESTAMPS = 0x02
_F_KEYS = 0x04
_F_HEADERS = 0x08
_HEADER = struct.Struct(">qiibIhiqqqhii")  # layout of rb.HEADER_SIZE bytes, see rb docstring
if _HEADER.size != rb.HEADER_SIZE:  # pragma: no cover - the batch header changed under us
    raise ImportError(f"pipelines.arrow_codec expects a {_HEADER.size}-byte batch header, "
                      f"partitions.log.record_batch has {rb.HEADER_SIZE}: update _HEADER")

TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")


class BatchColumns:
    """Columns of the records of one or more batches (one partition), in offset order."""

    __slots__ = ("keys", "values", "offsets", "timestamps_ms", "timestamp_types", "headers")

    def __init__(self, keys, values, offsets, timestamps_ms, timestamp_types, headers):
        self.keys = keys                      # pa.BinaryArray
        self.values = values                  # pa.BinaryArray
        self.offsets = offsets                # np.int64 array
        self.timestamps_ms = timestamps_ms    # np.int64 array
        self.timestamp_types = timestamp_types  # np.int32 array
        self.headers = headers                # list of tuples of (name, bytes) or None

    def __len__(self) -> int:
        return len(self.offsets)


def _binary_from_lengths(buf: pa.Buffer, lens: np.ndarray, pos: int) -> tuple:
    """An Arrow binary array over `buf[pos:]` given int32 lengths (-1 = null)."""
    n = len(lens)
    nulls = lens < 0
    null_count = int(nulls.sum())
    clean = np.where(nulls, 0, lens) if null_count else lens
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 0
    np.cumsum(clean, out=offsets[1:])
    total = int(offsets[-1])
    if pos + total > buf.size:
        raise rb.CorruptRecordError("records section is truncated")
    validity = None
    if null_count:
        validity = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    arr = pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), buf.slice(pos, total)],
                                null_count=null_count)
    return arr, pos + total


def decode_batch_columns(header: rb.BatchHeader, batch: memoryview, want_headers: bool) -> BatchColumns | None:
    """Columns of one batch (None for control batches and empty batches)."""
    n = header.record_count
    if n == 0 or header.is_control:
        return None
    if not header.attributes & rb.COLUMNAR_MASK:
        return _kafka_batch_columns(header, batch, want_headers)
    codec = header.attributes & rb.CODEC_MASK
    payload = batch[rb.HEADER_SIZE:rb.LOG_OVERHEAD + header.batch_length]
    if codec == 0:
        data = pa.py_buffer(payload)
    else:
        data = pa.py_buffer(rb._decompress(codec, payload))
    raw = memoryview(data)
    flags = raw[0]
    pos = 1
    base = header.base_offset
    if flags & _F_OFFSETS:
        offsets = np.frombuffer(data, dtype="<i4", count=n, offset=pos).astype(np.int64) + base
        pos += 4 * n
    else:
        offsets = np.arange(base, base + n, dtype=np.int64)
    if header.attributes & rb.TIMESTAMP_TYPE_MASK:
        if flags & _F_TIMESTAMPS:
            pos += 8 * n
        timestamps = np.full(n, header.max_timestamp, dtype=np.int64)
    elif flags & _F_TIMESTAMPS:
        timestamps = np.frombuffer(data, dtype="<i8", count=n, offset=pos) + header.first_timestamp
        pos += 8 * n
    else:
        timestamps = np.full(n, header.first_timestamp, dtype=np.int64)
    key_lens = None
    if flags & _F_KEYS:
        key_lens = np.frombuffer(data, dtype="<i4", count=n, offset=pos)
        pos += 4 * n
    value_lens = np.frombuffer(data, dtype="<i4", count=n, offset=pos)
    pos += 4 * n
    if flags & _F_HEADERS:
        pos += 4 * n
    if key_lens is not None:
        keys, pos = _binary_from_lengths(data, key_lens, pos)
    else:
        keys = pa.nulls(n, pa.binary())
    values, pos = _binary_from_lengths(data, value_lens, pos)
    headers = None
    if want_headers:
        if flags & _F_HEADERS:
            headers = [r.headers for r in rb.decode_records(bytes(batch), validate=False)]
        else:
            headers = [()] * n
    ts_type = np.full(n, header.timestamp_type, dtype=np.int32)
    return BatchColumns(keys, values, offsets, timestamps, ts_type, headers)


def _kafka_batch_columns(header: rb.BatchHeader, batch, want_headers: bool) -> BatchColumns:
    """Columns of one Kafka-format batch, through the reference decoder."""
    records = rb.decode_records(batch, validate=False)
    n = len(records)
    return BatchColumns(pa.array([r.key for r in records], pa.binary()),
                        pa.array([r.value for r in records], pa.binary()),
                        np.fromiter((r.offset for r in records), dtype=np.int64, count=n),
                        np.fromiter((r.timestamp for r in records), dtype=np.int64, count=n),
                        np.full(n, header.timestamp_type, dtype=np.int32),
                        [r.headers for r in records] if want_headers else None)


def decode_fetch(buf: bytes, start: int, end: int, want_headers: bool = False,
                 validate: bool = True) -> tuple:
    """Decode concatenated batches, keeping records with start <= offset < end.

    Returns (BatchColumns or None, next_offset) where next_offset follows the last batch
    seen (capped at `end`), so compacted gaps and control batches are stepped over.
    """
    parts = []
    next_offset = start
    for header, batch in rb.iter_batches(buf, validate=validate):
        if header.base_offset >= end:
            break
        next_offset = max(next_offset, min(header.next_offset, end))
        if header.next_offset <= start:
            continue
        cols = decode_batch_columns(header, batch, want_headers)
        if cols is None:
            continue
        lo = 0 if header.base_offset >= start else int(np.searchsorted(cols.offsets, start))
        hi = len(cols) if header.last_offset < end else int(np.searchsorted(cols.offsets, end))
        if lo or hi != len(cols):
            cols = _slice(cols, lo, hi)
        if len(cols):
            parts.append(cols)
    if not parts:
        return None, next_offset
    if len(parts) == 1:
        return parts[0], next_offset
    headers = None
    if want_headers:
        headers = [h for p in parts for h in p.headers]
    return BatchColumns(
        pa.concat_arrays([p.keys for p in parts]),
        pa.concat_arrays([p.values for p in parts]),
        np.concatenate([p.offsets for p in parts]),
        np.concatenate([p.timestamps_ms for p in parts]),
        np.concatenate([p.timestamp_types for p in parts]),
        headers,
    ), next_offset


def _slice(cols: BatchColumns, lo: int, hi: int) -> BatchColumns:
    return BatchColumns(cols.keys.slice(lo, hi - lo), cols.values.slice(lo, hi - lo),
                        cols.offsets[lo:hi], cols.timestamps_ms[lo:hi], cols.timestamp_types[lo:hi],
                        None if cols.headers is None else cols.headers[lo:hi])


def columns_from_tuples(records: list) -> BatchColumns | None:
    """[(offset, timestamp_ms, key, value, headers)] (the JSON/CBOR fetch path) -> columns."""
    if not records:
        return None
    offsets, ts, keys, values, headers = zip(*records)
    n = len(records)
    return BatchColumns(pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
                        np.array(offsets, dtype=np.int64), np.array(ts, dtype=np.int64),
                        np.zeros(n, dtype=np.int32), [tuple(h) for h in headers])


def to_record_batch(cols: BatchColumns, topic: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
    """Spark's row layout for the kraftlog source, typed exactly as `schema` says."""
    n = len(cols)
    arrays = {
        "key": cols.keys,
        "value": cols.values,
        "topic": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)),
                                                pa.array([topic])).cast(pa.string())
        if n > 64 else pa.array([topic] * n, pa.string()),
        "partition": pa.array(np.full(n, partition, dtype=np.int32)),
        "offset": pa.array(cols.offsets),
        "timestamp": pa.array(cols.timestamps_ms * 1000, type=pa.int64()).view(TIMESTAMP_TYPE),
        "timestampType": pa.array(cols.timestamp_types),
    }
    out = []
    for field in schema:
        if field.name == "headers":
            headers = cols.headers if cols.headers is not None else [()] * n
            out.append(pa.array([[{"key": k, "value": v} for k, v in h] for h in headers], type=field.type))
            continue
        arr = arrays.get(field.name)
        if arr is None:
            raise ValueError(f"the kraftlog source cannot fill column {field.name!r}; "
                             "use the default schema (key, value, topic, partition, offset, "
                             "timestamp, timestampType[, headers])")
        if arr.type != field.type:
            arr = arr.cast(field.type)
        out.append(arr)
    return pa.RecordBatch.from_arrays(out, schema=schema)


# ---- encoding ---------------------------------------------------------------------------

def _as_binary(arr) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = pa.concat_arrays(arr.chunks) if arr.num_chunks != 1 else arr.chunk(0)
    if arr.type != pa.binary():
        arr = arr.cast(pa.binary())
    return arr


def binary_lengths_and_data(arr) -> tuple:
    """(int32 lengths with -1 for nulls, the concatenated bytes) of a binary/string array."""
    arr = _as_binary(arr)
    n = len(arr)
    bufs = arr.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4)
    lens = np.diff(offs).astype(np.int32)
    if arr.null_count:
        lens[arr.is_null().to_numpy(zero_copy_only=False)] = -1
    first, last = int(offs[0]), int(offs[-1])
    data = memoryview(bufs[2])[first:last] if bufs[2] is not None and last > first else b""
    if arr.null_count and first != last:
        # null slots normally have zero length; make sure the bytes we ship match the lengths
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        if int(np.diff(offs)[~valid].sum()):
            return lens, b"".join(v for v in arr.to_pylist() if v is not None)
    return lens, data


def encode_batch(keys, values, headers: list | None = None, *, timestamp_ms: int | None = None,
                 compression: rb.Compression | str | int = rb.Compression.NONE,
                 producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1) -> bytes:
    """One record batch from Arrow key/value columns (keys may be None: all null).

    `headers` is an optional list (one entry per record) of [(name, bytes)] pairs.
    producer_id / producer_epoch / base_sequence are carried for idempotent producers.
    """
    value_lens, value_data = binary_lengths_and_data(values)
    n = len(value_lens)
    if n == 0:
        raise ValueError("a batch needs at least one record")
    flags = 0
    parts = [b""]
    key_data = b""
    if keys is not None and _as_binary(keys).null_count != n:
        key_lens, key_data = binary_lengths_and_data(keys)
        flags |= _F_KEYS
        parts.append(key_lens.astype("<i4").tobytes())
    parts.append(value_lens.astype("<i4").tobytes())
    header_data = b""
    if headers is not None and any(headers):
        flags |= _F_HEADERS
        counts = np.fromiter((len(h) for h in headers), dtype="<i4", count=n)
        parts.append(counts.tobytes())
        out = bytearray()
        for hs in headers:
            for name, value in hs:
                raw = name.encode("utf-8") if isinstance(name, str) else bytes(name)
                out += struct.pack("<H", len(raw)) + raw
                if value is None:
                    out += struct.pack("<i", -1)
                else:
                    out += struct.pack("<i", len(value)) + bytes(value)
        header_data = bytes(out)
    parts[0] = bytes((flags,))
    parts.append(key_data)
    parts.append(value_data)
    parts.append(header_data)
    section = b"".join(parts)
    codec = rb.Compression.from_name(compression) if isinstance(compression, str) else rb.Compression(compression)
    payload = rb._compress(int(codec), section) if codec else section
    ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
    batch_length = rb.HEADER_SIZE - rb.LOG_OVERHEAD + len(payload)
    buf = bytearray(rb.HEADER_SIZE + len(payload))
    _HEADER.pack_into(buf, 0, 0, batch_length, -1, rb.MAGIC, 0, int(codec) | rb.COLUMNAR_MASK, n - 1, ts, ts,
                      producer_id, producer_epoch, base_sequence, n)
    buf[rb.HEADER_SIZE:] = payload
    from crc32c import crc32c
    struct.pack_into(">I", buf, rb.CRC_OFFSET, crc32c(memoryview(buf)[rb.ATTRIBUTES_OFFSET:]))
    return bytes(buf)
