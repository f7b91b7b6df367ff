"""Growing a `--secure` local cluster (issue 17): `kraftlog cluster add-broker` and `cluster
add-controller` give the new node a certificate from the cluster's CA (CN broker-<id>, a
broker principal) and talk TLS as admin; the added broker replicates over TLS, the added
controller joins the quorum; `cluster down` + `cluster up` restarts both (cluster.json)."""
import base64
import json
import os
import ssl
import time
import urllib.request

import pytest

from deploy.cluster import CONTROLLER_PORT_OFFSET, RAFT_PORT_OFFSET, load_state
from tests.integration.test_cli_cluster import free_base_port, kraftlog

pytestmark = pytest.mark.integration


def https_json(url, ctx, auth, body=None, method="GET"):
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json", "Authorization": auth})
    with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
        return r.status, json.loads(r.read())


def wait_for(cond, what, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            out = cond()
        except OSError:
            out = None
        if out:
            return out
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout}s: {what}")


def test_secure_cluster_add_broker_and_controller_then_restart(tmp_path):
    data = str(tmp_path / "c")
    base = free_base_port(3, offsets=(0, CONTROLLER_PORT_OFFSET, RAFT_PORT_OFFSET, 3500))
    r = kraftlog("cluster", "up", "--secure", "--nodes", "1", "--data-dir", data, "--base-port", str(base),
                 "--kafka-base-port", str(base + 3500), timeout=240)
    try:
        assert r.returncode == 0, r.stderr
        url1, url2 = f"https://127.0.0.1:{base}", f"https://127.0.0.1:{base + 1}"
        ctx = ssl.create_default_context(cafile=os.path.join(data, "ca.pem"))
        password = open(os.path.join(data, "admin.password")).read().strip()
        auth = "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()

        r = kraftlog("cluster", "add-broker", "--data-dir", data, timeout=180)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [url2]
        r = kraftlog("cluster", "add-controller", "--data-dir", data, timeout=180)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [f"https://127.0.0.1:{base + CONTROLLER_PORT_OFFSET + 2}"]
        _, quorum = https_json(url1 + "/v1/admin/quorum", ctx, auth)
        assert [v["id"] for v in quorum["voters"]] == [1, 3]
        assert quorum["voters"][1]["address"] == f"127.0.0.1:{base + RAFT_PORT_OFFSET + 2}"

        # the added broker (User:broker-2 by its certificate) follows over TLS: in the ISR
        status, _ = https_json(url1 + "/v1/topics", ctx, auth, method="POST", body={
            "name": "grown", "partitions": 2, "replication_factor": 2})
        assert status == 201
        def write(p):   # acks=all through the partition's leader
            md = https_json(url1 + "/v1/metadata", ctx, auth)[1]
            leader = next(q["leader"] for t in md["topics"] if t["name"] == "grown" for q in t["partitions"]
                          if q["partition"] == p)
            leader_url = next((b["url"] for b in md["brokers"] if b["id"] == leader), None)
            return leader_url and https_json(f"{leader_url}/v1/topics/grown/partitions/{p}/records", ctx, auth,
                                             method="POST", body={"records": [{"value": f"v{p}"}]})[0] == 200
        for p in (0, 1):
            wait_for(lambda: write(p), f"a write to grown-{p}")

        def in_sync():
            md = https_json(url2 + "/v1/metadata", ctx, auth)[1]
            parts = [q for t in md["topics"] if t["name"] == "grown" for q in t["partitions"]]
            return len(parts) == 2 and all(sorted(q["isr"]) == [1, 2] for q in parts)
        wait_for(in_sync, "broker 2 in the ISR of every grown partition")
    finally:
        down = kraftlog("cluster", "down", "--data-dir", data)
    assert down.returncode == 0, down.stderr
    assert sorted(load_state(data)["added_controllers"]) == [3] and load_state(data)["added_brokers"] == [2]

    r = kraftlog("cluster", "up", "--nodes", "1", "--data-dir", data, "--base-port", str(base), timeout=240)
    try:
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [url1, url2]
        r = kraftlog("cluster", "status", "--data-dir", data, "--output", "json")
        assert {(p["node_id"], p["role"]) for p in json.loads(r.stdout)} == {
            (1, "controller"), (1, "broker"), (2, "broker"), (3, "controller")}
        # a 2-voter quorum writes metadata only with the restarted controller 3
        assert https_json(url2 + "/v1/topics", ctx, auth, method="POST", body={
            "name": "after-restart", "partitions": 1, "replication_factor": 2})[0] == 201
        quorum = wait_for(lambda: (lambda q: q if q["leader_id"] in (1, 3) else None)(
            https_json(url1 + "/v1/admin/quorum", ctx, auth)[1]), "a quorum leader after the restart")
        assert [v["id"] for v in quorum["voters"]] == [1, 3]
    finally:
        down = kraftlog("cluster", "down", "--data-dir", data)
    assert down.returncode == 0, down.stderr
