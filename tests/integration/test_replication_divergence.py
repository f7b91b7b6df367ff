"""A former leader that comes back with extra unreplicated records truncates them (to the
divergence point the new leader gives, by leader epoch) and converges to the new leader's
log, byte for byte."""
import os
import signal
import urllib.request

import pytest

from partitions.log.config import LogConfig
from partitions.log.log import Log
from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration


def _log_bytes(base_dir: str, broker_id: int, name: str) -> tuple[bytes, list]:
    lg = Log.open(os.path.join(base_dir, f"broker-{broker_id}", "logs", name), LogConfig())
    try:
        return bytes(lg.read(0, 1 << 30).records), list(lg.leader_epoch_cache.entries)
    finally:
        lg.close()


def _parked_replica_fetches(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("kraftlog_replica_fetches_waiting "):
                return float(line.split()[1])
    raise AssertionError("no kraftlog_replica_fetches_waiting metric")


def test_former_leader_truncates_its_unreplicated_tail_and_converges(tmp_path):
    base = str(tmp_path)
    with ReplicatedCluster(base, brokers=3, controller_args=["--broker-session-timeout-ms", "60000"]) as c:
        c.create_topic("d", partitions=1, replication_factor=3)
        p = c.partition("d")
        old = p["leader"]
        followers = [r for r in p["replicas"] if r != old]
        url = c.url(old) + "/v1/topics/d/partitions/0/records"
        status, _ = http("POST", url + "?acks=all", {"records": [{"value": f"committed-{i}"} for i in range(5)]})
        assert status == 200
        # followers paused: acks=1 writes land on the old leader only
        for b in followers:
            c.signal(b, signal.SIGSTOP)
        # the paused followers' parked long polls time out and are answered (into their
        # socket buffers); only then is nothing in flight that could carry the next records
        c.wait_for(lambda: _parked_replica_fetches(c.url(old)) == 0, 10, "no follower fetch parked on the leader")
        status, doc = http("POST", url + "?acks=1", {"records": [{"value": f"lost-{i}"} for i in range(7)]})
        assert status == 200 and doc["offsets"][0]["offset"] == 5, doc
        c.kill(old)
        for b in followers:
            c.signal(b, signal.SIGCONT)
        # a follower (ISR member) takes over in a new epoch and writes different records there
        newp = c.wait_for(lambda: (lambda q: q if q["leader"] in followers else None)(c.partition("d")),
                          20, "a new leader")
        assert newp["leader_epoch"] > p["leader_epoch"]
        new_url = c.url(newp["leader"]) + "/v1/topics/d/partitions/0/records"
        status, doc = http("POST", new_url + "?acks=all", {"records": [{"value": f"new-{i}"} for i in range(3)]})
        assert status == 200 and doc["offsets"][0]["offset"] == 5, doc
        # the old leader comes back: it must drop lost-* and copy new-*
        c.start_broker(old)
        c.wait_for(lambda: old in c.partition("d")["isr"], 30, "the old leader back in the ISR")
        status, doc = http("POST", new_url + "?acks=all", {"records": [{"value": "after"}]})
        assert status == 200
        values = [v for _, v in c.read_all("d")]
        assert values == [f"committed-{i}" for i in range(5)] + [f"new-{i}" for i in range(3)] + ["after"]
        for b in list(c.procs):
            c.stop_broker(b)
    logs = {b: _log_bytes(base, b, "d-0") for b in [old] + followers}
    leader_bytes, leader_epochs = logs[newp["leader"]]
    assert b"lost-" not in leader_bytes
    for b, (data, epochs) in logs.items():
        assert data == leader_bytes, f"broker {b}'s log differs from the leader's"
        assert epochs == leader_epochs
