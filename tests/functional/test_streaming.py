"""Streaming consume over HTTP (Server-Sent Events, http_api/broker/streaming.py) on an
in-process broker: 100k records in order across a reconnect that resumes with
Last-Event-ID, heartbeats while idle, the usual JSON errors before a stream starts, a
group stream that commits as it goes, and a bounded buffer for a client that stops reading."""
from __future__ import annotations

import asyncio
import json
import socket

from http_api.broker.app import BROKER_KEY

RECORDS = 100_000
BATCH = 5_000


async def create(c, name, partitions=1):
    r = await c.post("/v1/topics", json={"name": name, "partitions": partitions, "replication_factor": 1})
    assert r.status == 201, await r.text()


async def produce(c, topic, values, partition=0):
    r = await c.post(f"/v1/topics/{topic}/partitions/{partition}/records",
                     json={"records": [{"value": v} for v in values]})
    assert r.status == 200, await r.text()


class SSE:
    """A minimal EventSource reader over an aiohttp response: events and comment lines."""

    def __init__(self, resp) -> None:
        self.resp = resp
        self.comments = 0

    async def next_event(self, timeout: float = 30.0) -> dict:
        event: dict = {}
        while True:
            line = await asyncio.wait_for(self.resp.content.readline(), timeout)
            assert line, "the stream ended"
            line = line.decode().rstrip("\n")
            if line == "":
                if "data" in event or "event" in event:
                    return event
                continue
            if line.startswith(":"):
                self.comments += 1
                continue
            field, _, value = line.partition(": ")
            event[field] = value


async def fast_events(resp):
    """(id, data) of each event, parsed from whole chunks (100k events line by line are slow)."""
    buf = b""
    while True:
        chunk = await asyncio.wait_for(resp.content.readany(), 30)
        assert chunk, "the stream ended"
        events = (buf + chunk).split(b"\n\n")
        buf = events.pop()
        for ev in events:
            if ev.startswith(b"id: "):
                head, _, data = ev.partition(b"\ndata: ")
                yield int(head[4:]), data


async def test_100k_records_in_order_with_a_reconnect_resuming_at_last_event_id(broker):
    c = broker.client
    await create(c, "s")
    for start in range(0, RECORDS, BATCH):
        await produce(c, "s", [f"v{i}" for i in range(start, start + BATCH)])
    seen: list[int] = []
    resp = await c.get("/v1/topics/s/partitions/0/records/stream?offset=0")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    async for event_id, data in fast_events(resp):
        doc = json.loads(data)
        assert event_id == doc["offset"] and doc["value"] == f"v{doc['offset']}"
        seen.append(event_id)
        if len(seen) == RECORDS // 2 + 123:
            break
    resp.close()       # the connection drops mid-stream; the client resumes after the last id it saw
    resp = await c.get("/v1/topics/s/partitions/0/records/stream?offset=0",
                       headers={"Last-Event-ID": str(seen[-1])})
    assert resp.status == 200
    async for event_id, data in fast_events(resp):
        assert json.loads(data)["value"] == f"v{event_id}"
        seen.append(event_id)
        if len(seen) >= RECORDS:
            break
    resp.close()
    assert seen == list(range(RECORDS))


async def test_heartbeats_while_idle_then_new_records_arrive(broker):
    c = broker.client
    await create(c, "idle")
    resp = await c.get("/v1/topics/idle/partitions/0/records/stream?offset=latest&heartbeat_ms=50")
    assert resp.status == 200
    sse = SSE(resp)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30

    async def read_comments(n: int) -> None:
        while sse.comments < n:
            assert loop.time() < deadline, "no heartbeats"
            line = await asyncio.wait_for(resp.content.readline(), 30)
            assert line, "the stream ended"
            if line.startswith(b":"):
                sse.comments += 1
            else:
                assert line.startswith(b"retry:") or line == b"\n", line   # no record events while idle
    await read_comments(3)
    await produce(c, "idle", ["late"])
    ev = await sse.next_event()
    assert json.loads(ev["data"])["value"] == "late" and ev["id"] == "0"
    resp.close()


async def test_bad_input_gets_the_usual_json_errors_before_the_stream(broker):
    c = broker.client
    await create(c, "e")
    await produce(c, "e", ["a", "b"])
    cases = [
        ("/v1/topics/nope/partitions/0/records/stream?offset=0", {}, 404, "UNKNOWN_TOPIC_OR_PARTITION"),
        ("/v1/topics/e/partitions/0/records/stream?offset=99", {}, 416, "OFFSET_OUT_OF_RANGE"),
        ("/v1/topics/e/partitions/0/records/stream?offset=x", {}, 400, "INVALID_REQUEST"),
        ("/v1/topics/e/partitions/0/records/stream", {}, 400, "INVALID_REQUEST"),
        ("/v1/topics/e/partitions/0/records/stream?offset=0", {"Last-Event-ID": "zz"}, 400, "INVALID_REQUEST"),
        ("/v1/topics/e/partitions/0/records/stream?offset=0&isolation_level=dirty", {}, 400, "INVALID_REQUEST"),
        ("/v1/groups/g/records/stream?topics=nope", {}, 404, "UNKNOWN_TOPIC_OR_PARTITION"),
        ("/v1/groups/g/records/stream", {}, 400, "INVALID_REQUEST"),
    ]
    for path, headers, status, code in cases:
        r = await c.get(path, headers=headers)
        doc = await r.json()
        assert (r.status, doc["error_code"]) == (status, code), (path, r.status, doc)
        assert r.headers["Content-Type"].startswith("application/json")


async def test_group_stream_commits_as_it_goes_and_max_records_commits_exactly(broker):
    c = broker.client
    await create(c, "gs", partitions=2)
    await produce(c, "gs", [f"p0-{i}" for i in range(30)], partition=0)
    await produce(c, "gs", [f"p1-{i}" for i in range(30)], partition=1)
    resp = await c.get("/v1/groups/gsg/records/stream?topics=gs&auto_offset_reset=earliest&max_records=25")
    assert resp.status == 200, await resp.text()
    sse = SSE(resp)
    got = []
    for _ in range(25):
        ev = await sse.next_event()
        doc = json.loads(ev["data"])
        assert ev["id"] == f"gs/{doc['partition']}/{doc['offset']}" and doc["topic"] == "gs"
        got.append((doc["partition"], doc["offset"]))
    assert await resp.content.read() == b""    # ended after max_records
    committed = {(e["partition"]): e["offset"]
                 for e in (await (await c.get("/v1/groups/gsg/offsets")).json())["offsets"]}
    for p in (0, 1):
        sent = [o for q, o in got if q == p]
        assert committed.get(p, 0) == (max(sent) + 1 if sent else 0), (committed, got)
    # the next stream of the group resumes at the committed offsets: the other 35 records, once
    resp = await c.get("/v1/groups/gsg/records/stream?topics=gs&auto_offset_reset=earliest&max_records=35")
    sse = SSE(resp)
    rest = []
    for _ in range(35):
        doc = json.loads((await sse.next_event())["data"])
        rest.append((doc["partition"], doc["offset"]))
    resp.close()
    assert sorted(got + rest) == sorted((p, o) for p in (0, 1) for o in range(30))


async def test_a_client_that_stops_reading_holds_a_bounded_buffer(broker):
    c = broker.client
    routes = None
    for r in c.app.router.routes():
        handler = getattr(r.handler, "__self__", None)
        if handler is not None and type(handler).__name__ == "StreamRoutes":
            routes = handler
    assert routes is not None and c.app[BROKER_KEY] is routes.ctx
    routes.stream_buffer_bytes = 64 * 1024
    await create(c, "big")
    blob = "x" * 1000
    for _ in range(12):
        await produce(c, "big", [blob] * 1000)       # 12 MB, far above the buffer
    metrics = c.app[BROKER_KEY].metrics
    before = metrics.fetch_bytes._value.get()
    # a raw client whose receive buffer is fixed before it connects (Linux autotuning would
    # otherwise let the kernel absorb tens of MB on loopback: tcp_rmem max here is 32 MB)
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, (c.server.host, c.server.port))
        await loop.sock_sendall(sock, b"GET /v1/topics/big/partitions/0/records/stream?offset=0 HTTP/1.1\r\n"
                                      b"Host: x\r\nAccept: text/event-stream\r\n\r\n")
        # the client reads nothing: the broker stops reading the log once the socket and its
        # buffer are full (kernel send buffer, at most tcp_wmem max, + the small receive
        # buffer + stream_buffer_bytes), far below the 12 MB
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            wmem_max = int(f.read().split()[2])
        last, stable_since = -1, loop.time()
        while loop.time() - stable_since < 1.0:
            sent = metrics.fetch_bytes._value.get() - before
            if sent != last:
                last, stable_since = sent, loop.time()
            await asyncio.sleep(0.1)
        bound = wmem_max + 2 * sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) + routes.stream_buffer_bytes
        assert 0 < last <= bound + 256 * 1024 and last < 10_000_000, (last, bound)
        # and reading resumes the stream where it paused: the first event is offset 0
        head = b""
        while b"\nid: 0\n" not in head and b"\r\nid: 0\n" not in head:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 65536), 30)
            assert chunk, "the stream ended"
            head += chunk
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        # draining the socket lets the broker read on: more of the log is sent
        deadline = loop.time() + 30
        while metrics.fetch_bytes._value.get() - before <= last and loop.time() < deadline:
            await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 30)
        assert metrics.fetch_bytes._value.get() - before > last
    finally:
        sock.close()


async def test_read_committed_stream_waits_for_the_commit_and_skips_aborted_records(broker):
    from http_api.client import Producer

    c = broker.client
    await create(c, "tx")
    url = broker.config.url
    async with Producer(url, transactional_id="sse-tx") as p:
        await p.init_transactions()
        p.begin_transaction()
        await p.send("tx", "aborted", partition=0)
        await p.flush()
        await p.abort_transaction()
        p.begin_transaction()
        await p.send("tx", "committed", partition=0)
        await p.flush()          # written, transaction still open: above the LSO
        resp = await c.get("/v1/topics/tx/partitions/0/records/stream?offset=0&isolation_level=read_committed"
                           "&heartbeat_ms=50")
        assert resp.status == 200
        sse = SSE(resp)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while sse.comments < 3:        # heartbeats, no record, while the transaction is open
            assert loop.time() < deadline
            line = await asyncio.wait_for(resp.content.readline(), 30)
            assert not line.startswith(b"data:"), line
            sse.comments += line.startswith(b":")
        await p.commit_transaction()
        ev = await sse.next_event()
        assert json.loads(ev["data"])["value"] == "committed"
        resp.close()
