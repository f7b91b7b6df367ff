"""`kraftlog cluster up --secure`: a 3-node cluster with TLS on every listener; replication
between brokers (RF=3, acks=all, min.insync.replicas=2) and broker -> controller traffic
over TLS (brokers authenticate by their broker-<id> certificates); clients with the
cluster's CA and the admin's password from DATA_DIR/admin.password; plain HTTP refused on
broker and controller ports; the CLI without the CA is refused and told about --ca-file."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import stat
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from deploy.local_node import ROOT, free_port
from deploy.supervisor import port_in_use
from http_api.client import Consumer, Producer

pytestmark = pytest.mark.integration


def free_base_port(n):
    """A base port whose broker, controller and raft ports (base + {0, 1000, 2000} + i) are all
    free now (other tests run beside this one)."""
    for _ in range(200):
        base = free_port()
        if base + 2000 + n < 65535 and not any(port_in_use("127.0.0.1", base + off + i)
                                               for off in (0, 1000, 2000) for i in range(n)):
            return base
    raise RuntimeError("no free base port")


def kraftlog(*args, env=None, input=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], capture_output=True, text=True, input=input,
                          env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})), timeout=timeout, cwd=ROOT)


def https_json(url, ctx, auth, body=None, method="GET"):
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json", "Authorization": auth})
    with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
        return r.status, json.loads(r.read())


def plain_http_refused(url) -> bool:
    """True when a plain HTTP request to `url` gets no HTTP answer (the port speaks TLS)."""
    try:
        urllib.request.urlopen(url, timeout=10)
    except urllib.error.HTTPError:
        return False        # an HTTP answer, even an error: the port speaks plain HTTP
    except (urllib.error.URLError, ConnectionError, OSError):
        return True
    return False


@pytest.fixture
def secure_cluster(tmp_path):
    data = str(tmp_path / "c")
    for _ in range(3):   # a port picked free can be taken before the cluster binds it: pick again
        base = free_base_port(3)
        r = kraftlog("cluster", "up", "--secure", "--nodes", "3", "--data-dir", data, "--base-port", str(base),
                     timeout=240)
        taken = r.returncode != 0 and "is in use" in r.stderr
        if not taken or os.path.exists(os.path.join(data, "cluster.json")):
            break
    try:
        assert r.returncode == 0, r.stderr
        yield data, base, r.stdout.split()
    finally:
        if os.path.exists(os.path.join(data, "cluster.json")):
            down = kraftlog("cluster", "down", "--data-dir", data)
            assert down.returncode == 0, down.stderr


def test_secure_cluster_replicates_over_tls(secure_cluster):
    data, base, urls = secure_cluster
    assert urls == [f"https://127.0.0.1:{base + i}" for i in range(3)]
    ca_file = os.path.join(data, "ca.pem")
    password_file = os.path.join(data, "admin.password")
    assert stat.S_IMODE(os.stat(password_file).st_mode) == 0o600
    password = open(password_file).read().strip()
    assert len(password) >= 16
    auth = "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()
    ctx = ssl.create_default_context(cafile=ca_file)

    # the controllers serve https too, and every listener refuses plain HTTP
    procs = json.loads(kraftlog("cluster", "status", "--data-dir", data, "--output", "json").stdout)
    controller_urls = sorted(p["url"] for p in procs if p["role"] == "controller")
    assert controller_urls == [f"https://127.0.0.1:{base + 1000 + i}" for i in range(3)]
    status, st = https_json(controller_urls[0] + "/controller/v1/status", ctx, auth)
    assert status == 200 and st["leader_url"].startswith("https://")
    for url in urls + controller_urls:
        assert plain_http_refused(url.replace("https://", "http://") + "/healthz"), url

    # brokers registered their https URLs with the controllers (over TLS)
    _, md = https_json(urls[1] + "/v1/metadata", ctx, auth)
    assert sorted(b["url"] for b in md["brokers"]) == urls

    # RF=3 acks=all: min.insync.replicas=2 means every answered write reached a follower over TLS
    status, _ = https_json(urls[0] + "/v1/topics", ctx, auth, method="POST", body={
        "name": "tls-rf3", "partitions": 3, "replication_factor": 3, "configs": {}})
    assert status == 201

    async def produce_and_consume():   # the Python client with the CA and the admin's password
        creds = dict(ca_file=ca_file, user="admin", password=password)
        async with Producer(urls[2], acks="all", **creds) as p:
            futures = [await p.send("tls-rf3", f"v{i}".encode(), key=f"k{i % 7}".encode()) for i in range(300)]
            await p.flush()
            acked = [await f for f in futures]
        assert len(acked) == 300
        got = []
        async with Consumer(urls[1], auto_offset_reset="earliest", **creds) as c:
            await c.subscribe(["tls-rf3"])
            deadline = asyncio.get_running_loop().time() + 60
            while len(got) < 300 and asyncio.get_running_loop().time() < deadline:
                got += [r.value.decode() for r in await c.poll(1000)]
        return got

    got = asyncio.run(produce_and_consume())
    assert sorted(got) == sorted(f"v{i}" for i in range(300))

    # every replica kept up over TLS: the ISR of every partition is still all three brokers
    _, topic = https_json(urls[0] + "/v1/topics/tls-rf3", ctx, auth)
    assert all(sorted(p["isr"]) == [1, 2, 3] for p in topic["partitions"]), topic

    # the CLI with --ca-file / $KRAFTLOG_CA_FILE and the admin's password file
    login = ["--user", "admin", "--password-file", password_file]
    r = kraftlog("produce", "tls-rf3", "--bootstrap", urls[1], "--ca-file", ca_file, *login,
                 input="cli-1\ncli-2\n", env={"KRAFTLOG_CA_FILE": ""})
    assert r.returncode == 0, r.stderr
    r = kraftlog("consume", "tls-rf3", "--from-beginning", "--max-records", "302", "--bootstrap", urls[2], *login,
                 env={"KRAFTLOG_CA_FILE": ca_file})
    assert r.returncode == 0, r.stderr
    assert {"cli-1", "cli-2"} <= set(r.stdout.split())

    # the CLI without the CA: refused by the TLS handshake, and told what to do
    r = kraftlog("topic", "list", "--bootstrap", urls[0], env={"KRAFTLOG_CA_FILE": ""})
    assert r.returncode != 0 and "--ca-file" in r.stderr and "certificate verify failed" in r.stderr, r.stderr
