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
"""
from __future__ import annotations

import asyncio
import logging
import struct

from http_api.kafka import protocol
from http_api.kafka.apis import KafkaApis, NO_RESPONSE
from http_api.kafka.protocol import FrameError

log = logging.getLogger("kraftlog.kafka")

_SIZE = struct.Struct(">i")


def unsecured_listener_refusal(config) -> str | None:
    """Why this broker must not open its Kafka listener, or None. The listener has no TLS or
    SASL yet: on a broker whose HTTP API requires TLS, authentication or ACLs it would be an
    open side door to the same data, so it stays closed there."""
    sec = config.security
    what = [name for name, on in (("TLS", bool(sec.tls_cert_file)), ("authentication", bool(sec.authentication)),
                                  ("an authorizer", bool(sec.authorizer))) if on]
    if not what:
        return None
    return (f"the Kafka listener has no TLS/SASL yet and this broker's [security] configures {', '.join(what)}: "
            "not opening an unauthenticated side door to the same data; set kafka_port = 0 to silence this")


class KafkaListener:
    """Accepts Kafka client connections and runs each one's requests through `KafkaApis`."""

    def __init__(self, apis: KafkaApis, host: str, port: int, *, request_max_bytes: int,
                 connections_max_idle_ms: int = 600_000, connections_max: int = 0,
                 connections_max_per_ip: int = 0) -> None:
        self.apis = apis
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
                                                 backlog=1024)

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
                if size < 8 or size > self.request_max_bytes:
                    log.info("closing Kafka connection %s: request of %d bytes (kafka_request_max_bytes=%d, "
                             "a request header needs 8)", peer, size, self.request_max_bytes)
                    return
                try:
                    frame = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return   # truncated frame: the client went away mid-request
                try:
                    answer = await self.apis.handle(frame)
                except FrameError as e:
                    log.info("closing Kafka connection %s: %s", peer, e)
                    return
                except Exception:  # noqa: BLE001 - a bug answering one request must not stop the broker
                    log.exception("Kafka request from %s failed; closing the connection", peer)
                    return
                if answer is NO_RESPONSE:
                    continue
                writer.write(answer)
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
