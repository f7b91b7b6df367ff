"""Exactly-once end to end on a real 3-broker cluster, with real crashes.

3 brokers (RF=3, min.insync.replicas=2) and a controller run as processes; an input topic
holds N records, each with its own sequence key. The processing process
(tests/spark/exactly_once_pipeline.py: kraftlog source -> map -> kraftlog sink, idempotent by
default, checkpointed) copies them to an output topic. While it runs:

1. kill -9 the leader of an output partition while a micro-batch is half written; the
   pipeline carries on through the leader change (ISR of 2 >= min.insync.replicas) and
   commits that micro-batch; the broker is started again and rejoins every ISR;
2. kill -9 the processing process (its whole process group: driver, JVM, Python workers)
   while a micro-batch is half written (some of its output is in the topic, the
   micro-batch is not in the checkpoint's commit log), then start it again on the same
   checkpoint: it replays that micro-batch, under the producer ids and epoch it used.

At the end the output topic holds every input record exactly once (no loss, no duplicate,
checked per sequence key), each transformed as the pipeline says.
"""
from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from partitions.log import record_batch as rb
from tests.rigs.cluster import ReplicatedCluster
from pipelines import sink
from pipelines.client import Cluster
from tests.spark.helpers import checkpoint_batch_ids, checkpoint_end_offsets, stored_records

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIPELINE = os.path.join(ROOT, "tests", "spark", "exactly_once_pipeline.py")
RECORDS = 3000
PARTITIONS = 3
PER_TRIGGER = 200            # 15 micro-batches
SLOW_PARTITION_S = 1.5       # first run: the task of input partition 2 waits, so batches stay half written


def _key(seq: int) -> bytes:
    return b"seq-%06d" % seq


def _value(seq: int) -> bytes:
    return b"v-%06d-" % seq + b"x" * 40


class PipelineProcess:
    """One run of the processing process in its own process group (kill -9 hits all of it)."""

    def __init__(self, log_path: str, args: list):
        self.log_path = log_path
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, PIPELINE, *args], cwd=ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-chars:]

    def kill9(self) -> None:
        """SIGKILL to the whole group (the driver, its JVM, the Python workers), then wait
        until none of them is left."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        raise AssertionError(f"processes of group {self.proc.pid} still alive 30 s after SIGKILL")


def _wait(pred, timeout_s: float, what: str, procs=(), interval_s: float = 0.1):
    """Poll `pred` until truthy; fails early (with the log) when a pipeline process exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got:
            return got
        for p in procs:
            if not p.alive():
                raise AssertionError(f"pipeline exited with {p.proc.returncode} while waiting for {what}:\n"
                                     f"{p.log_tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def test_exactly_once_across_broker_and_pipeline_kill_9(tmp_path):
    base = str(tmp_path / "cluster")
    checkpoint = str(tmp_path / "chk")
    source, target = "in-" + uuid.uuid4().hex[:8], "out-" + uuid.uuid4().hex[:8]
    runs: list[PipelineProcess] = []
    c = ReplicatedCluster(base, brokers=3, broker_config={"min_insync_replicas": 2})
    try:
        c.start()
        for topic in (source, target):
            c.create_topic(topic, partitions=PARTITIONS, replication_factor=3,
                           configs={"min.insync.replicas": "2"})
        client = Cluster(c.urls, client_id="exactly-once-test")
        for p in range(PARTITIONS):
            seqs = list(range(p, RECORDS, PARTITIONS))
            for i in range(0, len(seqs), 500):
                batch = rb.build_batch([rb.Record(key=_key(s), value=_value(s)) for s in seqs[i:i + 500]])
                client.produce_raw(source, p, batch, acks="all")
        assert sum(client.offsets(source, p)[1] for p in range(PARTITIONS)) == RECORDS

        def output_total() -> int:
            return sum(client.offsets(target, p)[1] for p in range(PARTITIONS))

        def committed_input(batch_id: int) -> int:
            """Input records consumed through micro-batch `batch_id` (-1: none)."""
            if batch_id < 0:
                return 0
            return sum(checkpoint_end_offsets(checkpoint, batch_id)[source].values())

        def half_written_batch():
            """The micro-batch being written when part of its output is in the topic: planned
            (offsets log), not committed, and the output is past the previous batch's end."""
            planned, done = checkpoint_batch_ids(checkpoint, "offsets"), checkpoint_batch_ids(checkpoint, "commits")
            if not planned or planned[-1] in done:
                return None
            n = planned[-1]
            return n if output_total() > committed_input(n - 1) else None

        args = ["--bootstrap", ",".join(c.urls), "--input", source, "--output", target,
                "--checkpoint", checkpoint, "--max-offsets-per-trigger", str(PER_TRIGGER)]
        first = PipelineProcess(str(tmp_path / "pipeline-1.log"),
                                args + ["--slow-partition", "2", "--slow-s", str(SLOW_PARTITION_S)])
        runs.append(first)
        _wait(lambda: checkpoint_batch_ids(checkpoint, "commits"), 120, "the first micro-batch", [first])

        # 1. kill -9 the leader of output partition 0 while a micro-batch is half written
        broker_kill_batch = _wait(half_written_batch, 60, "a half-written micro-batch", [first], 0.02)
        victim = c.partition(target, 0)["leader"]
        c.kill(victim)
        c.wait_for(lambda: c.partition(target, 0)["leader"] not in (victim, -1), 30,
                   f"a new leader for {target}-0")
        # the pipeline carries on with the broker down: that micro-batch and the next commit
        _wait(lambda: broker_kill_batch + 1 in checkpoint_batch_ids(checkpoint, "commits"), 90,
              f"micro-batch {broker_kill_batch + 1} committed with broker {victim} down", [first])
        c.start_broker(victim)
        c.wait_for(lambda: all(len(q["isr"]) == 3 for t in (source, target) for q in c.partition_list(t)),
                   60, f"broker {victim} back in every ISR")

        # 2. kill -9 the processing process while a micro-batch is half written
        crash_batch = _wait(half_written_batch, 60, "a half-written micro-batch", [first], 0.02)
        first.kill9()
        written_at_crash = output_total()
        assert crash_batch not in checkpoint_batch_ids(checkpoint, "commits")
        assert written_at_crash > committed_input(crash_batch - 1), "the micro-batch was not half written"
        assert committed_input(crash_batch) < RECORDS, "nothing left for the restarted run"

        second = PipelineProcess(str(tmp_path / "pipeline-2.log"), args)
        runs.append(second)
        second.proc.wait(240)
        assert second.proc.returncode == 0, second.log_tail()
        progress_line = next(line for line in second.log_tail(100_000).splitlines() if line.startswith("PROGRESS "))
        replayed = [b["batchId"] for b in json.loads(progress_line[len("PROGRESS "):])]
        assert replayed[0] == crash_batch, (replayed, crash_batch)  # the half-written batch ran again

        # every input record exactly once in the output, transformed
        stored = stored_records(client, target, PARTITIONS)
        counts = collections.Counter(key for _, _, key, _, _ in stored)
        duplicates = {k: n for k, n in counts.items() if n > 1}
        missing = sorted(set(_key(s) for s in range(RECORDS)) - set(counts))
        assert not duplicates and not missing, (
            f"{len(duplicates)} keys written more than once (e.g. {sorted(duplicates.items())[:5]}), "
            f"{len(missing)} missing (e.g. {missing[:5]}); broker {victim} killed in micro-batch "
            f"{broker_kill_batch}, pipeline killed in micro-batch {crash_batch}")
        assert len(stored) == RECORDS
        assert all(value == b"out:" + _value(int(key[4:])) for _, _, key, value, _ in stored)
        # written by the idempotent path (derived producer ids), not the at-least-once fallback
        assert all(h.producer_id >= sink.DERIVED_FLAG for *_, h in stored)
        print(f"broker {victim} killed in micro-batch {broker_kill_batch}; pipeline killed in micro-batch "
              f"{crash_batch} with {written_at_crash - committed_input(crash_batch - 1)} of its "
              f"{committed_input(crash_batch) - committed_input(crash_batch - 1)} records written; "
              f"restarted run: micro-batches {replayed[0]}..{replayed[-1]}")
    finally:
        for run in runs:
            if run.alive():
                run.kill9()
        c.close()
