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


def test_uncompressed_kafka_batch_round_trips_byte_for_byte():
    kafka = _kafka_batch()
    stored, header = kafka_to_stored(kafka)
    assert header[rb.H_RECORD_COUNT] == len(SAMPLES)
    assert stored != kafka                     # the records section really is converted
    assert stored_batch_to_kafka(stored) == kafka


def test_stored_records_equal_the_kafka_records():
    stored, _ = kafka_to_stored(_kafka_batch())
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in rb.decode_records(stored)]
    assert got == [(i, ts, k, v, [tuple(x) for x in h]) for i, (k, v, h, ts) in enumerate(SAMPLES)]
    h = rb.BatchHeader.parse(stored)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) == (7, 1, 5, 4)


@pytest.mark.parametrize("codec", [1, 3, 4])   # gzip, lz4, zstd
def test_compressed_kafka_batches_are_stored_with_their_codec_and_read_back(codec):
    kafka = _kafka_batch(codec)
    stored, _ = kafka_to_stored(kafka)
    assert rb.BatchHeader.parse(stored).compression == codec
    back = stored_batch_to_kafka(stored)
    assert DefaultRecordBatch(back).validate_crc()
    assert _read(back) == _read(kafka)


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


def test_corrupt_and_snappy_batches_are_refused():
    kafka = bytearray(_kafka_batch())
    kafka[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        kafka_to_stored(bytes(kafka))
    snappy = bytearray(_kafka_batch())
    struct.pack_into(">h", snappy, rb.ATTRIBUTES_OFFSET, 2)
    struct.pack_into(">I", snappy, rb.CRC_OFFSET, crc32c(bytes(snappy[rb.ATTRIBUTES_OFFSET:])))
    with pytest.raises(KraftlogError) as e:
        kafka_to_stored(bytes(snappy))
    assert e.value.code is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    with pytest.raises(CorruptRecordError):
        kafka_to_stored(bytes(_kafka_batch())[:40])


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
