"""Writes go through the idempotent producer: a retried task does not duplicate records.

The shared SparkSession runs `local[2]`, where Spark never retries a failed task (the retry
count is fixed by the master string at session creation), so a retry is simulated by
running the same task again: the same pickled writer and Spark partition id with the same
rows, after a first attempt that died part-way through its rows.
"""
from __future__ import annotations

import collections

import pyarrow as pa
import pytest

from partitions.log import record_batch as rb
from pipelines import options as opt
from pipelines import sink
from tests.spark.helpers import reader

pytestmark = [pytest.mark.spark, pytest.mark.integration]

SCHEMA = "key string, value string"


def _sink(url, topic, **extra):
    """Sink options with idempotence on (it is opt-in) unless the test says otherwise."""
    return opt.parse_sink_options({"kraftlog.bootstrap.servers": url, "topic": topic,
                                   "kraftlog.enable.idempotence": "true", **extra})


def _arrow(rows, per_batch):
    """Input as Spark hands it to a task: Arrow batches of `per_batch` rows."""
    for i in range(0, len(rows), per_batch):
        chunk = rows[i:i + per_batch]
        yield pa.RecordBatch.from_arrays([pa.array([k for k, _ in chunk], pa.string()),
                                          pa.array([v for _, v in chunk], pa.string())], ["key", "value"])


def _dies_after(batches, n):
    for i, b in enumerate(batches):
        if i == n:
            raise RuntimeError("task attempt 0 dies here")
        yield b


def _stored(cluster, topic, partitions):
    """Every stored record as (value, batch header) over all partitions."""
    out = []
    for p in range(partitions):
        offset = 0
        _, hw = cluster.offsets(topic, p)
        while offset < hw:
            got = cluster.fetch(topic, p, offset, 1 << 20)
            for header, view in rb.iter_batches(got["batches"]):
                out += [(r.value, header) for r in rb.decode_records(bytes(view))]
            offset = got["next_offset"]
    return out


def test_retried_task_stores_each_row_once(broker_url, cluster, new_topic):
    topic = new_topic(partitions=2)
    # keyed rows (crc32c routing) and keyless rows (sticky partition): both must route the same way
    rows = [(f"k{i % 9}" if i % 3 else None, f"v{i}") for i in range(400)]
    options = _sink(broker_url, topic, **{"kraftlog.linger.records": "10"})  # many small batches
    writer = sink.KraftlogWriter(options, _schema())
    assert writer.base_producer_id >= 0

    with pytest.raises(RuntimeError, match="dies here"):
        sink.write_partition(options, _dies_after(_arrow(rows, 25), 12), writer.base_producer_id, 3)
    written = len(_stored(cluster, topic, 2))
    assert 150 <= written < 400  # part of the rows made it, well over 5 batches per partition

    msg = sink.write_partition(options, _arrow(rows, 25), writer.base_producer_id, 3)  # the retry
    assert msg.total == 400
    stored = _stored(cluster, topic, 2)
    assert sorted(v for v, _ in stored) == sorted(v.encode() for _, v in rows)
    assert {h.producer_id for _, h in stored} == {sink.derived_producer_id(writer.base_producer_id, 3, None)[0]}

    # another task (partition id) with the same rows is another producer: appended again
    sink.write_partition(options, _arrow(rows, 25), writer.base_producer_id, 4)
    assert len(_stored(cluster, topic, 2)) == 800


def test_retried_micro_batch_task_stores_each_row_once(broker_url, cluster, new_topic):
    topic = new_topic(partitions=1)
    options = _sink(broker_url, topic, **{"kraftlog.linger.records": "5"})
    writer = sink.KraftlogStreamWriter(options, _schema())
    batch0 = [(None, f"a{i}") for i in range(60)]
    batch1 = [(None, f"b{i}") for i in range(60)]
    base = writer.base_producer_id
    with pytest.raises(RuntimeError):
        sink.write_partition(options, _dies_after(_arrow(batch0, 10), 4), base, 0, batch_id=7)
    sink.write_partition(options, _arrow(batch0, 10), base, 0, batch_id=7)
    sink.write_partition(options, _arrow(batch1, 10), base, 0, batch_id=8)  # next epoch, sequence 0
    sink.write_partition(options, _arrow(batch1, 10), base, 0, batch_id=8)  # retried again
    stored = _stored(cluster, topic, 1)
    assert [v for v, _ in stored] == [v.encode() for _, v in batch0 + batch1]
    assert {h.producer_epoch for _, h in stored} == {7, 8}


def test_rerun_of_a_spark_job_with_the_same_writer_stores_each_row_once(spark, broker_url, cluster, new_topic):
    """Real executors: the writer is pickled to Python workers and tasks take their Spark
    partition id from TaskContext. Run 1 dies in every task after 40 rows; run 2 (the
    "retry") writes everything with the same writer."""
    topic = new_topic(partitions=2)
    options = _sink(broker_url, topic, **{"kraftlog.linger.records": "8"})
    writer = sink.KraftlogWriter(options, _schema())
    df = spark.range(0, 600, numPartitions=2).selectExpr("CAST(id % 13 AS STRING) AS key",
                                                         "CAST(id AS STRING) AS value")

    def job(fail_after_batches):
        def run(batches):  # self-contained: pickled by value to the Python workers
            def dies(it):
                for i, b in enumerate(it):
                    if i == fail_after_batches:
                        raise RuntimeError("task attempt 0 dies here")
                    yield b
            msg = writer.write(batches if fail_after_batches is None else dies(batches))
            yield pa.RecordBatch.from_arrays([pa.array([msg.total], pa.int64())], ["n"])
        return run

    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        with pytest.raises(Exception, match="dies here"):
            df.mapInArrow(job(2), "n long").collect()
        assert 0 < len(_stored(cluster, topic, 2)) < 600
        assert sum(r.n for r in df.mapInArrow(job(None), "n long").collect()) == 600
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    stored = _stored(cluster, topic, 2)
    counts = collections.Counter(v for v, _ in stored)
    assert sorted(counts) == sorted(str(i).encode() for i in range(600))
    assert set(counts.values()) == {1}
    assert all(h.producer_id >= sink.DERIVED_FLAG for _, h in stored)


def test_streaming_write_stamps_one_epoch_per_micro_batch(spark, broker_url, cluster, new_topic, tmp_path):
    """Executors see the micro-batch id (local property streaming.sql.batchId)."""
    source, target = new_topic(partitions=1), new_topic(partitions=1)
    cluster.produce_raw(source, 0, rb.build_batch([rb.Record(key=None, value=b"%d" % i) for i in range(30)]))
    q = (reader(spark, broker_url, subscribe=source, startingOffsets="earliest", maxOffsetsPerTrigger="10")
         .select("value").writeStream.format("kraftlog").option("kraftlog.bootstrap.servers", broker_url)
         .option("topic", target).option("kraftlog.enable.idempotence", "true").option("checkpointLocation", str(tmp_path / "chk"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    stored = _stored(cluster, target, 1)
    assert sorted(v for v, _ in stored) == sorted(b"%d" % i for i in range(30))
    assert {h.producer_epoch for _, h in stored} == {0, 1, 2}
    assert all(h.producer_id >= sink.DERIVED_FLAG and h.base_sequence >= 0 for _, h in stored)


def _schema():
    from pyspark.sql.types import StringType, StructField, StructType
    return StructType([StructField("key", StringType()), StructField("value", StringType())])


def test_idempotence_can_be_turned_off(broker_url, cluster, new_topic):
    topic = new_topic(partitions=1)
    options = _sink(broker_url, topic, **{"kraftlog.enable.idempotence": "false"})
    writer = sink.KraftlogWriter(options, _schema())
    assert writer.base_producer_id == -1
    rows = [(None, f"v{i}") for i in range(20)]
    sink.write_partition(options, _arrow(rows, 10), writer.base_producer_id, 0)
    sink.write_partition(options, _arrow(rows, 10), writer.base_producer_id, 0)
    stored = _stored(cluster, topic, 1)
    assert len(stored) == 40 and {h.producer_id for _, h in stored} == {-1}
