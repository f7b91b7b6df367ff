"""Growing a live local cluster (issue 17, API.md "Scale-out"), real processes:

* `kraftlog cluster add-broker` starts broker 2 next to a 1-node cluster, registered and
  unfenced; `cluster status` lists it, `cluster down` stops it, `cluster up` restarts it;
  `kraftlog reassign plan --add-brokers 2` proposes moves onto it.
* `kraftlog topic alter NAME --partitions P` grows a topic while an idempotent acks=all
  producer and a group consumer run: within metadata_max_age_ms the producer's keyless
  records land in the new partitions, the group rebalances onto them without a restart,
  and every acknowledged record is consumed (0 lost); the longest time without an
  acknowledged write per partition while the topic grows is printed (for a new partition:
  from the alter to its first acknowledged write).
"""
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from deploy.cluster import CONTROLLER_PORT_OFFSET, RAFT_PORT_OFFSET, alive
from deploy.local_node import ROOT
from http_api.client import Consumer, Producer

pytestmark = pytest.mark.integration

DEADLINE_S = 90


def kraftlog(*args, timeout=150):
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=timeout, cwd=ROOT)


def _free_base_port():
    # every derived port (HTTP of brokers 1-2, controller, raft, Kafka) free now, below the ephemeral range
    from tests.integration.test_cli_cluster import free_base_port
    return free_base_port(2, offsets=(0, CONTROLLER_PORT_OFFSET, RAFT_PORT_OFFSET, 3500))


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _status(data):
    r = kraftlog("cluster", "status", "--data-dir", data, "--output", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _wait(cond, what, timeout=DEADLINE_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout}s: {what}")


def test_add_broker_then_grow_a_topic_under_load(tmp_path):
    data = str(tmp_path / "c")
    base = _free_base_port()
    url1, url2 = f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"
    r = kraftlog("cluster", "up", "--nodes", "1", "--data-dir", data, "--base-port", str(base),
                 "--kafka-base-port", str(base + 3500))
    try:
        assert r.returncode == 0, r.stderr
        r = kraftlog("topic", "create", "early", "--partitions", "4", "--replication-factor", "1",
                     "--bootstrap", url1)
        assert r.returncode == 0, r.stderr
        r = kraftlog("cluster", "add-broker", "--data-dir", data)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [url2]
        brokers = {b["id"]: b for b in get(url1 + "/v1/metadata")["brokers"]}
        assert set(brokers) == {1, 2} and not brokers[2]["fenced"]
        assert sorted((p["node_id"], p["role"]) for p in _status(data)) == [
            (1, "broker"), (1, "controller"), (2, "broker")]

        r = kraftlog("topic", "create", "grow", "--partitions", "2", "--replication-factor", "1",
                     "--bootstrap", url1)
        assert r.returncode == 0, r.stderr
        growth = asyncio.run(_grow_under_load(url1, data))
        for p in range(2, 4):
            assert growth["produced"].get(p, 0) > 0, growth
            assert growth["consumed"].get(p, 0) > 0, growth

        # "early" was placed before broker 2 existed (all 4 partitions on broker 1): the plan
        # moves half of them onto it
        r = kraftlog("reassign", "plan", "--add-brokers", "2", "--topics", "early", "--output", "json",
                     "--bootstrap", url1)
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        assert plan["version"] == 1
        assert sorted(e["replicas"] for e in plan["partitions"]) == [[2], [2]], plan
        assert {e["topic"] for e in plan["partitions"]} == {"early"}
    finally:
        r = kraftlog("cluster", "down", "--data-dir", data)
    assert r.returncode == 0, r.stderr
    assert _status(data) == []
    r = kraftlog("cluster", "up", "--nodes", "1", "--data-dir", data, "--base-port", str(base))
    try:
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [url1, url2]
        _wait(lambda: any(b["id"] == 2 and not b["fenced"] for b in get(url1 + "/v1/metadata")["brokers"]),
              "broker 2 registered again after cluster up")
        assert {(p["node_id"], p["role"]) for p in _status(data)} == {(1, "broker"), (1, "controller"), (2, "broker")}
    finally:
        procs = _status(data)
        assert kraftlog("cluster", "down", "--data-dir", data).returncode == 0
    assert not any(alive(p["pid"]) for p in procs)


async def _grow_under_load(url: str, data: str) -> dict:
    """Produce keyless records (idempotent, acks=all) and consume them with a group while the
    topic grows from 2 to 4 partitions; -> records per partition produced and consumed."""
    acked: dict[bytes, int] = {}
    ack_times: dict[int, list[float]] = {}
    consumed: dict[bytes, int] = {}
    stop = asyncio.Event()
    producer = Producer(url, acks="all", linger_ms=5, metadata_max_age_ms=1_000)
    consumer = Consumer(url, group_id="grow-g", auto_offset_reset="earliest", metadata_max_age_ms=1_000,
                        max_wait_ms=200, session_timeout_ms=10_000)

    async def produce():
        i = 0
        while not stop.is_set():
            futs = [(f"v{i + k}".encode(), await producer.send("grow", f"v{i + k}")) for k in range(20)]
            i += 20
            for value, fut in futs:
                md = await fut
                acked[value] = md.partition
                ack_times.setdefault(md.partition, []).append(time.monotonic())
            await asyncio.sleep(0.02)

    async def consume():
        while True:
            for rec in await consumer.poll(200):
                consumed[rec.value] = rec.partition

    await consumer.subscribe(["grow"])
    ptask, ctask = asyncio.ensure_future(produce()), asyncio.ensure_future(consume())
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S

        async def until(cond, what):
            while not cond():
                for t in (ptask, ctask):
                    if t.done():
                        t.result()   # a client failed: raise its error
                assert loop.time() < deadline, f"not within {DEADLINE_S}s: {what}"
                await asyncio.sleep(0.1)

        await until(lambda: len(consumed) >= 100, "the group consumes the 2 original partitions")
        alter_started = time.monotonic()
        r = await asyncio.to_thread(kraftlog, "topic", "alter", "grow", "--partitions", "4", "--bootstrap", url)
        assert r.returncode == 0, r.stderr
        assert "4 partition(s)" in r.stdout
        await until(lambda: {2, 3} <= set(acked.values()), "keyless records land in the new partitions")
        await until(lambda: {2, 3} <= set(consumed.values()), "the group consumes the new partitions")
        stop.set()
        await ptask
        ended = time.monotonic()
        gaps = {p: round(max(b - a for a, b in zip(ts, ts[1:])), 2)
                for p, ts in sorted(ack_times.items())
                for ts in [[alter_started] + [t for t in ts if t >= alter_started] + [ended]]}
        print(f"\nlongest gap between acknowledged writes per partition while growing 2 -> 4 (s): {gaps}")
        await until(lambda: set(acked) <= set(consumed), "every acknowledged record is consumed")
        lost = set(acked) - set(consumed)
        assert not lost
        assert set(consumer.assignment()) == {("grow", p) for p in range(4)}
    finally:
        stop.set()
        for t in (ptask, ctask):
            t.cancel()
        await asyncio.gather(ptask, ctask, return_exceptions=True)
        await producer.close()
        await consumer.close()
    count = lambda d: {p: sum(1 for v in d.values() if v == p) for p in set(d.values())}  # noqa: E731
    return {"produced": count(acked), "consumed": count(consumed)}
