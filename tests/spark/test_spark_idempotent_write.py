"""Writes go through the idempotent producer by default: a retried task does not duplicate
records, whatever order its rows come in, and never drops rows silently.

A task dying part-way through its write is simulated two ways: in-process, a task whose
Cluster dies after N produce requests (then the same task runs again, rows reordered); and
with real Spark task retries (the shared session runs `local[2,4]`: 2 cores, 4 attempts),
where the testing failpoint option makes attempt 0 of every task die after N requests and
a mapInArrow step hands attempt 1 its rows in another order.
"""
from __future__ import annotations

import collections
import json
import os

import pyarrow as pa
import pytest

from partitions.log import record_batch as rb
from pipelines import options as opt
from pipelines import sink
from pipelines.client import Cluster
from tests.spark.helpers import reader

pytestmark = [pytest.mark.spark, pytest.mark.integration]

SCHEMA = "key string, value string"


def _sink(url, topic, **extra):
    """Sink options as a user writes them (idempotence is the default)."""
    return opt.parse_sink_options({"kraftlog.bootstrap.servers": url, "topic": topic, **extra})


def _arrow(rows, per_batch):
    """Input as Spark hands it to a task: Arrow batches of `per_batch` rows."""
    for i in range(0, len(rows), per_batch):
        chunk = rows[i:i + per_batch]
        yield pa.RecordBatch.from_arrays([pa.array([k for k, _ in chunk], pa.string()),
                                          pa.array([v for _, v in chunk], pa.string())], ["key", "value"])


def _dying_cluster(url, after_requests):
    """A Cluster whose produce requests fail after `after_requests`: a task attempt that dies
    part-way through its write (an executor lost)."""
    c = Cluster([url], client_id="dying-task")
    real, sent = c.produce_raw, [0]

    def produce_raw(*args, **kwargs):
        if sent[0] >= after_requests:
            raise RuntimeError("task attempt 0 dies here")
        sent[0] += 1
        return real(*args, **kwargs)

    c.produce_raw = produce_raw
    return c


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


@pytest.fixture
def small_requests(monkeypatch):
    """Requests of ~2 KiB and batches of ~1 KiB, so a few hundred rows make many of both."""
    monkeypatch.setattr(sink, "request_bytes_max_default", 2048)
    return {"kraftlog.batch.size": "1024"}


def test_retried_task_stores_each_row_once_in_any_order(broker_url, cluster, new_topic, small_requests):
    topic = new_topic(partitions=2)
    # unique keys (crc32c routing) and keyless rows (routed by value when idempotent)
    rows = [(None if i % 3 == 0 else f"k{i}", f"v{i}-" + "x" * 40) for i in range(400)]
    options = _sink(broker_url, topic, **small_requests)
    writer = sink.KraftlogWriter(options, _schema())
    assert writer.base_producer_id >= 0

    with pytest.raises(RuntimeError, match="dies here"):
        sink.write_partition(options, _arrow(rows, 25), writer.base_producer_id, 3,
                             cluster=_dying_cluster(broker_url, 6))
    written = len(_stored(cluster, topic, 2))
    assert 100 <= written < 400  # part of the rows made it, over 5 batches on a partition

    retry = list(reversed(rows))  # e.g. after a shuffle: other order, same rows
    msg = sink.write_partition(options, _arrow(retry, 30), writer.base_producer_id, 3)
    assert msg.total == 400
    assert msg.verified_duplicates > 0 and msg.unverified_duplicates > 0  # both kinds were resent
    stored = _stored(cluster, topic, 2)
    assert sorted(v for v, _ in stored) == sorted(v.encode() for _, v in rows)
    assert {h.producer_id for _, h in stored} == {sink.derived_producer_id(writer.base_producer_id, 3, None)[0]}

    # another task (partition id) with the same rows is another producer: appended again
    sink.write_partition(options, _arrow(rows, 25), writer.base_producer_id, 4)
    assert len(_stored(cluster, topic, 2)) == 800


def test_a_retry_with_other_rows_fails_instead_of_dropping_rows(broker_url, cluster, new_topic, small_requests):
    topic = new_topic(partitions=1)
    options = _sink(broker_url, topic, **small_requests)
    base = sink.KraftlogWriter(options, _schema()).base_producer_id
    rows = [(None, f"v{i:04d}-" + "x" * 40) for i in range(200)]
    with pytest.raises(RuntimeError, match="dies here"):
        sink.write_partition(options, _arrow(rows, 50), base, 0, cluster=_dying_cluster(broker_url, 2))
    before = [v for v, _ in _stored(cluster, topic, 1)]
    assert 0 < len(before) < 200
    # a non-deterministic input: the retry computes a different first row
    changed = [(None, "v0000-recomputed-" + "x" * 40)] + rows[1:]
    with pytest.raises(sink.NonDeterministicRetryError, match="kraftlog.enable.idempotence=false"):
        sink.write_partition(options, _arrow(changed, 50), base, 0)
    assert [v for v, _ in _stored(cluster, topic, 1)] == before  # nothing silently dropped or added

    # rows of one key keep their input order (Kafka's per-key order), so swapping two
    # updates of a key is a different write too
    topic2 = new_topic(partitions=1)
    options2 = _sink(broker_url, topic2, **small_requests)
    updates = [("user-1", f"update-{i:03d}-" + "x" * 40) for i in range(120)]
    with pytest.raises(RuntimeError, match="dies here"):
        sink.write_partition(options2, _arrow(updates, 40), base, 1, cluster=_dying_cluster(broker_url, 2))
    swapped = [updates[1], updates[0]] + updates[2:]
    with pytest.raises(sink.NonDeterministicRetryError):
        sink.write_partition(options2, _arrow(swapped, 40), base, 1)


def test_canonical_order_depends_only_on_the_rows_and_keeps_per_key_order():
    import random
    rows = [(None, b"x%d" % (i % 7)) for i in range(30)] + [(b"k%d" % (i % 4), b"u%d" % i) for i in range(30)]
    rng = random.Random(5)

    def ordered(rs):
        keys = pa.array([k for k, _ in rs], pa.binary())
        values = pa.array([v for _, v in rs], pa.binary())
        k, v, _ = sink._canonical_order(keys, values, None)
        return list(zip(k.to_pylist(), v.to_pylist()))

    reference = ordered(rows)
    for _ in range(5):
        shuffled = rows[:]
        rng.shuffle(shuffled)
        # a shuffle that keeps each key's updates in order (what a deterministic per-key source gives)
        per_key = collections.defaultdict(collections.deque)
        for k, v in rows:
            per_key[k].append(v)
        replay = [(k, per_key[k].popleft()) if k is not None else (k, v) for k, v in shuffled]
        assert ordered(replay) == reference
    keyed = [(k, v) for k, v in reference if k is not None]
    assert [v for k, v in keyed if k == b"k1"] == [b"u%d" % i for i in range(30) if i % 4 == 1]
    # the fast paths: only keyed rows (stable by key), only keyless rows (by value)
    only_keyed = [r for r in rows if r[0] is not None]
    interleaved = sorted(only_keyed, key=lambda r: int(r[1][1:]) % 3)  # another order of the same rows
    per_key_ok = all([v for k, v in interleaved if k == kk] == [v for k, v in only_keyed if k == kk]
                     for kk in {k for k, _ in only_keyed})
    assert per_key_ok is False  # this reordering swaps updates of a key: it must give another order
    assert ordered(interleaved) != ordered(only_keyed)
    assert [v for k, v in ordered(only_keyed) if k == b"k2"] == [b"u%d" % i for i in range(30) if i % 4 == 2]
    only_keyless = [r for r in rows if r[0] is None]
    assert ordered(only_keyless[::-1]) == ordered(only_keyless) == sorted(only_keyless, key=lambda r: r[1])


def test_an_idempotent_task_over_its_buffer_limit_says_what_to_do(broker_url, new_topic):
    topic = new_topic(partitions=1)
    options = _sink(broker_url, topic, **{"kraftlog.idempotence.buffer.max.bytes": "2048"})
    rows = [(None, "x" * 100) for _ in range(50)]
    with pytest.raises(ValueError, match="repartition"):
        sink.write_partition(options, _arrow(rows, 10), 1, 0)


def test_retried_micro_batch_task_stores_each_row_once(broker_url, cluster, new_topic, small_requests):
    topic = new_topic(partitions=1)
    options = _sink(broker_url, topic, **small_requests)
    writer = sink.KraftlogStreamWriter(options, _schema())
    batch0 = [(None, f"a{i:03d}-" + "x" * 40) for i in range(150)]
    batch1 = [(None, f"b{i:03d}-" + "x" * 40) for i in range(150)]
    base = writer.base_producer_id
    with pytest.raises(RuntimeError):
        sink.write_partition(options, _arrow(batch0, 10), base, 0, batch_id=7, cluster=_dying_cluster(broker_url, 2))
    sink.write_partition(options, _arrow(batch0[::-1], 10), base, 0, batch_id=7)
    sink.write_partition(options, _arrow(batch1, 10), base, 0, batch_id=8)  # next epoch, sequence 0
    sink.write_partition(options, _arrow(batch1, 10), base, 0, batch_id=8)  # retried again
    stored = _stored(cluster, topic, 1)
    assert [v for v, _ in stored] == [v.encode() for _, v in batch0 + batch1]  # canonical (sorted) order
    assert {h.producer_epoch for _, h in stored} == {7, 8}


def test_a_restarted_query_replays_a_micro_batch_without_duplicates(broker_url, cluster, new_topic, tmp_path):
    """The driver dies after a micro-batch was written but before it was committed to the
    checkpoint; the restarted query re-runs the same batchId with a new writer object."""
    topic = new_topic(partitions=2)
    checkpoint = str(tmp_path / "chk")
    options = _sink(broker_url, topic, checkpointLocation=checkpoint)
    rows = [(f"k{i}", f"v{i}") for i in range(100)]
    first = sink.KraftlogStreamWriter(options, _schema())
    for part in (0, 1):
        sink.write_partition(options, _arrow(rows[part::2], 20), first.base_producer_id, part, batch_id=3)
    with open(os.path.join(checkpoint, sink.checkpoint_file_name)) as f:
        assert json.load(f) == {"base_producer_id": first.base_producer_id}

    restarted = sink.KraftlogStreamWriter(_sink(broker_url, topic, checkpointLocation="file:" + checkpoint), _schema())
    assert restarted.base_producer_id == first.base_producer_id
    for part in (1, 0):
        sink.write_partition(options, _arrow(rows[part::2][::-1], 20), restarted.base_producer_id, part, batch_id=3)
    stored = _stored(cluster, topic, 2)
    assert sorted(v for v, _ in stored) == sorted(v.encode() for _, v in rows)

    other = sink.KraftlogStreamWriter(_sink(broker_url, topic, checkpointLocation=str(tmp_path / "other")), _schema())
    assert other.base_producer_id != first.base_producer_id  # another query, another producer


def test_spark_retries_a_task_that_died_mid_write_without_duplicates(spark, broker_url, cluster, new_topic):
    """Real task retries (local[2,4]): attempt 0 of each task dies after 2 produce requests;
    attempt 1 gets its rows in reverse order."""
    assert spark.sparkContext.master == "local[2,4]"
    topic = new_topic(partitions=3)

    def reorder_on_retry(batches):
        from pyspark import TaskContext
        batches = list(batches)
        if TaskContext.get().attemptNumber() > 0:
            batches = [b.slice(b.num_rows - 1 - i, 1) for b in reversed(batches) for i in range(b.num_rows)]
        yield from batches

    df = (spark.range(0, 3000, numPartitions=2)
          .selectExpr("IF(id % 3 = 0, NULL, CONCAT('k', CAST(id AS STRING))) AS key", "CAST(id AS STRING) AS value")
          .mapInArrow(reorder_on_retry, SCHEMA))

    def write(to, idempotence):
        (df.write.format("kraftlog").option("kraftlog.bootstrap.servers", broker_url).option("topic", to)
         .option("kraftlog.batch.size", "1024").option("kraftlog.enable.idempotence", idempotence)
         .option("kraftlog.linger.records", "200")
         .option("kraftlog.failpoint.first.attempt.fail.after.requests", "2").mode("append").save())

    write(topic, "true")
    stored = _stored(cluster, topic, 3)
    counts = collections.Counter(v for v, _ in stored)
    assert sorted(counts) == sorted(str(i).encode() for i in range(3000))
    assert set(counts.values()) == {1}
    assert all(h.producer_id >= sink.DERIVED_FLAG for _, h in stored)

    # control: the same failing first attempts at-least-once write what they sent twice
    control = new_topic(partitions=3)
    write(control, "false")
    counts = collections.Counter(v for v, _ in _stored(cluster, control, 3))
    assert sorted(counts) == sorted(str(i).encode() for i in range(3000))
    assert max(counts.values()) == 2


def test_streaming_write_stamps_one_epoch_per_micro_batch(spark, broker_url, cluster, new_topic, tmp_path):
    """Executors see the micro-batch id (local property streaming.sql.batchId)."""
    source, target = new_topic(partitions=1), new_topic(partitions=1)
    cluster.produce_raw(source, 0, rb.build_batch([rb.Record(key=None, value=b"%d" % i) for i in range(30)]))
    q = (reader(spark, broker_url, subscribe=source, startingOffsets="earliest", maxOffsetsPerTrigger="10")
         .select("value").writeStream.format("kraftlog").option("kraftlog.bootstrap.servers", broker_url)
         .option("topic", target).option("checkpointLocation", str(tmp_path / "chk"))
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


def test_keyless_rows_of_several_topics_route_the_same_in_any_order(broker_url, new_topic):
    """Idempotent routing of keyless rows must not depend on which topic a task saw first."""
    topics = [new_topic(partitions=3), new_topic(partitions=3)]
    options = _sink(broker_url, None)

    def routed(rows):
        producer = sink.PartitionedProducer(options, sink.IdempotentIdentity(1 << 62, 0), seed=5)
        for topic, value in rows:
            producer.append_batch(pa.RecordBatch.from_arrays(
                [pa.array([topic], pa.string()), pa.array([value], pa.string())], ["topic", "value"]))
        producer._route_keyless()
        return {tp: sorted(v for c in chunks for v in c[1].to_pylist()) for tp, chunks in producer._pending.items()}

    rows = [(topics[i % 2], f"v{i}") for i in range(40)]
    assert routed(rows) == routed(rows[::-1])
    assert len(routed(rows)) == 6  # every partition of both topics got a block
