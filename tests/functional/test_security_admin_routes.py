"""Users, bearer tokens and ACLs through the HTTP routes, in-process: a broker app
(`/v1/admin/...`) forwarding to a real controller server (`/controller/v1/security/...`)
over the in-memory raft log, with the broker's MetadataView fed by the real metadata
follower. Also the users bootstrap of `[security] bootstrap_users_file`."""
from __future__ import annotations

import asyncio
import json
import logging
import random

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from http_api.broker.app import BrokerDeps, create_app
from http_api.broker.config import BrokerConfig
from http_api.broker.metadata_view import MetadataView
from metadata_quorum.client import ControllerClient, MetadataFollower
from metadata_quorum.controller_server import ControllerConfig, ControllerServer, Voter
from metadata_quorum.security.config import SecurityConfig
from metadata_quorum.security.scram import hash_token, make_credential, verify_password
from metadata_quorum.state_machine import MetadataStateMachine
from raft import InMemoryReplicatedLog
from tests.rigs.controllers import free_port

PASSWORD = "correct-horse-battery-staple"


class _NoReplicas:
    """The replica manager part a security-only broker needs."""

    async def apply_metadata(self, image) -> None:
        return None


async def _until(pred, what: str, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


class Cluster:
    def __init__(self, server, runner, client, follower_task, broker):
        self.server, self.runner, self.client, self.follower_task, self.broker = (
            server, runner, client, follower_task, broker)

    @property
    def security(self):
        return self.server.sm.image.security


async def _start(tmp_path, security: SecurityConfig = SecurityConfig()) -> Cluster:
    port = free_port()
    voters = {1: Voter(1, "127.0.0.1", free_port(), port)}
    config = ControllerConfig(node_id=1, data_dir=str(tmp_path / "ctl"), voters=voters, cluster_id="c-sec",
                              maintenance_interval_ms=20, security=security)
    sm = MetadataStateMachine("c-sec")
    raft_log = InMemoryReplicatedLog(sm, node_id=1, leader=False)
    server = ControllerServer(config, sm, raft_log, rng=random.Random(1))
    runner = web.AppRunner(server.build_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    maint = asyncio.create_task(server.maintenance_loop())
    raft_log.become_leader()
    await _until(lambda: server.is_active, "the controller active")
    controller = ControllerClient([f"http://127.0.0.1:{port}"], request_timeout_ms=5000)
    view = MetadataView(_NoReplicas())
    follower = MetadataFollower(controller, lambda img, _changed=None: view.update(img), max_wait_ms=1000)
    task = asyncio.create_task(follower.run())
    deps = BrokerDeps(replica_manager=_NoReplicas(), metadata=view, controller=controller, groups=None)
    broker = TestClient(TestServer(create_app(BrokerConfig(broker_id=1), deps)))
    await broker.start_server()
    c = Cluster(server, runner, controller, task, broker)
    c.maint, c.view = maint, view
    await _until(lambda: view.image is not None, "the broker's first metadata")
    return c


async def _stop(c: Cluster) -> None:
    c.follower_task.cancel()
    c.maint.cancel()
    await c.broker.close()
    await c.client.close()
    await c.runner.cleanup()


@pytest.fixture
async def cluster(tmp_path):
    c = await _start(tmp_path)
    try:
        yield c
    finally:
        await _stop(c)


async def _call(c: Cluster, method: str, path: str, body=None):
    async with c.broker.request(method, path, json=body) as r:
        raw = await r.read()
        return r.status, (json.loads(raw) if raw else None)


async def test_users_are_created_listed_altered_and_deleted_without_exposing_keys(cluster, caplog):
    caplog.set_level(logging.DEBUG)
    status, doc = await _call(cluster, "POST", "/v1/admin/users", {"name": "alice", "password": PASSWORD})
    assert status == 201 and doc == {"name": "alice", "mechanism": "SCRAM-SHA-256", "iterations": 4096}
    # the broker answered once its own metadata had the user; the controller stores the credential only
    assert "alice" in cluster.view.security.scram_credentials
    assert verify_password(cluster.security.scram_credentials["alice"], PASSWORD)
    status, doc = await _call(cluster, "GET", "/v1/admin/users")
    assert status == 200 and doc == {"users": [{"name": "alice", "mechanism": "SCRAM-SHA-256", "iterations": 4096}]}

    status, doc = await _call(cluster, "POST", "/v1/admin/users", {"name": "alice", "password": "other"})
    assert status == 409 and doc["error_code"] == "DUPLICATE_RESOURCE"
    status, doc = await _call(cluster, "POST", "/v1/admin/users",
                              {"name": "weak", "password": PASSWORD, "iterations": 1000})
    assert status == 400 and doc["error_code"] == "INVALID_REQUEST" and "4096" in doc["message"]
    status, doc = await _call(cluster, "POST", "/v1/admin/users", {"name": "bad:name", "password": PASSWORD})
    assert status == 400 and doc["error_code"] == "INVALID_REQUEST"

    status, doc = await _call(cluster, "PUT", "/v1/admin/users/alice", {"password": "new-" + PASSWORD})
    assert status == 200
    assert verify_password(cluster.view.security.scram_credentials["alice"], "new-" + PASSWORD)
    # a precomputed credential: the password never reaches the cluster
    cred = make_credential("offline-secret", iterations=8192)
    status, doc = await _call(cluster, "POST", "/v1/admin/users", {"name": "svc", "credential": cred.to_dict()})
    assert status == 201 and doc["iterations"] == 8192
    assert cluster.view.security.scram_credentials["svc"] == cred

    status, _ = await _call(cluster, "DELETE", "/v1/admin/users/alice")
    assert status == 204 and "alice" not in cluster.view.security.scram_credentials
    status, doc = await _call(cluster, "DELETE", "/v1/admin/users/alice")
    assert status == 404 and doc["error_code"] == "RESOURCE_NOT_FOUND"
    # never logged, never in the replicated state
    assert PASSWORD not in caplog.text and "offline-secret" not in caplog.text
    assert PASSWORD not in json.dumps(cluster.server.sm.snapshot())
    assert PASSWORD not in json.dumps(cluster.server.sm.records_since(0, 1000))


async def test_tokens_are_returned_once_and_stored_by_hash(cluster):
    status, doc = await _call(cluster, "POST", "/v1/admin/tokens", {"principal": "User:svc", "lifetime_ms": 60_000})
    assert status == 201 and doc["principal"] == "User:svc" and doc["expiry_timestamp_ms"] > 0
    token, token_id = doc["token"], doc["token_id"]
    assert len(token) >= 40
    sec = cluster.view.security
    assert sec.token_principals == {hash_token(token): "User:svc"}
    assert token not in json.dumps(cluster.server.sm.snapshot())
    status, doc = await _call(cluster, "GET", "/v1/admin/tokens")
    assert status == 200 and [t["token_id"] for t in doc["tokens"]] == [token_id]
    assert token not in json.dumps(doc) and hash_token(token) not in json.dumps(doc)
    status, doc = await _call(cluster, "POST", "/v1/admin/tokens", {"principal": "svc"})
    assert status == 400 and doc["error_code"] == "INVALID_REQUEST"
    status, _ = await _call(cluster, "DELETE", f"/v1/admin/tokens/{token_id}")
    assert status == 204 and cluster.view.security.token_principals == {}
    status, doc = await _call(cluster, "DELETE", f"/v1/admin/tokens/{token_id}")
    assert status == 404 and doc["error_code"] == "RESOURCE_NOT_FOUND"


async def test_the_controller_removes_expired_tokens(cluster):
    status, doc = await _call(cluster, "POST", "/v1/admin/tokens", {"principal": "User:short", "lifetime_ms": 50})
    assert status == 201
    status, kept = await _call(cluster, "POST", "/v1/admin/tokens", {"principal": "User:long"})
    assert status == 201
    await _until(lambda: doc["token_id"] not in cluster.view.security.tokens, "the expired token removed")
    assert list(cluster.view.security.tokens) == [kept["token_id"]]


async def test_acls_are_added_listed_filtered_and_removed(cluster):
    read = {"principal": "User:alice", "resource_type": "TOPIC", "resource_name": "orders",
            "pattern_type": "LITERAL", "operation": "READ", "permission": "ALLOW"}
    deny = {"principal": "User:bob", "resource_type": "GROUP", "resource_name": "app-",
            "pattern_type": "PREFIXED", "operation": "ALL", "permission": "DENY"}
    status, doc = await _call(cluster, "POST", "/v1/admin/acls", {"acls": [read, deny]})
    assert status == 201 and [a["principal"] for a in doc["acls"]] == ["User:alice", "User:bob"]
    assert len(cluster.view.security.acls) == 2
    status, doc = await _call(cluster, "GET", "/v1/admin/acls")
    assert status == 200 and [dict(a, host="*") for a in doc["acls"]] == [dict(read, host="*"), dict(deny, host="*")]
    status, doc = await _call(cluster, "GET", "/v1/admin/acls?principal=User:bob")
    assert [a["resource_name"] for a in doc["acls"]] == ["app-"]
    status, doc = await _call(cluster, "GET", "/v1/admin/acls?resource_type=topic&resource_name=orders")
    assert [a["principal"] for a in doc["acls"]] == ["User:alice"]
    status, doc = await _call(cluster, "GET", "/v1/admin/acls?resource_type=table")
    assert status == 400 and doc["error_code"] == "INVALID_REQUEST"

    status, doc = await _call(cluster, "POST", "/v1/admin/acls", read)
    assert status == 409 and doc["error_code"] == "DUPLICATE_RESOURCE"
    status, doc = await _call(cluster, "POST", "/v1/admin/acls", dict(read, operation="EAT"))
    assert status == 400 and doc["error_code"] == "INVALID_REQUEST"

    status, doc = await _call(cluster, "POST", "/v1/admin/acls/delete", read)
    assert status == 200 and doc["deleted"][0]["principal"] == "User:alice"
    assert [b.principal for b in cluster.view.security.acls] == ["User:bob"]
    status, doc = await _call(cluster, "POST", "/v1/admin/acls/delete", read)
    assert status == 404 and doc["error_code"] == "RESOURCE_NOT_FOUND"


async def test_security_routes_are_in_the_openapi_document(cluster):
    status, doc = await _call(cluster, "GET", "/openapi.json")
    assert status == 200
    for path in ("/v1/admin/users", "/v1/admin/users/{name}", "/v1/admin/tokens", "/v1/admin/tokens/{token_id}",
                 "/v1/admin/acls", "/v1/admin/acls/delete"):
        assert path in doc["paths"], path


async def test_the_active_controller_creates_the_bootstrap_users(tmp_path):
    users_file = tmp_path / "users.json"
    precomputed = make_credential("pre", iterations=4096)
    users_file.write_text(json.dumps({"admin": "root-password", "svc": precomputed.to_dict()}))
    c = await _start(tmp_path, SecurityConfig(bootstrap_users_file=str(users_file)))
    try:
        await _until(lambda: {"admin", "svc"} <= set(c.view.security.scram_credentials), "the bootstrap users")
        assert verify_password(c.view.security.scram_credentials["admin"], "root-password")
        assert c.view.security.scram_credentials["svc"] == precomputed
        # a user changed since is left alone on the next activation
        status, _ = await _call(c, "PUT", "/v1/admin/users/admin", {"password": "rotated"})
        assert status == 200
        c.server.security._bootstrapped_term = None
        await c.server.security.bootstrap_if_needed()
        assert verify_password(c.security.scram_credentials["admin"], "rotated")
    finally:
        await _stop(c)
