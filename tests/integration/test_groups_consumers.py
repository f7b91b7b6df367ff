"""Consumer groups with real processes: three consumer processes share six partitions
without overlap; one is killed with SIGKILL and its partitions move to the others within
the session timeout; committed offsets never go backwards; a consumer restarted with the
same group resumes where the group committed."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SESSION_MS = 1500
TOPIC = "six"


class ConsumerProc:
    """groups_consumer_proc.py in a child process; its JSON lines parsed by a reader thread."""

    def __init__(self, url: str, group: str, topic: str = TOPIC, session_ms: int = SESSION_MS) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "groups_consumer_proc.py"), url, group,
                                      topic, str(session_ms)], cwd=ROOT, stdout=subprocess.PIPE,
                                     env={**os.environ, "PYTHONPATH": ROOT}, text=True)
        self.assignment: set = set()
        self.assignment_changes = 0
        self.records: list = []
        self.closed = False
        self._reader = threading.Thread(target=self._read, daemon=True, name="ConsumerProc-reader")
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            doc = json.loads(line)
            if "assignment" in doc:
                self.assignment = {tuple(x) for x in doc["assignment"]}
                self.assignment_changes += 1
            elif "r" in doc:
                self.records.append(tuple(doc["r"]))
            elif "closed" in doc:
                self.closed = True

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(30)
        self._reader.join(10)   # the pipe closed with the process: the reader has read it all

    def kill(self) -> None:
        """kill -9 if still running, and wait for it and its reader thread (for `finally`)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._reader.join(10)


def produce(url: str, n: int, start: int = 0) -> None:
    status, doc = http("POST", f"{url}/v1/topics/{TOPIC}/records",
                       {"records": [{"value": f"v{i}", "partition": i % 6} for i in range(start, start + n)]})
    assert status == 200, doc


def committed(url: str, group: str) -> dict:
    status, doc = http("GET", f"{url}/v1/groups/{group}/offsets")
    assert status == 200, doc
    return {(e["topic"], e["partition"]): e["offset"] for e in doc["offsets"]}


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_three_consumer_processes_kill_9_and_resume(tmp_path):
    with ReplicatedCluster(str(tmp_path), brokers=1) as c:
        url = c.urls[0]
        c.create_topic(TOPIC, partitions=6, replication_factor=1)
        produce(url, 60)
        procs: list[ConsumerProc] = []
        all_tps = {(TOPIC, p) for p in range(6)}
        stop_watch = threading.Event()
        watcher = None
        try:
            procs.extend(ConsumerProc(url, "g") for _ in range(3))

            def balanced(ps):
                sets = [p.assignment for p in ps]
                return sum(map(len, sets)) == 6 and set().union(*sets) == all_tps

            wait_for(lambda: balanced(procs) and sorted(len(p.assignment) for p in procs) == [2, 2, 2], 20,
                     "three consumers with two partitions each")
            wait_for(lambda: sum(len(p.records) for p in procs) >= 60, 20, "the first 60 records consumed")
            # no overlap: every record went to exactly one consumer
            got = [r for p in procs for r in p.records]
            assert sorted(got) == sorted(set(got)) and len(set(got)) == 60
            # a watcher samples the committed offsets throughout the failover; it records what
            # goes wrong instead of asserting (an assert would only end its own thread)
            samples: list[dict] = []
            failures: list[str] = []

            def watch():
                while not stop_watch.is_set():
                    status, doc = http("GET", f"{url}/v1/groups/g/offsets")
                    if status != 200:
                        failures.append(f"offset fetch answered {status}: {doc}")
                    else:
                        now = {(e["topic"], e["partition"]): e["offset"] for e in doc["offsets"]}
                        if samples:
                            failures.extend(f"committed offset of {tp} went backwards: {off} -> {now.get(tp)}"
                                            for tp, off in samples[-1].items() if now.get(tp, 0) < off)
                        samples.append(now)
                    stop_watch.wait(0.05)
            watcher = threading.Thread(target=watch, daemon=True, name="committed-offsets-watcher")
            watcher.start()
            wait_for(lambda: committed(url, "g") == {tp: 10 for tp in all_tps}, 10, "offsets 10 committed")
            victim, survivors = procs[0], procs[1:]
            killed = time.monotonic()
            victim.stop(signal.SIGKILL)
            produce(url, 60, 60)
            wait_for(lambda: balanced(survivors), 15, "the survivors own all six partitions")
            moved_after = time.monotonic() - killed
            print(f"\npartitions of the killed consumer moved after {moved_after:.2f} s (session {SESSION_MS} ms)")
            # the session timeout plus a rebalance round, with room for two busy cores
            assert moved_after < SESSION_MS / 1000 + 5, f"partitions moved after {moved_after:.1f} s"
            wait_for(lambda: failures or (samples and samples[-1] == {tp: 20 for tp in all_tps}), 15,
                     "offsets 20 committed (as the watcher sees them)")
            stop_watch.set()
            watcher.join(30)
            assert not watcher.is_alive(), "the watcher did not stop"
            assert not failures, failures[:5]
            assert len(samples) >= 10, samples   # it watched the whole failover, from 10 to 20
            for p in survivors:
                p.stop()
                assert p.closed
            # restarted with the same group: resumes at the committed offsets (20 per partition)
            produce(url, 6, 120)
            again = ConsumerProc(url, "g")
            procs.append(again)
            wait_for(lambda: len(again.records) >= 6, 20, "the restarted consumer reads the new records")
            assert sorted(again.records[:6]) == [(p, 20) for p in range(6)]
            status, d = http("GET", f"{url}/v1/groups/g")
            assert status == 200 and d["state"] in ("stable", "reconciling") and len(d["members"]) == 1
        finally:
            stop_watch.set()
            if watcher is not None:
                watcher.join(30)
            for p in procs:
                p.kill()
