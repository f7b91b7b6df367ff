"""Streaming consume over HTTP: Server-Sent Events (API.md "Console and streaming").

  GET /v1/topics/{t}/partitions/{p}/records/stream?offset=N[&isolation_level=..][&heartbeat_ms=..]
      One SSE event per record: `id` = its offset, `data` = the record as in the fetch
      answer (JSON: offset, timestamp, key/value or *_b64, headers). `Last-Event-ID` (the
      header an EventSource sends when it reconnects) resumes after that offset and wins over
      `offset` (`earliest` / `latest` are accepted too). Served by the partition leader only,
      like fetch; only records below the high watermark (read_committed: below the LSO).
  GET /v1/groups/{g}/records/stream?topics=a,b[&auto_offset_reset=earliest|latest]
      [&isolation_level=..][&max_records=N][&commit_interval_ms=..][&heartbeat_ms=..]
      Joins group g through the group coordinator (a member held by this broker for as long as
      the connection lasts), streams the partitions assigned to it (`id` = `topic/partition/
      offset`, `data` adds `topic` and `partition`) and commits as it goes: every
      `commit_interval_ms`, on a rebalance and at the end, the position after the records
      written to the connection. `max_records` ends the stream after N records (committed
      exactly there).

Bad input (unknown topic, a partition led elsewhere, an offset out of range, bad
parameters) is answered with the usual JSON error before the stream starts; an error during
the stream is one `event: error` (data = the error body) and the end of the stream, after
which a client reconnects (with Last-Event-ID for a partition).

While no record arrives, a comment line (`: heartbeat`) is written every `heartbeat_ms`
(default `STREAM_HEARTBEAT_MS`), so proxies keep the connection and a client sees a dead one.

Backpressure: each connection holds at most `stream_buffer_bytes` (default
`STREAM_BUFFER_BYTES`) of unsent answer: reads are at most half of it, and the next read
waits until the socket has drained below the other half (the transport's write buffer high
water mark), so a slow reader slows its own stream and costs the broker bounded memory.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
from aiohttp import web

from http_api.broker import tiering
from http_api.broker.context import BrokerContext, Routes, int_param, partition_param
from http_api.wire import codecs
from http_api.wire.auth import ANONYMOUS, PRINCIPAL_HEADER, principal_of
from partitions.errors import ErrorCode, KraftlogError
from partitions.log import transactions as txn

log = logging.getLogger("kraftlog.streaming")

EVENT_STREAM = "text/event-stream"
STREAM_BUFFER_BYTES = 1 << 20          # unsent answer bytes one stream may hold
STREAM_HEARTBEAT_MS = 15_000           # a comment line this often while idle
STREAM_HEARTBEAT_MIN_MS = 10
STREAM_COMMIT_INTERVAL_MS = 1_000      # group streams: commit the sent position this often
RETRY_MS = 1_000                       # the `retry:` an EventSource waits before reconnecting
THROTTLED_BACKOFF_MS = 50              # too many long polls waiting: retry the read after this
HEARTBEAT = b": heartbeat\n\n"


_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def sse_event(event_id: str, data: Any, event: str | None = None) -> bytes:
    """One SSE event; `data` is JSON on one line (JSON escapes newlines)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}id: {event_id}\ndata: {_encode(data)}\n\n".encode()


def error_event(err: KraftlogError) -> bytes:
    return b"event: error\ndata: " + codecs.error_body(err) + b"\n\n"


def _isolation(value: str | None) -> str:
    try:
        return txn.parse_isolation_level(value)
    except ValueError as e:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, str(e)) from None


def _heartbeat_ms(request: web.Request, default: int) -> int:
    return int_param(request.query.get("heartbeat_ms"), "heartbeat_ms", default=default,
                     minimum=STREAM_HEARTBEAT_MIN_MS)


def internal_session(ctx: BrokerContext, request: web.Request) -> aiohttp.ClientSession:
    """A client session for a consumer this broker runs on behalf of the request's client
    (group streams, REST proxy consumer instances): the broker's own connector and
    credentials, naming the client's principal (auth.PRINCIPAL_HEADER), so every broker it
    reaches authorizes the client, not this broker."""
    shared = ctx.deps.http_session
    headers = dict(ctx.internal_headers)
    principal = principal_of(request)
    if principal != ANONYMOUS:
        headers[PRINCIPAL_HEADER] = principal
    if shared is None or shared.closed:
        return aiohttp.ClientSession(headers=headers)
    return aiohttp.ClientSession(connector=shared.connector, connector_owner=False, headers=headers)


def loopback_consumer(ctx: BrokerContext, request: web.Request, **kwargs):
    """An `http_api.client.Consumer` bootstrapped at this broker, acting for the request's
    principal (see internal_session)."""
    from http_api.client import Consumer

    c = Consumer(ctx.config.url, session=internal_session(ctx, request),
                 client_id=request.headers.get("X-Client-Id") or f"kraftlog-broker-{ctx.config.broker_id}", **kwargs)
    c.t.auth_headers = {}     # the session's headers authenticate (never a broker's environment)
    c.t._own = True           # its session (not the shared connector) is closed with it
    return c


def _tps_of_topics(ctx: BrokerContext, topics: list[str]) -> None:
    img = ctx.image
    for t in topics:
        if t not in img.topics:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic {t!r} does not exist; list topics with GET /v1/topics")


class StreamRoutes(Routes):
    """The SSE handlers (see the module docstring)."""

    def __init__(self, ctx: BrokerContext, *, stream_buffer_bytes: int = STREAM_BUFFER_BYTES,
                 heartbeat_ms: int = STREAM_HEARTBEAT_MS) -> None:
        super().__init__(ctx)
        if stream_buffer_bytes < 2:
            raise ValueError("stream_buffer_bytes must be >= 2")
        self.stream_buffer_bytes = stream_buffer_bytes
        self.heartbeat_ms = heartbeat_ms
        self.closing = asyncio.Event()
        self.open_streams = 0

    # ---- partition stream ------------------------------------------------------------

    def _start_offset(self, request: web.Request, name: str, partition: int) -> int:
        last = request.headers.get("Last-Event-ID")
        if last not in (None, ""):
            return int_param(last, "Last-Event-ID") + 1
        raw = request.query.get("offset")
        if raw in ("earliest", "latest"):
            offs = self.rm.offsets(name, partition)   # the leader's: NOT_LEADER_OR_FOLLOWER elsewhere
            return offs["log_start_offset"] if raw == "earliest" else offs["high_watermark"]
        return int_param(raw, "offset")

    async def _read(self, name: str, partition: int, offset: int, max_bytes: int, wait_ms: int,
                    isolation: str, min_bytes: int) -> tuple[list[dict], int, int]:
        """(records rendered as in fetch, next offset, raw bytes read) from `offset`, waiting up
        to wait_ms for min_bytes; read_committed sees only what is below the LSO."""
        res = await tiering.remote_fetch(self.ctx, name, partition, offset, max_bytes)
        if res is None:
            while True:
                try:
                    res = await self.rm.fetch(name, partition, offset, max_bytes=max_bytes, min_bytes=min_bytes,
                                              max_wait_ms=wait_ms)
                    break
                except KraftlogError as e:
                    if e.code is not ErrorCode.THROTTLING_QUOTA_EXCEEDED:
                        raise
                    await asyncio.sleep(THROTTLED_BACKOFF_MS / 1000)   # a long poll slot frees up soon
                    wait_ms = max(0, wait_ms - THROTTLED_BACKOFF_MS)
        data, fetched_next = res.records, res.next_offset
        if isolation == txn.READ_COMMITTED:
            lg = self.rm.logs.get((name, partition))
            if lg is not None and getattr(lg, "transactions", None) is not None:
                lso = lg.last_stable_offset(res.high_watermark)
                aborted = lg.aborted_transactions(offset, lso)
                if isinstance(res, tiering.RemoteFetchResult):   # served by the store: its indexes too
                    aborted = tiering.merge_aborted(aborted, await tiering.remote_aborted_transactions(
                        self.ctx, name, partition, offset, min(lso, res.next_offset)))
                data, fetched_next = txn.filter_read_committed(data, offset, lso, aborted)
            records, nxt = codecs.decode_fetched(data, offset, binary=False)
            return records, max(nxt, fetched_next), len(res.records)
        records, nxt = codecs.decode_fetched(data, offset, binary=False)
        return records, nxt, len(res.records)

    async def _open(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={
            "Content-Type": EVENT_STREAM, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        if request.transport is not None:
            # at most stream_buffer_bytes unsent: a read (half of it) lands in a buffer drained below the other half
            request.transport.set_write_buffer_limits(high=self.stream_buffer_bytes // 2)
        await resp.write(f"retry: {RETRY_MS}\n\n".encode())
        return resp

    async def stream_partition(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["topic"]
        partition = partition_param(request)
        isolation = _isolation(request.query.get("isolation_level"))
        heartbeat_ms = _heartbeat_ms(request, self.heartbeat_ms)
        offset = self._start_offset(request, name, partition)
        max_bytes = max(1, min(self.config.fetch_max_bytes, self.stream_buffer_bytes // 2))
        # the first read before the answer starts: unknown topic, not the leader, out of range -> JSON errors
        records, nxt, raw = await self._read(name, partition, offset, max_bytes, 0, isolation, 1)
        resp = await self._open(request)
        self.open_streams += 1
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        min_bytes = 1
        try:
            while True:
                if records:
                    chunk = b"".join(sse_event(str(r["offset"]), r) for r in records)
                    self.metrics.fetch_bytes.inc(raw)
                    await resp.write(chunk)        # waits while the client lags (backpressure)
                    idle_since = loop.time()
                    min_bytes = 1
                elif raw and nxt == offset:
                    min_bytes = raw + 1            # only records above the LSO: wait for more, not spin
                offset = nxt
                if self.closing.is_set() or self.rm.closing:
                    break
                idle_ms = (loop.time() - idle_since) * 1000
                if idle_ms >= heartbeat_ms:
                    await resp.write(HEARTBEAT)
                    idle_since, idle_ms = loop.time(), 0
                wait_ms = max(1, int(heartbeat_ms - idle_ms))
                try:
                    records, nxt, raw = await self._read(name, partition, offset, max_bytes, wait_ms, isolation,
                                                         min_bytes)
                except KraftlogError as e:   # leadership moved, partition deleted ...: tell, then end
                    await resp.write(error_event(e))
                    break
        except ConnectionError:
            pass                                   # the client went away
        finally:
            self.open_streams -= 1
        return resp

    # ---- group stream ----------------------------------------------------------------

    async def stream_group(self, request: web.Request) -> web.StreamResponse:
        from http_api.broker.group_offsets import validate_group_id

        group = request.match_info["group"]
        validate_group_id(group)
        q = request.query
        topics = [t for t in (q.get("topics") or "").split(",") if t]
        if not topics:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "topics: give the topics to consume, e.g. ?topics=a,b")
        _tps_of_topics(self.ctx, topics)
        reset = q.get("auto_offset_reset", "latest")
        if reset not in ("earliest", "latest"):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "auto_offset_reset: earliest or latest")
        isolation = _isolation(q.get("isolation_level"))
        heartbeat_ms = _heartbeat_ms(request, self.heartbeat_ms)
        commit_ms = int_param(q.get("commit_interval_ms"), "commit_interval_ms", default=STREAM_COMMIT_INTERVAL_MS)
        max_records = int_param(q.get("max_records"), "max_records", default=0, minimum=0) or None
        consumer = loopback_consumer(self.ctx, request, group_id=group, auto_offset_reset=reset,
                                     isolation_level=isolation, auto_commit_interval_ms=commit_ms,
                                     max_bytes=max(1, self.stream_buffer_bytes // 2))
        try:
            await consumer.subscribe(topics)    # join errors (authorization, coordinator) -> JSON errors
        except BaseException:
            await consumer.close()
            raise
        resp = await self._open(request)
        self.open_streams += 1
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        sent = 0
        try:
            while max_records is None or sent < max_records:
                if self.closing.is_set() or self.rm.closing:
                    break
                idle_ms = (loop.time() - idle_since) * 1000
                try:
                    polled = await consumer.poll(max(1, int(min(heartbeat_ms - idle_ms, commit_ms))))
                except KraftlogError as e:
                    await resp.write(error_event(e))
                    break
                if polled:
                    take = polled if max_records is None else polled[:max_records - sent]
                    rest = polled[len(take):]
                    for tp, off in _first_offsets(rest).items():
                        consumer.seek(tp, off)          # not sent: not committed
                    chunk = b"".join(sse_event(f"{r.topic}/{r.partition}/{r.offset}", _group_record(r))
                                     for r in take)
                    await resp.write(chunk)
                    sent += len(take)
                    idle_since = loop.time()
                elif (loop.time() - idle_since) * 1000 >= heartbeat_ms:
                    await resp.write(HEARTBEAT)
                    idle_since = loop.time()
        except ConnectionError:
            pass                                   # the client went away
        finally:
            self.open_streams -= 1
            try:
                await consumer.close()           # commits the sent position, leaves the group
            except Exception as e:  # noqa: BLE001 - the client is gone; the session expires
                log.info("group %s stream: closing its consumer failed: %s", group, e)
        return resp


def _first_offsets(records) -> dict:
    out: dict = {}
    for r in records:
        tp = (r.topic, r.partition)
        if tp not in out or r.offset < out[tp]:
            out[tp] = r.offset
    return out


def _group_record(r) -> dict:
    doc = codecs.render_record(r, binary=False)
    doc["topic"], doc["partition"] = r.topic, r.partition
    return doc


_SSE_OK = {"description": "text/event-stream: `retry:`, then per record `id:` + `data:` (JSON), `: heartbeat` "
                          "while idle; `event: error` before the end on a failure",
           "content": {EVENT_STREAM: {"schema": {"type": "string"}}}}
_Q = [{"name": "isolation_level", "in": "query", "schema": {"type": "string",
                                                            "enum": ["read_uncommitted", "read_committed"]}},
      {"name": "heartbeat_ms", "in": "query", "schema": {"type": "integer", "minimum": STREAM_HEARTBEAT_MIN_MS}}]
OPENAPI_PATHS = {   # merged into the broker's /openapi.json (http_api/broker/openapi.py)
    "/v1/topics/{topic}/partitions/{partition}/records/stream": {"get": {
        "summary": "Server-Sent Events: the partition's records from `offset` (or after Last-Event-ID), following",
        "parameters": [{"name": "topic", "in": "path", "required": True, "schema": {"type": "string"}},
                       {"name": "partition", "in": "path", "required": True, "schema": {"type": "integer",
                                                                                      "minimum": 0}},
                       {"name": "offset", "in": "query", "schema": {"type": "string",
                                                                    "description": "N, earliest or latest"}},
                       {"name": "Last-Event-ID", "in": "header", "schema": {"type": "integer"}}, *_Q],
        "responses": {"200": _SSE_OK}}},
    "/v1/groups/{group}/records/stream": {"get": {
        "summary": "Server-Sent Events: the records of the partitions the group assigns to this stream, committed "
                   "as they are sent",
        "parameters": [{"name": "group", "in": "path", "required": True, "schema": {"type": "string"}},
                       {"name": "topics", "in": "query", "required": True, "schema": {"type": "string"}},
                       {"name": "auto_offset_reset", "in": "query",
                        "schema": {"type": "string", "enum": ["earliest", "latest"]}},
                       {"name": "max_records", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                       {"name": "commit_interval_ms", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                       *_Q],
        "responses": {"200": _SSE_OK}}},
}


def install_streaming(app: web.Application, ctx: BrokerContext, **limits: int) -> StreamRoutes:
    """Add the two SSE routes; open streams end when the app shuts down."""
    routes = StreamRoutes(ctx, **limits)
    r = app.router
    r.add_get("/v1/topics/{topic}/partitions/{partition}/records/stream", routes.stream_partition)
    r.add_get("/v1/groups/{group}/records/stream", routes.stream_group)

    async def _shutdown(app: web.Application) -> None:
        routes.closing.set()

    app.on_shutdown.append(_shutdown)
    return routes


__all__ = ["EVENT_STREAM", "OPENAPI_PATHS", "STREAM_BUFFER_BYTES", "STREAM_HEARTBEAT_MS", "StreamRoutes", "install_streaming",
           "internal_session", "loopback_consumer", "sse_event"]
