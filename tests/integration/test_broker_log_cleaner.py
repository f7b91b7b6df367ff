"""A real broker process compacts a topic through its LogScheduler (the pass runs in the
broker's cleaner child process), exposes the cleaner metrics, and still shuts down cleanly;
its own cleaner thread, on the real clock and with no admin call, keeps a tombstone through
the first pass that passes it and drops it once delete.retention.ms has gone by."""
import json
import signal
import time
import urllib.request

import pytest

from deploy.local_node import LocalNode
from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration


def call(method, url, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            ctype = r.headers.get("Content-Type", "")
            return r.status, (json.loads(raw) if raw and "json" in ctype else raw.decode())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_broker_process_compacts_in_its_cleaner_process(tmp_path):
    node = LocalNode(str(tmp_path / "data")).start()
    try:
        u = node.url
        configs = {"cleanup.policy": "compact", "segment.bytes": "1000", "min.cleanable.dirty.ratio": "0.1"}
        status, _ = call("POST", u + "/v1/topics", {"name": "state", "partitions": 1, "replication_factor": 1,
                                                    "configs": configs})
        assert status == 201
        for i in range(20):
            status, _ = call("POST", u + "/v1/topics/state/records?acks=all",
                             {"records": [{"key": f"k{j}", "value": f"v{i}.{j}"} for j in range(5)]})
            assert status == 200
        status, d = call("POST", u + "/admin/v1/log-cleaner/run", {})
        assert status == 200, d
        [c] = d["cleaned"]
        assert c["segments_cleaned"] > 0 and not c["aborted"]
        status, body = call("GET", u + "/v1/topics/state/partitions/0/records?offset=0")
        values = {r["key"]: r["value"] for r in body["records"]}
        assert values == {f"k{j}": f"v19.{j}" for j in range(5)}
        assert len(body["records"]) < 50  # of 100 (the active segment is never cleaned)
        status, text = call("GET", u + "/metrics")
        assert "kraftlog_log_cleaner_passes_total 1.0" in text
        assert 'kraftlog_log_dirty_ratio{partition="0",topic="state"}' in text
    finally:
        code = node.stop(signal.SIGTERM)
    assert code == 0, node.output
    assert "kraftlog stopped cleanly" in node.output


DELETE_RETENTION_MS = 3000


def test_broker_cleaner_thread_drops_a_tombstone_after_delete_retention_ms(tmp_path):
    # a short cleaner backoff: with nothing to clean the cleaner thread sleeps this long
    cluster = ReplicatedCluster(str(tmp_path), brokers=1, broker_config={"log_cleaner_backoff_ms": 200})
    try:
        cluster.start()
        u = cluster.url(1)
        cluster.create_topic("state", replication_factor=1, configs={
            "cleanup.policy": "compact", "segment.bytes": "100", "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": str(DELETE_RETENTION_MS)})   # 100 bytes: about one batch per segment

        def produce(key, value):
            status, doc = http("POST", f"{u}/v1/topics/state/partitions/0/records?acks=all",
                               {"records": [{"key": key, "value": value}]})
            assert status == 200, doc
            return doc["offsets"][0]["offset"]

        assert produce("k1", "v1") == 0
        produce("k2", "v2")
        tombstone_sent = time.time()
        tombstone = produce("k1", None)
        for i in range(3):   # later segments: the tombstone's is no longer the active one
            produce("k3", f"f{i}")

        def records():
            status, doc = http("GET", f"{u}/v1/topics/state/partitions/0/records?offset=0&max_wait_ms=0")
            assert status == 200, doc
            return [(r["offset"], r["key"], r["value"]) for r in doc["records"]]

        # 1. a pass of the broker's cleaner thread removed k1's superseded value and kept
        #    the tombstone (the first pass over a tombstone never removes it)
        after_first = cluster.wait_for(lambda: (lambda rs: rs if (0, "k1", "v1") not in rs else None)(records()),
                                       60, "the cleaner thread's first pass (k1=v1 superseded)")
        assert (tombstone, "k1", None) in after_first, after_first
        # 2. the tombstone goes, by the same thread, once delete.retention.ms has passed
        final = cluster.wait_for(lambda: (lambda rs: rs if all(k != "k1" for _, k, _ in rs) else None)(records()),
                                 60, "the tombstone dropped after delete.retention.ms")
        assert time.time() - tombstone_sent >= DELETE_RETENTION_MS / 1000
        assert (1, "k2", "v2") in final and final[-1] == (5, "k3", "f2"), final

        def counted():   # a pass's counters are recorded once it ends, after its swaps
            status, stats = http("GET", f"{u}/admin/v1/log-cleaner")
            return stats if status == 200 and stats["tombstones_removed_total"] >= 1 else None

        stats = cluster.wait_for(counted, 30, "the tombstone removal counted in the cleaner metrics")
        assert stats["passes_total"] >= 2, stats
    finally:
        stop_cleanly_then_close(cluster)


def stop_cleanly_then_close(cluster: ReplicatedCluster) -> None:
    """SIGTERM first: a broker stopping cleanly stops its cleaner process (kill -9 of the
    broker would leave that child behind), then whatever is left goes."""
    try:
        for broker_id in list(cluster.procs):
            cluster.stop_broker(broker_id)
    finally:
        cluster.close()
