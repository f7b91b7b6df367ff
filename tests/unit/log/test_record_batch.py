"""Record batch codec: layout, round trips, validation, in-place stamping."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings, strategies as st

from partitions.log.record_batch import (
    HEADER_SIZE,
    BatchHeader,
    Compression,
    CorruptRecordError,
    Record,
    RecordTooLargeError,
    build_batch,
    decode_batches,
    decode_records,
    iter_batches,
    set_log_append_time,
    stamp_batch,
    validate_batch,
)


def _recs(n=3):
    return [Record(b"k%d" % i, b"v%d" % i, timestamp=1000 + i) for i in range(n)]


def test_header_is_kafka_v2_layout():
    batch = build_batch(_recs(3), base_offset=7, producer_id=11, producer_epoch=2, base_sequence=5,
                        partition_leader_epoch=4)
    assert HEADER_SIZE == 61
    base, length, epoch, magic = struct.unpack_from(">qiib", batch)
    assert (base, epoch, magic) == (7, 4, 2)
    assert length == len(batch) - 12
    h = BatchHeader.parse(batch)
    assert (h.last_offset_delta, h.record_count, h.first_timestamp, h.max_timestamp) == (2, 3, 1000, 1002)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (11, 2, 5)
    assert (h.size, h.last_offset, h.next_offset) == (len(batch), 9, 10)
    assert h.compression is Compression.NONE and not h.is_control and h.timestamp_type == 0


@pytest.mark.parametrize("codec", list(Compression))
def test_round_trip_every_codec(codec):
    recs = [Record(b"key", b"x" * 500, headers=(("a", b"1"), ("b", None)), timestamp=5),
            Record(None, None, timestamp=9), Record(b"", b"", timestamp=7)]
    batch = build_batch(recs, compression=codec, base_offset=100)
    h = validate_batch(batch)
    assert h.compression == codec
    out = decode_records(batch)
    assert [(r.key, r.value, r.headers, r.timestamp, r.offset) for r in out] == [
        (b"key", b"x" * 500, (("a", b"1"), ("b", None)), 5, 100),
        (None, None, (), 9, 101),
        (b"", b"", (), 7, 102),
    ]
    if codec != Compression.NONE:
        assert len(batch) < HEADER_SIZE + 500


def test_compression_from_name():
    assert Compression.from_name("zstd") is Compression.ZSTD
    assert Compression.from_name("LZ4") is Compression.LZ4
    assert Compression.from_name("none") is Compression.NONE
    assert Compression.from_name("uncompressed") is Compression.NONE
    assert Compression.from_name("snappy") is Compression.SNAPPY
    with pytest.raises(ValueError, match="snappy"):   # the message lists the codecs
        Compression.from_name("brotli")


def test_missing_timestamps_get_now_ms():
    batch = build_batch([Record(None, b"a"), Record(None, b"b", timestamp=3)], now_ms=42)
    assert [r.timestamp for r in decode_records(batch)] == [42, 3]
    h = BatchHeader.parse(batch)
    assert (h.first_timestamp, h.max_timestamp) == (42, 42)


def test_control_and_log_append_time_flags():
    batch = bytearray(build_batch(_recs(2), is_control=True))
    assert BatchHeader.parse(batch).is_control
    set_log_append_time(batch, 777)
    h = validate_batch(batch)  # CRC recomputed
    assert h.timestamp_type == 1 and h.max_timestamp == 777
    assert [r.timestamp for r in decode_records(batch)] == [777, 777]


def test_stamp_batch_keeps_crc_valid():
    batch = bytearray(build_batch(_recs(3)))
    stamp_batch(batch, 1234, 9)
    h = validate_batch(batch)
    assert (h.base_offset, h.partition_leader_epoch) == (1234, 9)
    assert [r.offset for r in decode_records(batch)] == [1234, 1235, 1236]


def test_explicit_offset_deltas():
    batch = build_batch(_recs(3), base_offset=10, offset_deltas=[0, 4, 9])
    h = validate_batch(batch)
    assert h.last_offset_delta == 9 and h.record_count == 3
    assert [r.offset for r in decode_records(batch)] == [10, 14, 19]
    with pytest.raises(ValueError):
        build_batch(_recs(3), offset_deltas=[0, 0, 1])


def test_crc_detects_every_single_byte_flip_after_crc_field():
    batch = build_batch(_recs(4), compression=Compression.NONE)
    for i in range(21, len(batch)):
        bad = bytearray(batch)
        bad[i] ^= 0x01
        with pytest.raises(CorruptRecordError, match="CRC"):
            validate_batch(bad)


def test_validation_messages():
    batch = build_batch(_recs(2))
    with pytest.raises(CorruptRecordError, match="truncated"):
        validate_batch(batch[:30])
    with pytest.raises(CorruptRecordError, match="truncated"):
        validate_batch(batch[:-1])
    bad = bytearray(batch)
    bad[16] = 1
    with pytest.raises(CorruptRecordError, match="magic"):
        validate_batch(bad)
    bad = bytearray(batch)
    struct.pack_into(">i", bad, 8, 10)
    with pytest.raises(CorruptRecordError, match="minimum"):
        validate_batch(bad)
    with pytest.raises(RecordTooLargeError, match="max.message.bytes"):
        validate_batch(batch, max_batch_bytes=len(batch) - 1)
    assert validate_batch(batch, max_batch_bytes=len(batch)).size == len(batch)


def test_iter_batches_strict_and_lenient():
    a = build_batch(_recs(2), base_offset=0)
    b = build_batch(_recs(3), base_offset=2)
    buf = a + b
    got = [(h.base_offset, bytes(mv)) for h, mv in iter_batches(buf)]
    assert got == [(0, a), (2, b)]
    torn = buf[:-5]
    with pytest.raises(CorruptRecordError):
        list(iter_batches(torn))
    assert [h.base_offset for h, _ in iter_batches(torn, strict=False)] == [0]
    assert [r.offset for r in decode_batches(buf)] == [0, 1, 2, 3, 4]


def test_decode_batches_skip_control():
    buf = build_batch(_recs(1), base_offset=0) + build_batch(_recs(1), base_offset=1, is_control=True)
    assert [r.offset for r in decode_batches(buf)] == [0, 1]
    assert [r.offset for r in decode_batches(buf, skip_control=True)] == [0]


def test_garbage_records_section_is_corrupt_not_a_crash():
    batch = bytearray(build_batch(_recs(3)))
    struct.pack_into(">i", batch, 57, 50)  # record_count beyond what the section holds
    struct.pack_into(">i", batch, 23, 60)
    from crc32c import crc32c
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    with pytest.raises(CorruptRecordError):
        decode_records(batch)


_header = st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5)))
_record = st.builds(
    Record,
    key=st.one_of(st.none(), st.binary(max_size=20)),
    value=st.one_of(st.none(), st.binary(max_size=50)),
    headers=st.lists(_header, max_size=2).map(tuple),
    timestamp=st.one_of(st.none(), st.integers(0, 2**41)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_record, min_size=1, max_size=20), st.sampled_from(list(Compression)), st.integers(0, 2**40))
def test_round_trip_property(records, codec, base):
    batch = build_batch(records, compression=codec, base_offset=base, now_ms=99)
    out = decode_records(batch)
    assert len(out) == len(records)
    for i, (r, o) in enumerate(zip(records, out)):
        assert (o.key, o.value, o.headers, o.offset) == (r.key, r.value, r.headers, base + i)
        assert o.timestamp == (99 if r.timestamp is None else r.timestamp)
    h = validate_batch(batch)
    assert h.max_timestamp == max(o.timestamp for o in out)


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD])
def test_decompression_bombs_are_refused(codec, monkeypatch):
    import partitions.log.record_batch as rb

    batch = build_batch([Record(None, b"\0" * 200_000)], compression=codec)
    assert len(batch) < 20_000
    assert decode_records(batch)[0].value == b"\0" * 200_000
    monkeypatch.setattr(rb, "MAX_RECORDS_SECTION_BYTES", 100_000)
    with pytest.raises(CorruptRecordError, match="decompresses to"):
        decode_records(batch)
