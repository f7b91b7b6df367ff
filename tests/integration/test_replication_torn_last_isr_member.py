"""Regression (chaos long run seed 505, reproduced by seed 606; issue 9), real processes:
the last ISR member loses its unflushed tail in a crash. Before KIP-966 it was elected again
with the shorter log and the replicas that still had the acknowledged records truncated to
it. Now the replica that left the ISR while it was below min.insync.replicas (the ELR)
leads, and the torn broker does not lead on its own.

Sequence (as in the seed 606 broker logs): 20 records acknowledged with ISR [L, F1, F2];
F2 killed; 20 more acknowledged with ISR [L, F1]; F1 paused (SIGSTOP) so the ISR shrinks to
[L] and F1 joins the ELR; L killed and its active segment torn back into the second batch;
L and F2 restarted: the partition stays leaderless (L lost acknowledged records, F2 never
had them); F1 resumed: it leads with all 40 records.
"""
import glob
import os
import signal
import time

import pytest

from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _produce(c, broker, values):
    status, doc = http("POST", c.url(broker) + "/v1/topics/s/partitions/0/records?acks=all",
                       {"records": [{"value": v} for v in values]})
    assert status == 200, doc
    return doc


def test_torn_last_isr_member_does_not_lead_and_the_elr_member_keeps_acknowledged_records(tmp_path):
    with ReplicatedCluster(str(tmp_path), brokers=3, broker_config={"replica_lag_time_max_ms": 1000},
                           controller_args=["--broker-session-timeout-ms", "3000"]) as c:
        c.create_topic("s", partitions=1, replication_factor=3, configs={"min.insync.replicas": "2"})
        p = c.partition("s")
        leader = p["leader"]
        f1, f2 = [r for r in p["replicas"] if r != leader]
        first = [f"a{i}" for i in range(20)]
        second = [f"b{i}" for i in range(20)]
        _produce(c, leader, first)

        c.kill(f2)
        c.wait_for(lambda: f2 not in c.partition("s")["isr"], 20, "the killed follower out of the ISR")
        seg = sorted(glob.glob(os.path.join(str(tmp_path), f"broker-{leader}", "logs", "s-0", "*.log")))[-1]
        size_before = os.path.getsize(seg)
        _produce(c, leader, second)                       # acknowledged by ISR [leader, f1]
        assert os.path.getsize(seg) > size_before + 20

        c.signal(f1, signal.SIGSTOP)
        try:
            c.wait_for(lambda: c.partition("s")["isr"] == [leader], 20, "ISR shrunk to the leader")
            assert c.partition("s").get("elr") == [f1]
            # the premise: the ELR member is fenced (its session expired) before the leader is
            # lost, so no replica can lead; an unfenced ELR member would rightly be elected
            # (it holds every committed record), which 1 of 5 runs reached once the ISR
            # loop checks every 300 ms
            c.wait_for(lambda: next(b for b in c.controller_metadata()["brokers"] if b["id"] == f1)["fenced"],
                       20, "the stopped ELR member fenced")

            c.kill(leader)
            with open(seg, "r+b") as f:                   # the unflushed tail is lost, mid-batch
                f.truncate(size_before + 10)
            c.start_broker(leader)
            c.start_broker(f2)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:            # neither may lead: both lack acknowledged records
                part = c.partition("s")
                assert part["leader"] == -1, part
                time.sleep(0.2)
            assert leader not in part["isr"] and leader not in part.get("elr", []), part
            status, doc = http("POST", c.url(f2) + "/v1/topics/s/partitions/0/records?acks=all",
                               {"records": [{"value": "refused"}]})
            assert status == 503 and doc["error_code"] == "LEADER_NOT_AVAILABLE", doc
            assert f"waits for brokers [{f1}]" in doc["message"] and "unclean.leader.election" in doc["message"], doc
        finally:
            c.signal(f1, signal.SIGCONT)
        c.wait_for(lambda: c.partition("s")["leader"] == f1, 30, "the ELR member leading")
        c.wait_for(lambda: len(c.partition("s")["isr"]) >= 2, 30, "a follower back in the ISR")
        values = [v for _, v in c.read_all("s")]
        assert values == first + second, values
        # the torn broker truncated its log and fetched the records back
        _produce(c, f1, ["after"])
        c.wait_for(lambda: len(c.partition("s")["isr"]) == 3, 30, "full ISR again")
