"""The follower's lean HTTP/1.1 replica client against real sockets: an aiohttp leader app
(the broker's own server stack) and hand-written raw servers that misbehave on purpose.
Each test runs on asyncio's loop and on uvloop (conftest.py)."""
from __future__ import annotations

import asyncio
import os

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from http_api.broker import replica_client
from partitions.errors import ErrorCode, KraftlogError
from http_api.broker.replica_client import ReplicaTransport, decode_fetch_response, encode_fetch_header
from http_api.broker.replica_connection import ReplicaConnectionPool


def _answer(chunks: list[bytes]) -> tuple[list[dict], bytes]:
    entries = [{"topic": "t", "partition": i, "size": len(c), "high_watermark": 10 + i, "log_start_offset": 0,
                "log_end_offset": 20 + i} for i, c in enumerate(chunks)]
    return entries, encode_fetch_header(entries) + b"".join(chunks)


async def _leader_app(chunks: list[bytes], seen: list, refuse: bool = False) -> TestServer:
    """An aiohttp leader answering replica-fetch the way the broker app does (StreamResponse,
    Content-Length, header then chunks written separately), or refusing it."""
    entries, _ = _answer(chunks)

    async def fetch(request):
        seen.append(await request.json())
        if refuse:
            return web.json_response({"error_code": "FENCED_LEADER_EPOCH", "message": "stale epoch"}, status=400)
        head = encode_fetch_header(entries)
        resp = web.StreamResponse(headers={"Content-Type": replica_client.REPLICA_FETCH_MEDIA})
        resp.content_length = len(head) + sum(map(len, chunks))
        await resp.prepare(request)
        await resp.write(head)
        for c in chunks:
            await resp.write(c)
        await resp.write_eof()
        return resp

    async def epochs(request):
        doc = await request.json()
        return web.json_response({"partitions": [
            {"topic": p["topic"], "partition": p["partition"], "epoch": p["epoch"], "end_offset": 42}
            for p in doc["partitions"]]})

    app = web.Application()
    app.router.add_post("/internal/v1/replica-fetch", fetch)
    app.router.add_post("/internal/v1/epoch-end-offsets", epochs)
    server = TestServer(app)
    await server.start_server()
    return server


async def _fetch(t: ReplicaTransport, url: str, **kw):
    return await t.fetch(url, 2, 1, [{"topic": "t", "partition": 0, "offset": 0, "leader_epoch": 1}],
                         max_bytes=1 << 20, partition_max_bytes=1 << 20, max_wait_ms=kw.get("max_wait_ms", 100))


async def test_fetch_answers_every_partition_byte_for_byte_over_one_kept_alive_connection():
    chunks = [os.urandom(3 * 1024 * 1024 + 7), b"", os.urandom(100_000)]
    seen: list = []
    server = await _leader_app(chunks, seen)
    t = ReplicaTransport(request_timeout_ms=5000)
    try:
        url = str(server.make_url("")).rstrip("/")
        for _ in range(3):
            parts = await _fetch(t, url)
            assert [bytes(p.records) for p in parts] == chunks
            assert [(p.high_watermark, p.log_end_offset) for p in parts] == [(10, 20), (11, 21), (12, 22)]
        assert len(seen) == 3 and seen[0]["replica_id"] == 2 and seen[0]["broker_epoch"] == 1
        idle = [c for q in t.pool._idle.values() for c in q]
        assert len(idle) == 1 and not idle[0].closed          # the same connection served all three
        answers = await t.epoch_end_offsets(url, 2, [{"topic": "t", "partition": 0, "leader_epoch": 1, "epoch": 0}])
        assert answers == [("t", 0, 0, 42, None)]
    finally:
        await t.close()
        await server.close()


async def test_error_status_becomes_the_leaders_error_code():
    server = await _leader_app([b"x"], [], refuse=True)
    t = ReplicaTransport(request_timeout_ms=5000)
    try:
        with pytest.raises(KraftlogError) as e:
            await _fetch(t, str(server.make_url("")).rstrip("/"))
        assert e.value.code is ErrorCode.FENCED_LEADER_EPOCH and "stale epoch" in e.value.message
        assert [c for q in t.pool._idle.values() for c in q]   # an error answer keeps the connection
    finally:
        await t.close()
        await server.close()


async def test_nothing_listening_is_broker_not_available_refused():
    t = ReplicaTransport(request_timeout_ms=2000)
    srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    srv.close()
    await srv.wait_closed()
    with pytest.raises(KraftlogError) as e:
        await _fetch(t, f"http://127.0.0.1:{port}")
    assert e.value.code is ErrorCode.BROKER_NOT_AVAILABLE and e.value.extra.get("refused") is True
    await t.close()


class RawLeader:
    """A TCP server scripted per connection: `script(reader, writer)`."""

    def __init__(self, script):
        self.script = script
        self.connections = 0

    async def __aenter__(self):
        async def handle(reader, writer):
            self.connections += 1
            try:
                await self.script(reader, writer, self.connections)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()
        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        await self.server.wait_closed()


async def _read_request(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int([line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")][0])
    return await reader.readexactly(length)


def _http(body: bytes, extra_headers: str = "") -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Type: {replica_client.REPLICA_FETCH_MEDIA}\r\n"
            f"Content-Length: {len(body)}\r\n{extra_headers}\r\n").encode() + body


async def test_answer_dribbled_in_tiny_pieces_is_assembled_exactly():
    entries, body = _answer([os.urandom(50_000), os.urandom(777)])
    wire = _http(body)

    async def script(reader, writer, n):
        while True:
            await _read_request(reader)
            for i in range(0, len(wire), 997):
                writer.write(wire[i:i + 997])
                await writer.drain()
                if i % 20 == 0:
                    await asyncio.sleep(0)
    async with RawLeader(script) as leader:
        t = ReplicaTransport(request_timeout_ms=5000)
        parts = await _fetch(t, leader.url)
        assert b"".join(bytes(p.records) for p in parts) == body[-50_777:]
        parts = await _fetch(t, leader.url)
        assert len(parts) == 2 and leader.connections == 1
        await t.close()


@pytest.mark.parametrize("wire, why", [
    (_http(b"x" * 100)[:-40], "closed mid-body"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "chunked"),
    (b"HTTP/1.1 200 OK\r\n\r\n", "no content-length"),
    (b"SMTP ready\r\n\r\n", "not http"),
    (_http(b"abc") + b"garbage after the answer", "extra bytes"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000 + b"\r\n\r\n", "headers too long"),
])
async def test_a_garbled_or_cut_answer_is_broker_not_available_and_the_connection_dropped(wire, why):
    async def script(reader, writer, n):
        await _read_request(reader)
        writer.write(wire)
        await writer.drain()
        if why == "extra bytes":
            await asyncio.sleep(0.3)
    async with RawLeader(script) as leader:
        t = ReplicaTransport(request_timeout_ms=2000)
        with pytest.raises(KraftlogError) as e:
            await _fetch(t, leader.url)
            if why == "extra bytes":    # the answer itself was whole; the garbage kills the connection
                await asyncio.sleep(0.2)
                await _fetch(t, leader.url)
        assert e.value.code is ErrorCode.BROKER_NOT_AVAILABLE, why
        assert not [c for q in t.pool._idle.values() for c in q if not c.closed]
        await t.close()


async def test_a_leader_that_never_answers_times_out_and_a_cancelled_request_never_reuses_its_connection():
    async def script(reader, writer, n):
        await _read_request(reader)
        if n <= 2:
            await asyncio.sleep(30)       # hangs (blackholed leader)
            return
        _, body = _answer([b"late"])
        writer.write(_http(body))
        await writer.drain()
        await asyncio.sleep(1)
    async with RawLeader(script) as leader:
        t = ReplicaTransport(request_timeout_ms=300)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(KraftlogError) as e:
            await _fetch(t, leader.url, max_wait_ms=0)
        assert e.value.code is ErrorCode.BROKER_NOT_AVAILABLE and loop.time() - t0 < 2
        task = asyncio.ensure_future(_fetch(t, leader.url, max_wait_ms=0))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        parts = await _fetch(t, leader.url)        # a third, fresh connection answers
        assert bytes(parts[0].records) == b"late" and leader.connections == 3
        await t.close()


async def test_a_kept_alive_connection_closed_by_the_leader_while_idle_is_replaced_transparently():
    _, body = _answer([b"abc"])

    async def script(reader, writer, n):
        await _read_request(reader)
        writer.write(_http(body))
        await writer.drain()
        # the leader closes right after answering (idle keep-alive timeout)
    async with RawLeader(script) as leader:
        t = ReplicaTransport(request_timeout_ms=2000)
        for _ in range(3):
            parts = await _fetch(t, leader.url)
            assert bytes(parts[0].records) == b"abc"
            await asyncio.sleep(0.05)
        assert leader.connections == 3
        await t.close()


async def test_connection_close_header_is_honoured():
    _, body = _answer([b"abc"])

    async def script(reader, writer, n):
        while True:
            await _read_request(reader)
            writer.write(_http(body, "Connection: close\r\n"))
            await writer.drain()
    async with RawLeader(script) as leader:
        t = ReplicaTransport(request_timeout_ms=2000)
        await _fetch(t, leader.url)
        await _fetch(t, leader.url)
        assert leader.connections == 2
        await t.close()


def test_decode_rejects_answers_shorter_than_their_header_and_malformed_entries():
    entries, body = _answer([b"12345"])
    assert bytes(decode_fetch_response(body)[0].records) == b"12345"
    for bad in (body[:-1], body[:3], encode_fetch_header([{"topic": "t"}])):
        with pytest.raises(KraftlogError) as e:
            decode_fetch_response(bad)
        assert e.value.code is ErrorCode.CORRUPT_MESSAGE


def test_only_http_urls_are_spoken_to():
    with pytest.raises(ValueError):
        ReplicaConnectionPool.address("https://leader:9092")
    assert ReplicaConnectionPool.address("http://10.0.0.5:8082/") == ("10.0.0.5", 8082)



async def test_ipv6_leader_address_gets_a_bracketed_host_header():
    entries, _ = _answer([b"v6"])
    hosts = []

    async def fetch(request):
        hosts.append(request.headers["Host"])
        return web.Response(body=encode_fetch_header(entries) + b"v6", content_type=replica_client.REPLICA_FETCH_MEDIA)
    app = web.Application()
    app.router.add_post("/internal/v1/replica-fetch", fetch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "::1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    t = ReplicaTransport(request_timeout_ms=2000)
    try:
        parts = await _fetch(t, f"http://[::1]:{port}")
        assert bytes(parts[0].records) == b"v6" and hosts == [f"[::1]:{port}"]
    finally:
        await t.close()
        await runner.cleanup()
