"""Kafka's RecordBatch v2 records section <-> kraftlog's stored batches.

The stored batch header is Kafka's RecordBatch v2 header byte for byte; only the records
section differs (kraftlog's columnar layout, `partitions/log/record_batch.py`). The Kafka
listener converts at the edge (docs/RECORD_FORMAT.md has the measured decision):

- produce: `kafka_to_stored(batch)` checks the client's CRC-32C, decompresses, parses Kafka's
  varint records and re-encodes them as one stored batch with the same header facts
  (producer id/epoch, base sequence, record count, offset deltas, last offset delta,
  timestamps, timestamp type, control/transactional bits) and the same compression codec.
- fetch: `stored_to_kafka(batches)` decodes each stored batch and writes Kafka's records
  section, uncompressed, under the same header facts (base offset, leader epoch, producer
  fields) with a fresh CRC.

Keys, values, null keys and values, headers (null header values too), timestamps and
offsets are equal both ways. Kafka's snappy codec (2) is refused with
UNSUPPORTED_COMPRESSION_TYPE (no snappy binding in the serving dependencies).
"""
from __future__ import annotations

import struct

from crc32c import crc32c as _crc32c

from partitions.errors import ErrorCode, KraftlogError
from partitions.log import record_batch as rb
from partitions.log.record_batch import (ATTRIBUTES_OFFSET, CODEC_MASK, CONTROL_MASK, CRC_OFFSET, HEADER_SIZE,
                                         LOG_OVERHEAD, TIMESTAMP_TYPE_MASK, TRANSACTIONAL_MASK, LOG_APPEND_TIME,
                                         CREATE_TIME, CorruptRecordError, Record)

SNAPPY = 2
_HEADER = struct.Struct(">qiibIhiqqqhii")
_UI = struct.Struct(">I")

# zigzag varint bytes of every value in [-8192, 8192): one table lookup per small field
_SMALL = 8192


def _encode_varint_slow(v: int) -> bytes:
    z = (v << 1) ^ (v >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_VARINT_TABLE = [_encode_varint_slow(v) for v in range(-_SMALL, _SMALL)]
_T, _S = _VARINT_TABLE, _SMALL
_F_OFFSETS, _F_TIMESTAMPS, _F_KEYS, _F_HEADERS = 0x01, 0x02, 0x04, 0x08   # the columnar section's flags


def varint(v: int) -> bytes:
    """Kafka's zigzag varint/varlong."""
    if -_SMALL <= v < _SMALL:
        return _VARINT_TABLE[v + _SMALL]
    return _encode_varint_slow(v)


def _read_varint(buf, pos: int) -> tuple[int, int]:
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


# ---------------------------------------------------------------------- produce side

def parse_kafka_records(section: bytes, count: int, base_offset: int, first_timestamp: int
                        ) -> tuple[list[Record], list[int]]:
    """Kafka's uncompressed records section -> (Records with timestamps, offset deltas)."""
    records: list[Record] = []
    deltas: list[int] = []
    pos = 0
    end = len(section)
    rv = _read_varint
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
                key = None
            else:
                key = section[pos:pos + klen]
                pos += klen
            vlen, pos = rv(section, pos)
            if vlen < 0:
                value = None
            else:
                value = section[pos:pos + vlen]
                pos += vlen
            nh, pos = rv(section, pos)
            headers: tuple = ()
            if nh > 0:
                hs = []
                for _h in range(nh):
                    hklen, pos = rv(section, pos)
                    name = section[pos:pos + hklen].decode("utf-8")
                    pos += hklen
                    hvlen, pos = rv(section, pos)
                    if hvlen < 0:
                        hv = None
                    else:
                        hv = section[pos:pos + hvlen]
                        pos += hvlen
                    hs.append((name, hv))
                headers = tuple(hs)
            if pos != stop:
                raise CorruptRecordError("Kafka record length does not match its fields")
            records.append(Record(key, value, headers, first_timestamp + ts_delta))
            deltas.append(off_delta)
    except (IndexError, UnicodeDecodeError) as e:
        raise CorruptRecordError(f"truncated or malformed Kafka record: {e}") from None
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes after the last Kafka record of the batch")
    return records, deltas


def kafka_to_stored(batch, *, max_batch_bytes: int | None = None) -> tuple[bytes, tuple]:
    """One Kafka RecordBatch v2 (as a client sent it) -> (stored batch bytes, its raw header).
    Raises CorruptRecordError (bad CRC/framing) or KraftlogError UNSUPPORTED_COMPRESSION_TYPE."""
    h = _validate(batch, max_batch_bytes)
    codec = h[rb.H_ATTRIBUTES] & CODEC_MASK
    if codec == SNAPPY:
        raise KraftlogError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                            "snappy-compressed batches are not supported; use none, gzip, lz4 or zstd "
                            "(compression.type on the producer)")
    count = h[rb.H_RECORD_COUNT]
    if count <= 0:
        raise CorruptRecordError("a produced batch must hold at least one record")
    size = LOG_OVERHEAD + h[rb.H_BATCH_LENGTH]
    section = rb._decompress(codec, memoryview(batch)[HEADER_SIZE:size])
    records, deltas = parse_kafka_records(section, count, h[rb.H_BASE_OFFSET], h[rb.H_FIRST_TIMESTAMP])
    attrs = h[rb.H_ATTRIBUTES]
    stored = rb.build_batch(
        records, compression=codec, base_offset=h[rb.H_BASE_OFFSET], producer_id=h[rb.H_PRODUCER_ID],
        producer_epoch=h[rb.H_PRODUCER_EPOCH], base_sequence=h[rb.H_BASE_SEQUENCE],
        timestamp_type=LOG_APPEND_TIME if attrs & TIMESTAMP_TYPE_MASK else CREATE_TIME,
        is_control=bool(attrs & CONTROL_MASK), is_transactional=bool(attrs & TRANSACTIONAL_MASK),
        partition_leader_epoch=h[rb.H_LEADER_EPOCH],
        offset_deltas=deltas, last_offset_delta=h[rb.H_LAST_OFFSET_DELTA])
    return stored, h


def _validate(batch, max_batch_bytes: int | None) -> tuple:
    """`validate_batch_raw`, but a snappy codec is left for the caller to refuse by name."""
    try:
        return rb.validate_batch_raw(batch, 0, max_batch_bytes)
    except CorruptRecordError as e:
        if len(batch) >= HEADER_SIZE and (_HEADER.unpack_from(batch, 0)[5] & CODEC_MASK) == SNAPPY \
                and "compression codec" in str(e):
            return _HEADER.unpack_from(batch, 0)
        raise


def split_kafka_batches(buf) -> list[memoryview]:
    """The batches of a produce request's records field (whole batches only)."""
    mv = memoryview(buf)
    out = []
    pos = 0
    end = len(mv)
    while pos < end:
        if end - pos < LOG_OVERHEAD:
            raise CorruptRecordError("truncated record batch in the produce request")
        (blen,) = struct.unpack_from(">i", mv, pos + 8)
        size = LOG_OVERHEAD + blen
        if blen < HEADER_SIZE - LOG_OVERHEAD or pos + size > end:
            raise CorruptRecordError("truncated record batch in the produce request")
        out.append(mv[pos:pos + size])
        pos += size
    return out


# ---------------------------------------------------------------------- fetch side

def _kafka_records_section(records: list[Record], base_offset: int, first_ts: int) -> bytes:
    parts: list[bytes] = []
    append = parts.append
    vi = varint
    for r in records:
        key, value, headers = r.key, r.value, r.headers
        body = [b"\x00", vi(r.timestamp - first_ts), vi(r.offset - base_offset)]
        if key is None:
            body.append(b"\x01")  # varint(-1)
        else:
            body.append(vi(len(key)))
            body.append(key)
        if value is None:
            body.append(b"\x01")
        else:
            body.append(vi(len(value)))
            body.append(value)
        if headers:
            body.append(vi(len(headers)))
            for name, hv in headers:
                raw = name.encode("utf-8")
                body.append(vi(len(raw)))
                body.append(raw)
                if hv is None:
                    body.append(b"\x01")
                else:
                    body.append(vi(len(hv)))
                    body.append(hv)
        else:
            body.append(b"\x00")
        rec = b"".join(body)
        append(vi(len(rec)))
        append(rec)
    return b"".join(parts)


def _columnar_to_kafka_section(h: tuple, data) -> bytes | None:
    """A stored (columnar, uncompressed) records section straight to Kafka's, without
    building Records: about 1.3-1.9x faster than decode + encode. None when records carry
    headers (the general path handles those). `h` is the raw header tuple. The section comes
    from this broker's own log (CRC-checked when appended), so lengths are trusted."""
    n = h[rb.H_RECORD_COUNT]
    flags = data[0]
    if flags & _F_HEADERS:
        return None
    pos = 1
    if flags & _F_OFFSETS:
        deltas, pos = rb._read_int_array("i", data, pos, n)
        off_v = [varint(d) for d in deltas]
    else:
        off_v = _T[_S:_S + n] if n <= _S else [varint(d) for d in range(n)]
    ts_v = None   # None: every timestamp delta is 0 (LogAppendTime: clients use max_timestamp)
    if flags & _F_TIMESTAMPS:
        if h[rb.H_ATTRIBUTES] & TIMESTAMP_TYPE_MASK:
            pos += 8 * n
        else:
            tsd, pos = rb._read_int_array("q", data, pos, n)
            ts_v = [varint(d) for d in tsd]
    key_lens = None
    if flags & _F_KEYS:
        key_lens, pos = rb._read_int_array("i", data, pos, n)
    value_lens, pos = rb._read_int_array("i", data, pos, n)
    kpos = pos
    vpos = pos + (sum(k for k in key_lens if k > 0) if key_lens is not None else 0)
    out: list = []
    ap = out.append
    for i in range(n):
        tv = ts_v[i] if ts_v is not None else b"\x00"
        ov = off_v[i]
        kl = key_lens[i] if key_lens is not None else -1
        vl = value_lens[i]
        if kl < 0:
            kv, kb = b"\x01", b""
        else:
            kv, kb = (_T[_S + kl] if kl < _S else varint(kl)), data[kpos:kpos + kl]
            kpos += kl
        if vl < 0:
            vv, vb = b"\x01", b""
        else:
            vv, vb = (_T[_S + vl] if vl < _S else varint(vl)), data[vpos:vpos + vl]
            vpos += vl
        body_len = 2 + len(tv) + len(ov) + len(kv) + len(kb) + len(vv) + len(vb)   # + attributes, header count
        ap(_T[_S + body_len] if body_len < _S else varint(body_len))
        ap(b"\x00")
        ap(tv)
        ap(ov)
        ap(kv)
        ap(kb)
        ap(vv)
        ap(vb)
        ap(b"\x00")
    return b"".join(out)


def stored_batch_to_kafka(batch) -> bytes:
    """One stored batch -> the same batch in Kafka's format (records uncompressed)."""
    h = _HEADER.unpack_from(batch, 0)
    (base_offset, _blen, leader_epoch, magic, _crc, attrs, last_delta, first_ts, max_ts,
     pid, pepoch, bseq, count) = h
    section = b""
    if count:
        data = rb._decompress(attrs & CODEC_MASK, memoryview(batch)[HEADER_SIZE:LOG_OVERHEAD + _blen])
        section = _columnar_to_kafka_section(h, data)
    if section is None:   # records with headers: decode, then encode
        records = rb.decode_records(batch, validate=False)
        if attrs & TIMESTAMP_TYPE_MASK:
            # LogAppendTime: Kafka clients take max_timestamp for every record
            section = _kafka_records_section(records, base_offset, records[0].timestamp)
        else:
            section = _kafka_records_section(records, base_offset, first_ts)
    out = bytearray(HEADER_SIZE + len(section))
    _HEADER.pack_into(out, 0, base_offset, HEADER_SIZE - LOG_OVERHEAD + len(section), leader_epoch, magic, 0,
                      attrs & ~CODEC_MASK, last_delta, first_ts, max_ts, pid, pepoch, bseq, count)
    out[HEADER_SIZE:] = section
    _UI.pack_into(out, CRC_OFFSET, _crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def stored_to_kafka(buf) -> bytes:
    """Concatenated stored batches (a fetch answer) -> the same batches in Kafka's format."""
    mv = memoryview(buf)
    end = len(mv)
    pos = 0
    out: list[bytes] = []
    while pos + LOG_OVERHEAD <= end:
        (blen,) = struct.unpack_from(">i", mv, pos + 8)
        size = LOG_OVERHEAD + blen
        if pos + size > end:
            break  # a partial batch at the end of a size-capped read
        out.append(stored_batch_to_kafka(mv[pos:pos + size]))
        pos += size
    return b"".join(out)


# ---------------------------------------------------------------------- transactions

class InvalidRecord(ValueError):
    """A produced batch Kafka's broker refuses with INVALID_RECORD."""


def check_client_batch(h: tuple, transactional: bool) -> None:
    """A client's batch (raw header `h`): never a control batch (markers come only from the
    transaction coordinator); transactional exactly when the request names a transactional
    id, and then with a producer id and epoch (Kafka's broker checks the same)."""
    attrs = h[rb.H_ATTRIBUTES]
    if attrs & CONTROL_MASK:
        raise InvalidRecord("clients may not produce control batches (transaction markers)")
    if bool(attrs & TRANSACTIONAL_MASK) != transactional:
        raise InvalidRecord("a transactional batch needs a produce request with a transactional id, and "
                            "a produce request with a transactional id carries only transactional batches")
    if transactional and (h[rb.H_PRODUCER_ID] < 0 or h[rb.H_PRODUCER_EPOCH] < 0):
        raise InvalidRecord("a transactional batch needs the producer id and epoch from InitProducerId")


def batches_below(buf, last_stable_offset: int) -> tuple[bytes, int]:
    """The whole stored batches of `buf` that start below the last stable offset (what a
    read_committed fetch answers, control batches included), and the offset after the last
    one kept (the fetch's upper bound for the aborted transactions to list)."""
    mv = memoryview(buf)
    end = len(mv)
    pos = 0
    upper = -1
    while pos + LOG_OVERHEAD <= end:
        base = struct.unpack_from(">q", mv, pos)[0]
        (blen,) = struct.unpack_from(">i", mv, pos + 8)
        size = LOG_OVERHEAD + blen
        if base >= last_stable_offset or pos + size > end:
            break
        upper = base + struct.unpack_from(">i", mv, pos + rb.LAST_OFFSET_DELTA_OFFSET)[0] + 1
        pos += size
    return bytes(mv[:pos]) if pos < end else bytes(buf), upper
