"""Error answers of the broker app and the controller app, pinned byte for byte: both servers
share one error middleware (http_api/wire/middleware.py), and each keeps the answers it gave
before the merge (status, Content-Type, body), the broker's correlation id echo and internal
token check, and the logging rule: expected errors are answered without a log line, only a
bug logs, once, with its traceback."""
from __future__ import annotations

import asyncio
import json
import logging
import random
import types

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from http_api.broker.metadata_view import MetadataView
from http_api.broker.app import BrokerDeps, create_app
from http_api.broker.config import BrokerConfig
from metadata_quorum.controller_server import ControllerConfig, ControllerServer, Voter
from metadata_quorum.state_machine import MetadataStateMachine
from partitions.errors import ErrorCode, KraftlogError
from raft import InMemoryReplicatedLog

JSON = "application/json"
JSON_UTF8 = "application/json; charset=utf-8"


def _add_probe_routes(app: web.Application) -> None:
    """Handlers that fail in each way a handler can."""
    async def kraftlog_error(request):
        raise KraftlogError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "not the leader", leader_id=2)

    async def bug(request):
        raise RuntimeError("a bug")

    async def too_large(request):
        raise web.HTTPRequestEntityTooLarge(max_size=10, actual_size=20)

    async def unavailable(request):
        raise web.HTTPServiceUnavailable(reason="going away")

    async def redirect(request):
        raise web.HTTPFound("/elsewhere")

    async def cancelled(request):
        raise asyncio.CancelledError()

    async def ok(request):
        return web.json_response({"ok": True})

    for path, h in [("/probe/kraftlog-error", kraftlog_error), ("/probe/bug", bug), ("/probe/too-large", too_large),
                    ("/probe/unavailable", unavailable), ("/probe/redirect", redirect),
                    ("/probe/cancelled", cancelled), ("/probe/ok", ok)]:
        app.router.add_get(path, h)


def _broker_app() -> web.Application:
    config = BrokerConfig(broker_id=1, cluster_secret="s3cret")
    rm = types.SimpleNamespace()
    deps = BrokerDeps(replica_manager=rm, metadata=MetadataView(rm),
                      controller=None, groups=None)
    app = create_app(config, deps)
    _add_probe_routes(app)
    return app


def _controller_app() -> web.Application:
    voters = {1: Voter(1, "127.0.0.1", 1, 2)}
    config = ControllerConfig(node_id=1, data_dir="/nonexistent", voters=voters, cluster_id="c-test")
    sm = MetadataStateMachine("c-test")
    server = ControllerServer(config, sm, InMemoryReplicatedLog(sm, node_id=1, leader=False), rng=random.Random(1))
    app = server.build_app()
    _add_probe_routes(app)
    return app


async def _answer(client: TestClient, method: str, path: str, **kw) -> tuple[int, str, bytes]:
    async with client.request(method, path, allow_redirects=False, **kw) as r:
        return r.status, r.headers.get("Content-Type"), await r.read()


def _body(code: str, message: str, **extra) -> bytes:
    return json.dumps({"error_code": code, "message": message, **extra}).encode()


@pytest.fixture
def logged(caplog):
    caplog.set_level(logging.DEBUG, logger="kraftlog")
    return caplog


async def _client(app: web.Application) -> TestClient:
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_broker_error_answers_and_logs(logged):
    client = await _client(_broker_app())
    try:
        not_leader = _body("NOT_LEADER_OR_FOLLOWER", "not the leader", leader_id=2)
        assert await _answer(client, "GET", "/probe/kraftlog-error") == (421, JSON, not_leader)
        assert await _answer(client, "GET", "/probe/too-large") == (
            413, JSON, _body("RECORD_LIST_TOO_LARGE", "Request Entity Too Large"))
        assert await _answer(client, "GET", "/probe/unavailable") == (
            503, JSON, _body("INVALID_REQUEST", "going away"))
        assert await _answer(client, "GET", "/no/such/route") == (
            404, JSON, _body("INVALID_REQUEST", "no route GET /no/such/route; see GET /openapi.json"))
        assert await _answer(client, "DELETE", "/v1/metadata") == (
            405, JSON, _body("INVALID_REQUEST", "no route DELETE /v1/metadata; see GET /openapi.json"))
        assert await _answer(client, "POST", "/internal/v1/replica-fetch", json={}) == (
            401, JSON, _body("SASL_AUTHENTICATION_FAILED",
                             "/internal/v1/replica-fetch is for the brokers of this cluster: the request lacks "
                             "the token of the cluster secret (set the same `password` on every node)"))
        status, _, _ = await _answer(client, "GET", "/probe/redirect")
        assert status == 302
        assert [r for r in logged.records if r.levelno >= logging.WARNING] == []   # expected errors: no log

        # the correlation id comes back on answers and on error answers
        async with client.get("/probe/ok", headers={"X-Correlation-Id": "c-1"}) as r:
            assert r.status == 200 and r.headers["X-Correlation-Id"] == "c-1"
        async with client.get("/probe/kraftlog-error", headers={"X-Correlation-Id": "c-2"}) as r:
            assert r.status == 421 and r.headers["X-Correlation-Id"] == "c-2"

        # a bug: one log line with its traceback, a 500 naming the exception
        assert await _answer(client, "GET", "/probe/bug", headers={"X-Client-Id": "cli"}) == (
            500, JSON, _body("UNKNOWN_SERVER_ERROR", "internal error: RuntimeError: a bug; see the broker log"))
        errors = [r for r in logged.records if r.levelno >= logging.WARNING]
        assert [(r.name, r.getMessage()) for r in errors] == [
            ("kraftlog.broker", "unhandled error in GET /probe/bug (client_id=cli)")]
        assert errors[0].exc_info is not None and errors[0].exc_info[0] is RuntimeError

        # a cancelled handler (its client went away) is not an error: no log line of ours
        logged.clear()
        with pytest.raises(Exception):
            await _answer(client, "GET", "/probe/cancelled")
        assert [r for r in logged.records if r.name.startswith("kraftlog") and r.levelno >= logging.WARNING] == []
    finally:
        await client.close()


async def test_controller_error_answers_and_logs(logged):
    client = await _client(_controller_app())
    try:
        not_leader = _body("NOT_LEADER_OR_FOLLOWER", "not the leader", leader_id=2)
        assert await _answer(client, "GET", "/probe/kraftlog-error") == (421, JSON_UTF8, not_leader)
        assert await _answer(client, "GET", "/probe/too-large") == (
            413, JSON_UTF8, _body("INVALID_REQUEST", "Request Entity Too Large"))
        assert await _answer(client, "GET", "/probe/unavailable") == (
            503, JSON_UTF8, _body("UNKNOWN_SERVER_ERROR", "going away"))
        assert await _answer(client, "GET", "/no/such/route") == (
            404, JSON_UTF8, _body("INVALID_REQUEST", "Not Found"))
        assert await _answer(client, "DELETE", "/controller/v1/metadata") == (
            405, JSON_UTF8, _body("INVALID_REQUEST", "Method Not Allowed"))
        status, _, _ = await _answer(client, "GET", "/probe/redirect")
        assert status == 302
        async with client.get("/probe/ok", headers={"X-Correlation-Id": "c-1"}) as r:
            assert r.status == 200 and "X-Correlation-Id" not in r.headers
        assert [r for r in logged.records if r.levelno >= logging.WARNING] == []

        assert await _answer(client, "GET", "/probe/bug") == (
            500, JSON_UTF8, _body("UNKNOWN_SERVER_ERROR", "RuntimeError: a bug"))
        errors = [r for r in logged.records if r.levelno >= logging.WARNING]
        assert [(r.name, r.getMessage()) for r in errors] == [("kraftlog.controller", "controller request failed")]
        assert errors[0].exc_info is not None and errors[0].exc_info[0] is RuntimeError

        logged.clear()
        with pytest.raises(Exception):
            await _answer(client, "GET", "/probe/cancelled")
        assert [r for r in logged.records if r.name.startswith("kraftlog") and r.levelno >= logging.WARNING] == []
    finally:
        await client.close()
