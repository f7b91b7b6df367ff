"""The follower's lean HTTP/1.1 client for the internal replication routes.

A replica fetch answer carries hundreds of KiB of record batches. Through aiohttp's client
each byte was copied four times in user space (the event loop's read buffer, the HTTP
parser's body chunks, StreamReader slices, the final join) and every request paid for
aiohttp's request/response machinery. Here a `ReplicaConnection` is an
`asyncio.BufferedProtocol`: the kernel copies the answer body straight into one
`bytearray` of the announced Content-Length, and the follower appends memoryview slices
of it (no further copy).

Scope, on purpose narrow: one request at a time per connection (no pipelining), answers
framed by Content-Length (the broker's aiohttp server always sends it on these routes),
keep-alive, `http://`, or `https://` when the pool has a client TLS context (the node's
CA and client certificate: brokers authenticate to each other by mTLS). Anything else on
the wire is a `ProtocolError` and the connection is dropped. A request that is cancelled or times out drops its connection
too (its answer may still arrive). A request may bound the wait for its answer's first
byte and the pauses between its bytes (`ReadTimeout`, the connection dropped): a leader cut
off mid-request (no RST, packets dropped) leaves the connection open and silent, and the
fetch is re-sent as soon as the wait is over instead of after the whole request timeout
(issue 24: a healed follower rejoined the ISR 5-7 s late). A reused keep-alive connection that the peer closed
while idle is retried once on a fresh connection (both routes are safe to repeat: they
read, and a fetch only restates the follower's log end offset).
"""
from __future__ import annotations

import asyncio
from collections import deque
from urllib.parse import urlsplit

HEADER_BYTES_MAX = 64 * 1024          # status line + headers of one answer
BODY_BYTES_MAX = 256 * 1024 * 1024    # a larger Content-Length is refused as a protocol error
IDLE_CONNECTIONS_MAX = 4              # per leader address


class ProtocolError(Exception):
    """The peer answered something this client does not speak (or closed mid-answer)."""


class ReadTimeout(ProtocolError):
    """The answer did not start, or stopped arriving, within the request's read bounds."""


class ConnectionRefused(Exception):
    """Nothing listens at the leader's address (the process is gone)."""


class _Answer:
    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict, body: bytearray) -> None:
        self.status, self.headers, self.body = status, headers, body


class ReplicaConnection(asyncio.BufferedProtocol):
    """One keep-alive HTTP/1.1 connection; `request` sends one request, reads one answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._head = bytearray(HEADER_BYTES_MAX)
        self._scratch = bytearray(4096)
        self._head_len = 0
        self._body: bytearray | None = None
        self._body_view: memoryview | None = None
        self._body_len = 0
        self._status = 0
        self._headers: dict = {}
        self._keep_alive = True
        self._waiter: asyncio.Future | None = None
        # read bounds of the awaited answer (request's first_byte/idle timeouts)
        self._read_timer: asyncio.TimerHandle | None = None
        self._read_timer_loop: asyncio.AbstractEventLoop | None = None
        self._sent_at = 0.0
        self._last_byte_at: float | None = None   # loop time of its last byte; None: none yet

    # ---- asyncio.BufferedProtocol ----------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        # never an empty buffer (uvloop treats that as a fatal error): once the answer is
        # complete (the loop reads again when a read filled the buffer) or the headers
        # overflow, bytes land in a scratch buffer and buffer_updated refuses them
        if self._body_view is not None and self._body_len < len(self._body_view):
            return self._body_view[self._body_len:]
        if self._body_view is None and self._head_len < len(self._head):
            return memoryview(self._head)[self._head_len:]
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        if nbytes and self._read_timer is not None:
            self._last_byte_at = self._read_timer_loop.time()
        if self._waiter is None or self._waiter.done():
            if nbytes:
                self._fail(ProtocolError("bytes arrived while no request was waiting"))
            return
        if self._body_view is not None:
            if self._body_len >= len(self._body_view):
                self._fail(ProtocolError("more bytes than the announced Content-Length"))
                return
            self._body_len += nbytes
            self._maybe_done()
            return
        if self._head_len >= len(self._head):
            self._fail(ProtocolError(f"answer headers longer than {HEADER_BYTES_MAX} bytes"))
            return
        self._head_len += nbytes
        end = self._head.find(b"\r\n\r\n", 0, self._head_len)
        if end < 0:
            return
        try:
            self._parse_head(bytes(self._head[:end]))
        except ProtocolError as e:
            self._fail(e)
            return
        extra = self._head_len - (end + 4)
        if extra > len(self._body):
            self._fail(ProtocolError("more bytes than the announced Content-Length"))
            return
        self._body[:extra] = self._head[end + 4:self._head_len]
        self._body_len = extra
        self._body_view = memoryview(self._body)
        self._maybe_done()

    def eof_received(self) -> bool:
        self._fail(ProtocolError("the leader closed the connection"))
        return False

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._fail(exc if isinstance(exc, OSError) else ProtocolError("the leader closed the connection"))

    # ---- internals -----------------------------------------------------------------------

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        self._status = int(parts[1])
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise ProtocolError(f"bad header line {line[:80]!r}")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        if "transfer-encoding" in headers:
            raise ProtocolError(f"Transfer-Encoding {headers['transfer-encoding']} is not spoken here")
        try:
            length = int(headers["content-length"])
        except (KeyError, ValueError):
            raise ProtocolError("answer without a Content-Length") from None
        if not 0 <= length <= BODY_BYTES_MAX:
            raise ProtocolError(f"Content-Length {length} outside [0, {BODY_BYTES_MAX}]")
        self._headers = headers
        self._keep_alive = headers.get("connection", "").lower() != "close" and parts[0] != b"HTTP/1.0"
        self._body = bytearray(length)

    def _maybe_done(self) -> None:
        if self._body_len == len(self._body) and self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(_Answer(self._status, self._headers, self._body))

    def _fail(self, exc: BaseException) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _check_read(self, first_byte_timeout_s: float, idle_timeout_s: float) -> None:
        """Timer: fail the request if its answer has not started within `first_byte_timeout_s`
        of sending, or no byte came for `idle_timeout_s` since; otherwise look again then."""
        self._read_timer = None
        if self._waiter is None or self._waiter.done():
            return
        loop = self._read_timer_loop
        if self._last_byte_at is None:
            due = self._sent_at + first_byte_timeout_s
            why = f"no answer within {first_byte_timeout_s * 1000:.0f} ms"
        else:
            due = self._last_byte_at + idle_timeout_s
            why = f"the answer stopped for {idle_timeout_s * 1000:.0f} ms"
        if loop.time() >= due:
            self._fail(ReadTimeout(why))
            return
        self._read_timer = loop.call_at(due, self._check_read, first_byte_timeout_s, idle_timeout_s)

    async def request(self, head: bytes, body: bytes, first_byte_timeout_s: float | None = None,
                      idle_timeout_s: float | None = None) -> _Answer:
        """Send one request (head already has Content-Length) and read its answer. With
        `first_byte_timeout_s`, the answer must start that soon after sending, and then not
        pause for longer than `idle_timeout_s` (default: the same); else `ReadTimeout`."""
        if self.closed or self._waiter is not None:
            raise ProtocolError("connection is closed or busy")
        self._head_len = self._body_len = 0
        self._body = self._body_view = None
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        if first_byte_timeout_s is not None:
            self._read_timer_loop = loop
            self._sent_at, self._last_byte_at = loop.time(), None
            self._read_timer = loop.call_at(self._sent_at + first_byte_timeout_s, self._check_read,
                                            first_byte_timeout_s, idle_timeout_s or first_byte_timeout_s)
        try:
            self.transport.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                self.transport.write(body)
            answer = await self._waiter
        except BaseException:
            self.close()       # cancelled, timed out or failed mid-answer: never reuse
            raise
        finally:
            self._waiter = None
            self._body_view = None
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None
        if not self._keep_alive:
            self.close()
        return answer


class ReplicaConnectionPool:
    """Keep-alive connections per leader address, for the follower's fetchers."""

    def __init__(self, connect_timeout_s: float = 3.0, ssl_context=None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.ssl_context = ssl_context   # https:// leaders (verified against the node's CA)
        self._idle: dict[tuple[str, int], deque] = {}
        self.closed = False

    @staticmethod
    def address(url: str, scheme: str = "http") -> tuple[str, int]:
        u = urlsplit(url)
        if u.scheme != scheme or not u.hostname:
            raise ValueError(f"{url!r}: only {scheme}://host:port leaders are spoken to here"
                             + (" (this broker's TLS is on: every broker needs it)" if scheme == "https" else
                                " (set tls_cert_file/tls_key_file/tls_ca_file on this broker to reach https leaders)"))
        return u.hostname, u.port or (443 if scheme == "https" else 80)

    async def _connect(self, addr: tuple[str, int]) -> ReplicaConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if self.ssl_context is not None:
                    _, conn = await loop.create_connection(ReplicaConnection, *addr, ssl=self.ssl_context,
                                                           server_hostname=addr[0])
                else:
                    _, conn = await loop.create_connection(ReplicaConnection, *addr)
        except ConnectionRefusedError as e:
            raise ConnectionRefused(str(e)) from None
        return conn

    async def post(self, url: str, path: str, body: bytes, content_type: str = "application/json",
                   headers: dict | None = None, first_byte_timeout_s: float | None = None,
                   idle_timeout_s: float | None = None) -> _Answer:
        """POST `body` to `path` at the leader of `url`; -> the answer (status, headers, body).
        The read bounds are `ReplicaConnection.request`'s."""
        if self.closed:
            raise ProtocolError("the connection pool is closed")
        addr = self.address(url, "https" if self.ssl_context is not None else "http")
        host = f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}"   # IPv6 literal
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n{extra}Connection: keep-alive\r\n\r\n").encode("latin-1")
        idle = self._idle.setdefault(addr, deque())
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            try:
                answer = await conn.request(head, body, first_byte_timeout_s, idle_timeout_s)
            except ReadTimeout:
                raise       # the leader is silent, not a stale idle connection: no second try
            except (ProtocolError, ConnectionError):
                continue   # the peer dropped an idle keep-alive connection: try another / a fresh one
            self._release(addr, conn)
            return answer
        conn = await self._connect(addr)
        answer = await conn.request(head, body, first_byte_timeout_s, idle_timeout_s)
        self._release(addr, conn)
        return answer

    def _release(self, addr, conn: ReplicaConnection) -> None:
        idle = self._idle.setdefault(addr, deque())
        if conn.closed or self.closed or len(idle) >= IDLE_CONNECTIONS_MAX:
            conn.close()
        else:
            idle.append(conn)

    def close(self) -> None:
        self.closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
