"""The Kafka listener: an asyncio TCP server speaking Kafka's framing.

A request is a 4-byte big-endian size then the request (header + body); the answer is a
4-byte size then the response header (correlation id) and body. Like Kafka's broker, one
connection's requests are handled one at a time, in arrival order (the client may pipeline;
answers leave in the same order). acks=0 produce requests get no answer. A frame larger
than `kafka_request_max_bytes`, a frame that does not parse, or an API key / version this
listener does not serve closes the connection (ApiVersions of an unknown version is
answered with UNSUPPORTED_VERSION and the versions served, as Kafka does). A connection
silent between requests for `kafka_connections_max_idle_ms` is closed, and connections over
the HTTP edge's `connections_max` / `connections_max_per_ip` are closed at once. Nothing a client
sends is allowed to escape the connection: every failure is logged and answered or closed.

Security: TLS from the broker's `[security]` certificate (its live, reloading context), and
SASL (http_api/kafka/sasl.py) when authentication is on: a connection authenticates before
any request but ApiVersions / SaslHandshake / SaslAuthenticate, and a failed exchange is
answered, then closed.
"""
from __future__ import annotations

import asyncio
import logging
import struct

from http_api.kafka import protocol
from http_api.kafka.apis import KafkaApis, NO_RESPONSE
from http_api.kafka.protocol import FrameError
from http_api.kafka.sasl import SaslFailed, SaslSession

log = logging.getLogger("kraftlog.kafka")

_SIZE = struct.Struct(">i")


def unsecured_listener_refusal(config) -> str | None:
    """Why this broker must not open its Kafka listener, or None. The listener speaks TLS
    (SASL_SSL) when the broker has a certificate, requires SASL (PLAIN, SCRAM-SHA-256: the
    users and passwords of HTTP Basic) when authentication is on, and checks the same ACLs
    as HTTP. It stays closed where it would be a side door: authentication without `basic`
    (its users have no password the listener could check)."""
    sec = config.security
    if sec.authentication and "basic" not in sec.authentication:
        return ("the Kafka listener authenticates with SASL PLAIN/SCRAM-SHA-256 (passwords) and this broker's "
                f"[security] authentication is {', '.join(sec.authentication)} without basic: not opening it; add "
                "basic to authentication, or set kafka_port = 0 to silence this")
    return None


class KafkaListener:
    """Accepts Kafka client connections and runs each one's requests through `KafkaApis`."""

    def __init__(self, apis: KafkaApis, host: str, port: int, *, request_max_bytes: int,
                 connections_max_idle_ms: int = 600_000, connections_max: int = 0,
                 connections_max_per_ip: int = 0, ssl_context=None) -> None:
        self.apis = apis
        self.ssl_context = ssl_context   # TLS (SSL / SASL_SSL); None: PLAINTEXT / SASL_PLAINTEXT
        self.host = host
        self.port = port
        self.request_max_bytes = request_max_bytes
        self.connections_max_idle_ms = connections_max_idle_ms   # Kafka connections.max.idle.ms; 0: none
        self.connections_max = connections_max                   # 0: no cap (as the HTTP edge's settings)
        self.connections_max_per_ip = connections_max_per_ip
        self._per_ip: dict[str, int] = {}
        self.server: asyncio.base_events.Server | None = None
        self._conns: set[asyncio.Task] = set()

    @property
    def bound_port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, self.host, self.port, reuse_address=True,
                                                 backlog=1024, ssl=self.ssl_context)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for t in list(self._conns):
            t.cancel()
        for t in list(self._conns):
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        if self.server is not None:
            try:
                await asyncio.wait_for(self.server.wait_closed(), 2)
            except (asyncio.TimeoutError, Exception):
                pass
        self.server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        peer = writer.get_extra_info("peername")
        ip = peer[0] if isinstance(peer, tuple) else str(peer)
        self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
        idle_s = self.connections_max_idle_ms / 1000 if self.connections_max_idle_ms > 0 else None
        session = SaslSession(self.apis.sasl, ip) if self.apis.sasl is not None else None
        try:
            if (self.connections_max and len(self._conns) > self.connections_max) or \
                    (self.connections_max_per_ip and self._per_ip[ip] > self.connections_max_per_ip):
                log.info("closing Kafka connection %s: over connections_max=%d / connections_max_per_ip=%d",
                         peer, self.connections_max, self.connections_max_per_ip)
                return
            while True:
                try:
                    head = await asyncio.wait_for(reader.readexactly(4), idle_s)
                except asyncio.TimeoutError:
                    log.debug("closing idle Kafka connection %s", peer)
                    return
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                (size,) = _SIZE.unpack(head)
                bare = session is not None and session.unframed and not session.authenticated
                if size < (0 if bare else 8) or size > self.request_max_bytes:
                    log.info("closing Kafka connection %s: request of %d bytes (kafka_request_max_bytes=%d, "
                             "a request header needs 8)", peer, size, self.request_max_bytes)
                    return
                try:
                    frame = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return   # truncated frame: the client went away mid-request
                if bare:
                    # after SaslHandshake v0 (older clients): a bare SASL token, answered bare;
                    # a failure closes the connection without an answer (as Kafka's broker)
                    try:
                        token = session.step(bytes(frame))
                    except SaslFailed as e:
                        log.info("Kafka SASL authentication from %s failed: %s", peer, e)
                        return
                    writer.write(_SIZE.pack(len(token)) + token)
                    continue
                try:
                    answer = await self.apis.handle(frame, session)
                except FrameError as e:
                    log.info("closing Kafka connection %s: %s", peer, e)
                    return
                except Exception:  # noqa: BLE001 - a bug answering one request must not stop the broker
                    log.exception("Kafka request from %s failed; closing the connection", peer)
                    return
                if answer is NO_RESPONSE:
                    continue
                if type(answer) is list:   # a Fetch answer: header parts and records, unjoined
                    writer.writelines(answer)
                else:
                    writer.write(answer)
                if session is not None and session.close:   # a failed SASL exchange: answered, then closed
                    await writer.drain()
                    return
                if writer.transport.get_write_buffer_size() > 1 << 20:
                    await writer.drain()
        except asyncio.CancelledError:
            pass
        except ConnectionError:
            pass
        finally:
            if task is not None:
                self._conns.discard(task)
            self._per_ip[ip] -= 1
            if not self._per_ip[ip]:
                del self._per_ip[ip]
            try:
                writer.close()
            except Exception:  # noqa: BLE001
                pass


__all__ = ["KafkaListener", "protocol"]
