"""Controller quorum changes under load (issue 17, test 5 and the quorum part of test 7), all
real processes: 3 controllers + 3 brokers, an idempotent acks=all producer and a metadata
writer (topic config changes through a broker) running throughout.

1. Add a 4th controller the way DESIGN.md section 10 asks: the leader adds it first (the
   broker route /v1/admin/quorum/voters, before the process is up, so the change stays in
   flight until it has caught up); a second change meanwhile gets a clear 4xx; then the node
   starts with --join and catches up, and the add completes.
2. Remove the original leader controller with `kraftlog quorum remove-controller`: it hands
   its leadership over first, is removed, and exits by itself (a removed node is never told).
3. Metadata writes go on: a topic is created through the new quorum, and the longest gap
   between two successful metadata writes is measured and printed, with the longest time
   without an acknowledged write per partition; a group consumer reads every acknowledged
   record.
4. An unknown id is 404 VOTER_NOT_FOUND.
5. A follower controller whose data directory is wiped comes back at the same address with a
   new incarnation: it is refused (the others list its id with another incarnation) and
   stops, saying what to do. Every acknowledged record is
   in the log exactly once.
A second test: removing the last voter of a 1-controller quorum is refused.
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from replication_helpers import (BackgroundGroupConsumer, BackgroundProducer, assert_acked_exactly_once_in_order,
                                 longest_gaps_s)

from metadata_quorum.controller_server import Voter
from tests.rigs.cluster import ReplicatedCluster, http
from tests.rigs.controllers import ROOT, ControllerCluster, free_port

pytestmark = pytest.mark.integration


def kraftlog(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})


class MetadataWriter:
    """Changes a topic config through the brokers one write after another in a thread;
    `ok` = monotonic times of the successful writes."""

    def __init__(self, urls: list, topic: str) -> None:
        self.urls, self.topic = urls, topic
        self.ok: list = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            url = self.urls[i % len(self.urls)]
            status, _ = http("POST", f"{url}/v1/topics/{self.topic}/configs",
                             {"configs": {"retention.ms": str(3_600_000 + i)}}, timeout=20)
            if status == 200:
                self.ok.append(time.monotonic())
            else:
                self.failures += 1
                time.sleep(0.02)

    def start(self) -> "MetadataWriter":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def longest_gap_s(self, since: float, until: float) -> float:
        times = [since] + [t for t in self.ok if since <= t <= until] + [until]
        return max(b - a for a, b in zip(times, times[1:]))


def _describe(c: ReplicatedCluster) -> dict:
    status, doc = http("GET", c.url(1) + "/v1/admin/quorum")
    assert status == 200, doc
    return doc


def test_add_a_controller_then_remove_the_original_leader_under_load(tmp_path):
    c = ReplicatedCluster(str(tmp_path), brokers=3, controllers=3, broker_config={"min_insync_replicas": 2})
    prod = writer = group = None
    try:
        c.start()
        c.create_topic("q", partitions=2, replication_factor=3)
        c.create_topic("meta", partitions=1, replication_factor=3)
        prod = BackgroundProducer(c.urls, "q", [0, 1]).start()
        writer = MetadataWriter(c.urls, "meta").start()
        group = BackgroundGroupConsumer(c.urls, "q-g", ["q"]).start()
        prod.wait_acked(50, 60)
        leader = c.controllers.wait_active(30)
        # every controller registers itself (id, raft address, URL, incarnation)
        c.wait_for(lambda: all(v["state"] == "voter" and v["incarnation"] for v in _describe(c)["voters"]), 60,
                   "the 3 controllers to register")
        r = kraftlog("quorum", "describe", "--output", "json", "--bootstrap", c.url(1))
        assert r.returncode == 0, r.stderr
        before = json.loads(r.stdout)
        assert before["leader_id"] == leader and [v["id"] for v in before["voters"]] == [1, 2, 3]
        assert all(set(v) >= {"id", "address", "lag"} for v in before["voters"])

        # 1. add controller 4: first the leader adds it (the process is not up yet, so the
        # change waits for it to catch up), meanwhile a second change is refused
        cc = c.controllers
        cc.voters[4] = Voter(4, "127.0.0.1", free_port(), free_port())
        incarnation = "test-incarnation-4"
        os.makedirs(os.path.join(str(tmp_path), "controller-4"), exist_ok=True)
        with open(os.path.join(str(tmp_path), "controller-4", "controller.identity"), "w") as f:
            json.dump({"node_id": 4, "incarnation": incarnation}, f)
        change_started = time.monotonic()
        added: dict = {}
        body = {"id": 4, "raft_address": cc.voters[4].raft_address, "url": cc.voters[4].url,
                "incarnation": incarnation}
        adder = threading.Thread(target=lambda: added.update(
            answer=http("POST", c.url(2) + "/v1/admin/quorum/voters", body, timeout=120)), daemon=True)
        adder.start()
        c.wait_for(lambda: (_describe(c).get("pending_change") or {}).get("id") == 4, 30, "the add to be in flight")
        second = kraftlog("quorum", "remove-controller", "2", "--bootstrap", c.url(3))
        assert second.returncode != 0 and "POLICY_VIOLATION" in second.stderr and "adding controller 4" in second.stderr
        cc.extra_args = cc.extra_args + ["--join"]   # node 4 only: no election before the leader talks to it
        cc.start(4)
        cc.extra_args = cc.extra_args[:-1]
        adder.join(120)
        status, doc = added["answer"]
        assert status == 200 and doc["added"] == 4, (status, doc)
        assert [v["id"] for v in doc["voters"]] == [1, 2, 3, 4]
        if not doc["caught_up"]:   # the 30 s catch-up window began before the process started (a loaded machine)
            c.wait_for(lambda: (lambda lag: lag is not None and lag < 20)(
                next(v["lag"] for v in _describe(c)["voters"] if v["id"] == 4)), 120, "controller 4 to catch up")
        assert http("POST", c.url(1) + "/v1/topics", {"name": "after-add", "partitions": 1,
                                                      "replication_factor": 3})[0] in (200, 201)

        # 2. remove the original leader: it hands over first, then exits on its own
        r = kraftlog("quorum", "remove-controller", str(leader), "--bootstrap", c.url(3))
        assert r.returncode == 0, r.stderr
        assert cc.procs[leader].wait(30) == 0   # removed, never told: it noticed and stopped
        cc.procs.pop(leader)
        after = _describe(c)
        assert sorted(v["id"] for v in after["voters"]) == sorted({1, 2, 3, 4} - {leader})
        assert after["leader_id"] != leader and after["removed"] == [leader] and after["pending_change"] is None

        # 3. metadata writes go on
        status, _ = http("POST", c.url(1) + "/v1/topics", {"name": "after-remove", "partitions": 1,
                                                           "replication_factor": 3}, timeout=60)
        assert status in (200, 201)
        n = len(writer.ok)
        c.wait_for(lambda: len(writer.ok) >= n + 10, 30, "metadata writes after the change")
        change_ended = time.monotonic()
        gap = writer.longest_gap_s(change_started, change_ended)
        print(f"\nmetadata write gap during the quorum change (add + remove leader): {gap * 1000:.0f} ms "
              f"({len([t for t in writer.ok if change_started <= t <= change_ended])} writes ok, "
              f"{writer.failures} failed attempts); longest gap between acknowledged writes per partition (s): "
              f"{longest_gaps_s(prod, since=change_started, until=change_ended)}")
        assert gap < 15, f"metadata writes stopped for {gap:.1f} s"

        # 4. bad input: unknown id, and nothing changed
        r = kraftlog("quorum", "remove-controller", "99", "--bootstrap", c.url(2))
        assert r.returncode != 0 and "VOTER_NOT_FOUND" in r.stderr
        assert len(_describe(c)["voters"]) == 3

        # 5. a wiped follower cannot vote on under its old identity
        now = _describe(c)
        wiped = next(v["id"] for v in now["voters"] if v["id"] != now["leader_id"])
        cc.kill(wiped)
        shutil.rmtree(os.path.join(str(tmp_path), f"controller-{wiped}"))
        cc.start(wiped)
        cc.procs[wiped].wait(60)   # it refuses to start (or stops once it has caught up)
        cc.procs.pop(wiped)
        with open(os.path.join(str(tmp_path), f"controller-{wiped}", "controller.log")) as f:
            log = f.read()
        assert f"controller {wiped} is registered with incarnation" in log and "was lost or replaced" in log, log[-2000:]
        assert http("POST", c.url(1) + "/v1/topics", {"name": "after-wipe", "partitions": 1,
                                                      "replication_factor": 3}, timeout=60)[0] in (200, 201)
        n = prod.count()
        prod.wait_acked(n + 50, 60)
        writer.stop()
        prod.stop()
        for p in (0, 1):
            assert_acked_exactly_once_in_order(prod.acked[p], c.read_all("q", p))
        group.wait_consumed([prod], 90)
        group.stop()
    finally:
        if group is not None:
            group.stop()
        if writer is not None:
            writer.stop()
        if prod is not None:
            prod.stop()
        c.close()


def test_the_last_voter_cannot_be_removed(tmp_path):
    with ControllerCluster(1, str(tmp_path)) as cc:
        cc.start_all()
        cc.wait_active(30)
        status, doc = http("DELETE", cc.voters[1].url + "/controller/v1/quorum/voters/1")
        assert status == 400 and doc["error_code"] == "POLICY_VIOLATION" and doc["reason"] == "last_voter", doc
        assert "add another controller first" in doc["message"]
        status, doc = http("GET", cc.voters[1].url + "/controller/v1/quorum")
        assert [v["id"] for v in doc["voters"]] == [1] and doc["pending_change"] is None
