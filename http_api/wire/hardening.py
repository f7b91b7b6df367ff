"""The hardened HTTP edge of kraftlog's aiohttp servers (the broker and the controller).

aiohttp bounds neither how long a client may take to send a request nor how many
connections one address may hold, and it logs every malformed request with a traceback.
`HardenedAppRunner` (a drop-in `web.AppRunner`) serves connections with a request handler
that adds, per `HttpLimits`:

- a deadline for the request head (`request_header_timeout_ms`): it runs from the
  connection's start, and for each later request on a kept-alive connection from its first
  byte, until the head is parsed; a client that dribbles the head byte by byte (slowloris)
  or sends nothing is closed when it passes. Idle kept-alive connections between requests
  are left to aiohttp's keepalive timeout;
- a deadline for the request body (`request_body_timeout_ms`), from the end of the head to
  the last body byte; the handler reading it gets 408 and the connection closes. Only
  receiving counts: a long-poll fetch waiting to answer has long received its request;
- caps on connections in total and per client address (`connections_max`,
  `connections_max_per_ip`, Kafka's max.connections and max.connections.per.ip): a
  connection over a cap is answered 429 THROTTLING_QUOTA_EXCEEDED and closed at once;
- one log line per rejected request (malformed HTTP, a 400/401/403/408/413/415/429/431
  answer, a refused or timed-out connection) instead of a traceback, at most
  `rejected_request_logs_per_second` lines a second; the next line that gets through
  says how many were suppressed.

`HardeningStats` counts what was refused (tests and metrics read it). With TLS, aiohttp
sees a connection once its handshake is done (asyncio's ssl_handshake_timeout bounds that).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_protocol import RequestHandler

from http_api.wire.codecs import JSON, error_body
from partitions.errors import ErrorCode, KraftlogError

# answers that mean "the request was refused as it stands" (logged, rate limited)
REJECTED_STATUSES = frozenset({400, 401, 403, 408, 411, 413, 414, 415, 429, 431})
BODY_TIMEOUT_CLOSE_GRACE_S = 1.0   # after a body deadline: time for the 408 to go out before the close


@dataclass(frozen=True)
class HttpLimits:
    """Bounds of one HTTP listener (see the module docstring); 0 turns a deadline or cap off."""

    request_header_timeout_ms: int = 10_000
    request_body_timeout_ms: int = 30_000
    connections_max: int = 10_000            # Kafka max.connections
    connections_max_per_ip: int = 1_000      # Kafka max.connections.per.ip (local clusters share 127.0.0.1)
    rejected_request_logs_per_second: int = 10

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{f.name} must be an integer >= 0 (0: no limit), got {v!r}")

    @classmethod
    def from_settings(cls, settings: Any) -> "HttpLimits":
        """The limits among `settings`' attributes (a BrokerConfig, a settings group); the
        defaults for those it lacks."""
        return cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(cls)
                      if hasattr(settings, f.name)})


class RateLimitedLog:
    """At most `per_second` lines a second (fixed one-second windows) to `logger`; lines
    over the budget are counted and the next line logged names their count. No tracebacks."""

    def __init__(self, logger: logging.Logger, per_second: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.per_second = per_second
        self.clock = clock
        self.window = -1
        self.in_window = 0
        self.pending_suppressed = 0
        self.suppressed_total = 0

    def __bool__(self) -> bool:   # aiohttp tests its access_log for truth
        return True

    def log(self, level: int, msg: str, *args: Any, exc_info: BaseException | None = None) -> bool:
        """Log one line (True) or count it as suppressed (False); `exc_info` only for bugs."""
        window = int(self.clock())
        if window != self.window:
            self.window, self.in_window = window, 0
        if self.per_second and self.in_window >= self.per_second:
            self.pending_suppressed += 1
            self.suppressed_total += 1
            return False
        self.in_window += 1
        if self.pending_suppressed:
            msg += " (suppressed %d similar lines)"
            args += (self.pending_suppressed,)
            self.pending_suppressed = 0
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True


@dataclass
class HardeningStats:
    """What the edge refused since start."""

    connections_refused: int = 0
    header_timeouts: int = 0
    body_timeouts: int = 0
    malformed_requests: int = 0
    rejected_requests: int = 0


class ConnectionGuard:
    """Connection counts (total and per address) against `HttpLimits`, the rejection log
    and the stats of one listener."""

    def __init__(self, limits: HttpLimits, log: logging.Logger) -> None:
        self.limits = limits
        self.log = RateLimitedLog(log, limits.rejected_request_logs_per_second)
        self.stats = HardeningStats()
        self.total = 0
        self.per_ip: dict[str, int] = {}

    def admit(self, ip: str) -> Optional[str]:
        """Count a new connection from `ip`, or return why it is refused (not counted)."""
        lim = self.limits
        if lim.connections_max and self.total >= lim.connections_max:
            return (f"{self.total} connections are open (connections_max={lim.connections_max}); "
                    "retry later, reuse connections (keep-alive) or raise connections_max")
        n = self.per_ip.get(ip, 0)
        if lim.connections_max_per_ip and n >= lim.connections_max_per_ip:
            return (f"{n} connections are open from {ip} (connections_max_per_ip={lim.connections_max_per_ip}); "
                    "reuse connections (keep-alive), close idle ones or raise connections_max_per_ip")
        self.total += 1
        self.per_ip[ip] = n + 1
        return None

    def release(self, ip: str) -> None:
        self.total -= 1
        n = self.per_ip.get(ip, 0) - 1
        if n > 0:
            self.per_ip[ip] = n
        else:
            self.per_ip.pop(ip, None)


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line (a client's bytes must not forge log lines), at most `limit` chars."""
    return " ".join(text.split())[:limit]


def _raw_error_answer(status: int, reason: str, err: KraftlogError) -> bytes:
    body = error_body(err)
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {JSON}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


class HardenedRequestHandler(RequestHandler):
    """aiohttp's connection protocol with the deadlines, caps and quiet logging of the
    module docstring. Invariants: a head timer runs only while a head is being received, a
    body timer only while a parsed request's body is incomplete; an admitted connection is
    released exactly once (in connection_lost)."""

    guard: ConnectionGuard   # set by HardenedServer

    def _init_hardening(self, guard: ConnectionGuard) -> None:
        self.guard = guard
        self._ip = ""
        self._admitted = False
        self._head_timer: Optional[Any] = None
        self._body_timer: Optional[Any] = None
        self._body_payload: Optional[Any] = None

    # ---- connection caps -----------------------------------------------------------------
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self._ip = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else str(peer or "")
        why = self.guard.admit(self._ip)
        if why is not None:
            self.guard.stats.connections_refused += 1
            self.guard.log.log(logging.WARNING, "refused a connection from %s: %s", self._ip, why)
            transport.write(_raw_error_answer(429, "Too Many Requests",
                                              KraftlogError(ErrorCode.THROTTLING_QUOTA_EXCEEDED, why)))
            self.force_close()   # transport.close() sends what was written first
            return
        self._admitted = True
        self._start_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        if self._admitted:
            self._admitted = False
            self.guard.release(self._ip)
        super().connection_lost(exc)

    # ---- deadlines -------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._force_close or self._close:
            return
        if self._head_timer is None and self._body_payload is None and data:
            self._start_head_timer()   # the first byte of a new request on a kept-alive connection
        parsed_before = self._request_count
        super().data_received(data)
        if self._request_count != parsed_before:   # a head (or a parse error) is complete
            self._cancel_head_timer()
            payload = self._messages[-1][1] if self._messages else None
            if payload is not None and not payload.is_eof() and not self._force_close:
                self._start_body_timer(payload)
        if self._body_payload is not None and self._body_payload.is_eof():
            self._cancel_body_timer()

    def _start_head_timer(self) -> None:
        ms = self.guard.limits.request_header_timeout_ms
        if ms and self._head_timer is None:
            self._head_timer = self._loop.call_later(ms / 1000, self._head_expired)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _start_body_timer(self, payload) -> None:
        self._cancel_body_timer()
        ms = self.guard.limits.request_body_timeout_ms
        if ms:
            self._body_payload = payload
            self._body_timer = self._loop.call_later(ms / 1000, self._body_expired)

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._body_payload = None

    def _head_expired(self) -> None:
        self._head_timer = None
        self.guard.stats.header_timeouts += 1
        self.guard.log.log(logging.WARNING, "closed a connection from %s: request head not complete within "
                           "request_header_timeout_ms=%d", self._ip, self.guard.limits.request_header_timeout_ms)
        self.force_close()

    def _body_expired(self) -> None:
        payload, self._body_timer, self._body_payload = self._body_payload, None, None
        limit = self.guard.limits.request_body_timeout_ms
        self.guard.stats.body_timeouts += 1
        self.guard.log.log(logging.WARNING, "closed a connection from %s: request body not complete within "
                           "request_body_timeout_ms=%d", self._ip, limit)
        if payload is not None:   # the handler reading it answers 408 (the error middleware)
            payload.set_exception(web.HTTPRequestTimeout(
                reason=f"request body not complete within request_body_timeout_ms={limit}; send it faster"))
        self.close()   # no further requests on this connection
        self._loop.call_later(BODY_TIMEOUT_CLOSE_GRACE_S, self.force_close)

    # ---- quiet logging ---------------------------------------------------------------------
    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's errors outside the app's handlers: one line, no traceback."""
        exc = kw.get("exc_info")
        msg = args[0] % args[1:] if len(args) > 1 else (str(args[0]) if args else "error")
        if isinstance(exc, BaseException):
            msg = f"{msg}: {type(exc).__name__}: {exc}"
        self.guard.log.log(logging.WARNING, "%s (from %s)", one_line(msg), self._ip)

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """A request aiohttp could not parse (or a failure outside the handlers): a JSON
        error answer; a 4xx is logged once by RejectedRequestLog, a 5xx here with its traceback."""
        reason = one_line(message or (str(exc) if exc is not None else "") or "malformed request")
        if status < 500:
            self.guard.stats.malformed_requests += 1
            if status not in REJECTED_STATUSES:   # those are logged once, by RejectedRequestLog
                self.guard.log.log(logging.WARNING, "rejected a malformed request from %s: %d %s",
                                   request.remote or self._ip, status, reason)
        else:   # a failure outside the app's handlers is a bug: its traceback (still rate limited)
            self.guard.log.log(logging.ERROR, "failed a request from %s: %d %s", request.remote or self._ip,
                               status, reason, exc_info=exc)
        if request.writer.output_size > 0:
            raise ConnectionError("the answer was being sent already; closing the connection")
        code = ErrorCode.INVALID_REQUEST if status < 500 else ErrorCode.UNKNOWN_SERVER_ERROR
        what = "malformed HTTP request" if status < 500 else "internal error"
        resp = web.Response(status=status, body=error_body(KraftlogError(code, f"{what}: {reason}")),
                            content_type=JSON)
        resp.force_close()
        return resp


class RejectedRequestLog(AbstractAccessLogger):
    """aiohttp access logger that logs only rejected requests (REJECTED_STATUSES), one
    rate-limited line each with the error code and message of the answer."""

    def log(self, request, response, time: float) -> None:
        if response.status not in REJECTED_STATUSES:
            return
        guard: ConnectionGuard = self.logger.guard   # type: ignore[attr-defined]
        guard.stats.rejected_requests += 1
        detail = ""
        body = getattr(response, "body", None)
        if isinstance(body, (bytes, bytearray)) and body[:1] == b"{":
            try:
                doc = json.loads(body)
                detail = f" {doc.get('error_code')}: {one_line(str(doc.get('message')))}"
            except ValueError:
                pass
        guard.log.log(logging.INFO, "rejected %s %s from %s: %d%s", request.method, request.path,
                      request.remote, response.status, detail)

    @property
    def enabled(self) -> bool:
        return True


class _AccessLogHandle:
    """What aiohttp stores as the access logger's `logger`: the guard to report to."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard


class HardenedServer(web.Server):
    """aiohttp's Server that builds HardenedRequestHandlers sharing one ConnectionGuard."""

    guard: ConnectionGuard

    def __call__(self) -> RequestHandler:
        handler = HardenedRequestHandler(self, loop=self._loop, **self._kwargs)
        handler._init_hardening(self.guard)
        return handler


class HardeningCollector:
    """Prometheus collector of one listener's edge: what it refused, by reason
    (kraftlog_http_edge_refused_total{reason}) and the connections open now."""

    REASONS = {"connection_cap": "connections_refused", "header_timeout": "header_timeouts",
               "body_timeout": "body_timeouts", "malformed": "malformed_requests",
               "rejected": "rejected_requests"}

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        refused = CounterMetricFamily("kraftlog_http_edge_refused", "Connections and requests the HTTP edge "
                                      "refused or answered as rejected, by reason", labels=["reason"])
        for reason, attr in self.REASONS.items():
            refused.add_metric([reason], getattr(self.guard.stats, attr))
        yield refused
        yield GaugeMetricFamily("kraftlog_http_edge_connections", "Open HTTP connections", value=self.guard.total)


class HardenedAppRunner(web.AppRunner):
    """`web.AppRunner` serving `app` behind the hardened edge (module docstring). Extra
    keyword arguments go to aiohttp as for AppRunner; its access log is the rejection log."""

    def __init__(self, app: web.Application, limits: HttpLimits, log: logging.Logger, **kwargs: Any) -> None:
        self.guard = ConnectionGuard(limits, log)
        kwargs.pop("access_log", None)
        super().__init__(app, access_log_class=RejectedRequestLog, access_log=_AccessLogHandle(self.guard),
                         **kwargs)

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        server = HardenedServer(plain.request_handler, request_factory=plain.request_factory,
                                handler_cancellation=plain.handler_cancellation, loop=plain._loop,
                                **plain._kwargs)
        server.guard = self.guard
        return server
