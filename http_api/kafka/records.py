"""Kafka's record batches at the Kafka listener's edge.

A stored batch is Kafka's RecordBatch v2 header byte for byte; its records section is in one
of two formats, chosen per batch by attribute bit 7 (`record_batch.COLUMNAR_MASK`;
docs/RECORD_FORMAT.md has the measured decision):

- produce: `kafka_to_stored(batch)` checks the client's batch (CRC-32C, codec, bit 7 clear,
  record framing and offset deltas, decompressing to check) and returns it unchanged: the
  stored batch is the client's batch byte for byte (the leader stamps base offset and leader
  epoch, which precede the CRC, as Kafka's broker does).
- fetch: `stored_to_kafka(batches)` passes Kafka-format batches through untouched and
  converts only columnar ones (written over HTTP, by the Python client, Spark, the log
  cleaner or the transaction coordinator): Kafka's records section, uncompressed, under the
  same header facts (base offset, leader epoch, producer fields) with bit 7 cleared and a
  fresh CRC.

Keys, values, null keys and values, headers (null header values too), timestamps and
offsets are equal both ways. Snappy (codec 2) is read with cramjam (xerial framing or a raw
block, `record_batch._snappy_decompress`).
"""
from __future__ import annotations

import struct

from crc32c import crc32c as _crc32c

from partitions.log import record_batch as rb
from partitions.log.record_batch import (ATTRIBUTES_OFFSET, CODEC_MASK, COLUMNAR_MASK, CONTROL_MASK, CRC_OFFSET,
                                         HEADER_SIZE, LOG_OVERHEAD, TIMESTAMP_TYPE_MASK, TRANSACTIONAL_MASK,
                                         CorruptRecordError, Record)

_HEADER = struct.Struct(">qiibIhiqqqhii")
_UI = struct.Struct(">I")
_LEN_ATTRS = struct.Struct(">i9xh")   # batch_length, (epoch, magic, crc skipped), attributes

# zigzag varint bytes of every value in [-8192, 8192): one table lookup per small field
_SMALL = 8192
_encode_varint_slow = rb.encode_varint   # the log's encoder; the table below is its fast path
_VARINT_TABLE = [_encode_varint_slow(v) for v in range(-_SMALL, _SMALL)]
_T, _S = _VARINT_TABLE, _SMALL
_F_OFFSETS, _F_TIMESTAMPS, _F_KEYS, _F_HEADERS = 0x01, 0x02, 0x04, 0x08   # the columnar section's flags


def varint(v: int) -> bytes:
    """Kafka's zigzag varint/varlong."""
    if -_SMALL <= v < _SMALL:
        return _VARINT_TABLE[v + _SMALL]
    return _encode_varint_slow(v)


_read_varint = rb.read_varint


# ---------------------------------------------------------------------- produce side

def parse_kafka_records(section: bytes, count: int, base_offset: int, first_timestamp: int
                        ) -> tuple[list[Record], list[int]]:
    """Kafka's uncompressed records section -> (Records with timestamps, offset deltas)."""
    deltas, ts_deltas, keys, values, headers = rb.parse_kafka_records(section, count, first_timestamp)
    records = [Record(k, v, h, first_timestamp + t) for k, v, h, t in zip(keys, values, headers, ts_deltas)]
    return records, deltas


check_kafka_records = rb.check_kafka_records


def kafka_to_stored(batch, *, max_batch_bytes: int | None = None) -> tuple[bytes, tuple]:
    """One Kafka RecordBatch v2 as a client sent it -> (the batch to store, its raw header).
    The batch is stored as sent: checked (`check_kafka_records`), never re-encoded.
    Raises CorruptRecordError (bad CRC, framing or offsets, attribute bit 7 set)."""
    h = rb.validate_batch_raw(batch, 0, max_batch_bytes)
    attrs = h[rb.H_ATTRIBUTES]
    if attrs & COLUMNAR_MASK:
        raise CorruptRecordError("attribute bit 7 is not Kafka's: a produced batch must leave it clear")
    count = h[rb.H_RECORD_COUNT]
    if count <= 0:
        raise CorruptRecordError("a produced batch must hold at least one record")
    if h[rb.H_LAST_OFFSET_DELTA] != count - 1:
        raise CorruptRecordError(f"last offset delta {h[rb.H_LAST_OFFSET_DELTA]} of a produced batch must be "
                                 f"its record count {count} - 1")
    size = LOG_OVERHEAD + h[rb.H_BATCH_LENGTH]
    codec = attrs & CODEC_MASK
    if type(batch) is not bytes or len(batch) != size:
        batch = bytes(memoryview(batch)[:size])   # the one copy: the stored batch
    if codec == 0:
        check_kafka_records(batch, count, HEADER_SIZE, size)   # in place
    else:
        check_kafka_records(rb._decompress(codec, memoryview(batch)[HEADER_SIZE:size]), count)
    return batch, h


def split_kafka_batches(buf) -> list:
    """The batches of a produce request's records field (whole batches only): memoryviews,
    or `buf` itself when it is one whole batch (the common case: no copy later)."""
    if type(buf) is bytes and len(buf) >= LOG_OVERHEAD and \
            LOG_OVERHEAD + struct.unpack_from(">i", buf, 8)[0] == len(buf) >= HEADER_SIZE:
        return [buf]
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
    """One stored batch -> the same batch in Kafka's format: a Kafka-format batch untouched,
    a columnar one converted (records uncompressed, bit 7 cleared, fresh CRC)."""
    h = _HEADER.unpack_from(batch, 0)
    (base_offset, _blen, leader_epoch, magic, _crc, attrs, last_delta, first_ts, max_ts,
     pid, pepoch, bseq, count) = h
    if not attrs & COLUMNAR_MASK:
        return bytes(batch)
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
                      attrs & ~(CODEC_MASK | COLUMNAR_MASK), last_delta, first_ts, max_ts, pid, pepoch, bseq, count)
    out[HEADER_SIZE:] = section
    _UI.pack_into(out, CRC_OFFSET, _crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def stored_to_kafka(buf) -> bytes:
    """Concatenated stored batches (a fetch answer) -> the same batches in Kafka's format.
    Runs of Kafka-format batches are passed through as one slice (no copy when every batch
    is one); only columnar batches are converted; a partial batch at the end is left out."""
    mv = memoryview(buf)
    end = len(mv)
    pos = 0
    run = 0            # start of the current run of Kafka-format batches
    out: list = []
    unpack = _LEN_ATTRS.unpack_from
    while pos + HEADER_SIZE <= end:
        blen, attrs = unpack(mv, pos + 8)
        size = LOG_OVERHEAD + blen
        if pos + size > end:
            break  # a partial batch at the end of a size-capped read
        if attrs & COLUMNAR_MASK:
            if run < pos:
                out.append(mv[run:pos])
            out.append(stored_batch_to_kafka(mv[pos:pos + size]))
            run = pos + size
        pos += size
    if not out and run == 0 and pos == end:
        return buf if type(buf) is bytes else bytes(buf)
    if run < pos:
        out.append(mv[run:pos])
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
