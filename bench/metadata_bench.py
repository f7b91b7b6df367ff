"""Metadata quorum benchmark: `python -m bench.metadata_bench [--controllers 3] [--partitions 10000]`.

Starts real controller processes (3-voter pysyncobj quorum on loopback) and prints:
- metadata writes/s through the controller API (sequential and with concurrent clients);
- time to create 10,000 partitions (one topic; and 100 topics x 100 partitions);
- snapshot size and load time at 10,000 partitions (the pysyncobj dump format: pickle+gzip,
  and the JSON snapshot brokers get from the feed), follower catch-up from offset 0, and
  controller restart time with that metadata;
- failover: kill -9 the active controller, time to a new active controller and first write.
Figures are printed, not asserted (2 shared cores: expect noise).
"""
from __future__ import annotations

import argparse
import asyncio
import gzip
import io
import json
import pickle
import random
import statistics
import tempfile
import time

from metadata_quorum.client import ControllerClient, MetadataFollower
from metadata_quorum.controller import QuorumController
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import LeaderChangeRecord, record_to_dict
from metadata_quorum.state_machine import MetadataStateMachine
from tests.rigs.controllers import ControllerCluster


def row(name: str, value: str) -> None:
    print(f"| {name:<58} | {value:>32} |")


async def writes_per_second(client: ControllerClient, n: int, concurrency: int) -> float:
    for i in range(concurrency):
        try:
            await client.create_topic(f"w{i}", 1, 1)
        except Exception:
            pass
    counter = iter(range(n))

    async def worker(i: int):
        for k in counter:
            await client.alter_configs(f"w{i}", {"retention.ms": str(1000 + k)})

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return n / (time.perf_counter() - t0)


def snapshot_figures(partitions: int) -> dict:
    """In-process: build an image with `partitions` partitions and measure its snapshots."""
    sm = MetadataStateMachine("bench")
    ctl = QuorumController(rng=random.Random(1))

    def apply(records):
        res = sm.apply([{"request_id": None, "controller_epoch": 1, "records": [record_to_dict(r) for r in records]}])
        assert res[0]["ok"], res

    apply([LeaderChangeRecord(1, 1)])
    for b in (1, 2, 3):
        apply(ctl.register_broker(sm.image, b, f"i{b}", f"http://127.0.0.1:{9000 + b}", None, 0))
        apply(ctl.heartbeat(sm.image, b, sm.image.brokers[b].epoch, 10**9, 0))
    t0 = time.perf_counter()
    apply(ctl.create_topic(sm.image, "big", partitions, 3))
    apply_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    snap = sm.snapshot()
    snapshot_s = time.perf_counter() - t0
    buf = io.BytesIO()
    t0 = time.perf_counter()
    with gzip.GzipFile(fileobj=buf, mode="wb") as g:
        pickle.dump(snap, g)
    dump_s = time.perf_counter() - t0
    dumped = buf.getvalue()
    t0 = time.perf_counter()
    with gzip.GzipFile(fileobj=io.BytesIO(dumped)) as g:
        loaded = pickle.load(g)
    copy = MetadataStateMachine("bench")
    copy.restore(loaded)
    load_s = time.perf_counter() - t0
    as_json = json.dumps(snap["image"]).encode()
    t0 = time.perf_counter()
    MetadataImage.from_snapshot(json.loads(as_json))
    json_load_s = time.perf_counter() - t0
    return {"apply_s": apply_s, "snapshot_s": snapshot_s, "dump_s": dump_s, "dump_bytes": len(dumped),
            "load_s": load_s, "json_bytes": len(as_json), "json_load_s": json_load_s}


async def main_async(args) -> None:
    print(f"\nmetadata quorum benchmark: {args.controllers} controllers, {args.partitions} partitions\n")
    print(f"| {'measure':<58} | {'value':>32} |")
    print(f"|{'-' * 60}|{'-' * 34}|")
    if args.skip_cluster:
        return await snapshot_table(args)
    await cluster_table(args)
    await snapshot_table(args)


async def cluster_table(args) -> None:
    extra = ["--no-raft-fsync"] if args.no_fsync else []
    row("raft journal", "no sync (pysyncobj)" if args.no_fsync else "msync before ack (group commit)")
    with tempfile.TemporaryDirectory() as d, ControllerCluster(args.controllers, d, extra_args=extra) as cluster:
        cluster.start_all()
        t0 = time.perf_counter()
        cluster.wait_active(30)
        row("cold start: first active controller", f"{time.perf_counter() - t0:.2f} s")
        async with ControllerClient(cluster.urls, request_timeout_ms=60_000) as client:
            for b in (1, 2, 3):
                epoch = await client.register_broker(b, f"inc-{b}", f"http://127.0.0.1:{9000 + b}")
                await client.heartbeat(b, epoch, 10**9)
            row("metadata writes/s, 1 client (alter configs)", f"{await writes_per_second(client, args.writes, 1):.0f}/s")
            row("metadata writes/s, 16 concurrent clients", f"{await writes_per_second(client, args.writes, 16):.0f}/s")

            t0 = time.perf_counter()
            await client.create_topic("big", args.partitions, 3)
            row(f"create 1 topic x {args.partitions} partitions (RF 3)", f"{time.perf_counter() - t0:.3f} s")
            per_topic = max(1, args.partitions // 100)
            t0 = time.perf_counter()
            await asyncio.gather(*(client.create_topic(f"many-{i}", per_topic, 3) for i in range(100)))
            row(f"create 100 topics x {per_topic} partitions (concurrent)", f"{time.perf_counter() - t0:.3f} s")

            follower = MetadataFollower(client, max_wait_ms=0)
            t0 = time.perf_counter()
            target = (await client.metadata_json())["metadata_offset"]
            while follower.image.offset < target:
                await follower.poll_once(max_wait_ms=0)
            row(f"broker follower catch-up from offset 0 ({target} records)", f"{time.perf_counter() - t0:.3f} s")

            # restart all controllers with ~2x partitions of metadata: journal replay
            cluster.stop_all()
            t0 = time.perf_counter()
            cluster.start_all()
            cluster.wait_active(60)
            md = await client.metadata_json()
            assert any(t["name"] == "big" for t in md["topics"])
            row(f"restart all controllers ({2 * args.partitions} partitions) to active", f"{time.perf_counter() - t0:.2f} s")

            elections, writes = [], []
            for trial in range(args.failovers):
                active = cluster.wait_active(20)
                await asyncio.sleep(1.0)
                t0 = time.perf_counter()
                cluster.kill(active)
                cluster.wait_active(20, exclude=(active,))
                elections.append(time.perf_counter() - t0)
                await client.alter_configs("w0", {"retention.ms": str(trial)})
                writes.append(time.perf_counter() - t0)
                cluster.start(active)
            row(f"kill -9 active: new active controller (median of {args.failovers})",
                f"{statistics.median(elections):.3f} s")
            row(f"kill -9 active: first write accepted (median of {args.failovers})",
                f"{statistics.median(writes):.3f} s")
            row("  individual first-write times", " ".join(f"{x:.2f}" for x in writes))



async def snapshot_table(args) -> None:
    runs = [snapshot_figures(args.partitions) for _ in range(3)]
    f = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    row(f"apply one {args.partitions}-partition batch (state machine)", f"{f['apply_s'] * 1000:.1f} ms")
    row(f"snapshot at {args.partitions} partitions: pysyncobj dump (pickle+gzip)", f"{f['dump_bytes'] / 1024:.0f} KiB")
    row("  build snapshot + write dump", f"{(f['snapshot_s'] + f['dump_s']) * 1000:.1f} ms")
    row("  load dump + restore state machine", f"{f['load_s'] * 1000:.1f} ms")
    row(f"snapshot at {args.partitions} partitions: JSON (broker feed)", f"{f['json_bytes'] / 1024:.0f} KiB")
    row("  load JSON snapshot into a MetadataImage", f"{f['json_load_s'] * 1000:.1f} ms")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--controllers", type=int, default=3)
    p.add_argument("--partitions", type=int, default=10_000)
    p.add_argument("--writes", type=int, default=500)
    p.add_argument("--failovers", type=int, default=5)
    p.add_argument("--no-fsync", action="store_true", help="controllers without the per-entry journal sync")
    p.add_argument("--skip-cluster", action="store_true", help="only the in-process snapshot figures")
    args = p.parse_args(argv)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
