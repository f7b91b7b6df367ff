"""Controller quorum change benchmark: `python -m bench.quorum_change_bench [--rounds 2]`.

Real processes: 3 controllers + 3 brokers, and a metadata writer changing a topic config
through the brokers one write after another. Each round adds a controller (started with
--join, then added through a broker's /v1/admin/quorum/voters), removes the active
controller (it hands leadership over first), adds another one and removes a follower. Printed
per step: how long the change took and the metadata write gap (the longest time between
two successful metadata writes from the step's start until 10 writes after it ended).
Figures are printed, not asserted (2 shared cores: expect noise).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

from metadata_quorum.controller_server import Voter
from tests.rigs.cluster import ReplicatedCluster, http
from tests.rigs.controllers import free_port


def row(name: str, value: str) -> None:
    print(f"| {name:<44} | {value:>34} |")


class MetadataWriter:
    def __init__(self, urls: list, topic: str) -> None:
        self.urls, self.topic = urls, topic
        self.ok: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            status, _ = http("POST", f"{self.urls[i % len(self.urls)]}/v1/topics/{self.topic}/configs",
                             {"configs": {"retention.ms": str(3_600_000 + i)}}, timeout=20)
            if status == 200:
                self.ok.append(time.monotonic())
            else:
                time.sleep(0.02)

    def gap_s(self, since: float, until: float) -> float:
        times = [since] + [t for t in self.ok if since <= t <= until] + [until]
        return max(b - a for a, b in zip(times, times[1:]))

    def wait_more(self, n: int, timeout_s: float = 30.0) -> float:
        target = len(self.ok) + n
        deadline = time.monotonic() + timeout_s
        while len(self.ok) < target and time.monotonic() < deadline:
            time.sleep(0.02)
        return time.monotonic()


def _quorum(c: ReplicatedCluster) -> dict:
    status, doc = http("GET", c.url(1) + "/v1/admin/quorum")
    if status != 200:
        raise RuntimeError(f"quorum describe: {doc}")
    return doc


def _wait_exit(c: ReplicatedCluster, nid: int, timeout_s: float = 30.0) -> None:
    p = c.controllers.procs.pop(nid)
    p.wait(timeout_s)


def _add(c: ReplicatedCluster, writer: MetadataWriter, nid: int) -> tuple:
    """Start controller `nid` with --join, add it through a broker -> (took s, write gap s)."""
    cc = c.controllers
    cc.voters[nid] = Voter(nid, "127.0.0.1", free_port(), free_port())
    cc.extra_args = cc.extra_args + ["--join"]
    cc.start(nid)
    cc.extra_args = cc.extra_args[:-1]
    ident = None
    deadline = time.monotonic() + 60
    while ident is None and time.monotonic() < deadline:
        status, doc = http("GET", cc.voters[nid].url + "/controller/v1/quorum/identity", timeout=2)
        if status == 200:
            ident = doc
        else:
            time.sleep(0.1)
    t0 = time.monotonic()
    status, doc = http("POST", c.url(1) + "/v1/admin/quorum/voters",
                       {k: ident[k] for k in ("id", "raft_address", "url", "incarnation")}, timeout=120)
    t1 = time.monotonic()
    assert status == 200, doc
    return t1 - t0, writer.gap_s(t0, writer.wait_more(10))


def _remove(c: ReplicatedCluster, writer: MetadataWriter, step: str) -> tuple:
    """Remove the active controller or a follower through a broker -> (took s, write gap s)."""
    q = _quorum(c)
    leader = q["leader_id"]
    victim = leader if step == "remove active" else next(v["id"] for v in q["voters"] if v["id"] != leader)
    t0 = time.monotonic()
    status, doc = http("DELETE", f"{c.url(2)}/v1/admin/quorum/voters/{victim}", timeout=120)
    t1 = time.monotonic()
    assert status == 200, doc
    _wait_exit(c, victim)
    return t1 - t0, writer.gap_s(t0, writer.wait_more(10))


def run(rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="quorum-bench-") as d:
        c = ReplicatedCluster(d, brokers=3, controllers=3, broker_config={"min_insync_replicas": 2})
        writer = None
        results: dict = {"add": [], "remove active": [], "remove follower": []}
        try:
            c.start()
            c.create_topic("meta", partitions=1, replication_factor=3)
            writer = MetadataWriter(c.urls, "meta")
            writer._thread.start()
            writer.wait_more(20)
            deadline = time.monotonic() + 60
            while not all(v["incarnation"] for v in _quorum(c)["voters"]) and time.monotonic() < deadline:
                time.sleep(0.1)
            cc = c.controllers
            next_id = 4
            for _ in range(rounds):
                for step in ("add", "remove active", "add", "remove follower"):
                    if step == "add":
                        nid = next_id
                        next_id += 1
                        results[step].append(_add(c, writer, nid))
                    else:
                        results[step].append(_remove(c, writer, step))
        finally:
            if writer is not None:
                writer._stop.set()
                writer._thread.join(30)
            c.close()
    print(f"\nController quorum changes, 3 controllers + 3 brokers, metadata writer running ({rounds} rounds)\n")
    row("step", "change took / write gap (median, max)")
    row("-" * 44, "-" * 34)
    for step, values in results.items():
        if not values:
            continue
        took = [v[0] * 1000 for v in values]
        gap = [v[1] * 1000 for v in values]
        row(step, f"{statistics.median(took):.0f} ms / {statistics.median(gap):.0f} ms, {max(gap):.0f} ms")


def main(argv: list | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.quorum_change_bench")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    run(args.rounds)


if __name__ == "__main__":
    main()
