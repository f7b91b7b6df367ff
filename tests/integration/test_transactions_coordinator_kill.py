"""3 broker processes, everything at RF 3: kill -9 the transaction coordinator's broker after it
wrote PrepareCommit but before any marker (the crash-test hook KRAFTLOG_TEST_TXN_MARKER_DELAY_MS
holds a freshly decided commit's markers back; a resumed one never waits). The new leader of the
`__transaction_state` partition replays it, writes the markers and completes the commit:
read_committed consumers see nothing of the transaction before, and all of it after."""
import signal
import time

import pytest

from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration

TPS = [("ka", 0), ("ka", 1), ("kb", 0)]


def _read_committed(c, t, p, alive):
    leader = c.partition(t, p)["leader"]
    if leader not in alive:
        return None
    status, doc = http("GET", f"{c.url(leader)}/v1/topics/{t}/partitions/{p}/records?offset=0"
                              "&isolation_level=read_committed", timeout=10)
    return [r["value"] for r in doc["records"]] if status == 200 else None


def test_kill_9_coordinator_between_prepare_commit_and_markers(tmp_path, monkeypatch):
    monkeypatch.setenv("KRAFTLOG_TEST_TXN_MARKER_DELAY_MS", "600000")
    with ReplicatedCluster(str(tmp_path), brokers=3,
                           broker_config={"transaction_state_num_partitions": 1, "request_timeout_ms": 4000},
                           controller_args=["--broker-session-timeout-ms", "2500",
                                            "--broker-heartbeat-interval-ms", "500"]) as c:
        c.create_topic("ka", partitions=2, replication_factor=3)
        c.create_topic("kb", partitions=1, replication_factor=3)
        status, prod = http("POST", c.urls[0] + "/v1/transactions/k1/init", {})
        assert status == 200, prod
        c.wait_for(lambda: len(c.partition("__transaction_state", 0)["isr"]) == 3, 60,
                   "__transaction_state fully in sync")
        victim = c.partition("__transaction_state", 0)["leader"]
        alive = [i for i in c.ports if i != victim]
        status, doc = http("POST", c.url(alive[0]) + "/v1/transactions/k1/records", {
            **prod, "records": [{"topic": t, "partition": p, "value": f"v{t}{p}"} for t, p in TPS]})
        assert status == 200, doc
        # the decision is durable, the markers are held back: nothing is visible
        status, doc = http("POST", c.url(alive[0]) + "/v1/transactions/k1/commit", prod, timeout=30)
        assert status == 200 and doc["state"] == "PrepareCommit", (status, doc)
        assert all(_read_committed(c, t, p, list(c.ports)) == [] for t, p in TPS)
        c.kill(victim)
        t0 = time.monotonic()
        c.wait_for(lambda: all(_read_committed(c, t, p, alive) == [f"v{t}{p}"] for t, p in TPS), 120,
                   "the new coordinator to finish the commit on every partition")
        print(f"commit finished {time.monotonic() - t0:.1f} s after the kill")
        new = c.partition("__transaction_state", 0)["leader"]
        assert new in alive
        with open(c.log_path(new), errors="replace") as f:
            assert "resuming 1" in f.read()      # the new coordinator completed it from the log
        # the id is usable again: a new producer of it gets a newer epoch
        status, again = http("POST", c.url(alive[1]) + "/v1/transactions/k1/init", {}, timeout=30)
        assert status == 200 and again["producer_epoch"] > prod["producer_epoch"], again


def test_kill_9_partition_leader_during_a_transaction_commit_reaches_every_partition(tmp_path):
    with ReplicatedCluster(str(tmp_path), brokers=3,
                           broker_config={"transaction_state_num_partitions": 1, "request_timeout_ms": 4000},
                           controller_args=["--broker-session-timeout-ms", "2500",
                                            "--broker-heartbeat-interval-ms", "500"]) as c:
        c.create_topic("ka", partitions=2, replication_factor=3)
        c.create_topic("kb", partitions=1, replication_factor=3)
        status, prod = http("POST", c.urls[0] + "/v1/transactions/k2/init", {})
        assert status == 200, prod
        coordinator = c.partition("__transaction_state", 0)["leader"]
        status, doc = http("POST", c.urls[0] + "/v1/transactions/k2/records", {
            **prod, "records": [{"topic": t, "partition": p, "value": f"w{t}{p}"} for t, p in TPS]})
        assert status == 200, doc
        leaders = {tp: c.partition(*tp)["leader"] for tp in TPS}
        victims = [b for b in leaders.values() if b != coordinator]
        assert victims, f"every data partition is led by the coordinator {coordinator}: {leaders}"
        victim = victims[0]
        alive = [i for i in c.ports if i != victim]
        # the leader hangs while the commit writes its markers (the first marker attempt to it
        # fails after its timeout and is retried on the new leader), then dies
        c.signal(victim, signal.SIGSTOP)
        status, doc = http("POST", c.url(coordinator) + "/v1/transactions/k2/commit", prod, timeout=60)
        c.kill(victim)
        assert status == 200 and doc["state"] in ("PrepareCommit", "CompleteCommit"), (status, doc)
        c.wait_for(lambda: all(_read_committed(c, t, p, alive) == [f"w{t}{p}"] for t, p in TPS), 120,
                   "the commit's markers on every partition, the dead leader's ones on its successor")
        assert all(c.partition(*tp)["leader"] in alive for tp in TPS)
