"""kraftlog vs NATS JetStream vs Redis streams, one run, same record size (issue 21, goal 5).

Each system with its own Python client (http_api.client / nats-py / redis-py), 100 B records,
medians of `--rounds` interleaved rounds (round r runs every system before round r+1 starts):

- async produce, 1 node: kraftlog Producer.send() per record (acks=1 and acks=all) and
  Producer.send_batch() of 1000 and 5000 values (columns, one future per batch);
  JetStream publish_async (file storage); Redis XADD pipelined 1000 at a time;
- one record at a time, 1 node: p50 of awaiting each acknowledgement before the next send;
- async produce / one at a time at 3 nodes RF=3, and send() with
  max_in_flight_requests_per_connection 1 vs 5 (kraftlog only: a 3-node JetStream cluster
  is not started here);
- consume catch-up, 1 node: Consumer.poll() and Consumer.poll_columns() / JetStream pull
  fetch(1000) / XREAD COUNT 10000;
- produce -> consume p50 / p99 at RF=3 (kraftlog).

A server that is not installed is skipped with how to install it (Debian: `apt-get install
nats-server redis-server`; Python: `pip install -e '.[bench]'`). Figures are printed, never
asserted.

    python -m bench.peers_bench [--records N] [--rounds R] [--samples S] [--no-rf3]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from deploy.local_node import LocalNode, free_port  # noqa: E402
from tests.rigs.cluster import ReplicatedCluster, http  # noqa: E402

RECORD_BYTES = 100
VALUE = b"x" * RECORD_BYTES
SEND_BATCH_RECORDS = 1000


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _wait_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:.0f} s")


# ---- kraftlog -------------------------------------------------------------------------

async def kl_async_produce(url: str, topic: str, n: int, acks: str, batch: bool, in_flight: int = 5,
                           batch_records: int = SEND_BATCH_RECORDS, own_http: bool = True) -> float:
    from http_api.client import Producer
    async with Producer(url, acks=acks, linger_ms=5, batch_size_bytes=256 * 1024,
                        max_in_flight_requests_per_connection=in_flight) as p:
        p.t.own_http_connections = own_http   # False: produce requests through aiohttp's client
        t0 = time.perf_counter()
        if batch:
            values = [VALUE] * batch_records
            futs = [await p.send_batch(topic, values, partition=0) for _ in range(n // batch_records)]
            await p.flush()
            unknown = sum(f.result().offset < 0 for f in futs)
            if unknown:   # written once, but resent after a timeout and answered as an old duplicate
                print(f"{topic}: {unknown} of {len(futs)} batches acknowledged with offset -1", file=sys.stderr)
        else:
            futs = [await p.send(topic, VALUE, partition=0) for _ in range(n)]
            await p.flush()
            if futs[-1].result().offset < 0:
                print(f"{topic}: the last record acknowledged with offset -1 (an old duplicate)", file=sys.stderr)
        return n / (time.perf_counter() - t0)


async def kl_one_at_a_time(url: str, topic: str, samples: int, acks: str,
                           own_http: bool = True) -> tuple[list[float], float]:
    """-> (seconds of each write, the client process's CPU seconds per write)."""
    from http_api.client import Producer
    out = []
    async with Producer(url, acks=acks, linger_ms=0) as p:
        p.t.own_http_connections = own_http
        await (await p.send(topic, VALUE, partition=0))   # connection + producer id
        c0 = time.process_time()
        for _ in range(samples):
            t0 = time.perf_counter()
            await (await p.send(topic, VALUE, partition=0))
            out.append(time.perf_counter() - t0)
        cpu = (time.process_time() - c0) / samples
    return out, cpu


async def kl_consume(url: str, topic: str, n: int, own_http: bool = True) -> float:
    from http_api.client import Consumer
    async with Consumer(url, auto_offset_reset="earliest", max_bytes=4 << 20, max_wait_ms=100) as c:
        c.t.own_http_connections = own_http
        c.assign([(topic, 0)])
        await c.seek_to_beginning((topic, 0))
        got = 0
        t0 = time.perf_counter()
        while got < n:
            got += len(await c.poll(timeout_ms=1000))
        return got / (time.perf_counter() - t0)


async def kl_consume_columns(url: str, topic: str, n: int, own_http: bool = True) -> float:
    """Consumer.poll_columns(): each batch's values as a column (views of the fetched bytes);
    every value's length is read, as a consumer that looks at every record would."""
    from http_api.client import Consumer
    async with Consumer(url, auto_offset_reset="earliest", max_bytes=4 << 20, max_wait_ms=100) as c:
        c.t.own_http_connections = own_http
        c.assign([(topic, 0)])
        await c.seek_to_beginning((topic, 0))
        got = size = 0
        t0 = time.perf_counter()
        while got < n:
            for b in await c.poll_columns(timeout_ms=1000):
                got += len(b)
                size += sum(b.values.lengths)
        assert size == got * RECORD_BYTES
        return got / (time.perf_counter() - t0)


async def kl_e2e(url: str, topic: str, samples: int) -> list[float]:
    """ms from Producer.send (acks=all) to a long-polling Consumer.poll returning it."""
    from http_api.client import Consumer, Producer
    out: list[float] = []
    async with Producer(url, acks="all", linger_ms=0) as p, \
            Consumer(url, auto_offset_reset="latest", max_wait_ms=2000) as c:
        c.assign([(topic, 0)])
        await c.seek_to_end((topic, 0))
        done = asyncio.Event()

        async def consume():
            while len(out) < samples:
                for r in await c.poll(timeout_ms=2000):
                    out.append(time.perf_counter() - float(r.value))
            done.set()

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.2)   # the first long poll is parked at the end
        for _ in range(samples):
            await (await p.send(topic, repr(time.perf_counter()).encode(), partition=0))
            await asyncio.sleep(0.002)
        await asyncio.wait_for(done.wait(), 60)
        await task
    return out[:samples]


def _create(url: str, name: str, rf: int) -> None:
    status, body = http("POST", url + "/v1/topics", {"name": name, "partitions": 1, "replication_factor": rf})
    if status != 201:
        raise RuntimeError(f"cannot create {name}: {status} {body}")


# ---- NATS JetStream -------------------------------------------------------------------

class NatsServer:
    def __init__(self, tmp: str) -> None:
        self.port = free_port()
        self.dir = os.path.join(tmp, "nats")
        self.proc = subprocess.Popen(["nats-server", "-js", "-sd", self.dir, "-a", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


async def nats_round(port: int, stream: str, n: int, samples: int) -> dict:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[stream], storage=StorageType.FILE)
        out: dict = {}
        await js.publish(stream, VALUE)
        lat = []
        for _ in range(samples):
            t0 = time.perf_counter()
            await js.publish(stream, VALUE)
            lat.append(time.perf_counter() - t0)
        out["one"] = lat
        t0 = time.perf_counter()
        for _ in range(n):
            await js.publish_async(stream, VALUE)
        await js.publish_async_completed()
        out["async"] = n / (time.perf_counter() - t0)
        sub = await js.pull_subscribe(stream, durable=None, config=ConsumerConfig(ack_policy=AckPolicy.NONE))
        total = n + samples + 1
        got = 0
        t0 = time.perf_counter()
        while got < total:
            msgs = await sub.fetch(1000, timeout=5)
            got += len(msgs)
        out["consume"] = got / (time.perf_counter() - t0)
        await js.delete_stream(stream)
        return out
    finally:
        await nc.close()


# ---- Redis streams --------------------------------------------------------------------

class RedisServer:
    def __init__(self, tmp: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", tmp],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


async def redis_round(port: int, key: str, n: int, samples: int) -> dict:
    import redis.asyncio as aredis
    r = aredis.Redis(host="127.0.0.1", port=port)
    try:
        out: dict = {}
        await r.xadd(key, {"v": VALUE})
        lat = []
        for _ in range(samples):
            t0 = time.perf_counter()
            await r.xadd(key, {"v": VALUE})
            lat.append(time.perf_counter() - t0)
        out["one"] = lat
        t0 = time.perf_counter()
        for i in range(0, n, 1000):
            pipe = r.pipeline(transaction=False)
            for _ in range(min(1000, n - i)):
                pipe.xadd(key, {"v": VALUE})
            await pipe.execute()
        out["async"] = n / (time.perf_counter() - t0)
        last = "0"
        got = 0
        t0 = time.perf_counter()
        while True:
            res = await r.xread({key: last}, count=10000)
            if not res:
                break
            entries = res[0][1]
            got += len(entries)
            last = entries[-1][0]
        out["consume"] = got / (time.perf_counter() - t0)
        await r.delete(key)
        return out
    finally:
        await r.aclose()


# ---- the run ----------------------------------------------------------------------------

def _missing() -> dict[str, str]:
    """system -> how to install what is missing."""
    out = {}
    try:
        import nats  # noqa: F401
        nats_py = True
    except ImportError:
        nats_py = False
    if shutil.which("nats-server") is None or not nats_py:
        out["nats"] = ("NATS JetStream skipped: needs `nats-server` (Debian: apt-get install nats-server) "
                       "and nats-py (pip install -e '.[bench]')")
    try:
        import redis  # noqa: F401
        redis_py = True
    except ImportError:
        redis_py = False
    if shutil.which("redis-server") is None or not redis_py:
        out["redis"] = ("Redis skipped: needs `redis-server` (Debian: apt-get install redis-server) "
                        "and redis-py (pip install -e '.[bench]')")
    return out


async def _one(url: str, topic: str, samples: int, own_http: bool, add, key: str) -> None:
    lat, cpu = await kl_one_at_a_time(url, topic, samples, "all", own_http)
    add(key, lat)
    add(key + ".cpu", cpu)


async def run(n: int, rounds: int, samples: int, rf3: bool, aiohttp_too: bool = False) -> tuple[dict, dict]:
    missing = _missing()
    tmp = tempfile.mkdtemp(prefix="kraftlog-peers-")
    res: dict[str, list] = {}

    def add(key, value):
        res.setdefault(key, []).append(value)

    node = cluster = nats_srv = redis_srv = None
    try:
        node = LocalNode(os.path.join(tmp, "kl1"), extra_args=["--log-level", "WARNING"]).start()
        if rf3:
            cluster = ReplicatedCluster(os.path.join(tmp, "kl3"), brokers=3).start()
        if "nats" not in missing:
            nats_srv = NatsServer(tmp)
        if "redis" not in missing:
            redis_srv = RedisServer(tmp)
        for r in range(rounds):
            # kraftlog, 1 node
            for name in (f"a1-{r}", f"aa-{r}", f"b1-{r}", f"ba-{r}", f"b5-{r}", f"s-{r}"):
                _create(node.url, name, 1)
            async def both(key: str, phase, *, topic_own: str | None = None, topic_aio: str | None = None):
                """`phase(topic, own_http)` with the own connections ("kl." + key) and, with
                --aiohttp, through aiohttp ("aio." + key) back to back, the order swapped
                every round."""
                runs = [(True, topic_own)] + ([(False, topic_aio or topic_own)] if aiohttp_too else [])
                for own, topic in (runs if r % 2 == 0 else runs[::-1]):
                    await phase(topic, own, ("kl." if own else "aio.") + key)

            if aiohttp_too:
                for name in (f"xa1-{r}", f"xb1-{r}", f"xba-{r}", f"xs-{r}"):
                    _create(node.url, name, 1)

            def rate_phase(acks: str, batch: bool):
                async def phase(topic, own, key):
                    add(key, await kl_async_produce(node.url, topic, n, acks, batch=batch, own_http=own))
                return phase

            await both("async.acks1", rate_phase("1", False), topic_own=f"a1-{r}", topic_aio=f"xa1-{r}")
            add("kl.async.acksall", await kl_async_produce(node.url, f"aa-{r}", n, "all", batch=False))
            await both("batch.acks1", rate_phase("1", True), topic_own=f"b1-{r}", topic_aio=f"xb1-{r}")
            await both("batch.acksall", rate_phase("all", True), topic_own=f"ba-{r}", topic_aio=f"xba-{r}")
            add("kl.batch5k.acks1", await kl_async_produce(node.url, f"b5-{r}", n, "1", batch=True,
                                                           batch_records=5 * SEND_BATCH_RECORDS))

            async def one_phase(topic, own, key):
                await _one(node.url, topic, samples, own, add, key)

            async def consume_phase(topic, own, key):
                add(key, await kl_consume(node.url, topic, n, own_http=own))

            async def columns_phase(topic, own, key):
                add(key, await kl_consume_columns(node.url, topic, n, own_http=own))

            await both("one", one_phase, topic_own=f"s-{r}", topic_aio=f"xs-{r}")
            await both("consume", consume_phase, topic_own=f"b1-{r}")
            await both("consume.columns", columns_phase, topic_own=f"b1-{r}")
            if cluster is not None:
                for name in (f"r3a-{r}", f"r3b-{r}", f"r3s-{r}", f"r3e-{r}", f"r3i-{r}"):
                    cluster.create_topic(name, partitions=1, replication_factor=3)
                leader = cluster.url(cluster.partition(f"r3a-{r}")["leader"])
                add("kl3.async", await kl_async_produce(leader, f"r3a-{r}", n, "all", batch=False))
                leader_i = cluster.url(cluster.partition(f"r3i-{r}")["leader"])
                add("kl3.async.inflight1", await kl_async_produce(leader_i, f"r3i-{r}", n, "all", batch=False,
                                                                  in_flight=1))
                leader = cluster.url(cluster.partition(f"r3b-{r}")["leader"])
                add("kl3.batch", await kl_async_produce(leader, f"r3b-{r}", n, "all", batch=True))
                cluster.create_topic(f"r3b5-{r}", partitions=1, replication_factor=3)
                leader = cluster.url(cluster.partition(f"r3b5-{r}")["leader"])
                add("kl3.batch5k", await kl_async_produce(leader, f"r3b5-{r}", n, "all", batch=True,
                                                          batch_records=5 * SEND_BATCH_RECORDS))
                if aiohttp_too:
                    cluster.create_topic(f"xr3s-{r}", partitions=1, replication_factor=3)

                async def one3(topic, own, key):
                    await _one(",".join(cluster.urls), topic, samples, own, add, key.replace(".one", "3.one"))

                await both("one", one3, topic_own=f"r3s-{r}", topic_aio=f"xr3s-{r}")
                add("kl3.e2e", await kl_e2e(",".join(cluster.urls), f"r3e-{r}", samples))
            print(f"round {r + 1}/{rounds}: kraftlog done", file=sys.stderr, flush=True)
            if nats_srv is not None:
                o = await nats_round(nats_srv.port, f"S{r}", n, samples)
                for k, v in o.items():
                    add(f"nats.{k}", v)
            if redis_srv is not None:
                o = await redis_round(redis_srv.port, f"s{r}", n, samples)
                for k, v in o.items():
                    add(f"redis.{k}", v)
    finally:
        for srv in (redis_srv, nats_srv):
            if srv is not None:
                srv.stop()
        if cluster is not None:
            cluster.close()
        if node is not None:
            node.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return res, missing


def summarize(res: dict) -> dict[str, float]:
    """Medians over rounds; latency lists: the median of each round's p50 / p99 (seconds)."""
    out: dict[str, float] = {}
    for k, vs in res.items():
        if isinstance(vs[0], list):
            out[k + ".p50"] = statistics.median(pct(v, 0.5) for v in vs)
            out[k + ".p99"] = statistics.median(pct(v, 0.99) for v in vs)
        else:
            out[k] = statistics.median(vs)
    return out


def table(m: dict[str, float]) -> list[tuple[str, str, str, str]]:
    def rate(k):
        return f"{m[k] / 1000:,.0f}k/s" if k in m else "-"

    def us(k):
        return f"{m[k] * 1e6:,.0f} us" if k in m else "-"

    def ratio(a, b, lower_better=False):
        if a not in m or b not in m:
            return ""
        x = m[b] / m[a] if lower_better else m[a] / m[b]
        return f" ({x:.2f}x)"

    rows = [
        ("async produce, 1 node, send() per record",
         f"{rate('kl.async.acks1')} (acks=1), {rate('kl.async.acksall')} (acks=all)",
         rate("nats.async") + ratio("kl.async.acksall", "nats.async"),
         rate("redis.async") + ratio("kl.async.acks1", "redis.async") + " XADD pipelined"),
        ("async produce, 1 node, send_batch() of 1000",
         f"{rate('kl.batch.acks1')} (acks=1), {rate('kl.batch.acksall')} (acks=all)",
         ratio("kl.batch.acksall", "nats.async").strip(), ratio("kl.batch.acks1", "redis.async").strip()),
        ("async produce, 1 node, send_batch() of 5000, acks=1",
         rate("kl.batch5k.acks1"), ratio("kl.batch5k.acks1", "nats.async").strip(),
         ratio("kl.batch5k.acks1", "redis.async").strip()),
        ("one record at a time, 1 node, p50 (acks=all)",
         f"{us('kl.one.p50')} (p99 {us('kl.one.p99')})",
         us("nats.one.p50") + ratio("kl.one.p50", "nats.one.p50", lower_better=True),
         us("redis.one.p50") + ratio("kl.one.p50", "redis.one.p50", lower_better=True)),
        ("async produce, 3 nodes RF=3, send() / send_batch() of 1000 / of 5000",
         f"{rate('kl3.async')} / {rate('kl3.batch')} / {rate('kl3.batch5k')}", "-", "-"),
        ("  RF=3 send(), max_in_flight_requests_per_connection 1 -> 5",
         f"{rate('kl3.async.inflight1')} -> {rate('kl3.async')}", "-", "-"),
        ("one record at a time, RF=3, p50 / p99",
         f"{us('kl3.one.p50')} / {us('kl3.one.p99')}", "-", "-"),
        ("consume catch-up, 1 node",
         rate("kl.consume"),
         rate("nats.consume") + ratio("kl.consume", "nats.consume"),
         rate("redis.consume") + ratio("kl.consume", "redis.consume") + " XREAD"),
        ("consume catch-up, 1 node, poll_columns()",
         rate("kl.consume.columns"),
         ratio("kl.consume.columns", "nats.consume").strip(),
         ratio("kl.consume.columns", "redis.consume").strip()),
        ("produce -> consume p50 / p99, RF=3",
         f"{us('kl3.e2e.p50')} / {us('kl3.e2e.p99')}", "-", "-"),
    ]
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.peers_bench")
    ap.add_argument("--records", type=int, default=100_000, help="records per throughput phase")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=300, help="one-at-a-time writes per round")
    ap.add_argument("--no-rf3", action="store_true", help="skip the 3-broker kraftlog cluster")
    ap.add_argument("--aiohttp", action="store_true",
                    help="also run kraftlog's phases with produce/fetch through aiohttp's client (same rounds)")
    args = ap.parse_args(argv)
    res, missing = asyncio.run(run(args.records, args.rounds, args.samples, not args.no_rf3, args.aiohttp))
    for why in missing.values():
        print(why)
    rows = table(summarize(res))
    head = ("figure", "kraftlog (http_api.client)", "NATS JetStream (nats-py)", "Redis streams (redis-py)")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
    print(f"\npeers benchmark: {RECORD_BYTES} B records, {args.records:,} per throughput phase, medians of "
          f"{args.rounds} interleaved rounds; (x) = kraftlog / peer (latency: peer / kraftlog; > 1 is kraftlog ahead)")
    for r in [head] + rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))
    print()
    m = summarize(res)
    own = client_table(m)
    if own:
        print("kraftlog client: own HTTP/1.1 connections vs aiohttp's client, same rounds (own/aiohttp: > 1 is "
              "the own connections ahead; latency and CPU: aiohttp / own)")
        for r in own:
            print(" | ".join(r))
        print()


def client_table(m: dict[str, float]) -> list[tuple[str, str, str, str]]:
    """Rows (figure, own, aiohttp, ratio) for the phases run both ways."""
    rows = []
    for label, own, aio, kind in (
            ("send() per record, 1 node, acks=1", "kl.async.acks1", "aio.async.acks1", "rate"),
            ("send_batch() of 1000, acks=1", "kl.batch.acks1", "aio.batch.acks1", "rate"),
            ("send_batch() of 1000, acks=all", "kl.batch.acksall", "aio.batch.acksall", "rate"),
            ("one record at a time, 1 node, acks=all, p50", "kl.one.p50", "aio.one.p50", "us"),
            ("  p99", "kl.one.p99", "aio.one.p99", "us"),
            ("  client CPU per write", "kl.one.cpu", "aio.one.cpu", "us"),
            ("one record at a time, RF=3, p50", "kl3.one.p50", "aio3.one.p50", "us"),
            ("  p99", "kl3.one.p99", "aio3.one.p99", "us"),
            ("  client CPU per write", "kl3.one.cpu", "aio3.one.cpu", "us"),
            ("consume catch-up, poll()", "kl.consume", "aio.consume", "rate"),
            ("consume catch-up, poll_columns()", "kl.consume.columns", "aio.consume.columns", "rate")):
        if own not in m or aio not in m:
            continue
        if kind == "rate":
            rows.append((label, f"{m[own] / 1000:,.0f}k/s", f"{m[aio] / 1000:,.0f}k/s", f"{m[own] / m[aio]:.2f}x"))
        else:
            rows.append((label, f"{m[own] * 1e6:,.0f} us", f"{m[aio] * 1e6:,.0f} us", f"{m[aio] / m[own]:.2f}x"))
    return rows


if __name__ == "__main__":
    main()
