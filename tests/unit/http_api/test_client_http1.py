"""The client's own HTTP/1.1 connections (http_api/client/http1.py) that carry produce and
fetch requests: Content-Length and chunked framing (bytes arriving in any split), keep-alive
reuse, a connection closed mid-body, a timeout, Connection: close, TLS, and the Transport
mapping their failures and error answers as it does for aiohttp's. Servers are in-process,
on ports from bind(0)."""
from __future__ import annotations

import asyncio
import json
import ssl

import pytest
import trustme
from aiohttp import web

from http_api.client.http1 import Http1Pool
from http_api.client.transport import Transport
from partitions.errors import ErrorCode, KraftlogError


class ScriptedServer:
    """Answers each request with the next scripted response: a list of byte pieces written
    one by one (each drained), then `close` (after the pieces) or keep-alive."""

    def __init__(self, script: list[tuple[list[bytes], bool]]) -> None:
        self.script = list(script)
        self.requests: list[tuple[bytes, bytes]] = []   # (head, body)
        self.connections = 0
        self.server = None
        self.url = ""

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.script:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                pieces, close = self.script.pop(0)
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def _split(data: bytes, n: int) -> list[bytes]:
    return [data[i:i + n] for i in range(0, len(data), n)]


async def _req(pool: Http1Pool, url: str, path: str = "/x", body: bytes | None = b"payload", timeout_s: float = 30):
    return await pool.request("POST", url + path, headers={"Accept": "*/*"}, body=body, timeout_s=timeout_s,
                              connect_timeout_s=10)


async def test_content_length_bodies_in_any_split_share_one_keep_alive_connection():
    big = bytes(range(256)) * 4096   # 1 MiB: read into one preallocated buffer
    script = [(_split(_ok(b"first", "X-Kraftlog-Next-Offset: 7\r\n"), 3), False),
              ([_ok(big)], False), (_split(_ok(b""), 1), False)]
    async with ScriptedServer(script) as srv:
        pool = Http1Pool()
        status, headers, body = await _req(pool, srv.url, "/a?x=1")
        assert (status, body, headers.get("x-kraftlog-next-offset")) == (200, b"first", "7")
        assert (await _req(pool, srv.url))[2] == big
        assert (await _req(pool, srv.url, body=None))[2] == b""
        assert srv.connections == 1 and pool.connects == 1
        head, sent = srv.requests[0]
        assert head.startswith(b"POST /a?x=1 HTTP/1.1\r\n") and sent == b"payload"
        pool.close()


async def test_chunked_body_with_extensions_and_trailers_split_byte_by_byte():
    raw = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n")
    script = [(_split(raw, 1), False), ([raw], False)]
    async with ScriptedServer(script) as srv:
        pool = Http1Pool()
        assert (await _req(pool, srv.url))[2] == b"hello world"
        assert (await _req(pool, srv.url))[2] == b"hello world"
        assert pool.connects == 1
        pool.close()


async def test_aiohttp_server_chunked_stream_response_is_read_whole():
    async def stream(request):
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(50):
            await resp.write(b"%04d" % i)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/s", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        pool = Http1Pool()
        for _ in range(2):
            status, _, body = await pool.request("GET", url + "/s", headers={}, timeout_s=30, connect_timeout_s=10)
            assert (status, body) == (200, b"".join(b"%04d" % i for i in range(50)))
        assert pool.connects == 1
        pool.close()
    finally:
        await runner.cleanup()


async def test_connection_close_answers_and_bodies_without_length_are_not_reused():
    script = [([_ok(b"one", "Connection: close\r\n")], True),
              ([b"HTTP/1.1 200 OK\r\n\r\n", b"until ", b"the end"], True),
              ([_ok(b"three")], False)]
    async with ScriptedServer(script) as srv:
        pool = Http1Pool()
        assert (await _req(pool, srv.url))[2] == b"one"
        assert (await _req(pool, srv.url))[2] == b"until the end"
        assert (await _req(pool, srv.url))[2] == b"three"
        assert srv.connections == 3 and pool.connects == 3
        pool.close()


async def test_a_connection_closed_mid_body_fails_the_request_and_is_not_reused():
    script = [([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"only part"], True), ([_ok(b"next")], False)]
    async with ScriptedServer(script) as srv:
        pool = Http1Pool()
        with pytest.raises(ConnectionError, match="before the whole response"):
            await _req(pool, srv.url)
        assert (await _req(pool, srv.url))[2] == b"next"
        assert pool.connects == 2
        pool.close()


async def test_a_timeout_fails_the_request_and_drops_its_connection():
    script = [([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"], False), ([_ok(b"late")], False)]
    async with ScriptedServer(script) as srv:
        pool = Http1Pool()
        with pytest.raises(asyncio.TimeoutError):
            await _req(pool, srv.url, timeout_s=0.3)
        assert (await _req(pool, srv.url))[2] == b"late"
        assert pool.connects == 2
        pool.close()


async def test_a_cancelled_request_drops_its_connection():
    script = [([], False), ([_ok(b"after")], False)]   # the first request is never answered
    async with ScriptedServer(script) as srv:
        pool = Http1Pool()
        task = asyncio.ensure_future(_req(pool, srv.url))
        deadline = asyncio.get_running_loop().time() + 30
        while not srv.requests and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await _req(pool, srv.url))[2] == b"after"
        assert pool.connects == 2
        pool.close()


async def test_transport_hot_requests_carry_headers_params_and_map_errors_as_aiohttp_does():
    err = json.dumps({"error_code": "NOT_LEADER_OR_FOLLOWER", "message": "not the leader"}).encode()
    script = [([_ok(b"ok")], False),
              ([f"HTTP/1.1 421 Misdirected\r\nContent-Length: {len(err)}\r\n\r\n".encode() + err], False),
              ([b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"], False)]
    async with ScriptedServer(script) as srv:
        t = Transport(srv.url, client_id="cid", request_timeout_ms=30_000, token="tok")
        try:
            status, _, body = await t.request("GET", srv.url + "/v1/r", params={"offset": "5", "k": "a b"},
                                              accept="application/x", hot=True)
            assert (status, body) == (200, b"ok")
            head = srv.requests[0][0].decode()
            assert head.startswith("GET /v1/r?offset=5&k=a+b HTTP/1.1\r\n")
            for h in ("Accept: application/x", "X-Client-Id: cid", "Authorization: Bearer tok"):
                assert h in head
            with pytest.raises(KraftlogError) as e:
                await t.request("POST", srv.url + "/v1/r", data=b"b", content_type="t/x", hot=True)
            assert e.value.code is ErrorCode.NOT_LEADER_OR_FOLLOWER
            assert "Content-Type: t/x" in srv.requests[1][0].decode()
            with pytest.raises(KraftlogError) as e:   # closed mid-body: as a connection failure
                await t.request("POST", srv.url + "/v1/r", data=b"b", hot=True, timeout_s=0.3)
            assert e.value.code is ErrorCode.BROKER_NOT_AVAILABLE and t.is_suspect(srv.url)
        finally:
            await t.close()
        with pytest.raises(KraftlogError) as e:   # nobody listens any more
            t2 = Transport(srv.url, client_id="cid", request_timeout_ms=30_000)
            await t2.request("POST", srv.url + "/v1/r", data=b"b", hot=True)
        assert e.value.code is ErrorCode.BROKER_NOT_AVAILABLE
        await t2.close()


async def test_https_brokers_are_reached_over_tls_verified_by_the_ca():
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    requests = 0

    async def serve(reader, writer):
        nonlocal requests
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                requests += 1
                writer.write(_ok(b"secret"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        t = Transport(url, client_id="c", request_timeout_ms=30_000, ssl_context=client_ctx)
        for _ in range(2):
            assert (await t.request("GET", url + "/x", hot=True))[2] == b"secret"
        assert t._pool.connects == 1 and requests == 2
        await t.close()
        untrusted = Transport(url, client_id="c", request_timeout_ms=30_000, ssl_context=ssl.create_default_context())
        with pytest.raises(KraftlogError) as e:
            await untrusted.request("GET", url + "/x", hot=True)
        assert e.value.code is ErrorCode.BROKER_NOT_AVAILABLE and "TLS handshake" in str(e.value)
        await untrusted.close()
    finally:
        server.close()


async def test_a_connection_idle_past_the_idle_timeout_is_not_reused():
    async with ScriptedServer([([_ok(b"1")], False), ([_ok(b"2")], False), ([_ok(b"3")], False)]) as srv:
        pool = Http1Pool(idle_timeout_ms=60_000)
        assert (await _req(pool, srv.url))[2] == b"1"
        assert (await _req(pool, srv.url))[2] == b"2"
        assert pool.connects == 1
        for idle in pool._idle.values():
            for conn in idle:
                conn.idle_since -= 61   # idle for 61 s
        assert (await _req(pool, srv.url))[2] == b"3"
        assert pool.connects == 2
        pool.close()
