"""Structured Streaming reads and writes through Spark against a real broker."""
from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.spark.helpers import batch_reader, produce, reader

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _wait_rows(spark, table: str, count: int, query, timeout_s: float = 60.0) -> list:
    deadline = time.monotonic() + timeout_s
    while True:
        if query.exception() is not None:
            raise query.exception()
        rows = spark.sql(f"SELECT partition, offset, value FROM {table}").collect()
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_stream_reads_new_data_across_micro_batches(spark, broker_url, cluster, new_topic):
    topic = new_topic(partitions=2)
    produce(cluster, topic, 0, [b"before"])  # startingOffsets defaults to latest: never read
    table = "mem_" + uuid.uuid4().hex[:8]
    query = (reader(spark, broker_url, subscribe=topic).writeStream.format("memory").queryName(table)
             .trigger(processingTime="100 milliseconds").start())
    try:
        deadline = time.monotonic() + 60
        while not query.recentProgress and time.monotonic() < deadline:  # initial offsets taken
            time.sleep(0.1)
        expected = []
        batches_with_data = set()
        for round_ in range(3):
            values = [b"r%d-%d" % (round_, i) for i in range(20)]
            produce(cluster, topic, round_ % 2, values)
            expected += values
            rows = _wait_rows(spark, table, len(expected), query)
            assert sorted(bytes(r.value) for r in rows) == sorted(expected)
            # collected each round: recentProgress keeps only the last 100 micro-batches, and
            # 100 ms triggers on a slow machine push the early ones out
            batches_with_data |= {p["batchId"] for p in query.recentProgress if p["numInputRows"] > 0}
        deadline = time.monotonic() + 10  # the last batch's progress is posted after its rows
        while len(batches_with_data) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
            batches_with_data |= {p["batchId"] for p in query.recentProgress if p["numInputRows"] > 0}
        assert len(batches_with_data) >= 3
    finally:
        query.stop()


def test_restart_from_checkpoint_without_loss_or_duplicates(spark, broker_url, cluster, new_topic, tmp_path):
    topic = new_topic(partitions=2)
    out, chk = str(tmp_path / "out"), str(tmp_path / "chk")

    def run():
        q = (reader(spark, broker_url, subscribe=topic, startingOffsets="earliest")
             .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", chk)
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None
        return q

    produce(cluster, topic, 0, [b"a%d" % i for i in range(40)])
    produce(cluster, topic, 1, [b"b%d" % i for i in range(25)])
    run()
    produce(cluster, topic, 0, [b"a%d" % i for i in range(40, 55)])
    produce(cluster, topic, 1, [b"b%d" % i for i in range(25, 30)])
    second = run()
    assert sum(p["numInputRows"] for p in second.recentProgress) == 20  # only the new records
    rows = spark.read.parquet(out).collect()
    got = sorted((r.partition, r.offset, r.value) for r in rows)
    want = sorted([(0, i, "a%d" % i) for i in range(55)] + [(1, i, "b%d" % i) for i in range(30)])
    assert got == want
    offsets = json.loads(open(sorted((tmp_path / "chk" / "offsets").glob("[0-9]*"))[-1]).read().splitlines()[-1])
    assert offsets == {topic: {"0": 55, "1": 30}}


def test_max_offsets_per_trigger_is_respected(spark, broker_url, cluster, new_topic):
    topic = new_topic(partitions=2)
    produce(cluster, topic, 0, [b"x"] * 70)
    produce(cluster, topic, 1, [b"y"] * 30)
    table = "mem_" + uuid.uuid4().hex[:8]
    q = (reader(spark, broker_url, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="30")
         .writeStream.format("memory").queryName(table).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sizes == [30, 30, 30, 10]
    rows = spark.sql(f"SELECT partition, offset FROM {table}").collect()
    assert sorted((r.partition, r.offset) for r in rows) == \
        sorted([(0, i) for i in range(70)] + [(1, i) for i in range(30)])


def test_available_now_stops_at_the_offsets_seen_at_start(spark, broker_url, cluster, new_topic):
    topic = new_topic()
    produce(cluster, topic, 0, [b"x"] * 10)
    table = "mem_" + uuid.uuid4().hex[:8]
    stream = reader(spark, broker_url, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="3")

    def slow_batch(df, batch_id):  # data arriving while the query runs must not be read
        if batch_id == 0:
            produce(cluster, topic, 0, [b"late"] * 5)
        df.write.mode("append").saveAsTable(table)

    q = stream.writeStream.foreachBatch(slow_batch).trigger(availableNow=True).start()
    q.awaitTermination(120)
    assert q.exception() is None
    assert spark.table(table).count() == 10


def test_stream_fail_on_data_loss(spark, broker_url, cluster, new_topic, tmp_path):
    topic = new_topic()
    produce(cluster, topic, 0, [b"%d" % i for i in range(10)])

    def run(name, **extra):
        q = (reader(spark, broker_url, subscribe=topic, startingOffsets="earliest", **extra)
             .select("offset").writeStream.format("parquet").option("path", str(tmp_path / name / "out"))
             .option("checkpointLocation", str(tmp_path / name / "chk"))
             .trigger(availableNow=True).start())
        try:
            q.awaitTermination(120)
        except Exception:
            pass
        return q

    run("strict")
    run("lenient")
    produce(cluster, topic, 0, [b"%d" % i for i in range(10, 30)])
    cluster.delete_records(topic, 0, 20)  # offsets 10..19 are gone before they were read

    q = run("strict")
    assert q.exception() is not None and "failOnDataLoss" in str(q.exception())
    q = run("lenient", failOnDataLoss="false")
    assert q.exception() is None
    rows = spark.read.parquet(str(tmp_path / "lenient" / "out")).collect()
    assert sorted(r.offset for r in rows) == list(range(10)) + list(range(20, 30))


def test_stream_write_from_one_topic_to_another(spark, broker_url, cluster, new_topic, tmp_path):
    source, sink = new_topic(partitions=2), new_topic(partitions=2)
    produce(cluster, source, 0, [b"%d" % i for i in range(50)], keys=[b"k%d" % (i % 5) for i in range(50)])
    produce(cluster, source, 1, [b"%d" % i for i in range(50, 80)])
    q = (reader(spark, broker_url, subscribe=source, startingOffsets="earliest")
         .selectExpr("key", "concat(value, '!') AS value")
         .writeStream.format("kraftlog").option("kraftlog.bootstrap.servers", broker_url)
         .option("topic", sink).option("checkpointLocation", str(tmp_path / "chk"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    rows = batch_reader(spark, broker_url, subscribe=sink).collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(b"%d!" % i for i in range(80))
