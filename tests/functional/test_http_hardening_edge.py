"""The hardened HTTP edge (http_api/wire/hardening.py) in-process, over real sockets: a
slowloris head or body is closed at its deadline, a long poll that only waits to answer is
not, connection caps per address and in total answer 429, and rejected or malformed
requests log one line each (no traceback) within a per-second budget."""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import time

import pytest
from aiohttp import web

from http_api.wire.hardening import HardenedAppRunner, HttpLimits, RateLimitedLog
from http_api.wire.middleware import ErrorMiddleware
from partitions.errors import ErrorCode, KraftlogError

LOG = logging.getLogger("kraftlog.test_edge")


def make_app() -> web.Application:
    async def slow(request):   # a long poll: waits to answer, long after receiving the request
        await asyncio.sleep(float(request.query.get("s", "1.0")))
        return web.json_response({"waited": True})

    async def echo(request):
        raw = await request.read()
        try:
            doc = json.loads(raw)
        except ValueError:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "the body must be JSON") from None
        return web.json_response(doc)

    app = web.Application(middlewares=[ErrorMiddleware(LOG, unexpected_log="bug in {method} {path}")])
    app.router.add_get("/slow", slow)
    app.router.add_post("/echo", echo)
    return app


@pytest.fixture
async def edge():
    servers = []

    async def start(**limits):
        runner = HardenedAppRunner(make_app(), HttpLimits(**limits), LOG, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        servers.append(runner)
        port = site._server.sockets[0].getsockname()[1]
        return runner, port

    yield start
    for r in servers:
        await r.cleanup()


async def connect(port):
    return await asyncio.open_connection("127.0.0.1", port)


async def closed_within(reader, timeout: float) -> bytes:
    """Read until the server closes; fail if it does not within `timeout`. Returns the bytes."""
    data = b""
    async with asyncio.timeout(timeout):
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return data
            data += chunk


async def test_a_head_sent_byte_by_byte_is_closed_at_the_header_deadline(edge):
    runner, port = await edge(request_header_timeout_ms=400)
    reader, writer = await connect(port)
    head = b"GET /slow?s=0 HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200 + b"\r\n\r\n"
    started = time.monotonic()

    async def dribble():
        for b in head:
            writer.write(bytes([b]))
            await asyncio.sleep(0.05)     # 10+ s for the whole head

    task = asyncio.create_task(dribble())
    try:
        got = await closed_within(reader, 3.0)
    finally:
        task.cancel()
        writer.close()
    elapsed = time.monotonic() - started
    assert got == b"" and 0.35 <= elapsed < 3.0, (got, elapsed)
    assert runner.guard.stats.header_timeouts == 1


async def test_a_connection_sending_nothing_is_closed_at_the_header_deadline(edge):
    runner, port = await edge(request_header_timeout_ms=300)
    reader, writer = await connect(port)
    started = time.monotonic()
    assert await closed_within(reader, 3.0) == b""
    assert time.monotonic() - started >= 0.25
    writer.close()


async def test_a_body_never_finished_gets_408_and_is_closed_at_the_body_deadline(edge):
    runner, port = await edge(request_body_timeout_ms=400)
    reader, writer = await connect(port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"a\":")
    started = time.monotonic()
    got = await closed_within(reader, 4.0)
    writer.close()
    assert time.monotonic() - started >= 0.35
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    assert b"request_body_timeout_ms=400" in got
    assert runner.guard.stats.body_timeouts == 1


async def test_long_polls_and_kept_alive_requests_outlive_the_deadlines(edge):
    """The deadlines bound receiving: a 1.2 s long poll answers with 300 ms deadlines, and
    a kept-alive connection serves a second request after an idle pause."""
    _, port = await edge(request_header_timeout_ms=300, request_body_timeout_ms=300)
    reader, writer = await connect(port)
    try:
        for _ in range(2):
            writer.write(b"GET /slow?s=1.2 HTTP/1.1\r\nHost: x\r\n\r\n")
            async with asyncio.timeout(5):
                status = await reader.readline()
                assert status.startswith(b"HTTP/1.1 200"), status
                length = 0
                while (line := await reader.readline()) != b"\r\n":
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                assert json.loads(await reader.readexactly(length)) == {"waited": True}
            await asyncio.sleep(0.6)       # idle between requests: keep-alive, not a head deadline
        body = b'{"k": 1}'
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        async with asyncio.timeout(5):
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    finally:
        writer.close()


async def test_connections_per_address_and_in_total_are_capped(edge):
    runner, port = await edge(connections_max_per_ip=3)
    conns = [await connect(port) for _ in range(3)]
    await asyncio.sleep(0)   # let the server accept them
    for _ in range(50):
        if runner.guard.per_ip.get("127.0.0.1") == 3:
            break
        await asyncio.sleep(0.02)
    reader, writer = await connect(port)
    got = await closed_within(reader, 3.0)
    writer.close()
    assert got.startswith(b"HTTP/1.1 429"), got[:200]
    assert b"THROTTLING_QUOTA_EXCEEDED" in got and b"connections_max_per_ip=3" in got
    assert runner.guard.stats.connections_refused == 1
    for _, w in conns:         # closing one frees its slot
        w.close()
    for _ in range(100):
        if not runner.guard.per_ip:
            break
        await asyncio.sleep(0.02)
    assert runner.guard.total == 0 and runner.guard.per_ip == {}
    reader, writer = await connect(port)
    writer.write(b"GET /slow?s=0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (await closed_within(reader, 3.0)).startswith(b"HTTP/1.1 200")
    writer.close()

    runner2, port2 = await edge(connections_max=2)
    conns2 = [await connect(port2) for _ in range(2)]
    for _ in range(50):
        if runner2.guard.total == 2:
            break
        await asyncio.sleep(0.02)
    reader, writer = await connect(port2)
    got = await closed_within(reader, 3.0)
    assert got.startswith(b"HTTP/1.1 429") and b"connections_max=2" in got, got[:200]
    writer.close()
    for _, w in conns2:
        w.close()


async def test_malformed_requests_log_one_line_each_without_a_traceback(edge, caplog):
    runner, port = await edge()
    caplog.set_level(logging.INFO)
    for raw in (b"GARBAGE\x00\x01 / HTTP/1.1\r\n\r\n",                           # bad request line
                b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"):     # bad header
        reader, writer = await connect(port)
        writer.write(raw)
        got = await closed_within(reader, 3.0)
        writer.close()
        assert got.startswith((b"HTTP/1.1 400", b"HTTP/1.0 400")), got[:200]
        assert b'"error_code": "INVALID_REQUEST"' in got or b'"error_code":"INVALID_REQUEST"' in got, got
    reader, writer = await connect(port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\n{{{{{")
    got = await closed_within(reader, 3.0)
    writer.close()
    assert got.startswith(b"HTTP/1.1 400") and b"the body must be JSON" in got
    lines = [r for r in caplog.records if r.name == LOG.name]
    assert len(lines) == 3, [r.getMessage() for r in lines]
    assert all(r.exc_info is None and "Traceback" not in r.getMessage() for r in caplog.records)
    assert all("\n" not in r.getMessage() for r in lines)   # a client's bytes cannot forge log lines
    assert "POST /echo" in lines[2].getMessage() and "INVALID_REQUEST" in lines[2].getMessage()
    assert runner.guard.stats.malformed_requests == 2 and runner.guard.stats.rejected_requests >= 1


async def test_rejection_lines_are_rate_limited_with_a_suppressed_count(edge, caplog):
    runner, port = await edge(rejected_request_logs_per_second=3)
    caplog.set_level(logging.INFO)
    reader, writer = await connect(port)
    body = b"not json"
    t0 = time.monotonic()
    for _ in range(20):
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        async with asyncio.timeout(5):
            assert (await reader.readline()).startswith(b"HTTP/1.1 400")
            length = 0
            while (line := await reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
    windows = int(time.monotonic()) - int(t0) + 1
    lines = [r.getMessage() for r in caplog.records if r.name == LOG.name]
    assert len(lines) <= 3 * windows and runner.guard.log.suppressed_total == 20 - len(lines), lines
    await asyncio.sleep(1.05 - (time.monotonic() % 1.0))   # next window: the count is reported
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    async with asyncio.timeout(5):
        await reader.readline()
    writer.close()
    for _ in range(50):
        lines = [r.getMessage() for r in caplog.records if r.name == LOG.name]
        if "suppressed" in lines[-1]:
            break
        await asyncio.sleep(0.02)
    assert "suppressed" in lines[-1], lines[-3:]


def test_rate_limited_log_budget_and_suppressed_count():
    now = [100.0]
    records = []

    class Capture(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("kraftlog.test_edge.rate")
    logger.addHandler(h := Capture())
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        rl = RateLimitedLog(logger, 2, clock=lambda: now[0])
        assert [rl.log(logging.WARNING, "line %d", i) for i in range(5)] == [True, True, False, False, False]
        now[0] = 101.2
        assert rl.log(logging.WARNING, "line %d", 5)
        assert records == ["line 0", "line 1", "line 5 (suppressed 3 similar lines)"]
        assert rl.suppressed_total == 3
    finally:
        logger.removeHandler(h)


def test_limits_are_validated():
    with pytest.raises(ValueError, match="connections_max_per_ip"):
        HttpLimits(connections_max_per_ip=-1)
    assert HttpLimits().request_header_timeout_ms == 10_000 and HttpLimits().request_body_timeout_ms == 30_000
