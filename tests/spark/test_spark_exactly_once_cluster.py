"""Exactly-once end to end on a real 3-broker cluster, with real crashes.

3 brokers (RF=3, min.insync.replicas=2) and a controller run as processes; an input topic
holds N records, each with its own sequence key. The processing process
(tests/spark/exactly_once_pipeline.py: kraftlog source -> map -> kraftlog sink, idempotent by
default, checkpointed, local[2,4]) copies them to an output topic.

Its first run holds the task of input partition 2 of each micro-batch after its last row,
before its sink sends anything, until the test releases it; so "half written" (the other
tasks' output in the topic, the micro-batch not in the checkpoint's commit log) is a state
the test waits for, not a race:

1. micro-batch 1 half written: SIGSTOP the leader of output partition 0, release the held
   task, and once its produce request to that leader waits unread at the stopped broker,
   kill -9 the broker; the pipeline carries on through the leader change (ISR of 2 >=
   min.insync.replicas) and commits micro-batch 1, its output exactly once; the broker is
   started again while micro-batch 2 is half written and rejoins every ISR;
2. micro-batch 2 half written: kill -9 the processing process tree (driver, JVM, Spark's
   Python daemon and workers), then start it again on the same checkpoint, without the
   hold: it replays micro-batch 2, under the producer ids and epoch it used before, and runs
   on to the end of the input.

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
from pipelines import sink
from pipelines.client import Cluster
from tests.rigs.cluster import ReplicatedCluster
from tests.spark.helpers import checkpoint_batch_ids, checkpoint_end_offsets, stored_records

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIPELINE = os.path.join(ROOT, "tests", "spark", "exactly_once_pipeline.py")
RECORDS = 1500
PARTITIONS = 3
PER_TRIGGER = 300            # 5 micro-batches of 100 records per input partition (0-2: the faults, 3-4 after them)
HELD = 2                     # first run: the task of input partition 2 waits to be released


def _key(seq: int) -> bytes:
    return b"seq-%06d" % seq


def _value(seq: int) -> bytes:
    return b"v-%06d-" % seq + b"x" * 40


def _children() -> dict:
    """{parent pid: [child pids]} of every process visible in /proc."""
    out = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            out[ppid].append(int(name))
    return out


def _alive(pid: int) -> bool:
    """Running or stopped, not gone and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _tcp_sockets() -> list:
    """(local port, remote port, ESTABLISHED, receive queue bytes, inode) of each TCP socket."""
    out = []
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            out.append((int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16), f[3] == "01",
                        int(f[4].split(":")[1], 16), int(f[9])))
    return out


class PipelineProcess:
    """One run of the processing process. Spark's Python daemon puts itself and its workers
    in a process group of their own, so the process tree is walked (by pid) to kill it all."""

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

    def tree(self) -> set:
        """This process and all its descendants."""
        children, out, todo = _children(), set(), [self.proc.pid]
        while todo:
            pid = todo.pop()
            if pid not in out:
                out.add(pid)
                todo += children.get(pid, [])
        return out

    def has_request_waiting_at(self, port: int) -> bool:
        """A connection from this process tree to `port` has bytes its server has not read
        (a request sent to a broker that is stopped)."""
        inodes = set()
        for pid in self.tree():
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(int(link[8:-1]))
            except OSError:
                continue
        sockets = _tcp_sockets()
        mine = {lport for lport, rport, est, _, inode in sockets if est and rport == port and inode in inodes}
        return any(est and lport == port and rport in mine and rx > 0 for lport, rport, est, rx, _ in sockets)

    def kill9(self) -> None:
        """A crash of the whole processing side at once: SIGSTOP the tree (no process forks
        or writes any more), then SIGKILL every process of it; returns once none is left."""
        stopped: set = set()
        while True:
            pids = {p for p in self.tree() if _alive(p)} - stopped
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
            stopped |= pids
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in stopped):
            if time.monotonic() > deadline:
                raise AssertionError(f"{sorted(p for p in stopped if _alive(p))} alive 30 s after SIGKILL")
            time.sleep(0.1)


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
    # a long broker session: the stopped broker must still lead output partition 0 when the
    # released task sends to it (after kill -9, followers' refused fetches fence it at once)
    c = ReplicatedCluster(base, brokers=3, broker_config={"min_insync_replicas": 2},
                          controller_args=["--broker-session-timeout-ms", "60000"])
    t0 = time.monotonic()
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
        print(f"\n{time.monotonic() - t0:6.1f} s  cluster up, {RECORDS} input records written")

        def output_total() -> int:
            return sum(client.offsets(target, p)[1] for p in range(PARTITIONS))

        def consumed(batch_id: int, partitions=range(PARTITIONS)) -> int:
            """Input records of `partitions` consumed through micro-batch `batch_id` (-1: none)."""
            if batch_id < 0:
                return 0
            ends = checkpoint_end_offsets(checkpoint, batch_id)[source]
            return sum(ends[str(p)] for p in partitions)

        def half_written(batch_id: int, procs) -> int:
            """Wait until the task of input partition 2 of micro-batch `batch_id` has read its
            input and is held, and the other tasks have written their output; the output's size."""
            _wait(lambda: os.path.exists(os.path.join(hold_dir, f"held-{batch_id}")), 120,
                  f"the task of input partition {HELD} in micro-batch {batch_id} held", procs)
            held = consumed(batch_id, [HELD]) - consumed(batch_id - 1, [HELD])
            assert held > 0, f"micro-batch {batch_id} reads nothing from input partition {HELD}"
            want = consumed(batch_id - 1) + sum(consumed(batch_id, [p]) - consumed(batch_id - 1, [p])
                                                for p in range(PARTITIONS) if p != HELD)
            got = _wait(lambda: (lambda n: n if n >= want else None)(output_total()), 120,
                        f"micro-batch {batch_id} half written ({want} output records)", procs)
            assert batch_id not in checkpoint_batch_ids(checkpoint, "commits")
            return got

        def assert_exactly_once(upto_batch: int) -> list:
            """Every input record consumed through micro-batch `upto_batch` is in the output
            exactly once, transformed; returns the stored output records."""
            ends = checkpoint_end_offsets(checkpoint, upto_batch)[source]
            want = {_key(p + PARTITIONS * i) for p in range(PARTITIONS) for i in range(ends[str(p)])}
            stored = stored_records(client, target, PARTITIONS)
            counts = collections.Counter(key for _, _, key, _, _ in stored)
            duplicates = sorted((k, n) for k, n in counts.items() if n > 1)
            missing = sorted(want - set(counts))
            assert not duplicates and not missing, (
                f"through micro-batch {upto_batch}: {len(duplicates)} keys written more than once (e.g. "
                f"{duplicates[:5]}), {len(missing)} of {len(want)} missing (e.g. {missing[:5]})")
            assert all(value == b"out:" + _value(int(key[4:])) for _, _, key, value, _ in stored)
            return stored

        def release(batch_id: int) -> None:
            open(os.path.join(hold_dir, f"release-{batch_id}"), "w").close()

        def elapsed(what: str) -> None:
            print(f"{time.monotonic() - t0:6.1f} s  {what}")

        # the broker to kill leads output partition 0; it is the last bootstrap server, so
        # metadata requests do not wait on it while it is stopped
        victim = c.partition(target, 0)["leader"]
        bootstrap = [c.url(b) for b in sorted(c.ports) if b != victim] + [c.url(victim)]
        args = ["--bootstrap", ",".join(bootstrap), "--input", source, "--output", target,
                "--checkpoint", checkpoint, "--max-offsets-per-trigger", str(PER_TRIGGER)]
        hold_dir = str(tmp_path / "hold")
        os.makedirs(hold_dir)
        release(0)
        first = PipelineProcess(str(tmp_path / "pipeline-1.log"),
                                args + ["--hold-dir", hold_dir, "--hold-partition", str(HELD)])
        runs.append(first)
        _wait(lambda: 0 in checkpoint_batch_ids(checkpoint, "commits"), 180, "micro-batch 0 committed", [first])
        elapsed("micro-batch 0 committed")

        # 1. micro-batch 1 half written: the held task's rows go to the leader of output
        # partition 0 first. Stop that broker, release the task, and kill -9 the broker while
        # the task's produce request waits at it.
        half_written(1, [first])
        assert c.partition(target, 0)["leader"] == victim
        c.signal(victim, signal.SIGSTOP)
        release(1)
        _wait(lambda: first.has_request_waiting_at(c.ports[victim]), 60,
              f"a produce request from the pipeline waiting at stopped broker {victim}", [first], 0.02)
        c.kill(victim)
        c.wait_for(lambda: c.partition(target, 0)["leader"] not in (victim, -1), 30,
                   f"a new leader for {target}-0")
        elapsed(f"broker {victim} killed with a produce request in flight, {target}-0 has a new leader")
        _wait(lambda: 1 in checkpoint_batch_ids(checkpoint, "commits"), 120,
              f"micro-batch 1 committed with broker {victim} down", [first])
        assert_exactly_once(1)
        elapsed("micro-batch 1 committed, its output exactly once")
        half_written(2, [first])
        c.start_broker(victim)
        c.wait_for(lambda: all(len(q["isr"]) == 3 for t in (source, target) for q in c.partition_list(t)),
                   60, f"broker {victim} back in every ISR")
        elapsed(f"broker {victim} back in every ISR")

        # 2. kill -9 the processing process while micro-batch 2 is half written
        crash_batch = 2
        first.kill9()
        written_at_crash = output_total()
        assert crash_batch not in checkpoint_batch_ids(checkpoint, "commits")
        assert consumed(crash_batch - 1) < written_at_crash < consumed(crash_batch), "not half written"
        elapsed("pipeline killed")

        second = PipelineProcess(str(tmp_path / "pipeline-2.log"), args)
        runs.append(second)
        second.proc.wait(240)
        assert second.proc.returncode == 0, second.log_tail()
        elapsed("restarted pipeline done")
        progress_line = next(line for line in second.log_tail(100_000).splitlines() if line.startswith("PROGRESS "))
        replayed = [b["batchId"] for b in json.loads(progress_line[len("PROGRESS "):])]
        assert replayed[0] == crash_batch, (replayed, crash_batch)  # the half-written batch ran again

        # every input record exactly once in the output, transformed
        assert checkpoint_end_offsets(checkpoint, replayed[-1])[source] == {str(p): RECORDS // PARTITIONS
                                                                            for p in range(PARTITIONS)}
        stored = assert_exactly_once(replayed[-1])
        assert len(stored) == RECORDS
        # written by the idempotent path (derived producer ids), not the at-least-once fallback
        assert all(h.producer_id >= sink.DERIVED_FLAG for *_, h in stored)
        print(f"pipeline killed with {written_at_crash - consumed(crash_batch - 1)} of micro-batch {crash_batch}'s "
              f"{consumed(crash_batch) - consumed(crash_batch - 1)} records written; restarted run: micro-batches "
              f"{replayed[0]}..{replayed[-1]}")
    finally:
        for run in runs:
            run.kill9()
        c.close()
