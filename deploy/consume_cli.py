"""`kraftlog consume` over the brokers' Server-Sent Events streams (http_api/broker/streaming.py).

Without --group: one stream per partition of the topic, from its leader
(`GET /v1/topics/{t}/partitions/{p}/records/stream`, from `earliest` with --from-beginning,
else `latest`), merged. A stream that ends (leadership moved, connection lost) is reopened
on the partition's current leader with `Last-Event-ID`, so no record is skipped or repeated.

With --group: one group stream (`GET /v1/groups/{g}/records/stream`): the broker holds the
group membership and commits as it goes; --max-records is passed on (`max_records`), so the
broker stops there and commits exactly what was printed; the command reads the stream to its
end, after which the commit is done. A lost connection reopens the stream for the rest.
"""
from __future__ import annotations

import asyncio
import base64
import json
import sys
from typing import Any, AsyncIterator
from urllib.parse import quote

import aiohttp

from http_api.client.consumer import ConsumerRecord
from http_api.client.transport import MetadataCache, Transport
from partitions.errors import ErrorCode, KraftlogError

RECONNECT_BACKOFF_S = 0.2
STREAM_END_WAIT_S = 30.0          # after --max-records, how long the group stream may take to end (its commit)


async def _events(transport: Transport, url: str, params: dict, last_event_id: str | None) -> AsyncIterator[dict]:
    """The events of one SSE stream (`id`, `event`, `data`); KraftlogError when the broker
    answers an error (before the stream, or as an `error` event)."""
    session = await transport.session()
    headers = {"Accept": "text/event-stream", "X-Client-Id": transport.client_id, **transport.auth_headers}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    try:
        async with session.get(url, params=params, headers=headers,
                               timeout=aiohttp.ClientTimeout(total=None, sock_connect=transport.connect_timeout_ms / 1000)
                               ) as resp:
            if resp.status >= 400:
                body = await resp.read()
                doc = json.loads(body) if body else {}
                raise KraftlogError.from_body(doc) or KraftlogError(
                    ErrorCode.UNKNOWN_SERVER_ERROR, f"broker answered HTTP {resp.status}: {body[:200]!r}")
            event: dict = {}
            async for raw in resp.content:
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line:
                    if "data" in event:
                        if event.get("event") == "error":
                            raise KraftlogError.from_body(json.loads(event["data"])) or KraftlogError(
                                ErrorCode.UNKNOWN_SERVER_ERROR, event["data"])
                        yield event
                    event = {}
                    continue
                if line.startswith(":"):
                    continue                       # heartbeat
                name, _, value = line.partition(":")
                event[name] = value[1:] if value.startswith(" ") else value
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        transport.mark_suspect(url)
        raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE,
                            f"cannot reach broker at {url}: {e or type(e).__name__}; check that the broker is "
                            "running and --bootstrap / KRAFTLOG_URL points at it") from None


def _record(topic: str, partition: int, doc: dict) -> ConsumerRecord:
    def field(name: str) -> bytes | None:
        if doc.get(name + "_b64") is not None:
            return base64.b64decode(doc[name + "_b64"])
        v = doc.get(name)
        return None if v is None else v.encode("utf-8", "surrogatepass")
    return ConsumerRecord(topic, partition, doc["offset"], doc.get("timestamp", -1), field("key"), field("value"),
                          tuple((k, (v.encode() if isinstance(v, str) else v)) for k, v in (doc.get("headers") or {}).items()))


async def _partition_stream(transport: Transport, meta: MetadataCache, topic: str, partition: int, start: str,
                            params: dict, out: asyncio.Queue) -> None:
    """Feed `out` with the partition's records forever, reopening the stream where it stopped."""
    last: str | None = None
    failed = False
    while True:
        try:
            url = await meta.leader_url(topic, partition, refresh=failed)
            async for ev in _events(transport, f"{url}/v1/topics/{quote(topic)}/partitions/{partition}/records/stream",
                                    {"offset": start, **params}, last):
                await out.put(_record(topic, partition, json.loads(ev["data"])))
                last = ev["id"]
        except KraftlogError as e:
            if not (e.code.retriable or e.code is ErrorCode.BROKER_NOT_AVAILABLE):
                await out.put(e)
                return
        failed = True                             # reopen on the leader metadata names now
        await asyncio.sleep(RECONNECT_BACKOFF_S)


async def _group_stream(transport: Transport, group: str, topic: str, reset: str, params: dict,
                        max_records: int | None, out: asyncio.Queue) -> None:
    """Feed `out` with the group's records; None marks the end (max_records reached and committed)."""
    sent = 0
    while max_records is None or sent < max_records:
        q = {"topics": topic, "auto_offset_reset": reset, **params}
        if max_records is not None:
            q["max_records"] = str(max_records - sent)
        try:
            async for ev in _events(transport, f"{transport.bootstrap_url()}/v1/groups/{quote(group)}/records/stream",
                                    q, None):
                doc = json.loads(ev["data"])
                await out.put(_record(doc["topic"], doc["partition"], doc))
                sent += 1
            if max_records is not None and sent >= max_records:
                break                             # the broker ended the stream after committing
        except KraftlogError as e:
            if not (e.code.retriable or e.code is ErrorCode.BROKER_NOT_AVAILABLE):
                await out.put(e)
                return
            transport.rotate()
        await asyncio.sleep(RECONNECT_BACKOFF_S)
    await out.put(None)


async def consume(args, record_json) -> int:
    """The `kraftlog consume` command (see the module docstring); `record_json` renders
    --output json lines."""
    out_stream = sys.stdout.buffer
    transport = Transport(args.bootstrap, client_id=None, request_timeout_ms=30_000)
    meta = MetadataCache(transport)
    params: dict[str, Any] = {"heartbeat_ms": str(max(10, args.max_wait_ms))}
    if args.isolation_level != "read_uncommitted":
        params["isolation_level"] = args.isolation_level
    queue: asyncio.Queue = asyncio.Queue(maxsize=10_000)
    tasks: list[asyncio.Task] = []
    count = 0
    try:
        if args.group:
            reset = "earliest" if args.from_beginning else "latest"
            tasks.append(asyncio.ensure_future(_group_stream(transport, args.group, args.topic, reset, params,
                                                             args.max_records, queue)))
        else:
            n = await meta.partitions(args.topic)
            if n == 0:
                raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                    f"topic {args.topic!r} does not exist; create it or check the name")
            start = "earliest" if args.from_beginning else "latest"
            tasks += [asyncio.ensure_future(_partition_stream(transport, meta, args.topic, p, start, params, queue))
                      for p in range(n)]
        while args.max_records is None or count < args.max_records:
            item = await queue.get()
            if item is None:
                break
            if isinstance(item, KraftlogError):
                raise item
            if args.output == "json":
                out_stream.write(json.dumps(record_json(item)).encode() + b"\n")
            else:
                if args.print_key:
                    out_stream.write((item.key or b"") + args.key_separator.encode())
                out_stream.write((item.value or b"") + b"\n")
            count += 1
            if queue.empty():
                out_stream.flush()
        out_stream.flush()
        if args.group and tasks:
            # the group stream ends once the broker committed what was printed
            try:
                await asyncio.wait_for(asyncio.shield(tasks[0]), STREAM_END_WAIT_S)
            except asyncio.TimeoutError:
                print(f"kraftlog: the stream of group {args.group} did not end within {STREAM_END_WAIT_S:.0f} s; "
                      "its offsets may not be committed", file=sys.stderr)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await transport.close()
    return 0
