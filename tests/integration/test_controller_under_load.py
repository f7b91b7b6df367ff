"""Heavy data-plane load on the same machine causes no spurious controller elections.

3 controllers + 3 brokers share the 2 cores with four producer threads writing ~110 KB
raw batches at acks=all to RF=3 partitions. Throughout, and at the end, every controller
must report the same Raft term and the same leader as before the load, and no broker may be
fenced (a missed heartbeat under load would fence it and move its leaderships)."""
from __future__ import annotations

import threading
import time

import pytest

from partitions.log.record_batch import Record, build_batch
from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration

LOAD_SECONDS = 10.0
PRODUCER_THREADS = 4


def _controller_view(c: ReplicatedCluster) -> dict[int, tuple]:
    out = {}
    for nid in c.controllers.voters:
        st = c.controllers.status(nid)
        assert st is not None, f"controller {nid} did not answer /status"
        out[nid] = (st["term"], st["leader_id"])
    return out


def test_heavy_produce_load_causes_no_controller_election(tmp_path):
    with ReplicatedCluster(str(tmp_path), brokers=3, controllers=3) as c:
        c.create_topic("load", partitions=3, replication_factor=3)
        before = _controller_view(c)
        assert len(set(before.values())) == 1, f"controllers disagree before the load: {before}"
        leaders = {p["partition"]: p["leader"] for p in c.partition_list("load")}
        batch = build_batch([Record(None, b"x" * 100) for _ in range(1000)])
        acked = [0] * PRODUCER_THREADS
        errors: list = []
        stop = time.monotonic() + LOAD_SECONDS
        abort = threading.Event()   # set when the test fails early: the producers stop at once

        def produce(i: int) -> None:
            p = i % 3
            url = f"{c.url(leaders[p])}/v1/topics/load/partitions/{p}/records?acks=all"
            while time.monotonic() < stop and not abort.is_set():
                status, body = http("POST", url, raw=batch, content_type="application/vnd.kraftlog.batch")
                if status == 200:
                    acked[i] += 1
                else:
                    errors.append((status, body))

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCER_THREADS)]
        samples = []
        try:
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                samples.append(_controller_view(c))
                abort.wait(0.5)   # sampling interval
        finally:
            if any(t.is_alive() for t in threads):
                abort.set()
            for t in threads:
                if t.ident is not None:
                    t.join(60)

        total_mb = sum(acked) * len(batch) / 1e6
        assert total_mb > 50, f"the load was too light to prove anything: {total_mb:.0f} MB acked"
        assert not errors, f"produce failed under load (fencing or leader moves?): {errors[:3]}"
        for view in samples + [_controller_view(c)]:
            assert view == before, f"controller term/leader changed under load: {before} -> {view}"
        md = c.controller_metadata()
        assert all(not b["fenced"] for b in md["brokers"]), md["brokers"]
        assert {p["partition"]: p["leader"] for p in c.partition_list("load")} == leaders
        print(f"acked {total_mb:.0f} MB in {LOAD_SECONDS:.0f} s under load; controllers stayed at {before[1]}")
