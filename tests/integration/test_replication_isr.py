"""A follower stopped with SIGSTOP leaves the ISR after replica.lag.time.max.ms and rejoins
after SIGCONT; acks=all writes continue while ISR >= min.insync.replicas, and are refused
with NOT_ENOUGH_REPLICAS below it."""
import signal
import time

import pytest
from replication_helpers import BackgroundProducer, assert_acked_exactly_once_in_order

from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration

LAG_MS = 1000


def test_paused_follower_leaves_and_rejoins_the_isr(tmp_path):
    # long broker sessions: the paused broker must leave the ISR by lag, not by fencing
    with ReplicatedCluster(str(tmp_path), brokers=3, broker_config={"replica_lag_time_max_ms": LAG_MS},
                           controller_args=["--broker-session-timeout-ms", "60000"]) as c:
        c.create_topic("s", partitions=1, replication_factor=3, configs={"min.insync.replicas": "2"})
        p = c.partition("s")
        leader = p["leader"]
        follower = next(r for r in p["replicas"] if r != leader)
        prod = BackgroundProducer([c.url(leader)], "s", [0]).start()
        prod.wait_acked(30, 20)
        c.signal(follower, signal.SIGSTOP)
        paused_at = time.monotonic()
        try:
            c.wait_for(lambda: follower not in c.partition("s")["isr"], 15, "the paused follower out of the ISR")
            left_after = time.monotonic() - paused_at
            assert left_after >= LAG_MS / 1000 * 0.9
            n = prod.count()
            prod.wait_acked(n + 30, 20)  # ISR 2 >= min.insync.replicas 2: acks=all goes on
        finally:
            c.signal(follower, signal.SIGCONT)
        c.wait_for(lambda: follower in c.partition("s")["isr"], 20, "the follower back in the ISR")
        prod.wait_acked(prod.count() + 30, 20)
        prod.stop()
        assert_acked_exactly_once_in_order(prod.acked[0], c.read_all("s", 0))

        # below min.insync.replicas: pause both followers; once they are out, acks=all is refused
        others = [r for r in p["replicas"] if r != leader]
        for b in others:
            c.signal(b, signal.SIGSTOP)
        try:
            c.wait_for(lambda: c.partition("s")["isr"] == [leader], 15, "ISR shrunk to the leader")
            status, doc = http("POST", c.url(leader) + "/v1/topics/s/partitions/0/records?acks=all",
                               {"records": [{"value": "refused"}]})
            assert status == 503 and doc["error_code"] == "NOT_ENOUGH_REPLICAS", doc
            status, doc = http("POST", c.url(leader) + "/v1/topics/s/partitions/0/records?acks=1",
                               {"records": [{"value": "acks1"}]})
            assert status == 200, doc
        finally:
            for b in others:
                c.signal(b, signal.SIGCONT)
        c.wait_for(lambda: len(c.partition("s")["isr"]) == 3, 20, "full ISR again")
