"""3 brokers, RF=3, acks=all: kill -9 the leader of a partition while a producer writes;
every acknowledged write is readable afterwards, exactly once, in order; the killed broker
comes back, catches up and rejoins the ISR."""
import time

import pytest
from replication_helpers import BackgroundConsumer, BackgroundProducer, assert_acked_exactly_once_in_order

from tests.rigs.cluster import ReplicatedCluster

pytestmark = pytest.mark.integration


def test_kill_9_leader_under_acks_all_load_loses_no_acknowledged_write(tmp_path):
    with ReplicatedCluster(str(tmp_path), brokers=3, broker_config={"min_insync_replicas": 2}) as c:
        c.create_topic("k", partitions=2, replication_factor=3)
        prod = BackgroundProducer(c.urls, "k", [0, 1]).start()
        cons = BackgroundConsumer(c.urls, "k", 0).start()   # reads across the failover
        prod.wait_acked(100, 30)
        victim = c.partition("k", 0)["leader"]
        before = c.partition("k", 0)["leader_epoch"]
        killed_at = time.monotonic()
        c.kill(victim)
        # a new leader from the ISR, with a bumped leader epoch
        p0 = c.wait_for(lambda: (lambda p: p if p["leader"] not in (victim, -1) else None)(c.partition("k", 0)),
                        15, "a new leader for k-0")
        assert p0["leader_epoch"] > before and victim not in p0["isr"]
        n = len(prod.acked[0])
        c.wait_for(lambda: len(prod.acked[0]) > n + 20, 20, "writes acknowledged by the new leader")
        first_ack_after = next(t for _, _, t in prod.acked[0][n:])
        # fenced at once (followers report refused connections), not after the 9 s session
        # timeout; the bound sits below that timeout, far above the usual figure (printed)
        print(f"\nfirst acknowledgement by the new leader {first_ack_after - killed_at:.2f} s after kill -9")
        assert first_ack_after - killed_at < 8, first_ack_after - killed_at
        c.start_broker(victim)
        prod.wait_acked(prod.count() + 50, 30)
        prod.stop()
        c.wait_for(lambda: all(len(p["isr"]) == 3 for p in c.partition_list("k")), 30, "ISR back to 3")
        for p in (0, 1):
            log = c.read_all("k", p)
            assert_acked_exactly_once_in_order(prod.acked[p], log)
            if p == 0:
                # the consumer saw the committed log exactly: no gap, no duplicate, no reset
                cons.wait_offset(log[-1][0], 20)
                cons.stop()
                assert cons.records == log
        assert sum(len(v) for v in prod.acked.values()) > 150
