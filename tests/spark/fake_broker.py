"""A minimal in-memory broker speaking the routes the Spark connector uses (API.md).

Only for developing the connector before the real broker exists: single node, one leader
for everything, batches stored as produced and stamped with offsets. Runs an aiohttp app
on a background thread; `FakeBroker().start()` returns its URL.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import cbor2
from aiohttp import web

from partitions.log import record_batch as rb

RAW = "application/vnd.kraftlog.batch"


class _Partition:
    def __init__(self):
        self.batches: list[bytearray] = []  # stamped batches
        self.hw = 0
        self.log_start = 0

    def append(self, body: bytes) -> int:
        base = self.hw
        pos = 0
        while pos < len(body):
            header = rb.validate_batch(body, pos)
            batch = bytearray(body[pos:pos + header.size])
            rb.stamp_batch(batch, self.hw, 0)
            self.batches.append(batch)
            self.hw += header.last_offset_delta + 1
            pos += header.size
        return base


class FakeBroker:
    def __init__(self):
        self.topics: dict[str, list[_Partition]] = {}
        self.url = None

    def _err(self, status, code, msg):
        return web.json_response({"error_code": code, "message": msg}, status=status)

    def _part(self, request):
        t = request.match_info["t"]
        p = int(request.match_info["p"])
        if t not in self.topics or p >= len(self.topics[t]):
            raise web.HTTPNotFound(text=json.dumps({"error_code": "UNKNOWN_TOPIC_OR_PARTITION", "message": t}),
                                   content_type="application/json")
        return self.topics[t][p]

    async def metadata(self, request):
        return web.json_response({
            "cluster_id": "fake", "controller_id": 1,
            "brokers": [{"id": 1, "url": self.url, "rack": None, "fenced": False}],
            "topics": [{"name": t, "partitions": [{"partition": i, "leader": 1, "leader_epoch": 0,
                                                    "replicas": [1], "isr": [1]} for i in range(len(ps))]}
                       for t, ps in sorted(self.topics.items())]})

    async def create(self, request):
        body = await request.json()
        if body["name"] in self.topics:
            return self._err(409, "TOPIC_ALREADY_EXISTS", body["name"])
        self.topics[body["name"]] = [_Partition() for _ in range(body.get("partitions", 1))]
        return web.json_response({"name": body["name"]}, status=201)

    async def offsets(self, request):
        part = self._part(request)
        if "timestamp" in request.query:
            ms = int(request.query["timestamp"])
            for batch in part.batches:
                for r in rb.decode_records(batch):
                    if r.offset >= part.log_start and r.timestamp >= ms:
                        return web.json_response({"offset": r.offset})
            return web.json_response({"offset": None})
        return web.json_response({"log_start_offset": part.log_start, "high_watermark": part.hw})

    async def fetch(self, request):
        part = self._part(request)
        offset = int(request.query["offset"])
        max_bytes = int(request.query.get("max_bytes", 1 << 20))
        if offset < part.log_start or offset > part.hw:
            return self._err(416, "OFFSET_OUT_OF_RANGE", f"{offset} not in [{part.log_start}, {part.hw}]")
        out, size = [], 0
        for batch in part.batches:
            h = rb.BatchHeader.parse(batch)
            if h.last_offset < offset:
                continue
            if out and size + len(batch) > max_bytes:
                break
            out.append(bytes(batch))
            size += len(batch)
        data = b"".join(out)
        nxt = rb.BatchHeader.parse(out[-1]).next_offset if out else offset
        if request.headers.get("Accept", "").startswith(RAW):
            return web.Response(body=data, content_type=RAW, headers={
                "X-Kraftlog-High-Watermark": str(part.hw), "X-Kraftlog-Next-Offset": str(nxt),
                "X-Kraftlog-Log-Start-Offset": str(part.log_start)})
        recs = [{"offset": r.offset, "timestamp": r.timestamp, "key": r.key, "value": r.value,
                 "headers": dict(r.headers)} for r in rb.decode_batches(data) if r.offset >= offset]
        return web.Response(body=cbor2.dumps({"records": recs, "next_offset": nxt, "high_watermark": part.hw,
                                              "log_start_offset": part.log_start}),
                            content_type="application/cbor")

    async def produce(self, request):
        part = self._part(request)
        body = await request.read()
        if request.content_type == RAW:
            base = part.append(body)
            n = part.hw - base
        else:
            doc = cbor2.loads(body) if request.content_type == "application/cbor" else json.loads(body)
            recs = [rb.Record(key=_b(r.get("key")), value=_b(r.get("value")),
                              headers=tuple((k, _b(v)) for k, v in (r.get("headers") or {}).items()))
                    for r in doc["records"]]
            base = part.append(rb.build_batch(recs))
            n = len(recs)
        p = int(request.match_info["p"])
        return web.json_response({"offsets": [{"partition": p, "offset": base + i} for i in range(n)]})

    async def produce_topic(self, request):
        from http_api.partitioner import partition_for_key
        t = request.match_info["t"]
        doc = json.loads(await request.read())
        parts = self.topics[t]
        out = []
        for i, r in enumerate(doc["records"]):
            p = r.get("partition")
            if p is None:
                p = partition_for_key(_b(r["key"]), len(parts)) if r.get("key") is not None else i % len(parts)
            base = parts[p].append(rb.build_batch([rb.Record(key=_b(r.get("key")), value=_b(r.get("value")))]))
            out.append({"partition": p, "offset": base})
        return web.json_response({"offsets": out})

    async def delete_records(self, request):
        part = self._part(request)
        before = int((await request.json())["before_offset"])
        part.log_start = max(part.log_start, min(before, part.hw))
        part.batches = [b for b in part.batches if rb.BatchHeader.parse(b).last_offset >= part.log_start]
        return web.json_response({"log_start_offset": part.log_start})

    async def healthz(self, request):
        return web.json_response({"status": "ok"})

    def start(self) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        self.url = f"http://127.0.0.1:{port}"
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/v1/metadata", self.metadata)
        app.router.add_post("/v1/topics", self.create)
        app.router.add_get("/v1/topics/{t}/partitions/{p}/offsets", self.offsets)
        app.router.add_get("/v1/topics/{t}/partitions/{p}/records", self.fetch)
        app.router.add_post("/v1/topics/{t}/partitions/{p}/records", self.produce)
        app.router.add_post("/v1/topics/{t}/records", self.produce_topic)
        app.router.add_post("/v1/topics/{t}/partitions/{p}/delete-records", self.delete_records)
        app.router.add_get("/healthz", self.healthz)
        ready = threading.Event()

        def run():
            loop = asyncio.new_event_loop()
            runner = web.AppRunner(app, access_log=None)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
            ready.set()
            loop.run_forever()

        threading.Thread(target=run, daemon=True, name="fake-broker").start()
        ready.wait(10)
        time.sleep(0.05)
        return self.url


def _b(v):
    return v.encode() if isinstance(v, str) else v
