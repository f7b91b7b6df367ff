"""Transactions benchmark (figures printed as a table, not asserted), 3 brokers at RF 3:

- transactional produce (Producer(transactional_id=...), records written through the
  coordinator's records route, one commit per transaction) vs idempotent produce (the
  batching Producer) in records/s, for transactions of 100, 1,000 and 10,000 records;
- commit latency p50/p99 (the commit call: PrepareCommit, markers on 3 partitions,
  CompleteCommit, all acks=all);
- read_committed vs read_uncommitted consumer throughput over the same committed records.

    python -m bench.transactions_bench [--records N] [--value-bytes B]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from http_api.client import Consumer, Producer  # noqa: E402
from tests.rigs.cluster import ReplicatedCluster  # noqa: E402

PARTITIONS = 3


def _pct(lat: list[float], q: float) -> float:
    return sorted(lat)[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")


async def idempotent(url: str, topic: str, n: int, value: bytes) -> float:
    async with Producer(url, linger_ms=5) as p:
        t0 = time.perf_counter()
        futs = [await p.send(topic, value, partition=i % PARTITIONS) for i in range(n)]
        await p.flush()
        await asyncio.gather(*futs)
        return n / (time.perf_counter() - t0)


async def transactional(url: str, topic: str, n: int, size: int, value: bytes) -> tuple[float, list[float]]:
    commits: list[float] = []
    async with Producer(url, transactional_id=f"bench-{topic}-{size}") as p:
        await p.init_transactions()
        t0 = time.perf_counter()
        for _ in range(max(1, n // size)):
            p.begin_transaction()
            for i in range(size):
                await p.send(topic, value, partition=i % PARTITIONS)
            c0 = time.perf_counter()
            await p.commit_transaction()
            commits.append(time.perf_counter() - c0)
        return max(1, n // size) * size / (time.perf_counter() - t0), commits


async def consume(url: str, topic: str, isolation: str, expect: int) -> float:
    async with Consumer(url, isolation_level=isolation, max_wait_ms=200, max_bytes=4 << 20) as c:
        tps = [(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        for tp in tps:
            await c.seek_to_beginning(tp)
        got = 0
        t0 = time.perf_counter()
        while got < expect:
            got += len(await c.poll(200))
        return got / (time.perf_counter() - t0)


async def main_async(c: ReplicatedCluster, n: int, value: bytes) -> list[tuple]:
    url = c.urls[0]
    rows = []
    for size in (100, 1_000, 10_000):
        t_idem, t_txn = f"bi{size}", f"bt{size}"
        c.create_topic(t_idem, partitions=PARTITIONS, replication_factor=3)
        c.create_topic(t_txn, partitions=PARTITIONS, replication_factor=3)
        idem = await idempotent(url, t_idem, max(n, size), value)
        txn, commits = await transactional(url, t_txn, max(n, size), size, value)
        rows.append((f"txn of {size}", f"{txn:,.0f}", f"{idem:,.0f}", f"{txn / idem:.0%}",
                     f"{_pct(commits, 0.5):.1f}", f"{_pct(commits, 0.99):.1f}", len(commits)))
    total = max(n, 1_000) // 1_000 * 1_000
    rc = await consume(url, "bt1000", "read_committed", total)
    ru = await consume(url, "bt1000", "read_uncommitted", total)
    return rows, rc, ru


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, ReplicatedCluster(d, brokers=3, broker_config={
            "transaction_state_num_partitions": 3}) as c:
        rows, rc, ru = asyncio.run(main_async(c, a.records, b"x" * a.value_bytes))
    print(f"transactions, 3 brokers RF 3, {a.records} records of {a.value_bytes} B per mode")
    print(f"{'':14} {'txn rec/s':>10} {'idem rec/s':>10} {'ratio':>6} {'commit p50 ms':>14} {'p99 ms':>8} {'txns':>5}")
    for r in rows:
        print(f"{r[0]:14} {r[1]:>10} {r[2]:>10} {r[3]:>6} {r[4]:>14} {r[5]:>8} {r[6]:>5}")
    print(f"consume 1000-record transactions: read_committed {rc:,.0f} rec/s, read_uncommitted {ru:,.0f} rec/s "
          f"({rc / ru:.0%})")


if __name__ == "__main__":
    main()
