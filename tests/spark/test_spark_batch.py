"""Batch reads and writes through Spark against a real broker."""
from __future__ import annotations

import datetime
import json

import pytest

from tests.spark.helpers import batch_reader, produce

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_batch_read_equals_what_was_produced(spark, broker_url, cluster, new_topic):
    topic = new_topic(partitions=2)
    p0 = [f"a{i}".encode() for i in range(300)]
    p1 = [bytes([i % 256]) * (i % 50) for i in range(120)]  # arbitrary bytes, empty values too
    produce(cluster, topic, 0, p0[:100], keys=[b"k%d" % i for i in range(100)])
    produce(cluster, topic, 0, p0[100:], timestamp_ms=1_700_000_000_123)
    produce(cluster, topic, 1, p1)

    df = batch_reader(spark, broker_url, subscribe=topic)
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    rows = df.collect()
    got = sorted((r.partition, r.offset, r.key, r.value) for r in rows)
    want = sorted([(0, i, (b"k%d" % i if i < 100 else None), v) for i, v in enumerate(p0)]
                  + [(1, i, None, v) for i, v in enumerate(p1)])
    assert got == want
    assert {r.topic for r in rows} == {topic}
    stamped = [r for r in rows if r.partition == 0 and r.offset >= 100]
    assert {r.timestamp for r in stamped} == {
        datetime.datetime(2023, 11, 14, 22, 13, 20, 123000)}
    assert {r.timestampType for r in rows} == {0}


def test_batch_read_offset_bounds_and_split(spark, broker_url, cluster, new_topic):
    topic = new_topic(partitions=2)
    produce(cluster, topic, 0, [b"%d" % i for i in range(50)])
    produce(cluster, topic, 1, [b"%d" % i for i in range(50)])
    df = batch_reader(spark, broker_url, assign=json.dumps({topic: [0, 1]}),
                      startingOffsets=json.dumps({topic: {"0": 10, "1": -2}}),
                      endingOffsets=json.dumps({topic: {"0": 20, "1": -1}}),
                      maxRecordsPerPartition="7")
    assert df.rdd.getNumPartitions() == 2 + 8  # [10,20) in 2 pieces, [0,50) in 8
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    assert got == [(0, i) for i in range(10, 20)] + [(1, i) for i in range(50)]


def test_assign_reads_only_the_assigned_partitions(spark, broker_url, cluster, new_topic):
    topic = new_topic(partitions=3)
    for p in range(3):
        produce(cluster, topic, p, [b"p%d-%d" % (p, i) for i in range(5)])
    rows = batch_reader(spark, broker_url, assign=json.dumps({topic: [2, 0]})).collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(p, i) for p in (0, 2) for i in range(5)]
    with pytest.raises(Exception, match="assigned partitions do not exist"):
        batch_reader(spark, broker_url, assign=json.dumps({topic: [3]})).collect()


def test_batch_read_with_headers(spark, broker_url, cluster, new_topic):
    topic = new_topic()
    produce(cluster, topic, 0, [b"v0", b"v1"], headers=[[("h", b"x"), ("g", b"\xff")], []])
    rows = batch_reader(spark, broker_url, subscribe=topic, includeHeaders="true").orderBy("offset").collect()
    assert [[(h.key, h.value) for h in r.headers] for r in rows] == [[("h", b"x"), ("g", b"\xff")], []]


def test_write_then_read_back(spark, broker_url, cluster, new_topic):
    topic = new_topic(partitions=3)
    other = new_topic(partitions=1)
    data = [(f"user{i % 7}", f"value-{i}", None) for i in range(200)] + [(None, "to-other", other)]
    df = spark.createDataFrame(data, "key string, value string, topic string")
    df.write.format("kraftlog").option("kraftlog.bootstrap.servers", broker_url).option("topic", topic) \
        .mode("append").save()
    rows = batch_reader(spark, broker_url, subscribe=f"{topic},{other}").collect()
    got = sorted((r.topic, r.key, r.value) for r in rows)
    want = sorted((t or topic, k.encode() if k else None, v.encode()) for k, v, t in data)
    assert got == want
    # same key, same partition
    by_key = {}
    for r in rows:
        if r.topic == topic:
            by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(parts) == 1 for parts in by_key.values())


def test_write_explicit_partition_binary_and_headers(spark, broker_url, cluster, new_topic):
    topic = new_topic(partitions=2)
    df = spark.createDataFrame(
        [(bytearray(b"\x00\xff"), 1, [("h", bytearray(b"\x01"))]), (bytearray(b"z"), 0, [])],
        "value binary, partition int, headers array<struct<key: string, value: binary>>")
    df.write.format("kraftlog").option("kraftlog.bootstrap.servers", broker_url).option("topic", topic) \
        .mode("append").save()
    rows = batch_reader(spark, broker_url, subscribe=topic, includeHeaders="true").collect()
    got = sorted((r.partition, bytes(r.value), [(h.key, bytes(h.value)) for h in r.headers]) for r in rows)
    assert got == [(0, b"z", []), (1, b"\x00\xff", [("h", b"\x01")])]


def test_fail_on_data_loss_after_delete_records(spark, broker_url, cluster, new_topic):
    topic = new_topic()
    produce(cluster, topic, 0, [b"%d" % i for i in range(30)])
    assert cluster.delete_records(topic, 0, 10) == 10
    start = json.dumps({topic: {"0": 5}})

    with pytest.raises(Exception) as info:
        batch_reader(spark, broker_url, subscribe=topic, startingOffsets=start).collect()
    assert "failOnDataLoss" in str(info.value)

    rows = batch_reader(spark, broker_url, subscribe=topic, startingOffsets=start,
                        failOnDataLoss="false").collect()
    assert sorted(r.offset for r in rows) == list(range(10, 30))
    # earliest means the log start offset, not 0: no data loss reported
    rows = batch_reader(spark, broker_url, subscribe=topic).collect()
    assert sorted(r.offset for r in rows) == list(range(10, 30))



def test_starting_timestamp_and_subscribe_pattern(spark, broker_url, cluster, new_topic):
    topic = new_topic(partitions=2)
    produce(cluster, topic, 0, [b"old0", b"old1"], timestamp_ms=1_000)
    produce(cluster, topic, 0, [b"new0"], timestamp_ms=5_000)
    produce(cluster, topic, 1, [b"old2"], timestamp_ms=2_000)  # nothing newer: starts at the end
    rows = batch_reader(spark, broker_url, subscribePattern=topic[:6] + ".*" + topic[-2:],
                        startingTimestamp="3000").collect()
    assert [(r.topic, r.partition, r.offset, r.value) for r in rows] == [(topic, 0, 2, b"new0")]
