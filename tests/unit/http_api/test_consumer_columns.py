"""Consumer.poll_columns(): the records poll() returns, as one RecordColumns per batch
(offsets, timestamps, keys, values, headers) with keys and values as BytesColumns, views of
the fetched bytes; every kind of batch reads back as decode_records reads it."""
import asyncio
import struct
from array import array

import pytest
from crc32c import crc32c

from http_api.client.columns import BytesColumn, decode_columns
from http_api.client.consumer import Consumer
from http_api.client.producer import columns_batch
from http_api.wire import codecs
from partitions.log import record_batch as rb
from partitions.log.errors import CorruptRecordError


def _stamped(batch: bytes, base: int) -> bytes:
    b = bytearray(batch)
    rb.stamp_batch(b, base, 0)
    return bytes(b)


def _kafka_format(records: list, base: int) -> bytes:
    """A batch with Kafka's varint records section (bit 7 clear), as the Kafka listener stores."""
    b = bytearray(rb.build_batch(records, is_control=True))
    (attrs,) = struct.unpack_from(">h", b, rb.ATTRIBUTES_OFFSET)
    struct.pack_into(">h", b, rb.ATTRIBUTES_OFFSET, attrs & ~rb.CONTROL_MASK)
    struct.pack_into(">I", b, rb.CRC_OFFSET, crc32c(memoryview(b)[rb.ATTRIBUTES_OFFSET:]))
    return _stamped(bytes(b), base)


def _mixed_log() -> tuple[bytes, list]:
    """Batches of every kind back to back from offset 0 -> (fetch body, the records in it)."""
    batches = [
        _stamped(columns_batch([b"v%d" % i for i in range(5)], timestamp_ms=1000), 0),
        _stamped(rb.build_batch([rb.Record(b"k1", b"a", timestamp=7), rb.Record(None, None, timestamp=9),
                                 rb.Record(b"", b"", timestamp=8)]), 5),
        _stamped(rb.build_batch([rb.Record(b"h", b"with-headers", (("n", b"x"), ("m", None)), 11),
                                 rb.Record(b"h2", b"plain", (), 12)]), 8),
        _stamped(rb.build_batch([rb.Record(None, b"z%d" % i, timestamp=13) for i in range(4)],
                                compression="gzip"), 10),
        _stamped(rb.build_batch([rb.Record(None, None, timestamp=14)], is_control=True), 14),   # a marker
        _stamped(rb.build_batch([rb.Record(b"c", b"compacted", timestamp=15), rb.Record(b"d", b"kept", timestamp=15)],
                                offset_deltas=[1, 3], last_offset_delta=4), 15),
        _kafka_format([rb.Record(b"kk", b"kafka-0", timestamp=16), rb.Record(None, b"kafka-1", timestamp=17)], 20),
        _stamped(rb.build_batch([rb.Record(None, b"appended", timestamp=1)], timestamp_type=rb.LOG_APPEND_TIME), 22),
    ]
    body = b"".join(batches)
    return body, rb.decode_batches(body, skip_control=True)


def _rows(cols_list) -> list[tuple]:
    return [(o, t, k, v, tuple(h)) for c in cols_list
            for o, t, k, v, h in zip(c.offsets, c.timestamps, c.keys, c.values, c.headers)]


def test_every_kind_of_batch_reads_back_as_decode_records_reads_it():
    body, records = _mixed_log()
    cols, nxt = decode_columns("t", 3, body, 0)
    assert nxt == 23
    assert {(c.topic, c.partition) for c in cols} == {("t", 3)}
    assert len(cols) == 7                       # one per batch, the marker left out
    assert _rows(cols) == [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in records]
    assert [c.next_offset for c in cols] == [5, 8, 10, 14, 20, 22, 23]
    assert [list(c) for c in cols[:1]] == [[(i, None, b"v%d" % i) for i in range(5)]]


def test_a_batch_that_starts_before_the_position_is_cut():
    body, records = _mixed_log()
    for position in (1, 6, 9, 12, 16, 17, 21):
        cols, nxt = decode_columns("t", 0, body, position)
        assert nxt == 23
        assert _rows(cols) == [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers))
                               for r in records if r.offset >= position], position
    assert decode_columns("t", 0, body, 23) == ([], 23)


def test_values_are_views_of_the_fetched_bytes_until_read():
    body = _stamped(columns_batch([b"abc", None, b"", b"de"], keys=[b"k", None, b"kk", b""]), 40)
    (c,) = decode_columns("t", 0, body, 0)[0]
    assert isinstance(c.values, BytesColumn) and isinstance(c.keys, BytesColumn)
    assert c.offsets == range(40, 44)
    assert c.values.lengths == array("i", [3, -1, 0, 2])
    assert bytes(c.values.buffer) == b"abcde"
    assert isinstance(c.values.buffer, memoryview)
    assert c.values.tolist() == [b"abc", None, b"", b"de"]
    assert [c.values[i] for i in range(4)] == [b"abc", None, b"", b"de"]
    assert c.values[-1] == b"de" and c.values[1:3] == [None, b""]
    assert list(c.keys) == [b"k", None, b"kk", b""]
    cut = decode_columns("t", 0, body, 42)[0][0]     # the cut column slices the same buffer
    assert list(cut.values) == [b"", b"de"] and bytes(cut.values.buffer) == b"de"


def test_a_corrupt_length_array_is_refused():
    good = bytearray(columns_batch([b"abc", b"de"]))
    bad = bytearray(good)
    struct.pack_into("<i", bad, rb.HEADER_SIZE + 1, 9)         # value 0 claims 9 bytes: past the section
    with pytest.raises(CorruptRecordError):
        decode_columns("t", 0, bytes(bad), 0)
    struct.pack_into("<i", bad, rb.HEADER_SIZE + 1, -5)
    with pytest.raises(CorruptRecordError):
        decode_columns("t", 0, bytes(bad), 0)


class FakeLeader:
    """A log of 100 records in batches of 10 (every fetch request recorded)."""

    DOC = {"cluster_id": "c", "controller_id": 1, "brokers": [{"id": 1, "url": "http://b1:1"}],
           "topics": [{"name": "t", "partitions": [{"partition": 0, "leader": 1, "leader_epoch": 0,
                                                    "replicas": [1], "isr": [1]}]}]}

    def __init__(self) -> None:
        self.fetched: list[int] = []

    async def one(self, url: str) -> dict:
        return self.DOC

    async def request(self, method, url, params=None, **kw):
        offset = int(params["offset"])
        self.fetched.append(offset)
        await asyncio.sleep(0)
        base = offset - offset % 10
        body = b"".join(_stamped(columns_batch([b"%d" % (b + i) for i in range(10)]), b)
                        for b in range(base, min(base + 30, 100), 10))
        return 200, {codecs.HEADER_NEXT_OFFSET: str(min(base + 30, 100))}, body


async def test_poll_columns_returns_poll_s_records_and_moves_the_position():
    leader = FakeLeader()
    c = Consumer("http://b1:1", max_wait_ms=100)
    c.meta._one = leader.one
    c.t.request = leader.request
    c.assign([("t", 0)])
    try:
        c.seek(("t", 0), 5)
        got = await c.poll_columns(timeout_ms=1000)
        assert [list(b.offsets) for b in got] == [list(range(5, 10)), list(range(10, 20)), list(range(20, 30))]
        assert [v for b in got for v in b.values] == [b"%d" % i for i in range(5, 30)]
        assert await c.position(("t", 0)) == 30
        await asyncio.sleep(0.01)
        assert leader.fetched == [5, 30]          # fetch ahead, as poll()
        more = await c.poll_columns(timeout_ms=1000)
        assert more[0].offsets[0] == 30 and sum(map(len, more)) == 30
        c.seek(("t", 0), 95)
        (last,) = await c.poll_columns(timeout_ms=1000)
        assert list(last.values) == [b"%d" % i for i in range(95, 100)]
        assert last.next_offset == 100 and await c.position(("t", 0)) == 100
    finally:
        await c.close()
