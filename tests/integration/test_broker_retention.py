"""Background retention in a real broker process: its own LogScheduler thread, on the real
clock, deletes a topic's segments once `retention.ms` has passed (every
`log_retention_check_interval_ms`; an expired active segment is rolled first, so the whole
log goes), with no admin call; a topic with a long retention.ms written at the same time
keeps everything."""
import re
import time

import pytest

from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration

RETENTION_MS = 500
BROKER = {"log_retention_check_interval_ms": 200}   # Kafka's log.retention.check.interval.ms


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def test_broker_scheduler_deletes_segments_past_retention_ms(tmp_path):
    cluster = ReplicatedCluster(str(tmp_path), brokers=1, broker_config=BROKER)
    try:
        cluster.start()
        u = cluster.url(1)
        small = {"segment.bytes": "200", "segment.ms": "100"}
        cluster.create_topic("expiring", replication_factor=1, configs=dict(small, **{"retention.ms": str(RETENTION_MS)}))
        cluster.create_topic("kept", replication_factor=1, configs=dict(small, **{"retention.ms": "600000"}))
        for i in range(20):
            for topic in ("expiring", "kept"):
                status, doc = http("POST", f"{u}/v1/topics/{topic}/partitions/0/records?acks=all",
                                   {"records": [{"key": f"k{i}", "value": f"v{i}"}]})
                assert status == 200, doc
        last_write_sent = time.time()

        def expired():
            status, doc = http("GET", f"{u}/v1/topics/expiring/partitions/0/records?offset=20&max_wait_ms=0")
            return status == 200 and doc["log_start_offset"] == doc["high_watermark"] == 20

        cluster.wait_for(expired, 60, "every segment of 'expiring' deleted by the broker's retention thread")
        # records are stamped by the broker on arrival, after `last_write_sent`: the last
        # segment cannot have gone before retention.ms had passed since then
        assert time.time() - last_write_sent >= RETENTION_MS / 1000
        status, doc = http("GET", f"{u}/v1/topics/expiring/partitions/0/records?offset=0")
        assert status == 416 and doc["error_code"] == "OFFSET_OUT_OF_RANGE", doc
        # the long-retention topic, written at the same time, keeps everything
        assert [v for _, v in cluster.read_all("kept")] == [f"v{i}" for i in range(20)]
        status, doc = http("GET", f"{u}/v1/topics/kept/partitions/0/records?offset=0&max_wait_ms=0")
        assert doc["log_start_offset"] == 0
        status, stats = http("GET", f"{u}/admin/v1/log-cleaner")
        assert status == 200 and stats["retention_runs_total"] > 1
        assert stats["segments_deleted_by_retention_total"] >= 3, stats   # 20 records over 200-byte segments
        status, text = http_text(f"{u}/metrics")
        assert _metric(text, "kraftlog_log_retention_segments_deleted_total") >= stats["segments_deleted_by_retention_total"]
    finally:
        try:
            cluster.stop_broker(1)   # SIGTERM: a clean stop (its background threads and processes too)
        finally:
            cluster.close()


def http_text(url: str) -> tuple[int, str]:
    import urllib.request
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read().decode()
