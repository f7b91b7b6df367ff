"""Broker benchmark: a real `kraftlog serve` node vs a bare aiohttp echo server, same run.

Figures (printed as a table, not asserted):
- batched produce (raw record batches of 100-byte records, acks=1): requests/s, records/s,
  MB/s, and the ratio to the echo server's request rate for the same bodies (goal >= 60%);
- single-record produce requests/s (JSON, topic route, acks=1) vs echo;
- fetch catch-up records/s and MB/s (raw batches, 1 MiB per fetch);
- produce-to-consume latency p50/p99 with a long-polling consumer.

    python -m bench.broker_bench [--seconds S] [--concurrency C]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from deploy.local_node import LocalNode, free_port  # noqa: E402
from http_api.wire import codecs  # noqa: E402
from partitions.log import record_batch as rb  # noqa: E402

RECORD_BYTES = 100
RECORDS_PER_BATCH = 1000


# ---- echo baseline -------------------------------------------------------------------

def run_echo_server(port: int) -> None:
    """A bare aiohttp server: read the body, answer a small JSON (the floor for any broker)."""
    from aiohttp import web

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({"offsets": [{"partition": 0, "offset": len(body)}]})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/{tail:.*}", echo)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def start_echo() -> tuple[subprocess.Popen, str]:
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "bench.broker_bench", "--echo-server", str(port)], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            import urllib.request
            urllib.request.urlopen(urllib.request.Request(url + "/x", data=b"", method="POST"), timeout=1)
            return p, url
        except Exception:
            time.sleep(0.1)
    p.kill()
    raise RuntimeError("echo server did not start")


# ---- load generators -----------------------------------------------------------------

async def post_loop(session: aiohttp.ClientSession, url: str, body: bytes, content_type: str, seconds: float,
                    concurrency: int) -> tuple[int, float]:
    """POST `body` to `url` from `concurrency` workers for `seconds`; -> (requests ok, elapsed)."""
    stop_at = time.perf_counter() + seconds
    count = 0
    errors = 0

    async def worker():
        nonlocal count, errors
        headers = {"Content-Type": content_type}
        while time.perf_counter() < stop_at:
            async with session.post(url, data=body, headers=headers) as r:
                await r.read()
                if r.status == 200:
                    count += 1
                else:
                    errors += 1
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    if errors:
        print(f"  ({errors} failed requests to {url})", file=sys.stderr)
    return count, elapsed


async def alternate(session, urls: tuple[str, str], body: bytes, content_type: str, seconds: float,
                    concurrency: int, rounds: int = 3) -> tuple[float, float]:
    """Alternate short runs against (echo, broker) so machine noise hits both alike;
    -> median requests/s of each."""
    rates: tuple[list, list] = ([], [])
    for _ in range(rounds):
        for i, url in enumerate(urls):
            n, t = await post_loop(session, url, body, content_type, seconds / rounds, concurrency)
            rates[i].append(n / t)
    return statistics.median(rates[0]), statistics.median(rates[1])


async def fetch_catch_up(session: aiohttp.ClientSession, base: str, topic: str, hw: int) -> tuple[int, int, float]:
    offset = 0
    records = 0
    nbytes = 0
    t0 = time.perf_counter()
    while offset < hw:
        async with session.get(f"{base}/v1/topics/{topic}/partitions/0/records",
                               params={"offset": str(offset), "max_bytes": str(1 << 20)},
                               headers={"Accept": codecs.RAW_BATCH}) as r:
            data = await r.read()
            nxt = int(r.headers[codecs.HEADER_NEXT_OFFSET])
        for header, _ in rb.iter_batches(data, validate=False):
            records += header.record_count
        nbytes += len(data)
        if nxt <= offset:
            break
        offset = nxt
    return records, nbytes, time.perf_counter() - t0


async def latency(session: aiohttp.ClientSession, base: str, topic: str, samples: int,
                  interval_s: float) -> list[float]:
    """Producer sends one timestamped record every interval; a long-polling consumer
    measures send -> receive."""
    async with session.get(f"{base}/v1/topics/{topic}/partitions/0/offsets") as r:
        start = (await r.json())["high_watermark"]
    got: list[float] = []
    done = asyncio.Event()

    async def consumer():
        offset = start
        while len(got) < samples:
            async with session.get(f"{base}/v1/topics/{topic}/partitions/0/records",
                                   params={"offset": str(offset), "max_wait_ms": "5000"},
                                   headers={"Accept": codecs.RAW_BATCH}) as r:
                data = await r.read()
                nxt = int(r.headers[codecs.HEADER_NEXT_OFFSET])
            now = time.perf_counter()
            for rec in rb.decode_batches(data, validate=False):
                if rec.offset >= offset:
                    got.append(now - float(rec.value.decode()))
            offset = nxt
        done.set()

    async def producer():
        for _ in range(samples):
            body = rb.build_batch([rb.Record(None, repr(time.perf_counter()).encode())])
            async with session.post(f"{base}/v1/topics/{topic}/partitions/0/records", params={"acks": "1"},
                                    data=body, headers={"Content-Type": codecs.RAW_BATCH}) as r:
                await r.read()
            await asyncio.sleep(interval_s)

    c = asyncio.create_task(consumer())
    await producer()
    await asyncio.wait_for(done.wait(), 30)
    await c
    return got[:samples]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


# ---- main ----------------------------------------------------------------------------

async def run(seconds: float, concurrency: int) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    tmp = tempfile.mkdtemp(prefix="kraftlog-bench-")
    node = LocalNode(os.path.join(tmp, "data"), extra_args=["--log-level", "WARNING"]).start()
    echo_proc, echo_url = start_echo()
    try:
        conn = aiohttp.TCPConnector(limit=concurrency * 2)
        async with aiohttp.ClientSession(connector=conn) as s:
            base = node.url
            async with s.post(base + "/v1/topics", json={"name": "bench", "partitions": 1,
                                                         "replication_factor": 1}) as r:
                assert r.status == 201, await r.text()
            value = b"x" * RECORD_BYTES
            batch = rb.build_batch([rb.Record(None, value) for _ in range(RECORDS_PER_BATCH)])
            single = json.dumps({"records": [{"value": value.decode()}]}).encode()

            # warm up both
            await post_loop(s, f"{base}/v1/topics/bench/partitions/0/records?acks=1", batch, codecs.RAW_BATCH,
                            0.5, concurrency)
            await post_loop(s, echo_url + "/x", batch, codecs.RAW_BATCH, 0.5, concurrency)

            echo_rps, b_rps = await alternate(
                s, (echo_url + "/v1/topics/bench/partitions/0/records", f"{base}/v1/topics/bench/partitions/0/records?acks=1"),
                batch, codecs.RAW_BATCH, seconds, concurrency)
            rows.append(("batched produce (raw, 1000 x 100 B, acks=1) requests/s", f"{b_rps:,.0f}"))
            rows.append(("  records/s", f"{b_rps * RECORDS_PER_BATCH:,.0f}"))
            rows.append(("  MB/s (request bodies)", f"{b_rps * len(batch) / 1e6:,.1f}"))
            rows.append(("  echo server requests/s, same bodies", f"{echo_rps:,.0f}"))
            rows.append(("  broker / echo (goal >= 60%)", f"{100 * b_rps / echo_rps:.0f}%"))

            echo1, b1 = await alternate(s, (echo_url + "/v1/topics/bench/records",
                                            f"{base}/v1/topics/bench/records?acks=1"),
                                        single, codecs.JSON, seconds, concurrency)
            rows.append(("single-record produce (JSON, acks=1) requests/s", f"{b1:,.0f}"))
            rows.append(("  echo server requests/s, same bodies", f"{echo1:,.0f}"))
            rows.append(("  broker / echo", f"{100 * b1 / echo1:.0f}%"))

            async with s.get(f"{base}/v1/topics/bench/partitions/0/offsets") as r:
                hw = (await r.json())["high_watermark"]
            recs, nbytes, t_f = await fetch_catch_up(s, base, "bench", hw)
            rows.append(("fetch catch-up (raw, 1 MiB fetches) records/s", f"{recs / t_f:,.0f}"))
            rows.append(("  MB/s", f"{nbytes / t_f / 1e6:,.1f}  ({recs:,} records)"))

            from http_api.client import Producer
            n_client = 200_000
            async with Producer(base, acks=1, linger_ms=5, batch_size_bytes=256 * 1024) as producer:
                t0 = time.perf_counter()
                futs = [await producer.send("bench", value, partition=0) for _ in range(n_client)]
                await producer.flush()
                t_client = time.perf_counter() - t0
                assert all(f.result().offset >= 0 for f in futs)
            rows.append(("Python Producer (send() per record, linger 5 ms, 256 KiB) records/s",
                         f"{n_client / t_client:,.0f}"))

            lat = await latency(s, base, "bench", samples=300, interval_s=0.005)
            rows.append(("produce -> long-poll consume latency p50", f"{pct(lat, 0.5) * 1000:.2f} ms"))
            rows.append(("  p99", f"{pct(lat, 0.99) * 1000:.2f} ms  ({len(lat)} samples)"))
    finally:
        echo_proc.terminate()
        echo_proc.wait(10)
        node.stop()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.broker_bench")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--echo-server", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.echo_server:
        run_echo_server(args.echo_server)
        return
    rows = asyncio.run(run(args.seconds, args.concurrency))
    width = max(len(k) for k, _ in rows)
    print(f"\nbroker benchmark ({args.seconds:.0f} s per phase, {args.concurrency} connections, one client process)")
    print("-" * (width + 24))
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print()


if __name__ == "__main__":
    main()
