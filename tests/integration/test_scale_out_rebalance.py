"""Issue 17, test 1: grow a live 3-broker cluster to 4 and rebalance it, with the operator's
commands, while an idempotent acks=all producer and a group consumer run throughout:

`kraftlog cluster add-broker` -> `kraftlog reassign plan --add-brokers 4` (Kafka's
reassignment JSON) -> `kraftlog reassign execute - --throttle B` -> `kraftlog reassign
status --wait` -> replicas and leaders per broker within 1, every acknowledged write in the
log exactly once, in order, and consumed by the group.
"""
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from replication_helpers import BackgroundProducer, assert_acked_exactly_once_in_order

from deploy.cluster import CONTROLLER_PORT_OFFSET, RAFT_PORT_OFFSET
from deploy.local_node import ROOT
from http_api.client import Consumer

pytestmark = pytest.mark.integration

TOPIC, PARTITIONS, RF = "bal", 6, 2
THROTTLE_BYTES_PER_S = 4 * 1024 * 1024


def kraftlog(*args, stdin=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], input=stdin, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=timeout, cwd=ROOT)


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def read_log(urls: list[str], partition: int) -> list[tuple[int, str]]:
    """Every committed record (offset, value) of a partition, from its current leader."""
    out, offset = [], 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        md = get(urls[0] + "/v1/metadata")
        part = next(p for t in md["topics"] if t["name"] == TOPIC for p in t["partitions"]
                    if p["partition"] == partition)
        leader_url = next(b["url"] for b in md["brokers"] if b["id"] == part["leader"])
        try:
            doc = get(f"{leader_url}/v1/topics/{TOPIC}/partitions/{partition}/records?offset={offset}"
                      f"&max_bytes=1048576")
        except OSError:
            time.sleep(0.2)
            continue
        out.extend((r["offset"], r["value"]) for r in doc["records"])
        if doc["records"]:
            offset = doc["records"][-1]["offset"] + 1
        if offset >= doc["high_watermark"]:
            return out
    raise AssertionError(f"could not read {TOPIC}-{partition} to its end")


class GroupConsumer(threading.Thread):
    """A group consumer (the Python client) collecting every value it receives."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.values, self.errors = url, set(), []
        self.stopping = threading.Event()

    def run(self) -> None:
        async def main():
            consumer = Consumer(self.url, group_id="bal-g", auto_offset_reset="earliest", max_wait_ms=200,
                                session_timeout_ms=10_000, metadata_max_age_ms=2_000)
            try:
                await consumer.subscribe([TOPIC])
                while not self.stopping.is_set():
                    try:
                        for rec in await consumer.poll(200):
                            v = rec.value
                            self.values.add(v.decode() if isinstance(v, bytes) else v)
                    except Exception as exc:  # noqa: BLE001 - a move may answer retriable errors: keep polling
                        self.errors.append(exc)
                        await asyncio.sleep(0.2)
            finally:
                await consumer.close()
        asyncio.run(main())


def test_add_a_fourth_broker_plan_execute_throttled_balanced_without_loss(tmp_path):
    from tests.integration.test_cli_cluster import free_base_port
    base = free_base_port(4, offsets=(0, CONTROLLER_PORT_OFFSET, RAFT_PORT_OFFSET, 3500))
    data = str(tmp_path / "c")
    urls = [f"http://127.0.0.1:{base + i}" for i in range(4)]
    boot = ",".join(urls[:3])
    r = kraftlog("cluster", "up", "--nodes", "3", "--data-dir", data, "--base-port", str(base),
                 "--kafka-base-port", str(base + 3500))
    producer = consumer = None
    try:
        assert r.returncode == 0, r.stderr
        r = kraftlog("topic", "create", TOPIC, "--partitions", str(PARTITIONS), "--replication-factor", str(RF),
                     "--bootstrap", boot)
        assert r.returncode == 0, r.stderr
        producer = BackgroundProducer(urls[:3], TOPIC, list(range(PARTITIONS))).start()
        producer.wait_acked(200, 90)
        consumer = GroupConsumer(urls[0])
        consumer.start()

        r = kraftlog("cluster", "add-broker", "--data-dir", data)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [urls[3]]
        rf = {(t["name"], p["partition"]): len(p["replicas"]) for t in get(urls[0] + "/v1/metadata")["topics"]
              for p in t["partitions"]}
        r = kraftlog("reassign", "plan", "--add-brokers", "4", "--output", "json", "--bootstrap", boot)
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)    # every topic, __consumer_offsets (the group's coordinator) too
        assert plan["version"] == 1 and plan["partitions"], plan
        assert all(len(e["replicas"]) == rf[(e["topic"], e["partition"])] for e in plan["partitions"]), plan
        r = kraftlog("reassign", "execute", "-", "--throttle", str(THROTTLE_BYTES_PER_S), "--bootstrap", boot,
                     stdin=json.dumps(plan))
        assert r.returncode == 0, r.stderr
        r = kraftlog("reassign", "status", "--wait", "--bootstrap", boot, timeout=240)
        assert r.returncode == 0, r.stderr
        before = producer.count()
        producer.wait_acked(before + 100, 60)    # writes go on after the moves

        md = get(urls[0] + "/v1/metadata")
        parts = [p for t in md["topics"] for p in t["partitions"]]   # balanced over every topic
        replicas = {b: sum(b in p["replicas"] for p in parts) for b in (1, 2, 3, 4)}
        leaders = {b: sum(p["leader"] == b for p in parts) for b in (1, 2, 3, 4)}
        assert max(replicas.values()) - min(replicas.values()) <= 1, replicas
        assert max(leaders.values()) - min(leaders.values()) <= 1, leaders
        assert all(not p["adding_replicas"] and not p["removing_replicas"] for p in parts)
        assert replicas[4] >= sum(replicas.values()) // 4    # the new broker took its share

        producer.stop()
        # the figure the issue asks for: the longest time without an acknowledged write, per
        # partition, while the cluster grew and rebalanced
        gaps = {p: max((b[2] - a[2] for a, b in zip(acked, acked[1:])), default=0.0)
                for p, acked in producer.acked.items()}
        print(f"\nlongest gap between acknowledged writes per partition (s): "
              f"{ {p: round(g, 2) for p, g in sorted(gaps.items())} }")
        for p, acked in producer.acked.items():
            assert acked, f"nothing acknowledged on partition {p}: {producer.errors[:3]}"
            assert_acked_exactly_once_in_order(acked, read_log(urls, p))
        want = {v for acked in producer.acked.values() for _, v, _ in acked}
        deadline = time.monotonic() + 90
        while not want <= consumer.values and time.monotonic() < deadline:
            time.sleep(0.2)
        assert want <= consumer.values, f"{len(want - consumer.values)} acknowledged records never consumed"
    finally:
        if producer is not None:
            producer.stop()
        if consumer is not None:
            consumer.stopping.set()
            consumer.join(30)
        kraftlog("cluster", "down", "--data-dir", data)
