"""`kraftlog cluster up --tiered-storage`: a local SeaweedFS under the data dir, brokers
configured for it, a tiered topic's segments in the store; `cluster down` stops the store."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from deploy.local_node import ROOT
from deploy.seaweedfs import PORT_NAMES
from tests.rigs.cluster import http

pytestmark = pytest.mark.integration


def kraftlog(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=timeout, cwd=ROOT)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_base_port() -> int:
    """A base port whose broker, controller, raft and object store ports (+0, +1000, +2000,
    +3000..+3007) and Kafka port are all free."""
    import random
    for _ in range(200):
        base = random.randint(20000, 28000)
        if all(_free(p) for p in [base, base + 1000, base + 2000, base + 5000]
               + [base + 3000 + k for k in range(len(PORT_NAMES))]):
            return base
    raise RuntimeError("no free base port")


def test_cluster_up_tiered_storage_starts_seaweedfs_and_tiers_a_topic(tmp_path):
    data = str(tmp_path / "cluster")
    base = free_base_port()
    r = kraftlog("cluster", "up", "--nodes", "1", "--data-dir", data, "--base-port", str(base),
                 "--kafka-base-port", str(base + 5000), "--tiered-storage")
    state = json.load(open(os.path.join(data, "cluster.json"))) if os.path.exists(os.path.join(data, "cluster.json")) else {}
    try:
        assert r.returncode == 0, r.stderr
        assert "tiered storage on" in r.stderr
        ts = state["tiered_storage"]
        pid = ts["pid"]
        os.kill(pid, 0)   # running
        assert ts["ports"]["s3"] == base + 3000
        assert os.path.isdir(os.path.join(data, "seaweedfs", "data"))
        url = r.stdout.split()[0]
        status, doc = http("POST", url + "/v1/topics", {"name": "cold", "partitions": 1, "replication_factor": 1,
                                                        "configs": {"segment.bytes": "65536",
                                                                    "remote.storage.enable": "true",
                                                                    "local.retention.bytes": "131072"}})
        assert status == 201, doc
        records = [{"value": "v%05d" % i + "." * 200} for i in range(2000)]
        for i in range(0, 2000, 500):
            status, doc = http("POST", url + "/v1/topics/cold/partitions/0/records?acks=all",
                               {"records": records[i:i + 500]})
            assert status == 200, doc
        deadline = time.monotonic() + 90
        offs = {}
        while time.monotonic() < deadline:
            status, offs = http("GET", url + "/v1/topics/cold/partitions/0/offsets")
            if status == 200 and offs.get("local_log_start_offset", 0) > 0:
                break
            time.sleep(0.5)
        assert offs["log_start_offset"] == 0 and offs["local_log_start_offset"] > 0, offs
        status, doc = http("GET", url + "/v1/topics/cold/partitions/0/records?offset=0&max_bytes=65536")
        assert status == 200 and doc["records"][0]["value"].startswith("v00000"), doc
        # the broker config came from the cluster: [remote_storage] names the local store
        r2 = kraftlog("cluster", "down", "--data-dir", data)
        assert r2.returncode == 0, r2.stderr
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("cluster down left the object store running")
        assert json.load(open(os.path.join(data, "cluster.json")))["tiered_storage"]["pid"] is None
    finally:
        kraftlog("cluster", "down", "--data-dir", data)
