"""Rolling restart of every broker (SIGTERM = controlled shutdown, then start again) under
acks=all load: no acknowledged write is lost, every partition stays writable (the longest
gap between acknowledgements per partition is measured and bounded), and preferred leader
election moves leadership back once the brokers have returned."""
import time

import pytest
from replication_helpers import BackgroundProducer, assert_acked_exactly_once_in_order

from tests.rigs.cluster import ReplicatedCluster

pytestmark = pytest.mark.integration

PARTITIONS = 3
# below the controller's 9 s broker session timeout: leadership left by controlled shutdown,
# not by fencing (the usual figure, printed, is well under a second)
UNAVAILABLE_MAX_S = 8.0


def test_rolling_restart_under_load(tmp_path):
    with ReplicatedCluster(str(tmp_path), brokers=3, broker_config={"min_insync_replicas": 2},
                           controller_args=["--leader-imbalance-check-interval-ms", "1000"]) as c:
        c.create_topic("rr", partitions=PARTITIONS, replication_factor=3)
        prod = BackgroundProducer(c.urls, "rr", list(range(PARTITIONS))).start()
        prod.wait_acked(60, 30)
        for b in sorted(c.ports):
            led = [q["partition"] for q in c.partition_list("rr") if q["leader"] == b]
            t0 = time.monotonic()
            assert c.stop_broker(b) == 0
            stop_s = time.monotonic() - t0
            # controlled shutdown moved its leaderships away before it stopped
            assert all(q["leader"] != b for q in c.partition_list("rr")), (b, led)
            c.start_broker(b)
            c.wait_for(lambda: all(len(q["isr"]) == 3 for q in c.partition_list("rr")), 30, f"broker {b} in sync")
            n = prod.count()
            prod.wait_acked(n + 30, 20)
            print(f"broker {b}: led {led}, controlled shutdown + stop {stop_s:.2f} s")
        # preferred leaders again (the controller's periodic imbalance check)
        c.wait_for(lambda: all(q["leader"] == q["replicas"][0] for q in c.partition_list("rr")), 20,
                   "preferred leaders back")
        prod.wait_acked(prod.count() + 30, 20)
        prod.stop()
        gaps = {p: prod.longest_gap_s(p) for p in range(PARTITIONS)}
        print("longest unavailability per partition (s):", {p: round(g, 3) for p, g in gaps.items()})
        for p in range(PARTITIONS):
            assert_acked_exactly_once_in_order(prod.acked[p], c.read_all("rr", p))
        assert max(gaps.values()) < UNAVAILABLE_MAX_S, gaps
