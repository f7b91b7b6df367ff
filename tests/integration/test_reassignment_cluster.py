"""Partition reassignment (KIP-455) and broker decommission with real processes (issue 17,
tests 2-4), an idempotent acks=all producer writing and a group consumer reading throughout,
checked for zero loss and no duplicates; each scenario prints the longest time without an
acknowledged write per partition (the unavailability figure of docs/REASSIGNMENT.md):

- a move off the leader's broker under a replication throttle completes although the active
  controller is killed -9 in the middle; leadership moves to the first target replica and
  the removed broker deletes its copy;
- the destination broker is killed -9 mid-move: cancel restores the old replica set, and the
  destination deletes its partial copy when it comes back;
- decommissioning a broker that leads partitions moves every replica away and unregisters it.
"""
import json
import os
import subprocess
import sys
import time

import pytest
from replication_helpers import (BackgroundGroupConsumer, BackgroundProducer, assert_acked_exactly_once_in_order,
                                 longest_gaps_s)

from tests.rigs.cluster import ReplicatedCluster, http
from tests.rigs.controllers import ROOT

pytestmark = pytest.mark.integration

PRELOAD_BYTES = 4 * 1024 * 1024    # copied under the throttle: the move lasts seconds
VALUE_BYTES = 20_000


def preload(c: ReplicatedCluster, topic: str, partition: int = 0) -> None:
    """PRELOAD_BYTES of records on the partition (before the producer starts)."""
    per_request = 40
    for i in range(PRELOAD_BYTES // (per_request * VALUE_BYTES)):
        leader = c.partition(topic, partition)["leader"]
        status, doc = http("POST", f"{c.url(leader)}/v1/topics/{topic}/partitions/{partition}/records",
                           {"records": [{"value": f"{i}-{j}-" + "x" * VALUE_BYTES} for j in range(per_request)]})
        assert status == 200, doc


def preloaded_value_bytes() -> int:
    """The bytes of the values `preload` writes (the leader's log holds at least these)."""
    return PRELOAD_BYTES // (40 * VALUE_BYTES) * 40 * VALUE_BYTES


def moving(c: ReplicatedCluster, broker: int = 1) -> list:
    status, doc = http("GET", c.url(broker) + "/v1/reassignments")
    assert status == 200, doc
    return doc["reassignments"]


def has_log(c: ReplicatedCluster, broker: int, topic: str, partition: int) -> bool:
    logs = os.path.join(c.base_dir, f"broker-{broker}", "logs")
    return any(n == f"{topic}-{partition}" or n.startswith(f"{topic}-{partition}.") for n in os.listdir(logs))


def kraftlog(c: ReplicatedCluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The CLI against the cluster's brokers (exit status checked by the caller)."""
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args, "--bootstrap", ",".join(c.urls)],
                          input=stdin, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})


def check_no_loss(c: ReplicatedCluster, prod: BackgroundProducer, topic: str) -> None:
    for p, acked in prod.acked.items():
        assert acked, f"no write to {topic}-{p} was acknowledged (errors {prod.errors[:3]})"
        assert_acked_exactly_once_in_order(acked, c.read_all(topic, p, timeout=60))


def test_move_completes_across_a_controller_kill_and_the_leader_moves(tmp_path):
    with ReplicatedCluster(str(tmp_path), brokers=3, controllers=3) as c:
        c.create_topic("mv", partitions=1, replication_factor=2)
        preload(c, "mv")
        prod = BackgroundProducer(c.urls, "mv", [0]).start()
        group = BackgroundGroupConsumer(c.urls, "mv-g", ["mv"]).start()
        prod.wait_acked(30, 30)
        before = c.partition("mv")
        old_leader = before["leader"]
        spare = next(b for b in (1, 2, 3) if b not in before["replicas"])
        kept = next(r for r in before["replicas"] if r != old_leader)
        target = [kept, spare]
        # bad input: a clear 4xx and nothing changed
        for entry, code in (({"topic": "mv", "partition": 0, "replicas": [kept, 99]}, 400),
                            ({"topic": "nope", "partition": 0, "replicas": target}, 404),
                            ({"topic": "mv", "partition": 5, "replicas": target}, 404),
                            ({"topic": "mv", "partition": 0, "replicas": []}, 400),
                            ({"topic": "mv", "partition": 0, "replicas": [spare, spare]}, 400)):
            status, doc = http("POST", c.url(spare) + "/v1/reassignments", {"version": 1, "partitions": [entry]})
            assert status == code and doc["message"], (entry, status, doc)
        assert moving(c) == [] and c.partition("mv")["replicas"] == before["replicas"]
        status, doc = http("POST", c.url(spare) + "/v1/reassignments", {
            "version": 1, "partitions": [{"topic": "mv", "partition": 0, "replicas": target}],
            "throttle": 1024 * 1024})
        assert status == 202, doc
        move_started = time.monotonic()
        assert doc["reassignments"][0]["adding_replicas"] == [spare]
        assert doc["reassignments"][0]["removing_replicas"] == [old_leader]
        # mid-move: the leader reports bytes still to copy and copied, together its whole log
        [m] = c.wait_for(lambda: [m for m in moving(c, kept) if (m["bytes_remaining"] or 0) > 0], 20,
                         "bytes remaining")
        assert m["bytes_moved"] >= 0 and m["bytes_moved"] + m["bytes_remaining"] >= preloaded_value_bytes(), m
        active = c.controllers.active()
        c.controllers.kill(active)
        assert moving(c, kept), "the move ended before the controller was killed; raise PRELOAD_BYTES"
        c.controllers.wait_active(30, exclude=(active,))
        done = c.wait_for(lambda: (lambda p: p if not p["adding_replicas"] and not p["removing_replicas"]
                                   else None)(c.partition("mv")), 60, "the move to complete")
        assert done["replicas"] == target and sorted(done["isr"]) == sorted(target)
        assert done["leader"] == kept and done["leader_epoch"] > before["leader_epoch"]
        assert moving(c, kept) == []
        c.wait_for(lambda: not has_log(c, old_leader, "mv", 0), 30, f"broker {old_leader} to delete mv-0")
        prod.wait_acked(prod.count() + 30, 30)
        print(f"\nlongest gap between acknowledged writes per partition, move across a controller kill -9 (s): "
              f"{longest_gaps_s(prod, since=move_started, until=time.monotonic())}")
        prod.stop()
        check_no_loss(c, prod, "mv")
        group.wait_consumed([prod], 90)
        group.stop()


def test_cancel_after_the_destination_died_and_decommission_of_a_leader(tmp_path):
    # the group's __consumer_offsets at RF 2, so that one of 3 brokers can be decommissioned
    with ReplicatedCluster(str(tmp_path), brokers=3, broker_config={"offsets_topic_replication_factor": 2}) as c:
        c.create_topic("cx", partitions=1, replication_factor=2)
        c.create_topic("dc", partitions=3, replication_factor=2)
        preload(c, "cx")
        prod = BackgroundProducer(c.urls, "dc", [0, 1, 2]).start()
        cx_prod = BackgroundProducer(c.urls, "cx", [0]).start()
        group = BackgroundGroupConsumer(c.urls, "dc-g", ["cx", "dc"]).start()
        prod.wait_acked(30, 30)
        before = c.partition("cx")
        dest = next(b for b in (1, 2, 3) if b not in before["replicas"])
        target = [before["leader"], dest]
        plan = json.dumps({"version": 1, "partitions": [{"topic": "cx", "partition": 0, "replicas": target}]})
        move_started = time.monotonic()
        r = kraftlog(c, "reassign", "execute", "-", "--throttle", str(256 * 1024), stdin=plan)
        assert r.returncode == 0 and "Started the reassignment of 1 partition" in r.stdout, r.stderr
        c.wait_for(lambda: has_log(c, dest, "cx", 0), 20, f"broker {dest} to start copying cx-0")
        c.kill(dest)
        r = kraftlog(c, "reassign", "status", "--output", "json")
        assert r.returncode == 0, r.stderr
        [m] = json.loads(r.stdout)["reassignments"]
        assert m["adding_replicas"] == [dest] and m["removing_replicas"] == [r_ for r_ in before["replicas"]
                                                                            if r_ not in target]
        r = kraftlog(c, "reassign", "cancel", "--output", "json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["cancelled"] == [{"topic": "cx", "partition": 0}] and doc["reassignments"] == []
        after = c.partition("cx")
        assert sorted(after["replicas"]) == sorted(before["replicas"]) and not after["adding_replicas"]
        assert sorted(after["isr"]) == sorted(before["replicas"]) and after["leader"] == before["leader"]
        c.start_broker(dest)
        c.wait_for(lambda: not has_log(c, dest, "cx", 0), 30, f"broker {dest} to delete its partial cx-0")
        cx_prod.wait_acked(cx_prod.count() + 10, 30)
        print(f"\nlongest gap between acknowledged writes per partition, destination killed + cancel (s): "
              f"{longest_gaps_s(cx_prod, since=move_started, until=time.monotonic())}")
        # decommission a broker that leads partitions of dc
        victim = c.partition("dc", 0)["leader"]
        decommission_started = time.monotonic()
        status, doc = http("POST", c.url(victim) + f"/v1/brokers/{victim}/decommission")
        assert status == 200 and doc["state"] == "draining", doc
        waiter = subprocess.Popen([sys.executable, "-m", "deploy.cli", "broker", "decommission", str(victim),
                                   "--wait", "--bootstrap", ",".join(c.urls)], cwd=ROOT, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT})
        status, doc = http("POST", c.url(victim) + "/v1/topics", {"name": "fresh", "partitions": 4,
                                                                 "replication_factor": 2})
        assert status in (201, 202), doc
        assert all(victim not in p["replicas"] for p in doc["partitions"]), "a cordoned broker got a replica"

        def state_of(b):
            status, doc = http("GET", c.url(1 if victim != 1 else 2) + "/v1/brokers")
            return next(x["state"] for x in doc["brokers"] if x["id"] == b)
        try:
            out, err = waiter.communicate(timeout=90)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait(10)
        assert waiter.returncode == 0 and f"Broker {victim} is decommissioned" in out, err
        assert state_of(victim) == "decommissioned"
        md = c.controller_metadata()
        assert all(victim not in p["replicas"] for t in md["topics"] for p in t["partitions"])
        assert victim not in [b["id"] for b in md["brokers"]]
        for p in range(3):
            assert len(c.partition("dc", p)["replicas"]) == 2
        c.wait_for(lambda: not any(has_log(c, victim, "dc", p) for p in range(3)), 30, "the victim's logs deleted")
        # refused with a clear error: the 2 brokers left cannot lose one at replication factor 2
        last = next(b for b in (1, 2, 3) if b != victim)
        status, doc = http("POST", c.url(last) + f"/v1/brokers/{last}/decommission")
        assert status == 400 and doc["error_code"] == "POLICY_VIOLATION" and "replication factor 2" in doc["message"]
        c.kill(victim)   # decommissioned: its process may go
        prod.wait_acked(prod.count() + 30, 30)
        print(f"\nlongest gap between acknowledged writes per partition, decommission of a leader (s): "
              f"{longest_gaps_s(prod, since=decommission_started, until=time.monotonic())}")
        prod.stop()
        cx_prod.stop()
        check_no_loss(c, prod, "dc")
        check_no_loss(c, cx_prod, "cx")
        group.wait_consumed([prod, cx_prod], 90)
        group.stop()
