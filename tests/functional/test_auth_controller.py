"""The controller API with [security] authentication on (issue 16): only cluster principals
(brokers `User:broker-<id>`, super users) get in, and a broker registers, heartbeats and
reports only as itself: a forged registration is refused and the real one stays."""
from __future__ import annotations

import types
import uuid

import aiohttp
import pytest

from http_api.wire.auth import basic_header, broker_auth_headers, write_broker_credentials
from metadata_quorum.client import ControllerClient
from metadata_quorum.security.config import SecurityConfig
from metadata_quorum.security.scram import make_credential
from partitions.errors import ErrorCode, KraftlogError
from tests.functional.test_controller_api import start_node, stop_node

BROKER_PASSWORDS = {1: "pw-one", 2: "pw-two"}


def broker(bid):
    return {"Authorization": basic_header(f"broker-{bid}", BROKER_PASSWORDS[bid])}


ADMIN = {"Authorization": basic_header("admin", "admin-pw")}
ALICE = {"Authorization": basic_header("alice", "alice-pw")}


@pytest.fixture
async def node(tmp_path):
    creds = tmp_path / "broker-credentials.json"
    write_broker_credentials(str(creds), BROKER_PASSWORDS)
    security = SecurityConfig(authentication=("basic",), super_users=("User:admin",),
                              broker_credentials_file=str(creds), authentication_failures_max_per_second=1000)
    n = await start_node(security=security)
    users = {"admin": make_credential("admin-pw"), "alice": make_credential("alice-pw")}
    n.server.authenticator.image = lambda: types.SimpleNamespace(scram_credentials=users, tokens={},
                                                                 acls=(), version=1)
    try:
        async with aiohttp.ClientSession() as s:
            yield n, s
    finally:
        await stop_node(n)


def registration(bid, incarnation=None):
    return {"broker_id": bid, "incarnation_id": incarnation or uuid.uuid4().hex, "url": f"http://b{bid}:1"}


async def test_anonymous_and_wrong_credentials_get_401(node):
    n, s = node
    for headers in ({}, {"Authorization": basic_header("broker-1", "wrong")}):
        async with s.post(n.url + "/controller/v1/brokers/register", json=registration(1), headers=headers) as r:
            assert r.status == 401 and (await r.json())["error_code"] == "SASL_AUTHENTICATION_FAILED"
            assert 'Basic realm="kraftlog"' in r.headers["WWW-Authenticate"]
    async with s.get(n.url + "/healthz") as r:
        assert r.status == 200       # stays open


async def test_forged_registration_is_refused_and_the_real_one_stays(node):
    n, s = node
    real = registration(1)
    async with s.post(n.url + "/controller/v1/brokers/register", json=real, headers=broker(1)) as r:
        assert r.status == 200, await r.text()
        epoch = (await r.json())["broker_epoch"]
    for headers in (broker(2), ADMIN, ALICE):
        async with s.post(n.url + "/controller/v1/brokers/register", json=registration(1, "forged"),
                          headers=headers) as r:
            doc = await r.json()
            assert r.status == 403 and doc["error_code"] == "CLUSTER_AUTHORIZATION_FAILED", doc
            assert "may not act as broker 1" in doc["message"]
        async with s.post(n.url + "/controller/v1/brokers/heartbeat",
                          json={"broker_id": 1, "broker_epoch": epoch, "want_shutdown": True}, headers=headers) as r:
            assert r.status == 403
    b = n.server.sm.image.brokers[1]
    assert b.incarnation_id == real["incarnation_id"] and b.epoch == epoch and not b.in_controlled_shutdown
    async with s.post(n.url + "/controller/v1/brokers/heartbeat",
                      json={"broker_id": 1, "broker_epoch": epoch, "metadata_offset": 0}, headers=broker(1)) as r:
        assert r.status == 200, await r.text()


async def test_controller_api_is_for_cluster_principals_only(node):
    n, s = node
    for headers, status in ((ALICE, 403), (ADMIN, 200), (broker(2), 200)):
        async with s.get(n.url + "/controller/v1/metadata", headers=headers) as r:
            assert r.status == status, (headers, await r.text())
        async with s.post(n.url + "/controller/v1/topics", headers=headers,
                          json={"name": f"t{status}{len(headers)}", "partitions": 1, "replication_factor": 1}) as r:
            assert (r.status == 403) is (status == 403), await r.text()


async def test_broker_client_authenticates_with_its_password(node, tmp_path):
    n, _ = node
    pw = tmp_path / "broker-1.password"
    pw.write_text(BROKER_PASSWORDS[1] + "\n")
    security = SecurityConfig(authentication=("basic",), broker_password_file=str(pw))
    async with ControllerClient([n.url], headers=broker_auth_headers(security, 1)) as c:
        epoch = await c.register_broker(1, uuid.uuid4().hex, "http://b1:1")
        assert epoch >= 0
        with pytest.raises(KraftlogError) as e:      # a broker cannot register another
            await c.register_broker(2, uuid.uuid4().hex, "http://b2:1")
        assert e.value.code is ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    async with ControllerClient([n.url]) as c:       # no credentials
        with pytest.raises(KraftlogError) as e:
            await c.register_broker(1, uuid.uuid4().hex, "http://b1:1")
        assert e.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
