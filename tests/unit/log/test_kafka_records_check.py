"""The produce-path check of Kafka's records section (`record_batch.check_kafka_records`,
hand-tuned: one- and two-byte varints inline, offset deltas compared as bytes) accepts and
refuses exactly what a plain decode of every varint does, on batches kafka-python builds
and on thousands of mutations of them."""
from __future__ import annotations

import random

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from partitions.log import record_batch as rb
from partitions.log.errors import CorruptRecordError


def _reference_check(section: bytes, count: int) -> None:
    """The rule, decoded plainly: `count` records framed by their lengths (each >= 6 bytes,
    inside the section), offset deltas 0..count-1, nothing after the last record."""
    pos, end = 0, len(section)
    try:
        for i in range(count):
            length, pos = rb.read_varint(section, pos)
            stop = pos + length
            if length < 6 or stop > end:
                raise CorruptRecordError("length")
            _ts, p = rb.read_varint(section, pos + 1)
            off_delta, _ = rb.read_varint(section, p)
            if off_delta != i:
                raise CorruptRecordError("offset delta")
            pos = stop
    except IndexError:
        raise CorruptRecordError("truncated") from None
    if pos != end:
        raise CorruptRecordError("trailing")


def _accepts(check, section: bytes, count: int) -> bool:
    try:
        check(section, count)
        return True
    except CorruptRecordError:
        return False


def _section(rnd: random.Random, n: int, sizes=(0, 10, 50, 100, 200, 9000, 70_000)) -> bytes:
    """kafka-python's records section for `n` records: value sizes that need one-, two- and
    three-byte record lengths, timestamp deltas from 0 to far past two varint bytes."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 24)
    ts0 = 1_700_000_000_000
    for i in range(n):
        size = rnd.choice(sizes) if i % 50 else rnd.randint(0, 300)
        assert b.append(i, timestamp=ts0 + rnd.choice([0, 5, 63, 64, 900, 10 ** 6, -(10 ** 5)]),
                 key=rnd.choice([None, b"", b"key-%d" % i]), value=None if size == 70_000 and i % 2 else b"v" * size,
                 headers=[("h", b"x")] if i % 7 == 0 else []) is not None
    return bytes(b.build())[rb.HEADER_SIZE:]


def _noncanonical_offset_delta(section: bytes, index: int) -> bytes:
    """`section` with record `index`'s one-byte offset delta written as two bytes (0x80|v, 0x00):
    a longer encoding of the same value (its record length grows by one)."""
    pos = 0
    for i in range(index + 1):
        length, body = rb.read_varint(section, pos)
        if i < index:
            pos = body + length
    _ts, p = rb.read_varint(section, body + 1)
    assert section[p] < 0x80
    rec = section[body:p] + bytes([0x80 | section[p], 0x00]) + section[p + 1:body + length]
    return section[:pos] + rb.encode_varint(length + 1) + rec + section[body + length:]


def test_valid_sections_are_accepted_by_both():
    rnd = random.Random(20)
    for n in (1, 2, 63, 64, 65, 300):
        section = _section(rnd, n)
        assert _accepts(rb.check_kafka_records, section, n)
        assert _accepts(_reference_check, section, n)


def test_offset_deltas_past_the_byte_table_are_checked():
    """8,300 records: offset deltas of three varint bytes (past the canonical-bytes table)."""
    section = _section(random.Random(3), 8300, sizes=(0, 10, 100, 200))
    assert _accepts(rb.check_kafka_records, section, 8300)
    assert not _accepts(rb.check_kafka_records, section, 8299)   # trailing record
    last = 0
    pos = 0
    for _ in range(8300):   # renumber the last record's delta 8299 -> 8298: refused
        last = pos
        length, body = rb.read_varint(section, pos)
        pos = body + length
    length, body = rb.read_varint(section, last)
    _ts, p = rb.read_varint(section, body + 1)
    bad = section[:p] + rb.encode_varint(8298) + section[p + len(rb.encode_varint(8299)):]
    with pytest.raises(CorruptRecordError, match="offset delta 8298"):
        rb.check_kafka_records(bad, 8300)


def test_a_longer_encoding_of_the_right_offset_delta_is_accepted_like_a_plain_decode():
    section = _section(random.Random(5), 10)
    for index in (0, 3, 9):
        odd = _noncanonical_offset_delta(section, index)
        assert _accepts(_reference_check, odd, 10)
        assert _accepts(rb.check_kafka_records, odd, 10)


@pytest.mark.parametrize("seed", range(4))
def test_mutated_sections_get_the_same_verdict(seed):
    """Byte flips, truncations, extra bytes, wrong counts: the tuned check's verdict equals
    the plain decode's on every one (thousands, both verdicts present), also when it checks
    the section in place inside a larger buffer (start, end)."""
    rnd = random.Random(seed)
    verdicts = {True: 0, False: 0}
    for _ in range(25):
        n = rnd.choice([1, 3, 70, 130])
        section = _section(rnd, n)
        for _ in range(40):
            s = bytearray(section)
            kind = rnd.randrange(4)
            if kind == 0:   # flip bytes near record starts (lengths, timestamps, offset deltas)
                for _ in range(rnd.randint(1, 3)):
                    s[rnd.randrange(min(len(s), 64 * n))] = rnd.randrange(256)
            elif kind == 1:
                del s[rnd.randrange(len(s)):]
            elif kind == 2:
                s += bytes(rnd.randrange(1, 9))
            count = n + (rnd.choice([-1, 1]) if kind == 3 else 0)
            m = bytes(s)
            want = _accepts(_reference_check, m, count)
            assert _accepts(rb.check_kafka_records, m, count) == want, (seed, n, kind, count)
            framed = b"\xff" * 7 + m + b"\x00\x05\x80"   # checked in place inside a larger buffer
            assert _accepts(lambda sec, c: rb.check_kafka_records(sec, c, 7, 7 + len(m)), framed, count) == want
            verdicts[want] += 1
    assert verdicts[True] > 50 and verdicts[False] > 300, verdicts


def test_records_shorter_than_six_bytes_are_refused():
    """attributes, timestamp delta, offset delta, key and value lengths and the header count
    take at least six bytes: a five-byte record (no header count) is refused."""
    six = rb.encode_varint(6) + b"\x00\x00\x00\x01\x01\x00"      # null key, null value, no headers
    five = rb.encode_varint(5) + b"\x00\x00\x00\x01\x01"
    assert _accepts(rb.check_kafka_records, six, 1) and _accepts(_reference_check, six, 1)
    assert not _accepts(_reference_check, five, 1)
    with pytest.raises(CorruptRecordError, match="length 5"):
        rb.check_kafka_records(five, 1)
