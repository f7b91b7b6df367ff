"""`kraftlog cluster up/status/down` with a 2-node local cluster, restart keeps data."""
import json
import os
import random
import socket
import subprocess
import sys
import urllib.request

import pytest

from deploy.cluster import CONTROLLER_PORT_OFFSET, RAFT_PORT_OFFSET
from deploy.local_node import ROOT

pytestmark = pytest.mark.integration


def kraftlog(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=timeout, cwd=ROOT)


def _bindable(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_base_port(n, offsets=(0, CONTROLLER_PORT_OFFSET, RAFT_PORT_OFFSET)):
    """A base port whose every derived port (HTTP, controller, raft of n nodes) is free now,
    below the kernel's ephemeral range (32768+) so client connections cannot take them meanwhile."""
    for _ in range(200):
        base = random.randrange(20000, 32768 - max(offsets) - n)
        if all(_bindable(base + off + i) for off in offsets for i in range(n)):
            return base
    raise RuntimeError("no free base port")


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_cluster_up_status_down_restart(tmp_path):
    data = str(tmp_path / "c")
    base = free_base_port(2)
    kafka_base = base   # never Kafka's default 9092: tests run side by side
    while kafka_base in range(base - 1, base + RAFT_PORT_OFFSET + 2):
        kafka_base = free_base_port(2, offsets=(0,))
    r = kraftlog("cluster", "up", "--nodes", "2", "--data-dir", data, "--base-port", str(base),
                 "--kafka-base-port", str(kafka_base))
    try:
        assert r.returncode == 0, r.stderr
        urls = r.stdout.split()
        assert urls == [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
        md = get(urls[1] + "/v1/metadata")
        assert sorted(b["id"] for b in md["brokers"]) == [1, 2]
        r = kraftlog("cluster", "status", "--data-dir", data, "--output", "json")
        procs = json.loads(r.stdout)
        assert sorted((p["node_id"], p["role"]) for p in procs) == [
            (1, "broker"), (1, "controller"), (2, "broker"), (2, "controller")]
        assert all(set(p) == {"node_id", "role", "pid", "url"} | ({"kafka_address"} if p["role"] == "broker" else set())
                   for p in procs)
        assert sorted(p["kafka_address"] for p in procs if p["role"] == "broker") == [
            f"127.0.0.1:{kafka_base}", f"127.0.0.1:{kafka_base + 1}"]
        r = kraftlog("topic", "create", "kept", "--partitions", "2", "--bootstrap", urls[0])
        assert r.returncode == 0, r.stderr
        # no --replication-factor: the brokers' default (min(3, N) = 2 in cluster up), as kafka-topics does
        assert "replication factor 2" in r.stdout, r.stdout
        req = urllib.request.Request(urls[1] + "/v1/topics/kept/records?acks=1", method="POST",
                                     data=json.dumps({"records": [{"value": "v", "partition": p}
                                                                  for p in (0, 1)]}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
    finally:
        r = kraftlog("cluster", "down", "--data-dir", data)
    assert r.returncode == 0
    assert json.loads(kraftlog("cluster", "status", "--data-dir", data, "--output", "json").stdout) == []
    r = kraftlog("cluster", "up", "--nodes", "2", "--data-dir", data, "--base-port", str(base))
    try:
        assert r.returncode == 0, r.stderr
        assert get(f"http://127.0.0.1:{base}/v1/topics") == {"topics": ["kept"]}
    finally:
        assert kraftlog("cluster", "down", "--data-dir", data).returncode == 0
