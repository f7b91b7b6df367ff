"""Streaming consume benchmark (figures printed as a table, not asserted).

One real node (`kraftlog serve`), one partition of N records (value_bytes each), read to the
end three ways in the same run, each from offset 0 by one client:
- SSE stream (`GET .../records/stream`, one event per record, JSON);
- long-poll fetch in a loop (`GET .../records?offset=..&max_wait_ms=..`, JSON answers of
  max_bytes), the baseline an HTTP consumer uses without the stream;
- a tail: records/s and the latency from produce to the SSE event, with a producer sending
  one record every 10 ms while the stream follows.

    python -m bench.streaming_bench [--records N] [--value-bytes B]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

import aiohttp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from deploy.local_node import LocalNode  # noqa: E402

FETCH_MAX_BYTES = 1 << 20


async def _fill(s: aiohttp.ClientSession, url: str, n: int, value_bytes: int) -> None:
    r = await s.post(f"{url}/v1/topics", json={"name": "sb", "partitions": 1, "replication_factor": 1})
    assert r.status in (201, 202), await r.text()
    value = "x" * value_bytes
    for start in range(0, n, 5000):
        r = await s.post(f"{url}/v1/topics/sb/partitions/0/records?acks=1",
                         json={"records": [{"value": value} for _ in range(min(5000, n - start))]})
        assert r.status == 200, await r.text()


async def _sse(s: aiohttp.ClientSession, url: str, n: int) -> float:
    t0 = time.perf_counter()
    got = 0
    buf = b""
    async with s.get(f"{url}/v1/topics/sb/partitions/0/records/stream?offset=0") as r:
        assert r.status == 200, await r.text()
        async for chunk in r.content.iter_any():     # whole chunks, split into events here
            events = (buf + chunk).split(b"\n\n")
            buf = events.pop()
            for ev in events:
                data = ev.rpartition(b"\ndata: ")[2]
                if data and not ev.startswith(b":") and not ev.startswith(b"retry"):
                    json.loads(data)
                    got += 1
            if got >= n:
                break
    return n / (time.perf_counter() - t0)


async def _long_poll(s: aiohttp.ClientSession, url: str, n: int) -> float:
    t0 = time.perf_counter()
    offset = got = 0
    while got < n:
        async with s.get(f"{url}/v1/topics/sb/partitions/0/records",
                         params={"offset": str(offset), "max_bytes": str(FETCH_MAX_BYTES), "max_wait_ms": "500"}) as r:
            doc = await r.json()
        got += len(doc["records"])
        offset = doc["next_offset"]
    return n / (time.perf_counter() - t0)


async def _tail_latency(s: aiohttp.ClientSession, url: str, count: int) -> list[float]:
    """ms from the produce request's start to its record's SSE event, one record per 10 ms."""
    async with s.get(f"{url}/v1/topics/sb/partitions/0/offsets") as r:
        end = (await r.json())["high_watermark"]
    sent: dict[int, float] = {}
    lat: list[float] = []

    async def produce() -> None:
        for i in range(count):
            t = time.perf_counter()
            async with s.post(f"{url}/v1/topics/sb/partitions/0/records?acks=1",
                              json={"records": [{"value": f"t{i}"}]}) as r:
                sent[(await r.json())["offsets"][0]["offset"]] = t
            await asyncio.sleep(0.01)

    async with s.get(f"{url}/v1/topics/sb/partitions/0/records/stream?offset={end}") as r:
        task = asyncio.ensure_future(produce())
        async for line in r.content:
            if line.startswith(b"id: "):
                off = int(line[4:])
                now = time.perf_counter()
                while off not in sent:          # the answer may come after the event
                    await asyncio.sleep(0.001)
                lat.append((now - sent[off]) * 1000)
                if len(lat) == count:
                    break
        await task
    return lat


async def run(n: int, value_bytes: int) -> None:
    with tempfile.TemporaryDirectory() as d, LocalNode(os.path.join(d, "node")) as node:
        async with aiohttp.ClientSession() as s:
            await _fill(s, node.url, n, value_bytes)
            rows = []
            for name, fn in (("long-poll fetch (JSON, max_bytes 1 MiB)", _long_poll), ("SSE stream", _sse),
                             ("long-poll fetch, again", _long_poll), ("SSE stream, again", _sse)):
                rows.append((name, await fn(s, node.url, n)))
            lat = await _tail_latency(s, node.url, 200)
    print(f"{n} records of {value_bytes} B, one partition, one client, same node and run")
    print(f"{'reader':44} {'records/s':>12}")
    for name, rate in rows:
        print(f"{name:44} {rate:12,.0f}")
    lat.sort()
    print(f"tail (1 record / 10 ms): produce -> SSE event p50 {statistics.median(lat):.1f} ms, "
          f"p99 {lat[int(0.99 * (len(lat) - 1))]:.1f} ms")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    a = ap.parse_args(argv)
    asyncio.run(run(a.records, a.value_bytes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
