"""The Kafka listener's record conversion (http_api/kafka/records.py) and protocol helpers
(http_api/kafka/protocol.py), checked against kafka-python's own record batch builder and
reader (an independent implementation of Kafka's format)."""
from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from http_api.kafka import protocol
from http_api.kafka.records import kafka_to_stored, stored_batch_to_kafka, stored_to_kafka, varint
from partitions.errors import ErrorCode, KraftlogError
from partitions.log import record_batch as rb
from partitions.log.errors import CorruptRecordError

SAMPLES = [
    (b"k", b"v", [("h", b"x"), ("empty", b""), ("null", None)], 1_700_000_000_000),
    (None, None, [], 1_700_000_000_005),          # null key, tombstone
    (b"", b"", [], 1_699_999_999_000),            # empty key and value, an earlier timestamp
    (bytes(range(256)), b"y" * 70_000, [], 1_700_000_000_007),   # binary, multi-byte varints
]


def _kafka_batch(compression: int = 0, samples=SAMPLES, producer=(7, 1, 5)) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                  producer_id=producer[0], producer_epoch=producer[1], base_sequence=producer[2],
                                  batch_size=1 << 22)
    for i, (k, v, h, ts) in enumerate(samples):
        b.append(i, timestamp=ts, key=k, value=v, headers=h)
    return bytes(b.build())


def _read(batch: bytes) -> list:
    return [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in DefaultRecordBatch(batch)]


def _xerial_snappy(payload: bytes) -> bytes:
    """kafka-python's own xerial framing (what the Java client writes), its block codec
    supplied by cramjam (kafka-python looks for python-snappy)."""
    import cramjam
    from kafka import codec as kcodec

    class _Snappy:
        @staticmethod
        def compress(data):
            return bytes(cramjam.snappy.compress_raw(bytes(data)))

    saved = kcodec.snappy
    kcodec.snappy = _Snappy
    try:
        return kcodec.snappy_encode(payload, xerial_compatible=True, xerial_blocksize=1024)
    finally:
        kcodec.snappy = saved


def _with_section(kafka: bytes, codec: int, section: bytes) -> bytes:
    """`kafka` (uncompressed) with its records section replaced and `codec` set, CRC fixed."""
    out = bytearray(kafka[:rb.HEADER_SIZE] + section)
    struct.pack_into(">i", out, rb.BATCH_LENGTH_OFFSET, len(out) - rb.LOG_OVERHEAD)
    struct.pack_into(">h", out, rb.ATTRIBUTES_OFFSET, codec)
    struct.pack_into(">I", out, rb.CRC_OFFSET, crc32c(bytes(out[rb.ATTRIBUTES_OFFSET:])))
    return bytes(out)


def _snappy_batches() -> list[bytes]:
    """The same records snappy-compressed in xerial framing (Java, kafka-python) and as one raw
    snappy block (librdkafka)."""
    import cramjam
    plain = _kafka_batch()
    section = plain[rb.HEADER_SIZE:]
    return [_with_section(plain, 2, _xerial_snappy(section)),
            _with_section(plain, 2, bytes(cramjam.snappy.compress_raw(section)))]


@pytest.mark.parametrize("codec", [0, 1, 3, 4])   # none, gzip, lz4, zstd
def test_kafka_batches_are_stored_and_fetched_byte_for_byte(codec):
    kafka = _kafka_batch(codec)
    stored, header = kafka_to_stored(kafka)
    assert header[rb.H_RECORD_COUNT] == len(SAMPLES)
    assert stored == kafka                     # stored exactly as sent
    assert not rb.BatchHeader.parse(stored).is_columnar
    assert stored_batch_to_kafka(stored) == kafka
    assert stored_to_kafka(stored + stored) == kafka + kafka


@pytest.mark.parametrize("codec", [0, 1, 3, 4])
def test_kafka_format_batches_decode_like_kafka_reads_them(codec):
    """The central decoder reads Kafka-format batches: Records, the cleaner's keys, Arrow."""
    from pipelines import arrow_codec
    stored, _ = kafka_to_stored(_kafka_batch(codec))
    stored = bytearray(stored)
    rb.stamp_batch(stored, 100, 3)
    want = [(100 + i, ts, k, v, [tuple(x) for x in h]) for i, (k, v, h, ts) in enumerate(SAMPLES)]
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in rb.decode_records(bytes(stored))]
    assert got == want
    assert [(r.offset, r.key) for r in rb.decode_batches(bytes(stored))] == [(w[0], w[2]) for w in want]
    offsets, keys, value_lens = rb.decode_keys(bytes(stored))
    assert (list(offsets), list(keys)) == ([w[0] for w in want], [w[2] for w in want])
    assert value_lens == [-1 if w[3] is None else len(w[3]) for w in want]
    cols, nxt = arrow_codec.decode_fetch(bytes(stored), 0, 1000, want_headers=True)
    assert nxt == 104
    assert cols.offsets.tolist() == [w[0] for w in want] and cols.timestamps_ms.tolist() == [w[1] for w in want]
    assert cols.keys.to_pylist() == [w[2] for w in want] and cols.values.to_pylist() == [w[3] for w in want]
    assert cols.headers == [tuple(w[4]) for w in want]
    h = rb.BatchHeader.parse(stored)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) == (7, 1, 5, 4)


def test_snappy_kafka_batches_xerial_and_raw_are_stored_as_sent_and_read():
    want = _read(_kafka_batch())
    for kafka in _snappy_batches():
        stored, _ = kafka_to_stored(kafka)
        assert stored == kafka
        assert [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers])
                for r in rb.decode_records(stored)] == want
    # kraftlog writes snappy in xerial framing (as the Java client), readable by kafka-python's reader
    recs = [rb.Record(b"k%d" % i, b"v" * 5000, (), 1000 + i) for i in range(20)]
    built = rb.build_batch(recs, compression="snappy")
    assert rb.BatchHeader.parse(built).compression == rb.Compression.SNAPPY
    section = rb._decompress(2, memoryview(built)[rb.HEADER_SIZE:])
    assert bytes(memoryview(built)[rb.HEADER_SIZE:rb.HEADER_SIZE + 8]) == b"\x82SNAPPY\x00"
    assert rb._decompress(2, _xerial_snappy(section)) == section
    assert [(r.key, r.value) for r in rb.decode_records(built)] == [(r.key, r.value) for r in recs]


def test_mixed_fetch_passes_kafka_batches_through_and_converts_columnar_ones():
    from kafka.record.memory_records import MemoryRecords
    kafka = bytearray(_kafka_batch())
    rb.stamp_batch(kafka, 1, 0)
    col = rb.build_batch([rb.Record(b"a", b"1", (), 10)], base_offset=0)
    col2 = rb.build_batch([rb.Record(b"b", b"2", (), 20)], base_offset=5)
    assert rb.BatchHeader.parse(col).is_columnar
    out = stored_to_kafka(col + bytes(kafka) + col2)
    first, rest = len(stored_batch_to_kafka(col)), len(kafka)
    assert out[first:first + rest] == kafka          # the Kafka batch untouched
    mr = MemoryRecords(out)
    got = []
    while mr.has_next():
        batch = mr.next_batch()
        assert batch.validate_crc() and not batch.attributes & rb.COLUMNAR_MASK
        got += [(r.offset, r.key) for r in batch]
    assert got == [(0, b"a"), (1, b"k"), (2, None), (3, b""), (4, bytes(range(256))), (5, b"b")]


def test_stored_batches_built_by_kraftlog_read_by_a_kafka_reader():
    from kafka.record.memory_records import MemoryRecords
    recs = [rb.Record(b"a", b"1", (("x", b"y"),), 10), rb.Record(None, None, (), 12)]
    stored = rb.build_batch(recs, base_offset=40) + rb.build_batch([rb.Record(b"b", b"2", (), 20)], base_offset=42)
    mr = MemoryRecords(stored_to_kafka(stored))
    got = []
    while mr.has_next():
        batch = mr.next_batch()
        assert batch.validate_crc()
        got += [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in batch]
    assert got == [(40, 10, b"a", b"1", [("x", b"y")]), (41, 12, None, None, []), (42, 20, b"b", b"2", [])]


def test_a_partial_batch_at_the_end_of_a_fetch_is_left_out():
    stored = rb.build_batch([rb.Record(b"a", b"1", (), 10)]) + rb.build_batch([rb.Record(b"b", b"2", (), 11)],
                                                                                 base_offset=1)
    one = stored_to_kafka(stored[:len(stored) - 3])
    assert _read(one) == [(0, 10, b"a", b"1", [])]
    kafka = _kafka_batch()
    assert stored_to_kafka(kafka + kafka[:70]) == kafka


def test_malformed_kafka_batches_are_refused():
    kafka = bytearray(_kafka_batch())
    kafka[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        kafka_to_stored(bytes(kafka))
    with pytest.raises(CorruptRecordError):
        kafka_to_stored(bytes(_kafka_batch())[:40])
    plain = _kafka_batch()
    section = plain[rb.HEADER_SIZE:]
    with pytest.raises(CorruptRecordError, match="bit 7"):       # would be read as columnar
        kafka_to_stored(_with_section(plain, rb.COLUMNAR_MASK, section))
    with pytest.raises(CorruptRecordError, match="after the last"):
        kafka_to_stored(_with_section(plain, 0, section + b"\x00"))
    with pytest.raises(CorruptRecordError):
        kafka_to_stored(_with_section(plain, 0, section[:-1]))
    # records numbered 0, 2, ...: Kafka's broker refuses a produced batch whose deltas skip
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=1, key=b"a", value=b"1", headers=[])
    b.append(2, timestamp=1, key=b"b", value=b"2", headers=[])
    skipped = bytearray(b.build())
    struct.pack_into(">i", skipped, rb.LAST_OFFSET_DELTA_OFFSET, 1)
    struct.pack_into(">I", skipped, rb.CRC_OFFSET, crc32c(bytes(skipped[rb.ATTRIBUTES_OFFSET:])))
    with pytest.raises(CorruptRecordError, match="offset delta"):
        kafka_to_stored(bytes(skipped))
    with pytest.raises(CorruptRecordError, match="snappy"):
        kafka_to_stored(_with_section(plain, 2, b"\x82SNAPPY\x00" + bytes(8) + b"\x00\x00\x00\x09garbage!!"))


def test_varint_matches_kafka_zigzag():
    from kafka.record.util import encode_varint
    for v in (0, 1, -1, 63, -64, 64, 8191, -8192, 8192, 300_000, -(2 ** 40), 2 ** 62):
        out = bytearray()
        encode_varint(v, out.append)
        assert varint(v) == bytes(out), v


def test_request_header_v2_skips_tagged_fields():
    frame = struct.pack(">hhih", 18, 3, 99, 3) + b"abc" + b"\x01\x05\x02zz" + b"body"
    h = protocol.parse_header(frame, flexible=True)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (18, 3, 99, "abc")
    assert frame[h.body_offset:] == b"body"
    with pytest.raises(protocol.FrameError):
        protocol.parse_header(frame[:11], flexible=False)


def test_build_drops_fields_a_version_lacks_and_fills_required_lists():
    v0 = protocol.build(protocol.response_type(3, 0), {"brokers": [{"node_id": 1, "host": "h", "port": 9, "rack": "r"}],
                                                       "cluster_id": "c", "controller_id": 1})
    assert v0.topics == () and v0.brokers[0].host == "h" and not hasattr(v0, "cluster_id")
    frame = protocol.encode_response(3, 0, 5, v0)
    assert struct.unpack(">ii", frame[:8]) == (len(frame) - 4, 5)


def test_every_kraftlog_error_code_has_a_kafka_code():
    for code in ErrorCode:
        k = protocol.kafka_error(code)
        assert k.name.upper() == code.name or code is ErrorCode.UNSUPPORTED_MEDIA_TYPE, code


def test_the_kafka_listener_stays_closed_where_it_would_be_a_side_door():
    """Open with TLS, password authentication (SASL) and ACLs; closed where it cannot apply
    the broker's security: authentication without passwords."""
    from http_api.broker.config import BrokerConfig
    from http_api.kafka.server import unsecured_listener_refusal
    for opened in (dict(), dict(authentication=("basic",)), dict(tls_cert_file="/c.pem", tls_key_file="/k.pem"),
                   dict(authentication=("basic", "bearer"), tls_cert_file="/c.pem", tls_key_file="/k.pem"),
                   dict(authentication=("basic",), authorizer="acl", super_users=("User:admin",))):
        assert unsecured_listener_refusal(BrokerConfig(**opened)) is None, opened
    for secured in (dict(authentication=("bearer",)),):
        reason = unsecured_listener_refusal(BrokerConfig(**secured))
        assert reason is not None and "kafka_port = 0" in reason


def test_the_fast_fetch_conversion_equals_the_general_one():
    """stored -> Kafka without Records (records without headers) is byte-equal to decode + encode
    over random batches: null/empty/large keys and values, sparse offsets (compacted), codecs,
    LogAppendTime."""
    import random
    from http_api.kafka import records as kr
    rnd = random.Random(20)
    for _ in range(200):
        n = rnd.randint(1, 40)
        recs = [rb.Record(rnd.choice([None, b"", b"k" * rnd.randint(1, 300)]),
                          rnd.choice([None, b"", b"v" * rnd.randint(1, 20_000)]), (), 1000 + rnd.randint(-5000, 5000))
                for _ in range(n)]
        deltas = sorted(rnd.sample(range(n * 3), n)) if rnd.random() < 0.3 else None
        stored = rb.build_batch(recs, offset_deltas=deltas, base_offset=rnd.randint(0, 10 ** 12),
                                compression=rnd.choice([0, 1, 3, 4]), timestamp_type=rnd.choice([0, 0, 1]))
        h = kr._HEADER.unpack_from(stored, 0)
        data = rb._decompress(h[rb.H_ATTRIBUTES] & rb.CODEC_MASK, memoryview(stored)[rb.HEADER_SIZE:])
        decoded = rb.decode_records(stored)
        first = decoded[0].timestamp if h[rb.H_ATTRIBUTES] & rb.TIMESTAMP_TYPE_MASK else h[rb.H_FIRST_TIMESTAMP]
        assert kr._columnar_to_kafka_section(h, data) == kr._kafka_records_section(decoded, h[rb.H_BASE_OFFSET], first)


def test_kafka_ports_of_make_run_and_cluster_up(tmp_path):
    """API.md: `make run` (kraftlog serve, no flags) listens for Kafka on 9092; `cluster up`
    gives broker i kafka-base-port + i - 1 (9092 by default) and its broker command carries it."""
    import json as _json
    from deploy.cluster import node_configs
    from deploy.config import NodeConfig
    from deploy.supervisor import broker_command
    assert NodeConfig().broker.kafka_port == 9092
    state = {"nodes": 3, "base_port": 18082, "data_dir": str(tmp_path), "cluster_id": "c", "password": "p"}
    assert [c.broker.kafka_port for c in node_configs(state)] == [9092, 9093, 9094]
    cfgs = node_configs(dict(state, kafka_base_port=29000))
    assert [c.broker.kafka_port for c in cfgs] == [29000, 29001, 29002]
    cmd = broker_command(cfgs[1])
    assert _json.loads(cmd[cmd.index("--config-json") + 1])["kafka_port"] == 29001


def test_http_raw_produce_takes_kafka_batches_and_refuses_bit7_less_columnar_ones():
    """The HTTP raw-batch route stores both formats; a columnar batch without bit 7 (a client
    from before Kafka-format storage) would be read as Kafka's records, so it is refused."""
    from http_api.wire import codecs
    kafka = _kafka_batch(1)
    assert [h.record_count for h in codecs.validate_raw_batches(kafka, max_message_bytes=1 << 22,
                                                               max_records=100)] == [4]
    old = bytearray(rb.build_batch([rb.Record(b"k", b"v", (), 1)]))
    struct.pack_into(">h", old, rb.ATTRIBUTES_OFFSET, 0)
    struct.pack_into(">I", old, rb.CRC_OFFSET, crc32c(bytes(old[rb.ATTRIBUTES_OFFSET:])))
    with pytest.raises(KraftlogError) as e:
        codecs.validate_raw_batches(bytes(old), max_message_bytes=1 << 22, max_records=100)
    assert e.value.code is ErrorCode.CORRUPT_MESSAGE and "bit 7" in str(e.value)


def test_check_accepts_every_batch_kafka_python_builds_multi_byte_varints_included():
    """300 records: offset deltas past one varint byte, timestamp deltas negative and large."""
    import random
    rnd = random.Random(7)
    samples = [(rnd.choice([None, b"k" * rnd.randint(0, 200)]), rnd.choice([None, b"v" * rnd.randint(0, 3000)]),
                [("h", b"x")] if i % 9 == 0 else [], 1_700_000_000_000 + rnd.randint(-10 ** 6, 10 ** 6))
               for i in range(300)]
    for codec in (0, 4):
        kafka = _kafka_batch(codec, samples=samples, producer=(-1, -1, -1))
        assert kafka_to_stored(kafka)[0] == kafka
        assert _read(kafka) == [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers])
                                for r in rb.decode_records(kafka)]
