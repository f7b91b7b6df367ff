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
        threading.Thread(target=self._read, daemon=True).start()

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
        procs = [ConsumerProc(url, "g") for _ in range(3)]
        all_tps = {(TOPIC, p) for p in range(6)}
        try:
            def balanced(ps):
                sets = [p.assignment for p in ps]
                return sum(map(len, sets)) == 6 and set().union(*sets) == all_tps

            wait_for(lambda: balanced(procs) and sorted(len(p.assignment) for p in procs) == [2, 2, 2], 20,
                     "three consumers with two partitions each")
            wait_for(lambda: sum(len(p.records) for p in procs) >= 60, 20, "the first 60 records consumed")
            # no overlap: every record went to exactly one consumer
            got = [r for p in procs for r in p.records]
            assert sorted(got) == sorted(set(got)) and len(set(got)) == 60
            history = []
            stop_watch = threading.Event()

            def watch():
                while not stop_watch.is_set():
                    history.append(committed(url, "g"))
                    time.sleep(0.05)
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            wait_for(lambda: committed(url, "g") == {tp: 10 for tp in all_tps}, 10, "offsets 10 committed")
            victim, survivors = procs[0], procs[1:]
            killed = time.monotonic()
            victim.stop(signal.SIGKILL)
            produce(url, 60, 60)
            wait_for(lambda: balanced(survivors), 15, "the survivors own all six partitions")
            moved_after = time.monotonic() - killed
            print(f"\npartitions of the killed consumer moved after {moved_after:.2f} s (session {SESSION_MS} ms)")
            assert moved_after < SESSION_MS / 1000 + 2.5, f"partitions moved after {moved_after:.1f} s"
            wait_for(lambda: committed(url, "g") == {tp: 20 for tp in all_tps}, 15, "offsets 20 committed")
            stop_watch.set()
            watcher.join(5)
            for a, b in zip(history, history[1:]):
                for tp, off in a.items():
                    assert b.get(tp, 0) >= off, f"committed offset of {tp} went backwards: {off} -> {b.get(tp)}"
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
            for p in procs:
                if p.proc.poll() is None:
                    p.proc.kill()
                    p.proc.wait(10)
