"""Partition move rate (KIP-455 reassignment), unthrottled and throttled, and produce latency
during a throttled move.

A real cluster (tests/rigs/cluster.py: 1 controller, 3 brokers); one partition at RF=2
preloaded with `--mb` MB, then moved off its leader's broker to the spare broker:

- unthrottled: MB/s = the partition's bytes / (time from POST /v1/reassignments until the
  metadata shows the move complete);
- throttled at `--throttle-mb` MB/s: the same, and the ratio to the throttle (goal: within 25%);
- progress accuracy: during the throttled move, `bytes_moved` and `bytes_remaining` of GET
  /v1/reassignments sampled against the destination's log size on disk (the largest
  difference, as a share of the partition's size);
- produce p99: one acks=all writer (1 KB values, one request in flight) on another partition
  led by the same leader, for `--produce-s` seconds without a move and during the throttled move
  (goal <= 2x).

    python -m bench.reassignment_bench [--mb 48] [--throttle-mb 4] [--produce-s 5]

Timings on a shared 2-core machine are noisy; figures are printed, not asserted.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.rigs.cluster import ReplicatedCluster, http  # noqa: E402

VALUE_BYTES = 20_000
PER_REQUEST = 40


def preload(c: ReplicatedCluster, topic: str, partition: int, mb: int) -> None:
    leader = c.partition(topic, partition)["leader"]
    for i in range(mb * 1024 * 1024 // (PER_REQUEST * VALUE_BYTES)):
        status, doc = http("POST", f"{c.url(leader)}/v1/topics/{topic}/partitions/{partition}/records",
                           {"records": [{"value": f"{i}-{j}-" + "x" * VALUE_BYTES} for j in range(PER_REQUEST)]},
                           timeout=60)
        if status != 200:
            raise RuntimeError(f"preload: {status} {doc}")


def partition_bytes(c: ReplicatedCluster, broker: int, topic: str, partition: int) -> int:
    d = os.path.join(c.base_dir, f"broker-{broker}", "logs", f"{topic}-{partition}")
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".log"))


def move(c: ReplicatedCluster, topic: str, partition: int, throttle: int | None,
         progress: list | None = None) -> tuple[int, float]:
    """Move the partition off its leader's broker; (bytes moved, seconds). With `progress`,
    appends (reported bytes_moved, destination's bytes on disk, bytes_remaining) samples."""
    p = c.partition(topic, partition)
    spare = next(b for b in c.ports if b not in p["replicas"])
    kept = next(r for r in p["replicas"] if r != p["leader"])
    size = partition_bytes(c, p["leader"], topic, partition)
    body = {"version": 1, "partitions": [{"topic": topic, "partition": partition, "replicas": [kept, spare]}]}
    if throttle is not None:
        body["throttle"] = throttle
    started = time.monotonic()
    status, doc = http("POST", c.url(kept) + "/v1/reassignments", body)
    if status != 202:
        raise RuntimeError(f"reassign: {status} {doc}")
    if progress is None:
        c.wait_for(lambda: not c.partition(topic, partition)["adding_replicas"], 600, "the move", interval=0.02)
        return size, time.monotonic() - started
    deadline = started + 600
    while c.partition(topic, partition)["adding_replicas"]:
        if time.monotonic() > deadline:
            raise RuntimeError("the move did not end within 600 s")
        _, doc = http("GET", c.url(kept) + "/v1/reassignments")
        on_disk = partition_bytes(c, spare, topic, partition) if os.path.isdir(
            os.path.join(c.base_dir, f"broker-{spare}", "logs", f"{topic}-{partition}")) else 0
        for m in doc.get("reassignments", []):
            if (m["topic"], m["partition"]) == (topic, partition) and m.get("bytes_moved") is not None:
                progress.append((m["bytes_moved"], on_disk, m["bytes_remaining"]))
        time.sleep(0.25)
    return size, time.monotonic() - started


class LatencyProbe:
    """acks=all writes of 1 KB, one in flight, to one partition; latencies in ms."""

    def __init__(self, c: ReplicatedCluster, topic: str, partition: int) -> None:
        self.c, self.topic, self.partition = c, topic, partition
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        leader = self.c.partition(self.topic, self.partition)["leader"]
        url = f"{self.c.url(leader)}/v1/topics/{self.topic}/partitions/{self.partition}/records?acks=all"
        while not self._stop.is_set():
            t0 = time.monotonic()
            status, _ = http("POST", url, {"records": [{"value": "y" * 1000}]})
            if status == 200:
                self.latencies.append((time.monotonic() - t0) * 1000)

    def __enter__(self) -> "LatencyProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)

    def p99(self) -> float:
        if len(self.latencies) < 2:
            return float("nan")
        return statistics.quantiles(self.latencies, n=100)[98]


def main(argv: list | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=48, help="MB preloaded in the moved partition")
    ap.add_argument("--throttle-mb", type=float, default=4.0, help="throttle of the throttled move, MB/s")
    ap.add_argument("--produce-s", type=float, default=5.0, help="seconds of the no-move latency baseline")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="reassign-bench-") as d, ReplicatedCluster(d, brokers=3) as c:
        c.create_topic("free", partitions=1, replication_factor=2)
        c.create_topic("slow", partitions=1, replication_factor=2)
        c.create_topic("lat", partitions=1, replication_factor=2)
        preload(c, "free", 0, args.mb)
        preload(c, "slow", 0, args.mb)
        size, secs = move(c, "free", 0, None)
        print(f"unthrottled move: {size / 2**20:.1f} MB in {secs:.2f} s = {size / 2**20 / secs:.1f} MB/s")
        # the latency probe writes to a partition led where the throttled move is copied from
        slow_leader = c.partition("slow", 0)["leader"]
        lat = c.partition("lat", 0)
        if lat["leader"] != slow_leader:   # moves lat so that slow's leader leads it (first target replica)
            replicas = [slow_leader, next(r for r in lat["replicas"] if r != slow_leader)]
            http("POST", c.url(slow_leader) + "/v1/reassignments",
                 {"version": 1, "partitions": [{"topic": "lat", "partition": 0, "replicas": replicas}]})
            c.wait_for(lambda: c.partition("lat", 0)["leader"] == slow_leader and
                       not c.partition("lat", 0)["adding_replicas"], 60, "the latency partition's leader")
        with LatencyProbe(c, "lat", 0) as base:
            time.sleep(args.produce_s)
        throttle = int(args.throttle_mb * 2**20)
        samples: list = []
        with LatencyProbe(c, "lat", 0) as during:
            size, secs = move(c, "slow", 0, throttle, samples)
        rate = size / secs
        print(f"throttled move at {args.throttle_mb:.1f} MB/s: {size / 2**20:.1f} MB in {secs:.2f} s = "
              f"{rate / 2**20:.2f} MB/s ({rate / throttle:.0%} of the throttle; goal 75-125%)")
        if samples:
            worst = max(abs(moved - disk) for moved, disk, _ in samples)
            mid = samples[len(samples) // 2]
            print(f"progress during the throttled move: {len(samples)} samples, reported bytes_moved within "
                  f"{worst / 2**10:.0f} KB ({worst / size:.1%} of the partition) of the destination's log on disk; "
                  f"midway: moved {mid[0] / 2**20:.1f} MB (on disk {mid[1] / 2**20:.1f} MB), "
                  f"remaining {mid[2] / 2**20:.1f} MB")
        print(f"produce p99 (acks=all, 1 KB, same leader): {base.p99():.1f} ms without a move "
              f"({len(base.latencies)} writes), {during.p99():.1f} ms during the throttled move "
              f"({len(during.latencies)} writes): {during.p99() / base.p99():.2f}x (goal <= 2x)")


if __name__ == "__main__":
    main(sys.argv[1:])
