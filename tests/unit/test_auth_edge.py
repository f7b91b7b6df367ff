"""The authentication edge (http_api/wire/auth.py): the cache of successful Basic checks
(hit, invalidated by a changed or deleted credential), the per-address failure limit
(429 without a password check, cached credentials still pass, refills with time), and the
deploy rule that brokers of a secured node get no raft secret."""
from __future__ import annotations

import types

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

import http_api.wire.auth as auth
from deploy.config import NodeConfig
from deploy.supervisor import broker_env
from http_api.broker.internal_auth import broker_cluster_secret
from http_api.wire.auth import AuthMiddleware, Authenticator, basic_header
from metadata_quorum.security.config import SecurityConfig
from metadata_quorum.security.scram import make_credential

import pytest

BASIC = SecurityConfig(authentication=("basic",), authentication_failures_max_per_second=5)


class Image:
    def __init__(self, **users):
        self.users = {u: make_credential(p) for u, p in users.items()}

    def get(self):
        return types.SimpleNamespace(scram_credentials=self.users, tokens={}, acls=(), version=1)


def req(user, password):
    return make_mocked_request("GET", "/v1/topics", headers={"Authorization": basic_header(user, password)})


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = auth.verify_password

    def verify(cred, password):
        calls.append(password)
        return real(cred, password)
    monkeypatch.setattr(auth, "verify_password", verify)
    return calls


def test_successful_checks_are_cached_and_a_changed_credential_drops_them(counted):
    img = Image(alice="pw1")
    a = Authenticator(BASIC, img.get)
    for _ in range(50):
        assert a.authenticate(req("alice", "pw1")) == "User:alice"
    assert len(counted) == 1 and a.cache_hits == 49          # one PBKDF2, then the cache
    with pytest.raises(auth.AuthenticationFailed):
        a.authenticate(req("alice", "wrong"))               # a wrong password is never a hit
    img.users["alice"] = make_credential("pw2")             # password changed (new salt)
    with pytest.raises(auth.AuthenticationFailed):
        a.authenticate(req("alice", "pw1"))                 # the cached old password is gone
    assert a.authenticate(req("alice", "pw2")) == "User:alice"
    assert a.authenticate(req("alice", "pw2")) == "User:alice"
    assert counted == ["pw1", "wrong", "pw1", "pw2"]
    del img.users["alice"]                                  # user deleted
    with pytest.raises(auth.AuthenticationFailed):
        a.authenticate(req("alice", "pw2"))


async def test_failures_are_rate_limited_per_address_without_password_checks(counted):
    now = [100.0]
    a = Authenticator(BASIC, Image(alice="pw").get, clock=lambda: now[0])

    async def ok(request):
        return web.json_response({"principal": auth.principal_of(request)})

    app = web.Application(middlewares=[AuthMiddleware(a)])
    app.router.add_get("/x", ok)
    app.router.add_get("/healthz", ok)
    async with TestClient(TestServer(app)) as c:
        good = {"Authorization": basic_header("alice", "pw")}
        assert (await c.get("/x", headers=good)).status == 200          # cached from now on
        bad = {"Authorization": basic_header("alice", "guess")}
        statuses = [(await c.get("/x", headers=bad)).status for _ in range(8)]
        assert statuses == [401] * 5 + [429] * 3, statuses
        checks = len(counted)
        assert checks == 1 + 5                                          # no PBKDF2 once throttled
        r = await c.get("/x", headers=bad)
        assert r.status == 429 and "authentication_failures_max_per_second" in (await r.json())["message"]
        assert (await c.get("/x")).status == 429                        # no credentials: throttled too
        assert (await c.get("/x", headers=good)).status == 200          # a cached credential still passes
        assert (await c.get("/healthz")).status == 200
        assert len(counted) == checks
        now[0] += 1.0                                                   # a second later: 5 more tries
        assert [(await c.get("/x", headers=bad)).status for _ in range(6)] == [401] * 5 + [429]
        assert a.failures == 10 and a.limiter.refused >= 5


def test_no_authentication_is_anonymous():
    a = Authenticator(SecurityConfig())
    assert a.authenticate(make_mocked_request("GET", "/x")) == auth.ANONYMOUS


def test_brokers_of_a_secured_node_get_no_raft_secret():
    env = {"KRAFTLOG_RAFT_PASSWORD": "raft-secret"}
    plain = NodeConfig.load(None, {})
    assert broker_env(plain, env)["KRAFTLOG_RAFT_PASSWORD"] == "raft-secret"
    secure = NodeConfig.load(None, {"authentication": ["basic"], "authorizer": "acl"})
    assert broker_env(secure, env)["KRAFTLOG_RAFT_PASSWORD"] == ""
    assert broker_cluster_secret(secure.broker.security, None, env) is None
    assert broker_cluster_secret(secure.broker.security, "configured", env) is None
    assert broker_cluster_secret(plain.broker.security, None, env) == "raft-secret"
