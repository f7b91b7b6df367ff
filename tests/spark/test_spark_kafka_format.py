"""Spark reads Kafka-written data (issue 20): batches in Kafka's varint format, stored as a
Kafka client sent them, next to columnar ones in the same partition."""
from __future__ import annotations

import datetime

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from partitions.log import record_batch as rb
from tests.spark.helpers import batch_reader, produce

# run alone (or first), the session's SparkSession and kraftlog node start inside this test's
# time: 569 s of setup at load 25-35 on 2 shared cores, beyond the default 300 s
pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(900)]


def _kafka_batch(records, codec: int) -> bytes:
    """A batch exactly as kafka-python's producer builds it."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, (k, v, h, ts) in enumerate(records):
        b.append(i, timestamp=ts, key=k, value=v, headers=h)
    return bytes(b.build())


def test_spark_reads_kafka_format_batches_next_to_columnar_ones(spark, broker_url, cluster, new_topic):
    topic = new_topic()
    produce(cluster, topic, 0, [b"col-%d" % i for i in range(3)], keys=[b"c"] * 3, timestamp_ms=1_000)  # 0-2
    want = [(i, b"c", b"col-%d" % i, 1_000, []) for i in range(3)]
    off = 3
    for codec in (0, 1, 4):   # none, gzip, zstd
        recs = [(b"k%d" % j if j % 3 else None, None if j == 4 else b"kafka-%d-%d" % (codec, j),
                 [("h", b"%d" % j)] if j % 2 else [], 2_000 + j) for j in range(6)]
        batch = _kafka_batch(recs, codec)
        cluster.produce_raw(topic, 0, batch)
        want += [(off + j, k, v, ts, h) for j, (k, v, h, ts) in enumerate(recs)]
        off += len(recs)
    stored = cluster.fetch(topic, 0, 0, 1 << 20)["batches"]
    assert [h.is_columnar for h, _b in rb.iter_batches(stored)] == [True, False, False, False]
    cbor = cluster.fetch(topic, 0, 0, 1 << 20, raw=False)["records"]     # the broker's CBOR decode
    assert len(cbor) == off
    rows = batch_reader(spark, broker_url, subscribe=topic, includeHeaders="true").collect()
    got = sorted((r.offset, r.key, r.value, r.timestamp, [(h["key"], h["value"]) for h in r.headers])
                 for r in rows)
    assert got == [(o, k, v, datetime.datetime.utcfromtimestamp(ts / 1000), h) for o, k, v, ts, h in want]
