"""3 brokers, `__consumer_offsets` with RF 3: kill -9 the broker coordinating a group while
a member commits (acks=all into the offsets topic); a new coordinator is elected with the
partition's new leader, rebuilds the group from the replicated log (the member keeps its id
and epoch), commits continue there, every acknowledged commit is still visible and the
committed offset never goes backwards."""
import threading
import time

import pytest
from test_groups_consumers import ConsumerProc

from partitions.groups.records import partition_for_group
from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration

GROUP = "fg"


def test_kill_9_coordinator_commits_continue_on_the_new_leader(tmp_path):
    with ReplicatedCluster(str(tmp_path), brokers=3, broker_config={"offsets_topic_num_partitions": 3},
                           controller_args=["--broker-session-timeout-ms", "2500",
                                            "--broker-heartbeat-interval-ms", "500"]) as c:
        c.create_topic("in", partitions=2, replication_factor=3)
        status, m = http("POST", c.urls[0] + f"/v1/groups/{GROUP}/join",
                         {"subscribed_topics": ["in"], "session_timeout_ms": 60000})
        assert status == 200, m
        assert len(m["assignment"]) == 2
        c.wait_for(lambda: all(len(p["isr"]) == 3 for p in c.partition_list("__consumer_offsets")), 30,
                   "__consumer_offsets fully in sync")
        status, coord = http("GET", c.urls[1] + f"/v1/groups/{GROUP}/coordinator")
        assert status == 200, coord
        victim = coord["coordinator_id"]
        # a real Consumer process in a group coordinated by the same broker, reading "in"
        cgroup = next(g for g in (f"cg{i}" for i in range(100))
                      if partition_for_group(g, 3) == partition_for_group(GROUP, 3))
        status, doc = http("POST", c.urls[0] + "/v1/topics/in/records",
                           {"records": [{"value": str(i), "partition": i % 2} for i in range(20)]})
        assert status == 200, doc
        proc = ConsumerProc(",".join(c.urls), cgroup, topic="in", session_ms=10000)
        stop = threading.Event()
        t = None
        try:
            alive = [i for i in c.ports if i != victim]
            acked: list[tuple[int, float]] = []
            seen: list[int] = []
            errors: list = []

            def committer():
                i, k = 0, 0
                while not stop.is_set():
                    i += 1
                    url = c.url(alive[k % len(alive)])
                    status, doc = http("POST", f"{url}/v1/groups/{GROUP}/offsets", {
                        "member_id": m["member_id"], "member_epoch": m["member_epoch"],
                        "offsets": [{"topic": "in", "partition": 0, "offset": i}]}, timeout=10)
                    if status == 200:
                        acked.append((i, time.monotonic()))
                    else:
                        errors.append((status, doc))
                        k += 1
                        time.sleep(0.05)
                    status, doc = http("GET", f"{url}/v1/groups/{GROUP}/offsets", timeout=10)
                    if status == 200 and doc["offsets"]:
                        seen.append(doc["offsets"][0]["offset"])

            t = threading.Thread(target=committer, daemon=True)
            t.start()
            c.wait_for(lambda: len(proc.records) >= 20, 30, "the consumer process read the first records")
            c.wait_for(lambda: len(acked) >= 20, 20, "commits acknowledged")
            n = len(acked)
            killed_at = time.monotonic()
            c.kill(victim)
            c.wait_for(lambda: len(acked) >= n + 20, 30, f"commits acknowledged after the coordinator died ({errors[-3:]})")
            first_after = next(ts for _, ts in acked[n:] if ts > killed_at)
            stop.set()
            t.join(20)
            status, coord2 = http("GET", c.url(alive[0]) + f"/v1/groups/{GROUP}/coordinator")
            assert status == 200 and coord2["coordinator_id"] in alive, coord2
            # every acknowledged commit survived: the latest one is what the group has
            status, doc = http("GET", c.url(alive[1]) + f"/v1/groups/{GROUP}/offsets")
            assert doc == {"offsets": [{"topic": "in", "partition": 0, "offset": acked[-1][0]}]}
            assert seen == sorted(seen), "a committed offset went backwards"
            # the group's membership was rebuilt from the replicated log: same member, same epoch
            status, hb = http("POST", c.url(alive[0]) + f"/v1/groups/{GROUP}/heartbeat", {
                "member_id": m["member_id"], "member_epoch": m["member_epoch"], "owned": m["assignment"]})
            assert status == 200 and hb["member_epoch"] == m["member_epoch"] and hb["assignment"] == m["assignment"], hb
            status, d = http("GET", c.url(alive[1]) + f"/v1/groups/{GROUP}")
            assert status == 200 and d["coordinator_id"] in alive and len(d["members"]) == 1
            # the consumer kept its membership and partitions, read on, and its commits landed
            status, doc = http("POST", c.url(alive[0]) + "/v1/topics/in/records",
                               {"records": [{"value": str(i), "partition": i % 2} for i in range(20, 40)]})
            assert status == 200, doc
            c.wait_for(lambda: {r for r in proc.records} >= {(i % 2, i // 2) for i in range(40)}, 30,
                       "the consumer process read the records produced after the failover")
            c.wait_for(lambda: http("GET", c.url(alive[0]) + f"/v1/groups/{cgroup}/offsets")[1]["offsets"] ==
                       [{"topic": "in", "partition": 0, "offset": 20}, {"topic": "in", "partition": 1, "offset": 20}],
                       20, "the consumer's commits on the new coordinator")
            assert proc.assignment_changes == 1, "the consumer lost its partitions during the failover"
            proc.stop()
            assert proc.closed
            print(f"\ncommits resumed {first_after - killed_at:.2f} s after kill -9 of coordinator {victim}; "
                  f"{len(errors)} failed attempts meanwhile")
            assert first_after - killed_at < 15
        finally:
            stop.set()
            if t is not None:
                t.join(30)
            proc.kill()
