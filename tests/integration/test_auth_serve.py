"""`kraftlog serve` with [security] HTTP Basic and ACLs but no TLS (issue 16): the broker
authenticates to its controller with a generated broker password (DATA_DIR/broker.password,
its verifier in DATA_DIR/broker-credentials.json), the broker process holds no raft secret,
clients need credentials, and a user gets exactly what the ACLs give."""
from __future__ import annotations

import asyncio
import json
import os

import aiohttp

from deploy.local_node import LocalNode
from http_api.wire.auth import basic_header

ADMIN = {"Authorization": basic_header("admin", "admin-pw")}


def _config(tmp_path) -> str:
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"admin": "admin-pw", "carol": "carol-pw"}))
    path = tmp_path / "node.toml"
    path.write_text(f'[security]\nauthentication = ["basic"]\nauthorizer = "acl"\nsuper_users = ["User:admin"]\n'
                    f'bootstrap_users_file = "{users}"\n')
    return str(path)


def _environ(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(e.decode().split("=", 1) for e in f.read().split(b"\0") if b"=" in e)


async def test_secured_node_without_tls_serves_authenticated_clients(tmp_path):
    data = tmp_path / "data"
    node = LocalNode(str(data), extra_args=["--config", _config(tmp_path)])
    try:
        node.start(timeout=90)      # ready = the broker registered with its controller as broker-1
        assert "UNAUTHENTICATED" not in node.output
        assert (data / "broker.password").exists() and oct((data / "broker.password").stat().st_mode)[-3:] == "600"
        verifiers = json.loads((data / "broker-credentials.json").read_text())
        assert list(verifiers) == ["broker-1"] and "broker.password" not in json.dumps(verifiers)
        pids = {int(p) for p in os.listdir("/proc") if p.isdigit()}
        brokers = [p for p in pids if "http_api.broker.server" in _cmdline(p) and str(data) in _cmdline(p)]
        assert brokers and all(not _environ(p).get("KRAFTLOG_RAFT_PASSWORD") for p in brokers)
        async with aiohttp.ClientSession() as s:
            async with s.get(node.url + "/v1/topics") as r:
                assert r.status == 401 and "Basic" in r.headers["WWW-Authenticate"]
            # the active controller creates the bootstrap users once it is active, and the broker
            # learns them from the metadata: poll until admin authenticates (bounded)
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                async with s.get(node.url + "/v1/topics", headers=ADMIN) as r:
                    if r.status == 200:
                        break
                    assert r.status == 401 and asyncio.get_running_loop().time() < deadline, await r.text()
                await asyncio.sleep(0.1)
            async with s.post(node.url + "/v1/topics", headers=ADMIN,
                              json={"name": "orders", "partitions": 1, "replication_factor": 1}) as r:
                assert r.status == 201, await r.text()
            carol = {"Authorization": basic_header("carol", "carol-pw")}
            async with s.post(node.url + "/v1/topics/orders/records", json={"records": [{"value": "v"}]},
                              headers=carol) as r:
                doc = await r.json()
                assert r.status == 403 and doc["error_code"] == "TOPIC_AUTHORIZATION_FAILED", doc
            async with s.post(node.url + "/v1/admin/acls", headers=ADMIN, json={
                    "principal": "User:carol", "resource_type": "TOPIC", "resource_name": "orders",
                    "operation": "WRITE"}) as r:
                assert r.status == 201, await r.text()
            async with s.post(node.url + "/v1/topics/orders/records", json={"records": [{"value": "v"}]},
                              headers=carol) as r:
                assert r.status == 200, await r.text()
            async with s.get(node.url + "/metrics", headers=carol) as r:
                assert r.status == 403     # DESCRIBE on the cluster needed
    finally:
        node.stop()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_node_without_security_says_it_is_unauthenticated(tmp_path):
    node = LocalNode(str(tmp_path / "data"))
    try:
        node.start(timeout=90)
        lines = [ln for ln in node.output.splitlines() if "UNAUTHENTICATED" in ln]
        assert len(lines) == 2, node.output      # once by the broker, once by the controller
        assert any("broker 1" in ln for ln in lines) and any("controller 1" in ln for ln in lines)
    finally:
        node.stop()
