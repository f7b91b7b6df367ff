"""Incremental replica fetch sessions (KIP-227, issue 25) across a leader restart: the
sessions die with the leader's process; its followers start over with full fetches and keep
replicating. With RF=2 and min.insync.replicas=2, an acks=all write to a partition the
restarted broker leads again only succeeds once its follower fetches from the new process
(through a fresh session), and a second round of writes only completes when the parked
session long polls wake on the appends."""
import time

import pytest

from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration

PARTITIONS = 4
DEADLINE_S = 90.0   # generous: a loaded 2-core machine restarts a broker in tens of seconds


def produce_all(c: ReplicatedCluster, value: str, deadline_s: float = DEADLINE_S) -> None:
    """One acks=all record per partition through its current leader, retried until 200."""
    todo = set(range(PARTITIONS))
    end = time.monotonic() + deadline_s
    last = None
    while todo:
        assert time.monotonic() < end, f"partitions {sorted(todo)} not written ({value}): {last}"
        for p in sorted(todo):
            try:
                leader = c.partition("fs", p)["leader"]
            except Exception as e:  # noqa: BLE001 - the controller is busy: ask again
                last = e
                continue
            if leader not in c.procs:
                continue
            status, doc = http("POST", f"{c.url(leader)}/v1/topics/fs/partitions/{p}/records?acks=all",
                               {"records": [{"value": f"{value}{p}"}]}, timeout=40)
            if status == 200:
                todo.discard(p)
            else:
                last = (p, status, str(doc)[:200])
        if todo:
            time.sleep(0.2)   # back off between rounds of retries, not a synchronisation


def test_followers_catch_up_after_the_leader_restarts(tmp_path):
    with ReplicatedCluster(str(tmp_path), brokers=2,
                           controller_args=["--leader-imbalance-check-interval-ms", "1000"]) as c:
        c.create_topic("fs", partitions=PARTITIONS, replication_factor=2, configs={"min.insync.replicas": "2"})
        produce_all(c, "a")
        victim = c.partition("fs", 0)["leader"]
        led = [q["partition"] for q in c.partition_list("fs") if q["replicas"][0] == victim]
        c.kill(victim)
        c.start_broker(victim)
        # preferred leader election gives it its partitions back; its follower in sync
        c.wait_for(lambda: all(q["leader"] == victim and len(q["isr"]) == 2
                               for q in c.partition_list("fs") if q["partition"] in led),
                   DEADLINE_S, f"broker {victim} leading {led} again with a full ISR")
        produce_all(c, "b")   # min ISR 2: the follower fetches from the restarted leader
        produce_all(c, "c")
        for p in range(PARTITIONS):
            values = [v for _, v in c.read_all("fs", p, timeout=DEADLINE_S)]
            distinct = [v for i, v in enumerate(values) if i == 0 or values[i - 1] != v]   # retried duplicates
            assert distinct == [f"a{p}", f"b{p}", f"c{p}"], (p, values)
