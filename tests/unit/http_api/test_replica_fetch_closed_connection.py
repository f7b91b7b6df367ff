"""A follower that gave up on its replica fetch (its timeout) closes the connection before
the leader answers: the leader's write fails with a connection reset. That is no error of
the leader: it must not be logged as an unhandled error (seen at 100,000 partitions, issue 25)."""
from __future__ import annotations

import logging
from types import SimpleNamespace

from aiohttp import web

from http_api.broker.replica import ReplicaRoutes


class _ResetOnPrepare(web.StreamResponse):
    async def prepare(self, request):
        raise ConnectionResetError("Cannot write to closing transport")


async def test_an_answer_to_a_closed_connection_is_dropped_quietly(monkeypatch, caplog):
    routes = ReplicaRoutes.__new__(ReplicaRoutes)

    async def read_document(request):
        return {"replica_id": 2, "partitions": []}

    async def replica_fetch(*a, **kw):
        return []
    routes.ctx = SimpleNamespace(read_document=read_document)
    routes.config = SimpleNamespace(fetch_max_wait_ms=500, fetch_max_bytes=1 << 20, fetch_default_max_bytes=1 << 20)
    routes.rm = SimpleNamespace(replica_fetch=replica_fetch, closing=False, core=SimpleNamespace(
        fetch_request_from=lambda *a: None), _clock_ms=lambda: 0)
    routes.metrics = SimpleNamespace(replica_fetch_requests=SimpleNamespace(inc=lambda *a: None),
                                     replica_fetch_bytes=SimpleNamespace(inc=lambda *a: None))
    monkeypatch.setattr(web, "StreamResponse", _ResetOnPrepare)
    with caplog.at_level(logging.DEBUG, logger="kraftlog.broker"):
        resp = await routes.replica_fetch(SimpleNamespace())
    assert isinstance(resp, _ResetOnPrepare)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
