"""Where the time of one acks=all write goes (issue 21, goal 3): a per-stage breakdown at
1 node and at 3 nodes RF=3, the Python Producer writing one 100 B record at a time.

Stages (p50 of each, microseconds; the rows add up to about the total):

- client send: Producer.send() until the HTTP request starts (batch encode, the
  partition's queue, the sender task);
- HTTP floor: the same client's round trip to a bare aiohttp server answering a small JSON
  (client aiohttp + loopback + server aiohttp request parsing and response), measured
  alongside;
- broker handler, acks=1: the broker's produce handler at acks=1 (route, body checks,
  append to the leader's log) = acks=1 round trip - HTTP floor;
- replication, acks=all - acks=1: the leader's wait for its high watermark: the parked
  follower fetches woken by the append, the followers' append, their next fetch that
  carries their log end offset, the high watermark advance, the waiter answered;
- client ack: the HTTP answer until the record's future is resolved;
- also printed: the client process's CPU time of one acks=all write and of one echo
  request, the broker's own mean produce handler time (kraftlog_produce_latency_seconds),
  and the HTTP floor with a minimal HTTP/1.1 client on an asyncio protocol (`RawHttp`, one
  prebuilt request) to the same echo server.

Every column is measured twice in the same samples, alternating: "own" (the client's own
HTTP/1.1 connections, http_api/client/http1.py, the default) and "aiohttp" (produce
requests through aiohttp's client, `Transport.own_http_connections = False`).

Each sample is, per client, an echo round trip, an acks=1 write and an acks=all write back to back, and
the stage figures are p50s of per-sample differences, so load drifts hit all alike (on a
shared, loaded machine the absolute figures still move a lot between runs).

    python -m bench.latency_bench [--samples N] [--rounds R] [--no-rf3]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

import aiohttp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.broker_bench import start_echo  # noqa: E402
from deploy.local_node import LocalNode  # noqa: E402
from http_api.client import Producer  # noqa: E402
from tests.rigs.cluster import ReplicatedCluster, http  # noqa: E402

VALUE = b"x" * 100


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _handler_mean(url: str) -> tuple[float, float]:
    """(sum seconds, count) of the broker's produce handler histogram."""
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/metrics") as r:
            text = await r.text()
    total = count = 0.0
    for line in text.splitlines():
        m = re.match(r"kraftlog_produce_latency_seconds_(sum|count)(?:\{[^}]*\})?\s+([0-9.eE+-]+)", line)
        if m:
            if m.group(1) == "sum":
                total += float(m.group(2))
            else:
                count += float(m.group(2))
    return total, count


class TimedProducer:
    """A Producer writing one record at a time; per write: send -> request start, the
    request's round trip, answer -> future resolved, total."""

    def __init__(self, bootstrap: str, acks: str, own_http: bool = True) -> None:
        self.p = Producer(bootstrap, acks=acks, linger_ms=0)
        self.p.t.own_http_connections = own_http   # False: produce requests through aiohttp's client
        self.marks: dict[str, float] = {}

    async def start(self, topic: str) -> "TimedProducer":
        await (await self.p.send(topic, VALUE, partition=0))   # connection, producer id, metadata
        request = self.p.t.request

        async def timed_request(*a, **kw):
            self.marks["start"] = time.perf_counter()
            try:
                return await request(*a, **kw)
            finally:
                self.marks["end"] = time.perf_counter()

        self.p.t.request = timed_request
        return self

    async def write(self, topic: str) -> tuple[float, float, float, float, float]:
        """-> (send, round trip, ack, total, client CPU of the write) in seconds."""
        c0 = time.process_time()
        t0 = time.perf_counter()
        await (await self.p.send(topic, VALUE, partition=0))
        t1 = time.perf_counter()
        cpu = time.process_time() - c0
        m = self.marks
        return m["start"] - t0, m["end"] - m["start"], t1 - m["end"], t1 - t0, cpu


class _RawHttpProtocol(asyncio.Protocol):
    """Answers of a keep-alive HTTP/1.1 connection, framed by Content-Length."""

    def __init__(self) -> None:
        self.buf = b""
        self.waiter: asyncio.Future | None = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].lower()
        i = head.find(b"content-length:")
        n = 0
        if i >= 0:
            j = head.find(b"\r\n", i)
            n = int(head[i + 15:j if j >= 0 else len(head)])
        if len(self.buf) >= end + 4 + n:
            body, self.buf = self.buf[end + 4:end + 4 + n], self.buf[end + 4 + n:]
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(body)


class RawHttp:
    """A minimal HTTP/1.1 client (one prebuilt request, no aiohttp) for the HTTP floor
    without aiohttp's client: what a lighter client path could reach."""

    def __init__(self, url: str, path: str, body: bytes) -> None:
        self.host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.port = int(port)
        self.request = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/octet-stream\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        self.transport = self.protocol = None

    async def connect(self) -> "RawHttp":
        loop = asyncio.get_running_loop()
        self.transport, self.protocol = await loop.create_connection(_RawHttpProtocol, self.host, self.port)
        return self

    async def round_trip(self) -> bytes:
        self.protocol.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(self.request)
        return await asyncio.wait_for(self.protocol.waiter, 30)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


CLIENTS = ("own", "aiohttp")   # the client's own HTTP/1.1 connections, aiohttp's client


async def breakdown(bootstrap: str, leader_url: str, topic: str, echo_url: str, samples: int,
                    rounds: int) -> dict[str, list[tuple[str, float]]]:
    """Each sample is, for each client (own connections, then aiohttp's), an echo round trip,
    an acks=1 write and an acks=all write back to back, so the differences and the two
    clients are taken under the same load; medians of per-round p50s. -> {client: rows}."""
    from http_api.client.transport import Transport
    echo = Transport(echo_url, client_id="bench", request_timeout_ms=30_000)
    prods = {c: (await TimedProducer(bootstrap, "1", c == "own").start(topic),
                 await TimedProducer(bootstrap, "all", c == "own").start(topic)) for c in CLIENTS}
    for c in CLIENTS:
        await echo.request("POST", echo_url + "/x", data=VALUE, hot=c == "own")
    raw = await RawHttp(echo_url, "/x", VALUE).connect()
    await raw.round_trip()
    rows: dict[str, dict[str, list[float]]] = {c: {} for c in CLIENTS}
    h_sum = h_cnt = 0.0
    try:
        for _ in range(rounds):
            s0, c0 = await _handler_mean(leader_url)
            per: dict[str, dict[str, list[float]]] = {c: {} for c in CLIENTS}
            for _ in range(samples):
                for c in CLIENTS:
                    p1, pa = prods[c]
                    cpu0 = time.process_time()
                    t0 = time.perf_counter()
                    await echo.request("POST", echo_url + "/v1/topics/t/partitions/0/records", data=VALUE,
                                       content_type="application/vnd.kraftlog.batch", params={"acks": "all"},
                                       hot=c == "own")
                    floor = time.perf_counter() - t0
                    floor_cpu = time.process_time() - cpu0
                    t0 = time.perf_counter()
                    await raw.round_trip()
                    raw_floor = time.perf_counter() - t0
                    _, rtt1, _, total1, _ = await p1.write(topic)
                    send, rtta, ack, total, cpu = await pa.write(topic)
                    for k, v in (("send", send), ("floor", floor), ("handler1", rtt1 - floor),
                                 ("replication", rtta - rtt1), ("ack", ack), ("total", total), ("total1", total1),
                                 ("raw_floor", raw_floor), ("floor_cpu", floor_cpu), ("cpu", cpu)):
                        per[c].setdefault(k, []).append(v)
            s1, c1 = await _handler_mean(leader_url)
            h_sum += s1 - s0
            h_cnt += c1 - c0
            for c in CLIENTS:
                for k, v in per[c].items():
                    rows[c].setdefault(k, []).append(pct(v, 0.5))
                rows[c].setdefault("p99", []).append(pct(per[c]["total"], 0.99))
    finally:
        for p1, pa in prods.values():
            await p1.p.close()
            await pa.p.close()
        await echo.close()
        raw.close()
    out = {}
    for c in CLIENTS:
        med = {k: statistics.median(v) for k, v in rows[c].items()}
        out[c] = [
            ("client send (encode, queue, sender)", med["send"]),
            ("HTTP floor (client + loopback + aiohttp server)", med["floor"]),
            ("broker handler, acks=1 (route, checks, append)", med["handler1"]),
            ("replication (acks=all - acks=1: follower wake-up, fetch, HW)", med["replication"]),
            ("client ack (answer -> future resolved)", med["ack"]),
            ("= one acks=all write, p50", med["total"]),
            ("  p99", med["p99"]),
            ("  acks=1 write, p50", med["total1"]),
            ("  client CPU of one acks=all write, p50", med["cpu"]),
            ("  client CPU of one echo request (HTTP floor), p50", med["floor_cpu"]),
            ("  broker's mean produce handler time (acks=1 and all, both clients)",
             h_sum / h_cnt if h_cnt else float("nan")),
            ("  HTTP floor, bench's minimal HTTP/1.1 client (RawHttp)", med["raw_floor"]),
        ]
    return out


async def run(samples: int, rounds: int, rf3: bool) -> dict[str, list[tuple[str, float]]]:
    tmp = tempfile.mkdtemp(prefix="kraftlog-latency-")
    echo_proc, echo_url = start_echo()
    node = cluster = None
    out = {}
    try:
        node = LocalNode(os.path.join(tmp, "kl1"), extra_args=["--log-level", "WARNING"]).start()
        status, body = http("POST", node.url + "/v1/topics", {"name": "lat", "partitions": 1, "replication_factor": 1})
        assert status == 201, body
        for c, rows in (await breakdown(node.url, node.url, "lat", echo_url, samples, rounds)).items():
            out[f"1 node, {c}"] = rows
        if rf3:
            cluster = ReplicatedCluster(os.path.join(tmp, "kl3"), brokers=3,
                                        broker_config={"min_insync_replicas": 2}).start()
            cluster.create_topic("lat", partitions=1, replication_factor=3)
            leader = cluster.url(cluster.partition("lat")["leader"])
            for c, rows in (await breakdown(",".join(cluster.urls), leader, "lat", echo_url, samples,
                                            rounds)).items():
                out[f"RF=3, {c}"] = rows
    finally:
        echo_proc.terminate()
        echo_proc.wait(10)
        if cluster is not None:
            cluster.close()
        if node is not None:
            node.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.latency_bench")
    ap.add_argument("--samples", type=int, default=300, help="writes per stage per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-rf3", action="store_true")
    args = ap.parse_args(argv)
    res = asyncio.run(run(args.samples, args.rounds, not args.no_rf3))
    names = [k for k, _ in next(iter(res.values()))]
    width = max(len(n) for n in names)
    cols = list(res)
    print(f"\none acks=all write of a 100 B record, per stage, p50 us (medians of {args.rounds} rounds x "
          f"{args.samples} writes; the Python Producer, linger_ms=0)")
    print("(own: the client's own HTTP/1.1 connections for produce; aiohttp: aiohttp's client; same samples, "
          "alternating)")
    print(" " * width + "  " + "  ".join(f"{c:>16}" for c in cols))
    for i, n in enumerate(names):
        print(f"{n:<{width}}  " + "  ".join(f"{res[c][i][1] * 1e6:>16,.0f}" for c in cols))
    print()


if __name__ == "__main__":
    main()
