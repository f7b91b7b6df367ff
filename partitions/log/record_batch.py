"""The one record batch codec shared by the broker, the client and Spark.

A batch is a fixed 61-byte big-endian header in Kafka's v2 layout followed by the records
section (compressed as a whole by the batch's codec):

    offset  size  field
    0       8     base_offset              int64   stamped by the leader
    8       4     batch_length             int32   bytes after this field
    12      4     partition_leader_epoch   int32   stamped by the leader
    16      1     magic                    int8    always 2
    17      4     crc                      uint32  CRC-32C of bytes [21, end)
    21      2     attributes               int16   bits 0-2 codec, bit 3 timestamp type
                                                   (1 = LogAppendTime), bit 4 transactional,
                                                   bit 5 control (transactions.py), bit 7
                                                   columnar records section (below)
    23      4     last_offset_delta        int32
    27      8     first_timestamp          int64   ms
    35      8     max_timestamp            int64   ms
    43      8     producer_id              int64
    51      2     producer_epoch           int16
    53      4     base_sequence            int32
    57      4     record_count             int32

Base offset and leader epoch precede the CRC, so the broker stamps them in place without
re-encoding (`stamp_batch`). The broker validates (`validate_batch`) but never decodes.

Two records section formats, chosen per batch by attribute bit 7 (`COLUMNAR_MASK`, inside
the CRC; docs/RECORD_FORMAT.md):

- bit 7 clear: Kafka's own varint-framed records, exactly as a Kafka client produced the
  batch (the Kafka listener stores and serves such batches byte for byte).
- bit 7 set: kraftlog's columnar layout below, which `build_batch` writes (the HTTP
  routes, the Python client, Spark, the log cleaner). Control batches (transaction markers:
  one record each) are the exception: `build_batch` writes them in Kafka's format, so Kafka
  consumers read markers untouched too.

`decode_records`, `decode_keys` and `decode_batches` read both, so callers need not care.
Log dirs written before bit 7 existed (every batch columnar, bit 7 clear) are upgraded in
place when opened (`upgrade_log_dir`).

Columnar records section (uncompressed form; little-endian, chosen so that
encoding/decoding does no per-record Python function calls for the common case):

    u8 flags:  0x01 explicit offset deltas   (else 0..n-1)
               0x02 timestamp deltas present (else all records have first_timestamp)
               0x04 key lengths present      (else every key is None)
               0x08 headers present          (else every record has no headers)
    [int32 offset_delta   x n]   if 0x01
    [int64 timestamp_delta x n]  if 0x02 (relative to first_timestamp)
    [int32 key_length     x n]   if 0x04 (-1 = null key)
    int32 value_length    x n    (-1 = null value, a tombstone)
    [int32 header_count   x n]   if 0x08
    key bytes, concatenated
    value bytes, concatenated
    headers, per record, per header: u16 name length, utf-8 name, int32 value length
    (-1 = null), value bytes                                    if 0x08
"""
from __future__ import annotations

import enum
import struct
import sys
import threading
import zlib
from array import array
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import attrgetter
from typing import Iterable, Iterator, Sequence

from crc32c import crc32c as _crc32c

from ..clock import SYSTEM_CLOCK
from .errors import CorruptRecordError, RecordTooLargeError

MAGIC = 2
# Byte offsets of the header fields within a batch (Kafka's DefaultRecordBatch names).
BASE_OFFSET_OFFSET = 0
BATCH_LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21  # the CRC covers [ATTRIBUTES_OFFSET, end)
LAST_OFFSET_DELTA_OFFSET = 23
FIRST_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
PRODUCER_EPOCH_OFFSET = 51
BASE_SEQUENCE_OFFSET = 53
RECORD_COUNT_OFFSET = 57
HEADER_SIZE = 61
LOG_OVERHEAD = 12  # base_offset + batch_length: bytes that batch_length does not count
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD

_HEADER = struct.Struct(">qiibIhiqqqhii")
_LENGTH = struct.Struct(">qi")  # base_offset, batch_length
_PREFIX = struct.Struct(">qii")  # base_offset, batch_length, partition_leader_epoch
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_UI = struct.Struct(">I")
_H = struct.Struct(">h")
_U16 = struct.Struct("<H")
_I32LE = struct.Struct("<i")
assert _HEADER.size == HEADER_SIZE

CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
COLUMNAR_MASK = 0x80  # the records section is kraftlog's columnar layout, not Kafka's varint records

CREATE_TIME = 0
LOG_APPEND_TIME = 1

_F_OFFSETS = 0x01
_F_TIMESTAMPS = 0x02
_F_KEYS = 0x04
_F_HEADERS = 0x08

_BIG_ENDIAN_HOST = sys.byteorder == "big"

__all__ = [
    "MAGIC",
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "BATCH_LENGTH_OFFSET",
    "PARTITION_LEADER_EPOCH_OFFSET",
    "CRC_OFFSET",
    "COLUMNAR_MASK",
    "ATTRIBUTES_OFFSET",
    "LAST_OFFSET_DELTA_OFFSET",
    "MAX_TIMESTAMP_OFFSET",
    "Compression",
    "Record",
    "BatchHeader",
    "CorruptRecordError",
    "RecordTooLargeError",
    "build_batch",
    "build_empty_batch",
    "validate_batch",
    "validate_batch_raw",
    "iter_batches",
    "stamp_batch",
    "set_log_append_time",
    "decode_records",
    "decode_keys",
    "decode_batches",
    "check_kafka_records",
    "check_kafka_batch",
    "batch_base_offset",
    "CREATE_TIME",
    "LOG_APPEND_TIME",
]


class Compression(enum.IntEnum):
    """Per-batch compression codec (attributes bits 0-2), Kafka's numbering."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_name(cls, name: "str | Compression | None") -> "Compression":
        """`"zstd"` -> ZSTD; accepts None/"none"/"uncompressed" and Kafka's names."""
        if isinstance(name, Compression):
            return name
        if name is None:
            return cls.NONE
        key = str(name).strip().lower()
        if key in ("", "none", "uncompressed"):
            return cls.NONE
        try:
            return cls[key.upper()]
        except KeyError:
            raise ValueError(
                f"unknown compression {name!r}: use one of none, gzip, snappy, lz4, zstd"
            ) from None


@dataclass(slots=True)
class Record:
    """One record. `timestamp` in ms (None = stamped at build time); `offset` is filled
    in by decoding (-1 before the record has an offset); `value=None` is a tombstone."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int | None = None
    offset: int = -1


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The parsed fixed header of one batch (see the module docstring for the layout)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @classmethod
    def parse(cls, buf, pos: int = 0) -> "BatchHeader":
        """Parse the header at `pos` (no validation; see `validate_batch`)."""
        if len(buf) - pos < HEADER_SIZE:
            raise CorruptRecordError(
                f"batch header at position {pos} is truncated: {len(buf) - pos} bytes, need {HEADER_SIZE}"
            )
        return cls(*_HEADER.unpack_from(buf, pos))

    @property
    def size(self) -> int:
        """Total bytes of the batch including the 12-byte offset+length prefix."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & CODEC_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_columnar(self) -> bool:
        """The records section is kraftlog's columnar layout (else Kafka's varint records)."""
        return bool(self.attributes & COLUMNAR_MASK)

    @property
    def timestamp_type(self) -> int:
        """0 = CreateTime, 1 = LogAppendTime."""
        return (self.attributes >> 3) & 1

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


# ---------------------------------------------------------------- compression

_tls = threading.local()


def _zstd():
    pair = getattr(_tls, "zstd", None)
    if pair is None:
        import zstandard

        pair = (zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor())
        _tls.zstd = pair
    return pair


def _compress(codec: int, data: bytes) -> bytes:
    if codec == Compression.NONE:
        return data
    if codec == Compression.ZSTD:
        return _zstd()[0].compress(data)
    if codec == Compression.LZ4:
        import lz4.frame

        return lz4.frame.compress(data)
    if codec == Compression.GZIP:
        return zlib.compress(data, 6, 31)
    if codec == Compression.SNAPPY:
        return _snappy_xerial_compress(data)
    raise ValueError(f"unsupported compression codec {codec}: use 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd")


# Kafka's snappy (codec 2) is xerial's snappy-java stream framing (what the Java client and
# kafka-python write): a 16-byte header (magic, version 1, compatible version 1), then blocks
# of [int32 big-endian length][raw snappy block]. librdkafka writes one raw snappy block
# without framing; readers accept both (as Kafka's broker does).
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_BYTES = 32 * 1024  # snappy-java's default block size


def _snappy_xerial_compress(data) -> bytes:
    import cramjam

    mv = memoryview(data)
    parts = [_XERIAL_HEADER]
    for pos in range(0, len(mv), _XERIAL_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(mv[pos:pos + _XERIAL_BLOCK_BYTES]))
        parts.append(_I.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data) -> bytes:
    import cramjam

    raw = cramjam.snappy.decompress_raw
    size_of = cramjam.snappy.decompress_raw_len
    mv = memoryview(data)
    if bytes(mv[:8]) != _XERIAL_MAGIC:
        size = size_of(mv)
        if size > MAX_RECORDS_SECTION_BYTES:
            raise _too_big(size)
        return bytes(raw(mv))
    pos, end = 16, len(mv)
    out = []
    total = 0
    while pos < end:
        if end - pos < 4:
            raise CorruptRecordError("snappy (xerial) block length is truncated")
        (length,) = _I.unpack_from(mv, pos)
        pos += 4
        if length < 0 or pos + length > end:
            raise CorruptRecordError("snappy (xerial) block runs past the records section")
        block = mv[pos:pos + length]
        total += size_of(block)
        if total > MAX_RECORDS_SECTION_BYTES:
            raise _too_big(total)
        out.append(bytes(raw(block)))
        pos += length
    return b"".join(out)


# Largest decompressed records section accepted (guards consumers against a batch that
# claims or expands to an absurd size: a decompression bomb).
MAX_RECORDS_SECTION_BYTES = 256 << 20


def _too_big(size: int) -> CorruptRecordError:
    return CorruptRecordError(
        f"records section decompresses to {size} bytes, more than the {MAX_RECORDS_SECTION_BYTES} allowed"
    )


def _decompress(codec: int, data) -> bytes:
    try:
        if codec == Compression.NONE:
            return bytes(data)
        if codec == Compression.ZSTD:
            import zstandard

            size = zstandard.frame_content_size(data)
            if size > MAX_RECORDS_SECTION_BYTES:
                raise _too_big(size)
            return _zstd()[1].decompress(data, max_output_size=MAX_RECORDS_SECTION_BYTES)
        if codec == Compression.LZ4:
            import lz4.frame

            size = lz4.frame.get_frame_info(data).get("content_size") or 0
            if size > MAX_RECORDS_SECTION_BYTES:
                raise _too_big(size)
            if size:
                return lz4.frame.decompress(data)
            d = lz4.frame.LZ4FrameDecompressor()
            out = d.decompress(data, max_length=MAX_RECORDS_SECTION_BYTES)
            if not d.eof:
                raise _too_big(len(out))
            return out
        if codec == Compression.SNAPPY:
            return _snappy_decompress(data)
        if codec == Compression.GZIP:
            d = zlib.decompressobj(47)
            out = d.decompress(data, MAX_RECORDS_SECTION_BYTES)
            if d.unconsumed_tail:
                raise _too_big(len(out))
            return out
    except CorruptRecordError:
        raise
    except Exception as exc:  # codec libraries raise their own error types
        raise CorruptRecordError(f"cannot decompress records with codec {codec}: {exc}") from exc
    raise CorruptRecordError(f"unsupported compression codec {codec} in batch attributes")


# ---------------------------------------------------------------- encoding

_get_key = attrgetter("key")
_get_value = attrgetter("value")
_get_ts = attrgetter("timestamp")
_get_headers = attrgetter("headers")


def _int_array(code: str, values) -> bytes:
    arr = array(code, values)
    if _BIG_ENDIAN_HOST:
        arr.byteswap()
    return arr.tobytes()


def _lengths_and_data(items: list) -> tuple[bytes, bytes]:
    if None in items:
        lens = [-1 if item is None else len(item) for item in items]
        data = b"".join([item for item in items if item is not None])
    else:
        lens = list(map(len, items))
        data = b"".join(items)
    return _int_array("i", lens), data


def _encode_headers(all_headers: list) -> tuple[bytes, bytes]:
    counts = list(map(len, all_headers))
    out = bytearray()
    pack_u16 = _U16.pack
    pack_i32 = _I32LE.pack
    for headers in all_headers:
        for name, value in headers:
            raw = name.encode("utf-8") if isinstance(name, str) else bytes(name)
            out += pack_u16(len(raw))
            out += raw
            if value is None:
                out += pack_i32(-1)
            else:
                out += pack_i32(len(value))
                out += value
    return _int_array("i", counts), bytes(out)


def encode_records_section(
    records: Sequence[Record], timestamps: list[int], first_timestamp: int, offset_deltas: Sequence[int] | None
) -> bytes:
    """Encode the (uncompressed) records section. Internal; exposed for benchmarks."""
    flags = 0
    parts: list[bytes] = [b""]
    if offset_deltas is not None:
        flags |= _F_OFFSETS
        parts.append(_int_array("i", offset_deltas))
    if timestamps.count(first_timestamp) != len(timestamps):
        flags |= _F_TIMESTAMPS
        parts.append(_int_array("q", [t - first_timestamp for t in timestamps]))
    keys = list(map(_get_key, records))
    if keys.count(None) != len(keys):
        flags |= _F_KEYS
        key_lens, key_data = _lengths_and_data(keys)
        parts.append(key_lens)
    else:
        key_data = b""
    value_lens, value_data = _lengths_and_data(list(map(_get_value, records)))
    parts.append(value_lens)
    all_headers = list(map(_get_headers, records))
    header_data = b""
    if any(all_headers):
        flags |= _F_HEADERS
        counts, header_data = _encode_headers(all_headers)
        parts.append(counts)
    parts[0] = bytes((flags,))
    parts.append(key_data)
    parts.append(value_data)
    if header_data:
        parts.append(header_data)
    return b"".join(parts)


def encode_varint(v: int) -> bytes:
    """Kafka's zigzag varint/varlong."""
    z = (v << 1) ^ (v >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def encode_kafka_records_section(records: Sequence[Record], timestamps: list[int], first_timestamp: int,
                                 offset_deltas: Sequence[int] | None) -> bytes:
    """Kafka's varint records section (uncompressed) of `records`: the control batches'
    format here; the Kafka listener has a table-driven encoder for its fetch conversion."""
    out = []
    vi = encode_varint
    for i, r in enumerate(records):
        body = [b"\x00", vi(timestamps[i] - first_timestamp), vi(i if offset_deltas is None else offset_deltas[i])]
        for item in (r.key, r.value):
            if item is None:
                body.append(b"\x01")   # varint(-1)
            else:
                body.append(vi(len(item)))
                body.append(bytes(item))
        body.append(vi(len(r.headers)))
        for name, hv in r.headers:
            raw = name.encode("utf-8") if isinstance(name, str) else bytes(name)
            body.append(vi(len(raw)))
            body.append(raw)
            if hv is None:
                body.append(b"\x01")
            else:
                body.append(vi(len(hv)))
                body.append(bytes(hv))
        rec = b"".join(body)
        out.append(vi(len(rec)))
        out.append(rec)
    return b"".join(out)


def build_batch(
    records: Sequence[Record] | Iterable[Record],
    *,
    compression: Compression | int | str = Compression.NONE,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamp_type: int = CREATE_TIME,
    is_control: bool = False,
    partition_leader_epoch: int = -1,
    now_ms: int | None = None,
    offset_deltas: Sequence[int] | None = None,
    is_transactional: bool = False,
    last_offset_delta: int | None = None,
) -> bytes:
    """Encode `records` as one batch. Records without a timestamp get `now_ms` (default:
    the current time). `offset_deltas` (strictly increasing, starting anywhere >= 0) and
    `last_offset_delta` (the batch's offset span, >= the last record's delta) are for
    rewriting compacted batches; by default records get deltas 0..n-1. The records section is
    columnar (attribute bit 7), except for control batches (Kafka's varint records)."""
    if not isinstance(records, (list, tuple)):
        records = list(records)
    n = len(records)
    if n == 0:
        raise ValueError("a batch needs at least one record")
    codec = Compression.from_name(compression) if isinstance(compression, str) else Compression(compression)
    timestamps = list(map(_get_ts, records))
    if None in timestamps:
        now = SYSTEM_CLOCK.now_ms() if now_ms is None else int(now_ms)
        timestamps = [now if t is None else t for t in timestamps]
    first_ts = timestamps[0]
    max_ts = max(timestamps)
    if offset_deltas is not None:
        offset_deltas = list(offset_deltas)
        if len(offset_deltas) != n:
            raise ValueError(f"offset_deltas has {len(offset_deltas)} entries for {n} records")
        if offset_deltas == list(range(n)):
            offset_deltas = None
        else:
            if offset_deltas[0] < 0 or any(b <= a for a, b in zip(offset_deltas, offset_deltas[1:])):
                raise ValueError("offset_deltas must be >= 0 and strictly increasing")
    last_delta = n - 1 if offset_deltas is None else offset_deltas[-1]
    if last_offset_delta is not None:
        if last_offset_delta < last_delta:
            raise ValueError(f"last_offset_delta {last_offset_delta} is below the last record's delta {last_delta}")
        last_delta = last_offset_delta
    if is_control:   # a transaction marker: Kafka's format, so Kafka consumers get it untouched
        section = encode_kafka_records_section(records, timestamps, first_ts, offset_deltas)
        attributes = int(codec)
    else:
        section = encode_records_section(records, timestamps, first_ts, offset_deltas)
        attributes = int(codec) | COLUMNAR_MASK
    payload = _compress(codec, section)
    attributes |= TIMESTAMP_TYPE_MASK if timestamp_type == LOG_APPEND_TIME else 0
    if is_control:
        attributes |= CONTROL_MASK
    if is_transactional:
        attributes |= TRANSACTIONAL_MASK
    batch_length = HEADER_SIZE - LOG_OVERHEAD + len(payload)
    buf = bytearray(HEADER_SIZE + len(payload))
    _HEADER.pack_into(
        buf,
        0,
        base_offset,
        batch_length,
        partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        last_delta,
        first_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        n,
    )
    buf[HEADER_SIZE:] = payload
    _UI.pack_into(buf, CRC_OFFSET, _crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:]))
    return bytes(buf)


def build_empty_batch(
    *,
    base_offset: int,
    last_offset_delta: int,
    first_timestamp: int = -1,
    max_timestamp: int = -1,
    partition_leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
) -> bytes:
    """A batch with no records spanning offsets [base, base + last_offset_delta]: the log
    cleaner keeps one where it removed every record, so offsets stay accounted for. Always
    columnar and uncompressed (`attributes`' codec and format bits are replaced)."""
    section = b"\x00"
    buf = bytearray(HEADER_SIZE + len(section))
    _HEADER.pack_into(
        buf, 0, base_offset, HEADER_SIZE - LOG_OVERHEAD + len(section), partition_leader_epoch, MAGIC, 0,
        (attributes & ~CODEC_MASK) | COLUMNAR_MASK, last_offset_delta, first_timestamp, max_timestamp, producer_id, producer_epoch,
        base_sequence, 0,
    )
    buf[HEADER_SIZE:] = section
    _UI.pack_into(buf, CRC_OFFSET, _crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:]))
    return bytes(buf)


# ---------------------------------------------------------------- validation


# Indexes into the raw header tuple returned by `validate_batch_raw` (hot paths avoid
# building a BatchHeader object per batch).
H_BASE_OFFSET, H_BATCH_LENGTH, H_LEADER_EPOCH, H_MAGIC, H_CRC, H_ATTRIBUTES = 0, 1, 2, 3, 4, 5
H_LAST_OFFSET_DELTA, H_FIRST_TIMESTAMP, H_MAX_TIMESTAMP = 6, 7, 8
H_PRODUCER_ID, H_PRODUCER_EPOCH, H_BASE_SEQUENCE, H_RECORD_COUNT = 9, 10, 11, 12
_VALID_CODECS = frozenset((0, 1, 2, 3, 4))


def validate_batch_raw(buf, pos: int = 0, max_batch_bytes: int | None = None) -> tuple:
    """`validate_batch` returning the raw header tuple (fields in header order, see the
    H_* indexes) instead of a BatchHeader: the broker's per-batch fast path."""
    available = len(buf) - pos
    if available < HEADER_SIZE:
        raise CorruptRecordError(
            f"batch at position {pos} is truncated: {available} bytes left, a header needs {HEADER_SIZE}"
        )
    h = _HEADER.unpack_from(buf, pos)
    batch_length = h[H_BATCH_LENGTH]
    size = LOG_OVERHEAD + batch_length
    if batch_length < _MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"batch at position {pos} has batch_length {batch_length}, less than the minimum {_MIN_BATCH_LENGTH}"
        )
    if max_batch_bytes is not None and size > max_batch_bytes:
        raise RecordTooLargeError(
            f"batch at position {pos} is {size} bytes, more than max.message.bytes={max_batch_bytes}: "
            f"send smaller batches or raise max.message.bytes"
        )
    if size > available:
        raise CorruptRecordError(
            f"batch at position {pos} is truncated: batch_length says {size} bytes, only {available} present"
        )
    if h[H_MAGIC] != MAGIC:
        raise CorruptRecordError(f"batch at position {pos} has magic {h[H_MAGIC]}, only magic {MAGIC} is supported")
    crc = _crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + size])
    if crc != h[H_CRC]:
        raise CorruptRecordError(
            f"batch at position {pos} (base offset {h[H_BASE_OFFSET]}) fails its CRC-32C check: "
            f"stored {h[H_CRC]:#010x}, computed {crc:#010x}"
        )
    if h[H_ATTRIBUTES] & CODEC_MASK not in _VALID_CODECS:
        raise CorruptRecordError(f"batch at position {pos} uses unknown compression codec {h[H_ATTRIBUTES] & CODEC_MASK}")
    count, last_delta = h[H_RECORD_COUNT], h[H_LAST_OFFSET_DELTA]
    if count < 0 or last_delta < 0 or count > last_delta + 1:
        raise CorruptRecordError(
            f"batch at position {pos} has record_count {count} inconsistent with last_offset_delta {last_delta}"
        )
    return h


def validate_batch(buf, pos: int = 0, *, max_batch_bytes: int | None = None) -> BatchHeader:
    """Check the batch at `pos`: length bounds, magic, CRC-32C, codec, counts. Returns the
    header; raises CorruptRecordError (or RecordTooLargeError if the batch is larger than
    `max_batch_bytes`)."""
    return BatchHeader(*validate_batch_raw(buf, pos, max_batch_bytes))


def iter_batches(buf, *, validate: bool = True, strict: bool = True) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Yield (header, batch bytes) for each batch of concatenated batches in `buf`.

    strict=True raises CorruptRecordError on a corrupt or partial batch; strict=False
    simply stops before it (recovery: the caller truncates at the last yielded end)."""
    mv = memoryview(buf)
    end = len(mv)
    pos = 0
    while pos < end:
        try:
            if validate:
                header = validate_batch(mv, pos)
            else:
                header = BatchHeader.parse(mv, pos)
                if header.batch_length < _MIN_BATCH_LENGTH or pos + LOG_OVERHEAD + header.batch_length > end:
                    raise CorruptRecordError(
                        f"batch at position {pos} is truncated or has a bad length {header.batch_length}"
                    )
        except CorruptRecordError:
            if strict:
                raise
            return
        size = LOG_OVERHEAD + header.batch_length
        yield header, mv[pos : pos + size]
        pos += size


def batch_base_offset(buf, pos: int = 0) -> int:
    """The base offset of the batch at `pos`, without parsing the whole header."""
    return _Q.unpack_from(buf, pos)[0]


def stamp_batch(batch: bytearray, base_offset: int, partition_leader_epoch: int, pos: int = 0) -> None:
    """Set base offset and leader epoch in place. Both precede the CRC: no re-encoding and
    the CRC stays valid."""
    _Q.pack_into(batch, pos + BASE_OFFSET_OFFSET, base_offset)
    _I.pack_into(batch, pos + PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch)


def set_log_append_time(batch: bytearray, timestamp_ms: int, pos: int = 0) -> None:
    """Mark the batch LogAppendTime with max_timestamp = `timestamp_ms`, in place.

    attributes and max_timestamp are covered by the CRC, so this recomputes the CRC
    (one CRC-32C pass over the batch; the records are not re-encoded). Decoding then
    reports `timestamp_ms` as every record's timestamp."""
    (batch_length,) = _I.unpack_from(batch, pos + BATCH_LENGTH_OFFSET)
    (attributes,) = _H.unpack_from(batch, pos + ATTRIBUTES_OFFSET)
    _H.pack_into(batch, pos + ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
    _Q.pack_into(batch, pos + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    end = pos + LOG_OVERHEAD + batch_length
    _UI.pack_into(batch, pos + CRC_OFFSET, _crc32c(memoryview(batch)[pos + ATTRIBUTES_OFFSET : end]))


# ---------------------------------------------------------------- decoding


def _read_int_array(code: str, data: bytes, pos: int, n: int) -> tuple[list[int], int]:
    width = 4 if code == "i" else 8
    end = pos + width * n
    if end > len(data):
        raise CorruptRecordError("records section is truncated")
    arr = array(code)
    arr.frombytes(data[pos:end])
    if _BIG_ENDIAN_HOST:
        arr.byteswap()
    return arr.tolist(), end


def _slices(data: bytes, lens: list[int], pos: int) -> tuple[list, int]:
    """Split `data` from `pos` into pieces of the given lengths (-1 = None)."""
    if -1 in lens:
        out: list = []
        for length in lens:
            if length < 0:
                if length != -1:
                    raise CorruptRecordError(f"negative length {length} in records section")
                out.append(None)
            else:
                out.append(data[pos : pos + length])
                pos += length
        if pos > len(data):
            raise CorruptRecordError("records section is truncated")
        return out, pos
    ends = list(accumulate(lens, initial=pos))
    end = ends[-1]
    if end > len(data) or (lens and min(lens) < 0):
        raise CorruptRecordError("records section is truncated or has a negative length")
    return list(map(data.__getitem__, map(slice, ends, ends[1:]))), end


def _decode_headers(data: bytes, pos: int, counts: list[int]) -> tuple[list, int]:
    out = []
    unpack_u16 = _U16.unpack_from
    unpack_i32 = _I32LE.unpack_from
    try:
        for count in counts:
            if count == 0:
                out.append(())
                continue
            headers = []
            for _ in range(count):
                (name_len,) = unpack_u16(data, pos)
                pos += 2
                name = data[pos : pos + name_len].decode("utf-8")
                pos += name_len
                (value_len,) = unpack_i32(data, pos)
                pos += 4
                if value_len < 0:
                    value = None
                else:
                    value = data[pos : pos + value_len]
                    pos += value_len
                headers.append((name, value))
            out.append(tuple(headers))
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"bad record headers: {exc}") from exc
    if pos > len(data):
        raise CorruptRecordError("records section headers are truncated")
    return out, pos


def _decode(header: BatchHeader, data: bytes) -> list[Record]:
    n = header.record_count
    if n == 0:
        return []
    if not data:
        raise CorruptRecordError("records section is empty")
    flags = data[0]
    pos = 1
    if flags & _F_OFFSETS:
        deltas, pos = _read_int_array("i", data, pos, n)
        offsets = list(map(header.base_offset.__add__, deltas))
    else:
        offsets = range(header.base_offset, header.base_offset + n)
    if header.attributes & TIMESTAMP_TYPE_MASK:
        if flags & _F_TIMESTAMPS:
            pos += 8 * n
        timestamps = repeat(header.max_timestamp, n)
    elif flags & _F_TIMESTAMPS:
        ts_deltas, pos = _read_int_array("q", data, pos, n)
        timestamps = map(header.first_timestamp.__add__, ts_deltas)
    else:
        timestamps = repeat(header.first_timestamp, n)
    if flags & _F_KEYS:
        key_lens, pos = _read_int_array("i", data, pos, n)
    else:
        key_lens = None
    value_lens, pos = _read_int_array("i", data, pos, n)
    if flags & _F_HEADERS:
        header_counts, pos = _read_int_array("i", data, pos, n)
    else:
        header_counts = None
    if key_lens is not None:
        keys, pos = _slices(data, key_lens, pos)
    else:
        keys = repeat(None, n)
    values, pos = _slices(data, value_lens, pos)
    if header_counts is not None:
        headers, pos = _decode_headers(data, pos, header_counts)
    else:
        headers = repeat((), n)
    if pos != len(data):
        raise CorruptRecordError(f"records section has {len(data) - pos} unexpected trailing bytes")
    return list(map(Record, keys, values, headers, timestamps, offsets))


def read_varint(buf, pos: int) -> tuple[int, int]:
    """Kafka's zigzag varint/varlong at `pos` -> (value, position after it)."""
    shift = 0
    z = 0
    while True:
        b = buf[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint longer than 10 bytes in a Kafka record")


def parse_kafka_records(section, count: int, first_timestamp: int, *, with_values: bool = True
                        ) -> tuple[list[int], list[int], list, list, list]:
    """Kafka's uncompressed varint records section -> (offset deltas, timestamp deltas, keys,
    values, headers) with `count` entries each; with_values=False gives value lengths
    (-1 = null) instead of values and no headers (the log cleaner's key pass).
    Raises CorruptRecordError unless the section holds exactly `count` well-formed records."""
    deltas: list[int] = []
    ts_deltas: list[int] = []
    keys: list = []
    values: list = []
    all_headers: list = []
    pos = 0
    end = len(section)
    rv = read_varint
    try:
        for _ in range(count):
            length, pos = rv(section, pos)
            stop = pos + length
            if length < 0 or stop > end:
                raise CorruptRecordError(f"Kafka record length {length} runs past the records section")
            pos += 1  # record attributes (unused in v2)
            ts_delta, pos = rv(section, pos)
            off_delta, pos = rv(section, pos)
            klen, pos = rv(section, pos)
            if klen < 0:
                keys.append(None)
            else:
                keys.append(section[pos:pos + klen])
                pos += klen
            vlen, pos = rv(section, pos)
            if not with_values:
                values.append(vlen if vlen >= 0 else -1)
                pos = stop
            else:
                if vlen < 0:
                    values.append(None)
                else:
                    values.append(section[pos:pos + vlen])
                    pos += vlen
                nh, pos = rv(section, pos)
                headers: tuple = ()
                if nh > 0:
                    hs = []
                    for _h in range(nh):
                        hklen, pos = rv(section, pos)
                        name = bytes(section[pos:pos + hklen]).decode("utf-8")
                        pos += hklen
                        hvlen, pos = rv(section, pos)
                        if hvlen < 0:
                            hv = None
                        else:
                            hv = section[pos:pos + hvlen]
                            pos += hvlen
                        hs.append((name, hv))
                    headers = tuple(hs)
                all_headers.append(headers)
            if pos != stop:
                raise CorruptRecordError("Kafka record length does not match its fields")
            ts_deltas.append(ts_delta)
            deltas.append(off_delta)
    except (IndexError, UnicodeDecodeError) as e:
        raise CorruptRecordError(f"truncated or malformed Kafka record: {e}") from None
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes after the last Kafka record of the batch")
    return deltas, ts_deltas, keys, values, all_headers


# the varint bytes of offset deltas 0..8191: the produce check compares bytes instead of decoding
_OFFSET_DELTA_VARINTS = tuple(encode_varint(i) for i in range(8192))


def check_kafka_records(section, count: int, start: int = 0, end: int | None = None) -> None:
    """Kafka's uncompressed records section (`section[start:end]`: a whole batch can be
    checked in place, without copying its records) holds exactly `count` records framed by
    their lengths, with offset deltas 0..count-1 (what Kafka's broker checks of a produced v2
    batch). Keys and values are not touched. The hot path of every Kafka produce: per record
    it decodes the length (one- and two-byte varints inline), skips the timestamp delta and
    compares the offset delta's bytes with the canonical encoding of its index (decoding it
    only when they differ, so a non-canonical encoding of the right value still passes)."""
    if not isinstance(section, bytes):
        section = bytes(memoryview(section)[start:end])   # bytes index faster than a memoryview; one memcpy
        start, end = 0, None
    pos = start
    if end is None:
        end = len(section)
    rv = read_varint
    starts = section.startswith
    expected = _OFFSET_DELTA_VARINTS
    n_expected = len(expected)
    try:
        for i in range(count):
            b = section[pos]
            if b < 0x80:   # one-byte length
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                b2 = section[pos + 1]
                if b2 < 0x80:   # two-byte length (records of 64..8191 bytes)
                    z = (b & 0x7F) | (b2 << 7)
                    length = (z >> 1) ^ -(z & 1)
                    pos += 2
                else:
                    length, pos = rv(section, pos)
            stop = pos + length
            if length < 6 or stop > end:
                raise CorruptRecordError(f"Kafka record {i} has length {length}, past the records section "
                                         f"or too short")
            p = pos + 1                      # after the record's attributes byte: the timestamp delta
            if section[p] < 0x80:
                p += 1
            elif section[p + 1] < 0x80:
                p += 2
            else:
                p = rv(section, p)[1]
            if i >= n_expected or not starts(expected[i], p):   # offset delta
                b = section[p]
                off_delta = (b >> 1) ^ -(b & 1) if b < 0x80 else rv(section, p)[0]
                if off_delta != i:
                    raise CorruptRecordError(f"Kafka record {i} has offset delta {off_delta}; a produced batch "
                                             f"numbers its records 0..{count - 1}")
            pos = stop
    except IndexError:
        raise CorruptRecordError("truncated Kafka record in the batch") from None
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes after the last of the batch's {count} Kafka records")


def check_kafka_batch(buf, pos: int = 0) -> None:
    """Check the records of the Kafka-format batch at `pos` (bit 7 clear; header already
    validated): `check_kafka_records` over its decompressed section. What a broker checks
    of a produced Kafka batch, so no reader ever meets a records section it cannot parse."""
    header = BatchHeader.parse(buf, pos)
    section = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    codec = header.attributes & CODEC_MASK
    try:
        check_kafka_records(section if codec == 0 else _decompress(codec, section), header.record_count)
    except CorruptRecordError as e:
        raise CorruptRecordError(
            f"batch at position {pos} has attribute bit 7 clear, so its records must be Kafka's varint "
            f"records: {e} (a kraftlog client from before Kafka-format storage writes columnar records "
            f"without bit 7: upgrade it)") from None


def _decode_kafka(header: BatchHeader, data: bytes) -> list[Record]:
    n = header.record_count
    if n == 0:
        return []
    deltas, ts_deltas, keys, values, headers = parse_kafka_records(data, n, header.first_timestamp)
    if header.attributes & TIMESTAMP_TYPE_MASK:
        timestamps = repeat(header.max_timestamp, n)
    else:
        timestamps = map(header.first_timestamp.__add__, ts_deltas)
    offsets = map(header.base_offset.__add__, deltas)
    return list(map(Record, keys, values, headers, timestamps, offsets))


def decode_records(batch_bytes, *, validate: bool = True) -> list[Record]:
    """Decode one batch (starting at byte 0 of `batch_bytes`) into Records with absolute
    offsets and timestamps. With validate=True the CRC and bounds are checked first."""
    if validate:
        header = validate_batch(batch_bytes, 0)
    else:
        header = BatchHeader.parse(batch_bytes, 0)
    mv = memoryview(batch_bytes)[HEADER_SIZE : LOG_OVERHEAD + header.batch_length]
    data = _decompress(header.attributes & CODEC_MASK, mv)
    try:
        if not header.attributes & COLUMNAR_MASK:
            return _decode_kafka(header, data)
        return _decode(header, data)
    except (ValueError, IndexError, struct.error) as exc:
        if isinstance(exc, CorruptRecordError):
            raise
        raise CorruptRecordError(f"batch at base offset {header.base_offset} has a bad records section: {exc}") from exc


def decode_keys(batch_bytes) -> tuple[Sequence[int], Sequence, list[int]]:
    """(offsets, keys, value lengths) of one batch without building Records or slicing
    values: the log cleaner's fast path. A value length of -1 is a tombstone; keys are
    bytes or None. No CRC check (the caller read the batch from its own log)."""
    header = BatchHeader.parse(batch_bytes, 0)
    n = header.record_count
    if n == 0:
        return (), (), []
    mv = memoryview(batch_bytes)[HEADER_SIZE : LOG_OVERHEAD + header.batch_length]
    data = _decompress(header.attributes & CODEC_MASK, mv)
    if not header.attributes & COLUMNAR_MASK:
        deltas, _ts, keys, value_lens, _h = parse_kafka_records(data, n, header.first_timestamp, with_values=False)
        return list(map(header.base_offset.__add__, deltas)), keys, value_lens
    try:
        if not data:
            raise CorruptRecordError("records section is empty")
        flags = data[0]
        pos = 1
        if flags & _F_OFFSETS:
            deltas, pos = _read_int_array("i", data, pos, n)
            offsets: Sequence[int] = list(map(header.base_offset.__add__, deltas))
        else:
            offsets = range(header.base_offset, header.base_offset + n)
        if flags & _F_TIMESTAMPS:
            pos += 8 * n
        key_lens = None
        if flags & _F_KEYS:
            key_lens, pos = _read_int_array("i", data, pos, n)
        value_lens, pos = _read_int_array("i", data, pos, n)
        if flags & _F_HEADERS:
            pos += 4 * n
        keys: Sequence = _slices(data, key_lens, pos)[0] if key_lens is not None else (None,) * n
    except (ValueError, IndexError, struct.error) as exc:
        if isinstance(exc, CorruptRecordError):
            raise
        raise CorruptRecordError(f"batch at base offset {header.base_offset} has a bad records section: {exc}") from exc
    return offsets, keys, value_lens


def decode_batches(buf, *, validate: bool = True, skip_control: bool = False) -> list[Record]:
    """Decode concatenated batches (as returned by a fetch) into one list of Records."""
    out: list[Record] = []
    for header, batch in iter_batches(buf, validate=validate):
        if skip_control and header.attributes & CONTROL_MASK:
            continue
        out.extend(decode_records(batch, validate=False))
    return out
