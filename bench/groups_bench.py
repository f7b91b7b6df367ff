"""Consumer group benchmark (figures printed as a table, not asserted).

- offset commits/s through HTTP (acks=all into `__consumer_offsets`), one group per
  connection, C connections, on 1 broker (RF 1) and 3 brokers (RF 3), vs single-record
  acks=all produce requests/s to an ordinary topic in the same cluster (the floor a commit
  can reach: a commit is one record append plus validation);
- heartbeat requests/s (no change: nothing written) and p50/p99 latency;
- time from 3 members joining to a stable, non-overlapping assignment of 6 partitions;
- coordinator load: replay of N `__consumer_offsets` records into the pure core (records/s).

    python -m bench.groups_bench [--seconds S] [--concurrency C]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

import aiohttp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from partitions.groups import records as grec  # noqa: E402
from partitions.groups.coordinator import GroupCoordinatorState  # noqa: E402
from tests.rigs.cluster import ReplicatedCluster, http  # noqa: E402


async def _rate(url_for, body_for, seconds: float, concurrency: int) -> tuple[float, list[float]]:
    lat: list[float] = []
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession() as s:
        async def worker(i: int) -> None:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                async with s.post(url_for(i), json=body_for(i)) as r:
                    await r.read()
                    assert r.status == 200, (r.status, await r.text())
                lat.append(time.perf_counter() - t0)
        t0 = time.monotonic()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return len(lat) / (time.monotonic() - t0), lat


def _pct(lat: list[float], q: float) -> float:
    return sorted(lat)[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")


async def cluster_figures(c: ReplicatedCluster, rf: int, seconds: float, conc: int) -> list[tuple]:
    url = c.urls[0]
    c.create_topic("bt", partitions=6, replication_factor=rf)
    counter = [0]

    def commit_body(i):
        counter[0] += 1
        return {"offsets": [{"topic": "bt", "partition": i % 6, "offset": counter[0]}]}
    for i in range(conc):   # create the offsets topic and load every coordinator first
        assert http("POST", f"{url}/v1/groups/bg{i}/offsets", commit_body(i))[0] == 200
    # produce baseline: same cluster and entry broker (topic route: forwarded to leaders like commits), one record per request, acks=all
    prod_rate, prod_lat = await _rate(lambda i: f"{url}/v1/topics/bt/records?acks=all",
                                      lambda i: {"records": [{"value": "x", "partition": i % 6}]}, seconds, conc)
    commit_rate, commit_lat = await _rate(lambda i: f"{url}/v1/groups/bg{i}/offsets", commit_body, seconds, conc)
    # heartbeats of stable members (nothing to write)
    members = []
    for i in range(conc):
        _, m = http("POST", f"{url}/v1/groups/hb{i}/join", {"subscribed_topics": ["bt"]})
        _, m = http("POST", f"{url}/v1/groups/hb{i}/heartbeat", {"member_id": m["member_id"],
                                                                 "member_epoch": m["member_epoch"],
                                                                 "owned": m["assignment"]})
        members.append(m)
    hb_rate, hb_lat = await _rate(lambda i: f"{url}/v1/groups/hb{i}/heartbeat",
                                  lambda i: {"member_id": members[i]["member_id"],
                                             "member_epoch": members[i]["member_epoch"],
                                             "owned": members[i]["assignment"]}, seconds, conc)
    # three members to a stable assignment
    t0 = time.monotonic()
    ms = [http("POST", f"{url}/v1/groups/st/join", {"subscribed_topics": ["bt"]})[1] for _ in range(3)]
    while True:
        for m in ms:
            _, d = http("POST", f"{url}/v1/groups/st/heartbeat", {
                "member_id": m["member_id"], "member_epoch": m["member_epoch"], "owned": m["assignment"]})
            m.update(d)
        if sorted(len(m["assignment"]) for m in ms) == [2, 2, 2]:
            break
    stable_ms = (time.monotonic() - t0) * 1000
    tag = f"{len(c.ports)} broker(s), RF {rf}"
    return [
        (f"commit acks=all ({tag})", f"{commit_rate:,.0f}/s", f"p50 {_pct(commit_lat, .5):.1f} ms, "
         f"p99 {_pct(commit_lat, .99):.1f} ms", f"{commit_rate / prod_rate:.0%} of produce"),
        (f"produce 1 record acks=all ({tag})", f"{prod_rate:,.0f}/s", f"p50 {_pct(prod_lat, .5):.1f} ms, "
         f"p99 {_pct(prod_lat, .99):.1f} ms", "baseline"),
        (f"heartbeat, no change ({tag})", f"{hb_rate:,.0f}/s", f"p50 {_pct(hb_lat, .5):.1f} ms, "
         f"p99 {_pct(hb_lat, .99):.1f} ms", ""),
        (f"3 members -> stable 2/2/2 ({tag})", f"{stable_ms:.0f} ms", "sequential HTTP round trips", ""),
    ]


def replay_figures(n: int = 200_000) -> list[tuple]:
    recs = [(grec.offset_key(f"g{i % 100}", "t", i % 50), grec.offset_value(i, "", 0)) for i in range(n)]
    st = GroupCoordinatorState()
    t0 = time.perf_counter()
    for i, (k, v) in enumerate(recs):
        st.replay(k, v, i, 0)
    dt = time.perf_counter() - t0
    return [(f"coordinator load: replay {n:,} offset records", f"{n / dt:,.0f} records/s",
             f"{dt * 1000:.0f} ms", "pure core, one thread")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--concurrency", type=int, default=8)
    a = ap.parse_args()
    rows = replay_figures()
    for brokers in (1, 3):
        with tempfile.TemporaryDirectory() as d:
            with ReplicatedCluster(d, brokers=brokers, broker_config={"offsets_topic_num_partitions": 3}) as c:
                rows += asyncio.run(cluster_figures(c, min(3, brokers), a.seconds, a.concurrency))
    w = [max(len(str(r[i])) for r in rows) for i in range(4)]
    print(f"\nconsumer groups bench ({a.concurrency} connections, {a.seconds:.0f} s per figure, 2 shared cores)")
    for r in rows:
        print("  ".join(str(x).ljust(w[i]) for i, x in enumerate(r)))


if __name__ == "__main__":
    main()
