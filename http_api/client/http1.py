"""The client's own HTTP/1.1 connections for its hot paths (produce and fetch requests).

aiohttp's client costs several hundred microseconds of CPU per request (docs/PERFORMANCE.md);
a produce or fetch request needs far less: one prebuilt request head, a keep-alive
connection, and a response parser that reads a Content-Length body straight into one
preallocated buffer (`asyncio.BufferedProtocol`: the socket reads into it, no chunk joining).

`Http1Connection` is one keep-alive connection (plain TCP or TLS) carrying one request at a
time; `Http1Pool` keeps the idle ones per broker. A response is framed by Content-Length,
chunked transfer coding, or the end of the connection. Invariants: a connection goes back to
the pool only after a whole response was read on it and neither side asked to close it; a
request that fails, times out or is cancelled mid-way closes its connection (its response
may still arrive). Failures raise `ConnectionError` (closed before the response was whole,
malformed response), `asyncio.TimeoutError` or `OSError`/`ssl.SSLError` from the connect."""
from __future__ import annotations

import asyncio
import functools
import ssl
import time
from urllib.parse import urlencode, urlsplit

from multidict import CIMultiDict

DEFAULT_MAX_IDLE_CONNECTIONS = 64   # idle keep-alive connections kept per broker
# an idle connection older than this is closed instead of reused: before aiohttp's server closes
# it (75 s), so a request never races the server's close (aiohttp's client also uses 60 s)
DEFAULT_IDLE_TIMEOUT_MS = 60_000
MAX_HEAD_BYTES = 64 * 1024          # a response head longer than this is refused
_READ_CHUNK_BYTES = 256 * 1024      # read buffer for heads, chunked bodies and bodies without a length

_IDLE, _HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE = range(5)


class Http1Connection(asyncio.BufferedProtocol):
    """One keep-alive HTTP/1.1 connection, one request at a time (see module docstring)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False      # a whole response was read and nobody asked to close
        self.idle_since = 0.0      # monotonic time it went back to the pool
        self._state = _IDLE
        self._waiter: asyncio.Future | None = None
        self._scratch = bytearray(_READ_CHUNK_BYTES)
        self._scratch_view = memoryview(self._scratch)
        self._buf = bytearray()    # head bytes, or raw chunked / until-close body bytes
        self._status = 0
        self._headers: CIMultiDict | None = None
        self._keep_alive = True
        self._body: bytearray | None = None
        self._body_view: memoryview | None = None
        self._filled = 0
        self._chunks = bytearray()   # a chunked body, decoded

    # ---- asyncio callbacks ------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.reusable = False
        if self._state == _UNTIL_CLOSE and exc is None:
            self._finish(bytes(self._buf))
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionResetError(
                f"the broker closed the connection before the whole response arrived ({exc or 'EOF'})"))
        self._state = _IDLE

    def eof_received(self):
        return None   # close our side too: connection_lost follows

    def get_buffer(self, sizehint: int):
        if self._state == _LENGTH:
            return self._body_view[self._filled:]
        return self._scratch_view

    def buffer_updated(self, nbytes: int) -> None:
        if self._state == _LENGTH:
            self._filled += nbytes
            if self._filled == len(self._body):
                self._finish(self._body)
            return
        if self._state == _IDLE:   # bytes nobody asked for: the connection cannot be trusted
            self._fail(ConnectionError("the broker sent bytes outside of a response"))
            return
        self._buf += self._scratch_view[:nbytes]
        self._progress()

    # ---- one request --------------------------------------------------------------------

    def exchange(self, request: bytes, timeout_s: float) -> asyncio.Future:
        """Send `request` (head and body); -> a future of (status, headers, body)."""
        loop = asyncio.get_running_loop()
        self.reusable = False
        self._waiter = waiter = loop.create_future()
        self._state = _HEAD
        self._buf = bytearray()
        timer = loop.call_later(timeout_s, self._timed_out, waiter, timeout_s)
        waiter.add_done_callback(lambda _f: timer.cancel())
        self.transport.write(request)
        return waiter

    def _timed_out(self, waiter: asyncio.Future, timeout_s: float) -> None:
        if waiter is self._waiter and not waiter.done():
            self._fail(asyncio.TimeoutError(f"no whole response within {timeout_s:.3f} s"))

    def abort(self) -> None:
        """Drop the connection (a request abandoned mid-way)."""
        self.reusable = False
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: BaseException) -> None:
        waiter = self._waiter
        self._state = _IDLE
        self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _finish(self, body) -> None:
        self._state = _IDLE
        self._body = self._body_view = None
        waiter, self._waiter = self._waiter, None
        self.reusable = self._keep_alive and not self.closed
        if not self._keep_alive and self.transport is not None:
            self.transport.close()
        if waiter is not None and not waiter.done():
            # a Content-Length body is the bytearray the socket read into (no copy), others bytes
            waiter.set_result((self._status, self._headers, body if isinstance(body, bytearray) else bytes(body)))

    # ---- parsing ------------------------------------------------------------------------

    def _progress(self) -> None:
        try:
            if self._state == _HEAD:
                self._parse_head()
            if self._state == _CHUNKED:
                self._parse_chunks()
        except (ValueError, IndexError) as e:
            self._fail(ConnectionError(f"malformed HTTP response from the broker: {e}"))

    def _parse_head(self) -> None:
        while self._state == _HEAD:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD_BYTES:
                    raise ValueError(f"response head longer than {MAX_HEAD_BYTES} bytes")
                return
            lines = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
            rest = self._buf[end + 4:]
            version, status = lines[0].split(" ", 2)[:2]
            if not version.startswith("HTTP/1."):
                raise ValueError(f"status line {lines[0]!r}")
            code = int(status)
            headers = CIMultiDict()
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep:
                    raise ValueError(f"header line {line!r}")
                headers.add(name.strip(), value.strip())
            if 100 <= code < 200:    # an interim answer (100 Continue): the real one follows
                self._buf = rest
                continue
            self._status, self._headers = code, headers
            connection = headers.get("Connection", "").lower()
            self._keep_alive = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
            if code in (204, 304):
                self._buf = bytearray()
                self._finish(b"")
            elif "chunked" in headers.get("Transfer-Encoding", "").lower():
                self._buf = rest
                self._chunks = bytearray()
                self._state = _CHUNKED
            elif "Content-Length" in headers:
                length = int(headers["Content-Length"])
                if length < 0 or len(rest) > length:
                    raise ValueError("body longer than its Content-Length")
                self._buf = bytearray()
                if len(rest) == length:
                    self._finish(bytes(rest))
                    return
                self._body = bytearray(length)
                self._body[:len(rest)] = rest
                self._body_view = memoryview(self._body)
                self._filled = len(rest)
                self._state = _LENGTH
            else:   # the body ends with the connection
                self._keep_alive = False
                self._buf = rest
                self._state = _UNTIL_CLOSE

    def _parse_chunks(self) -> None:
        buf = self._buf
        pos = 0
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(bytes(buf[pos:eol]).split(b";", 1)[0].strip(), 16)
            if size == 0:   # the last chunk, then optional trailers up to an empty line
                end = buf.find(b"\r\n\r\n", eol)
                if buf[eol:eol + 4] != b"\r\n\r\n" and end < 0:
                    break
                self._buf = bytearray()
                self._finish(bytes(self._chunks))
                return
            if len(buf) < eol + 2 + size + 2:
                break
            if buf[eol + 2 + size:eol + 4 + size] != b"\r\n":
                raise ValueError("chunk not followed by CRLF")
            self._chunks += buf[eol + 2:eol + 2 + size]
            pos = eol + 4 + size
        if pos:
            del buf[:pos]


@functools.lru_cache(maxsize=1024)
def _split_url(url: str) -> tuple[tuple[str, str, int], str, str, str]:
    """-> ((scheme, host, port), path, query, Host header) of a URL (cached: a producer asks
    for the same few URLs again and again)."""
    u = urlsplit(url)
    scheme = u.scheme or "http"
    host = u.hostname or "127.0.0.1"
    port = u.port or (443 if scheme == "https" else 80)
    return (scheme, host, port), u.path or "/", u.query, u.netloc.rsplit("@", 1)[-1]


def build_request(method: str, url: str, *, headers: dict[str, str], body: bytes | None,
                  params: dict | None = None) -> tuple[tuple[str, str, int], bytes]:
    """-> ((scheme, host, port), the request's bytes: head and body)."""
    key, target, query, host_header = _split_url(url)
    if params:
        query = f"{query}&{urlencode(params)}" if query else urlencode(params)
    if query:
        target = f"{target}?{query}"
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body) if body is not None else 0}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return key, (head + body if body else head)


class Http1Pool:
    """Idle keep-alive `Http1Connection`s per broker (scheme, host, port); at most
    `max_idle_connections` kept per broker, the rest closed when released; one idle for
    `idle_timeout_ms` or longer is closed instead of reused."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None,
                 max_idle_connections: int = DEFAULT_MAX_IDLE_CONNECTIONS,
                 idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS) -> None:
        self.ssl_context = ssl_context
        self.max_idle_connections = max_idle_connections
        self.idle_timeout_s = idle_timeout_ms / 1000
        self._idle: dict[tuple[str, str, int], list[Http1Connection]] = {}
        self._open: set[Http1Connection] = set()   # every connection not yet closed, idle or busy
        self.connects = 0   # connections opened (keep-alive reuse shows as fewer)
        self.closed = False

    async def request(self, method: str, url: str, *, headers: dict[str, str], body: bytes | None = None,
                      params: dict | None = None, timeout_s: float, connect_timeout_s: float):
        """One request on an idle or new connection; -> (status, headers, body). The body is
        bytes, or for a Content-Length body longer than the first read the bytearray the
        socket read into (not copied again: fetches of megabytes)."""
        if self.closed:
            raise ConnectionError("the client is closed")
        key, raw = build_request(method, url, headers=headers, body=body, params=params)
        deadline = time.monotonic() + timeout_s
        conn = self._take(key)
        if conn is None:
            conn = await self._connect(key, min(connect_timeout_s, timeout_s))
        try:
            result = await conn.exchange(raw, max(0.0, deadline - time.monotonic()))
        except BaseException:
            conn.abort()   # failed, timed out or cancelled mid-way: never reused
            self._open.discard(conn)
            raise
        self._release(key, conn)
        return result

    def _take(self, key) -> Http1Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.reusable:
                if now - conn.idle_since < self.idle_timeout_s:
                    return conn
                conn.abort()
            self._open.discard(conn)
        return None

    def _release(self, key, conn: Http1Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if conn.reusable and not conn.closed and len(idle) < self.max_idle_connections:
            conn.idle_since = time.monotonic()
            idle.append(conn)
            return
        if not conn.closed:
            conn.abort()
        self._open.discard(conn)

    async def _connect(self, key, timeout_s: float) -> Http1Connection:
        scheme, host, port = key
        ctx = None
        if scheme == "https":
            ctx = self.ssl_context if self.ssl_context is not None else ssl.create_default_context()
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(Http1Connection, host, port, ssl=ctx,
                                   server_hostname=host if ctx is not None else None), timeout_s)
        if self.closed:   # closed while connecting: nobody would ever close this one
            conn.abort()
            raise ConnectionError("the client is closed")
        self.connects += 1
        self._open.add(conn)
        return conn

    def close(self) -> None:
        """Close every connection, busy ones too (their requests fail with ConnectionError),
        and any a request is still opening."""
        self.closed = True
        for conn in self._open:
            if not conn.closed:
                conn.abort()
        self._open.clear()
        self._idle.clear()
