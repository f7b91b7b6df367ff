"""The transactional sink (`kraftlog.transactional.id`, issue 18): a streaming query killed
mid-batch and restarted writes each input record exactly once, as a read_committed reader
sees the output.

One broker and a controller run as processes; an input topic holds N records, each with its
own sequence key. The processing process (tests/spark/exactly_once_pipeline.py with
`--sink-option kraftlog.transactional.id=<query>`) copies them to an output topic, each task
of a micro-batch as one transaction under `<query>-<Spark partition>`. Its first run holds the
task of input partition 2 of micro-batch 0 before its sink writes; once the other tasks'
transactions are committed (read_committed shows their output) and the micro-batch is not in
the checkpoint's commit log, the whole processing process is killed with kill -9. The second
run replays micro-batch 0: the tasks whose transaction committed find their micro-batch
marker and write nothing, the held one writes its rows (fencing the killed run's producer of
its id), and the run goes on to the end of the input. Then: every input record exactly once
under read_committed, every output batch transactional, and each task's marker at the last
micro-batch.
"""
from __future__ import annotations

import collections
import json
import os
import time
import uuid

import pytest

from partitions.log import record_batch as rb
from pipelines.client import RAW_BATCH_TYPE, Cluster
from tests.rigs.cluster import ReplicatedCluster
from tests.spark.helpers import checkpoint_batch_ids, checkpoint_end_offsets
from tests.spark.test_spark_exactly_once_cluster import PipelineProcess, _wait

# two Spark JVM start-ups on a loaded 2-core machine: generous
pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

RECORDS = 300
PARTITIONS = 3
PER_TRIGGER = 150            # 2 micro-batches of 50 records per input partition
HELD = 2                     # first run: the task of input partition 2 waits to be released


def _key(seq: int) -> bytes:
    return b"seq-%06d" % seq


def _value(seq: int) -> bytes:
    return b"v-%06d" % seq


def read_committed(client: Cluster, topic: str) -> list:
    """Every record of `topic` a read_committed reader gets: (key, value, batch header)."""
    out = []
    for p in range(PARTITIONS):
        offset = 0
        while True:
            _, hdrs, data = client.partition_call(
                topic, p, "GET", "records", query={"offset": offset, "max_bytes": 1 << 20, "max_wait_ms": 0,
                                                   "isolation_level": "read_committed"},
                headers={"Accept": RAW_BATCH_TYPE})
            lso = int(hdrs.get("x-kraftlog-last-stable-offset", -1))
            for header, view in rb.iter_batches(data):
                for r in rb.decode_records(bytes(view)):
                    if r.offset >= offset:
                        out.append((r.key, r.value, header))
            nxt = int(hdrs.get("x-kraftlog-next-offset", offset))
            if nxt >= lso or nxt <= offset:
                break
            offset = nxt
    return out


def test_transactional_stream_killed_mid_batch_writes_each_record_once(tmp_path):
    checkpoint = str(tmp_path / "chk")
    source, target = "in-" + uuid.uuid4().hex[:8], "out-" + uuid.uuid4().hex[:8]
    query_id = "q-" + uuid.uuid4().hex[:8]
    runs: list[PipelineProcess] = []
    c = ReplicatedCluster(str(tmp_path / "cluster"), brokers=1)
    t0 = time.monotonic()
    try:
        c.start()
        for topic in (source, target):
            c.create_topic(topic, partitions=PARTITIONS, replication_factor=1)
        client = Cluster(c.urls, client_id="transactional-sink-test")
        for p in range(PARTITIONS):
            seqs = list(range(p, RECORDS, PARTITIONS))
            client.produce_raw(source, p, rb.build_batch([rb.Record(key=_key(s), value=_value(s)) for s in seqs]))

        def consumed(batch_id: int, partitions=range(PARTITIONS)) -> int:
            if batch_id < 0:
                return 0
            ends = checkpoint_end_offsets(checkpoint, batch_id)[source]
            return sum(ends[str(p)] for p in partitions)

        def committed_keys() -> collections.Counter:
            return collections.Counter(k for k, _, _ in read_committed(client, target))

        hold_dir = str(tmp_path / "hold")
        os.makedirs(hold_dir)
        args = ["--bootstrap", ",".join(c.urls), "--input", source, "--output", target, "--checkpoint", checkpoint,
                "--max-offsets-per-trigger", str(PER_TRIGGER), "--sink-option", f"kraftlog.transactional.id={query_id}"]
        first = PipelineProcess(str(tmp_path / "pipeline-1.log"),
                                args + ["--hold-dir", hold_dir, "--hold-partition", str(HELD)])
        runs.append(first)
        _wait(lambda: os.path.exists(os.path.join(hold_dir, "held-0")), 400, "micro-batch 0's task held", [first])
        # the other tasks of micro-batch 0 committed their transactions: read_committed shows them
        want = sum(consumed(0, [p]) for p in range(PARTITIONS) if p != HELD)
        _wait(lambda: sum(committed_keys().values()) >= want, 240,
              f"micro-batch 0 half committed ({want} records visible)", [first], 0.3)
        assert 0 not in checkpoint_batch_ids(checkpoint, "commits")
        first.kill9()
        at_crash = sum(committed_keys().values())
        assert 0 < at_crash < consumed(0), "not half written"
        print(f"\n{time.monotonic() - t0:6.1f} s  pipeline killed with micro-batch 0 half committed "
              f"({at_crash} of {consumed(0)} records)")

        second = PipelineProcess(str(tmp_path / "pipeline-2.log"), args)
        runs.append(second)
        second.proc.wait(400)
        assert second.proc.returncode == 0, second.log_tail()
        progress_line = next(line for line in second.log_tail(100_000).splitlines() if line.startswith("PROGRESS "))
        replayed = [b["batchId"] for b in json.loads(progress_line[len("PROGRESS "):])]
        assert replayed[0] == 0, replayed   # the half-committed micro-batch ran again
        print(f"{time.monotonic() - t0:6.1f} s  restarted run: micro-batches {replayed}")

        assert checkpoint_end_offsets(checkpoint, replayed[-1])[source] == {
            str(p): RECORDS // PARTITIONS for p in range(PARTITIONS)}
        stored = read_committed(client, target)
        counts = collections.Counter(k for k, _, _ in stored)
        duplicates = sorted((k, n) for k, n in counts.items() if n > 1)
        missing = sorted({_key(s) for s in range(RECORDS)} - set(counts))
        assert not duplicates and not missing, (f"{len(duplicates)} keys written more than once (e.g. "
                                                f"{duplicates[:5]}), {len(missing)} missing (e.g. {missing[:5]})")
        assert all(v == b"out:" + _value(int(k[4:])) for k, v, _ in stored)
        assert all(h.is_transactional for _, _, h in stored)   # written in transactions
        # each task's micro-batch marker is at the last micro-batch
        for p in range(PARTITIONS):
            _, _, data = client._any_broker("GET", f"/v1/groups/kraftlog-sink-{query_id}-{p}/offsets",
                                            headers={"Accept": "application/json"})
            assert max(o["offset"] for o in json.loads(data)["offsets"]) == replayed[-1] + 1
    finally:
        for run in runs:
            run.kill9()
        c.close()
