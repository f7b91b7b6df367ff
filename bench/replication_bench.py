"""Replication benchmark on a real 3-broker cluster (1 controller + 3 broker processes).

Figures (printed, not asserted):
- produce throughput, raw batches of 100-byte records: RF=3 acks=all vs RF=1 acks=1 on the
  same cluster in the same run, alternating A/B rounds (goal: RF=3 >= 50% of RF=1);
- end-to-end latency p50/p99 at RF=3 acks=all (send -> a long-polling consumer has it);
- failover: kill -9 of a partition leader -> first acknowledged write on the new leader
  (default settings; several rounds, the killed broker restarted in between);
- mass failover: kill -9 a broker leading many partitions; time until every one of them
  has taken an acknowledged write again;
- node failover: 3 controllers, kill -9 the active controller and a partition leader at
  once (a combined node dying); time to the first acknowledged write.

    python -m bench.replication_bench [--seconds S] [--concurrency C] [--partitions-mass N]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time

import aiohttp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from http_api.wire import codecs  # noqa: E402
from http_api.client import Consumer, Producer  # noqa: E402
from partitions.log import record_batch as rb  # noqa: E402
from tests.rigs.cluster import ReplicatedCluster, http  # noqa: E402

RECORD_BYTES = 100
RECORDS_PER_BATCH = 1000
PARTITIONS = 3


def _leaders(c: ReplicatedCluster, topic: str) -> dict[int, str]:
    return {p["partition"]: c.url(p["leader"]) for p in c.partition_list(topic)}


async def produce_throughput(c: ReplicatedCluster, topic: str, acks: str, seconds: float, concurrency: int) -> float:
    """records/s of raw-batch produce to the partition leaders, `concurrency` requests in flight."""
    batch = rb.build_batch([rb.Record(None, b"x" * RECORD_BYTES) for _ in range(RECORDS_PER_BATCH)])
    leaders = _leaders(c, topic)
    done = moves = 0
    stop_at = time.monotonic() + seconds
    async with aiohttp.ClientSession() as s:
        async def worker(i: int):
            nonlocal done, moves
            p = i % PARTITIONS
            while time.monotonic() < stop_at:
                url = f"{leaders[p]}/v1/topics/{topic}/partitions/{p}/records?acks={acks}"
                async with s.post(url, data=batch, headers={"Content-Type": codecs.RAW_BATCH}) as r:
                    body = await r.read()
                if r.status == 200:
                    done += RECORDS_PER_BATCH
                elif r.status in (421, 503):
                    # leadership moved (a preferred-leader rebalance under load): follow it, as
                    # a client refreshing metadata would; the time spent counts against us
                    moves += 1
                    await asyncio.sleep(0.05)
                    leaders.update(await asyncio.to_thread(_leaders, c, topic))
                else:
                    raise RuntimeError(f"produce answered {r.status}: {body[:200]!r}")
        t0 = time.monotonic()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        rate = done / (time.monotonic() - t0)
    if moves:
        print(f"  ({moves} answers sent the bench to a new leader during this round)")
    return rate


async def e2e_latency(c: ReplicatedCluster, topic: str, n: int) -> list[float]:
    """ms from Producer.send (acks=all, idempotent) to the consumer's poll returning it."""
    sent: dict[bytes, float] = {}
    lat: list[float] = []
    async with Consumer(c.urls, auto_offset_reset="latest", max_wait_ms=1000) as consumer:
        consumer.assign([(topic, 0)])
        await consumer.position((topic, 0))

        async def consume():
            while len(lat) < n:
                for r in await consumer.poll(1000):
                    t = sent.get(r.value)
                    if t is not None:
                        lat.append((time.perf_counter() - t) * 1000)
        task = asyncio.ensure_future(consume())
        async with Producer(c.urls, acks="all", linger_ms=0) as producer:
            for i in range(n):
                v = f"lat-{i}".encode()
                sent[v] = time.perf_counter()
                await (await producer.send(topic, v, partition=0))
                await asyncio.sleep(0.005)
        await asyncio.wait_for(task, 30)
    return lat


def first_ack_after_kill(c: ReplicatedCluster, topic: str, partition: int) -> tuple[float, int]:
    """kill -9 the leader of topic-partition; seconds until a write is acknowledged by a new
    leader (the client retries on the other brokers, refreshing metadata). -> (s, victim)"""
    victim = c.partition(topic, partition)["leader"]
    others = [c.url(b) for b in c.ports if b != victim]
    t0 = time.monotonic()
    c.kill(victim)
    i = 0
    while True:
        url = others[i % len(others)]
        i += 1
        status, _ = http("POST", f"{url}/v1/topics/{topic}/records?acks=all",
                         {"records": [{"value": "after-kill", "partition": partition}]}, timeout=5)
        if status == 200:
            return time.monotonic() - t0, victim
        time.sleep(0.01)


async def mass_failover(c: ReplicatedCluster, topic: str) -> tuple[int, float, float]:
    """kill -9 the broker leading the most partitions of `topic`; -> (partitions it led,
    seconds until all have a new leader in metadata, seconds until each took a write)."""
    parts = c.partition_list(topic)
    counts: dict[int, int] = {}
    for p in parts:
        counts[p["leader"]] = counts.get(p["leader"], 0) + 1
    victim = max(counts, key=counts.get)
    led = [p["partition"] for p in parts if p["leader"] == victim]
    others = [c.url(b) for b in c.ports if b != victim]
    t0 = time.monotonic()
    c.kill(victim)
    async with Producer(others, acks="all", linger_ms=0) as producer:
        async def one(p):
            await (await producer.send(topic, b"mass", partition=p))
            return time.monotonic() - t0
        results = await asyncio.gather(*(one(p) for p in led))
    elected = None
    while elected is None:
        if all(p["leader"] != victim for p in c.partition_list(topic)):
            elected = time.monotonic() - t0
    return len(led), elected, max(results)


def node_failover(base: str) -> float:
    """3 controllers + 3 brokers: kill -9 the active controller and, at the same moment, the
    leader of a partition (a whole combined node dying); seconds to the first acked write."""
    with ReplicatedCluster(base, brokers=3, controllers=3) as c:
        active = c.controllers.wait_active()
        c.create_topic("node", 3, 3)
        part = next((p for p in c.partition_list("node") if p["leader"] == active), c.partition_list("node")[0])
        victim = part["leader"]
        others = [c.url(b) for b in c.ports if b != victim]
        t0 = time.monotonic()
        c.controllers.kill(active)
        c.kill(victim)
        i = 0
        while True:
            status, _ = http("POST", f"{others[i % 2]}/v1/topics/node/records?acks=all",
                             {"records": [{"value": "x", "partition": part["partition"]}]}, timeout=5)
            i += 1
            if status == 200:
                return time.monotonic() - t0
            time.sleep(0.01)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="per throughput round")
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds of the throughput comparison")
    ap.add_argument("--concurrency", default="6,24,256", help="requests in flight; a comma list runs each")
    ap.add_argument("--latency-records", type=int, default=300)
    ap.add_argument("--failover-rounds", type=int, default=3)
    ap.add_argument("--partitions-mass", type=int, default=150)
    args = ap.parse_args(argv)
    base = tempfile.mkdtemp(prefix="kraftlog-repl-bench-")
    print(f"data under {base} (removed at the end)")
    try:
        run_all(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _fresh_topic(c: ReplicatedCluster, name: str, rf: int) -> None:
    """(Re)create a throughput topic: a round writes GBs, so each starts from an empty topic
    and the disk holds at most one round's data."""
    status, doc = http("DELETE", f"{c.urls[0]}/v1/topics/{name}")
    if status not in (200, 202, 204, 404):
        raise RuntimeError(f"delete topic {name}: {status} {doc}")
    c.wait_for(lambda: http("GET", f"{c.urls[0]}/v1/topics/{name}")[0] == 404, 30, f"{name} deleted")
    c.create_topic(name, PARTITIONS, rf)


def run_all(args, base: str) -> None:
    with ReplicatedCluster(base, brokers=3) as c:
        for conc in [int(x) for x in str(args.concurrency).split(",")]:
            rf1, rf3 = [], []
            for r in range(args.rounds):
                order = [("rf1", "1", rf1), ("rf3", "all", rf3)]
                for topic, acks, out in (order if r % 2 == 0 else order[::-1]):
                    _fresh_topic(c, topic, 1 if topic == "rf1" else 3)
                    out.append(asyncio.run(produce_throughput(c, topic, acks, args.seconds, conc)))
            a, b = statistics.median(rf1), statistics.median(rf3)
            print(f"[{conc} in flight] produce RF=1 acks=1:   {a:>10,.0f} records/s  {a * RECORD_BYTES / 1e6:6.1f} MB/s"
                  f"  rounds {[round(x) for x in rf1]}")
            print(f"[{conc} in flight] produce RF=3 acks=all: {b:>10,.0f} records/s  {b * RECORD_BYTES / 1e6:6.1f} MB/s"
                  f"  rounds {[round(x) for x in rf3]}")
            print(f"[{conc} in flight] RF=3 acks=all / RF=1 acks=1 = {b / a:.0%} (goal >= 50%)")

        c.create_topic("lat", 1, 3)
        lat = asyncio.run(e2e_latency(c, "lat", args.latency_records))
        print(f"end-to-end latency RF=3 acks=all: p50 {pct(lat, 0.5):.1f} ms  p99 {pct(lat, 0.99):.1f} ms "
              f"({len(lat)} records)")

        c.create_topic("fo", 1, 3)
        times = []
        for _ in range(args.failover_rounds):
            s, victim = first_ack_after_kill(c, "fo", 0)
            times.append(s)
            c.start_broker(victim)
            c.wait_for(lambda: len(c.partition("fo")["isr"]) == 3, 60, "ISR back")
        print(f"kill -9 leader -> first acked write on the new leader: median {statistics.median(times):.2f} s "
              f"rounds {[round(t, 2) for t in times]} (goal < 3 s)")

        c.create_topic("mass", args.partitions_mass, 3)
        n, elected, writable = asyncio.run(mass_failover(c, "mass"))
        print(f"mass failover: {n} partitions led by the killed broker; all re-elected in {elected:.2f} s, "
              f"all took an acked write within {writable:.2f} s")
        for name in ("rf1", "rf3"):
            http("DELETE", f"{c.urls[0]}/v1/topics/{name}")
    node = [node_failover(os.path.join(base, f"node-{i}")) for i in range(args.failover_rounds)]
    print(f"kill -9 of the active controller + a leader together -> first acked write: median "
          f"{statistics.median(node):.2f} s rounds {[round(t, 2) for t in node]}")


if __name__ == "__main__":
    main()
