"""Spark reads a tiered topic whole: most of it only in the object store (a real SeaweedFS),
the tail on the broker's disk. The source reads through the same HTTP fetch route, so it
does not care where the data is (issue 19)."""
from __future__ import annotations

import json
import time

import pytest

from deploy.local_node import LocalNode
from pipelines.client import Cluster
from tests.rigs.cluster import http
from tests.rigs.seaweedfs import seaweedfs_store
from tests.spark.helpers import batch_reader, produce

pytestmark = [pytest.mark.spark, pytest.mark.integration]

SEGMENT_BYTES = 64 * 1024
LOCAL_BYTES = 128 * 1024


def test_spark_batch_read_spans_the_remote_store_and_the_local_tail(spark, tmp_path):
    with seaweedfs_store(str(tmp_path)) as store:
        settings = {**store.broker_settings("kraftlog-spark"), "log_retention_check_interval_ms": 300}
        config = tmp_path / "node.json"
        config.write_text(json.dumps(settings))
        node = LocalNode(str(tmp_path / "node"), extra_args=["--config", str(config)]).start()
        try:
            cluster = Cluster([node.url])
            topic = "tiered-spark"
            cluster.create_topic(topic, partitions=1, replication_factor=1, configs={
                "segment.bytes": str(SEGMENT_BYTES), "remote.storage.enable": "true",
                "local.retention.bytes": str(LOCAL_BYTES), "retention.ms": "-1"})
            cluster.wait_for_topic(topic, 1)
            values = [f"{i:08d}".encode().ljust(100, b".") for i in range(6000)]   # ~0.7 MB: ~10 segments
            for i in range(0, len(values), 500):
                produce(cluster, topic, 0, values[i:i + 500])
            # wait until the first segments left the broker's disk (only the store has them)
            deadline = time.monotonic() + 90
            while True:
                _, offs = http("GET", f"{node.url}/v1/topics/{topic}/partitions/0/offsets")
                if offs["local_log_start_offset"] > 1000 and offs["log_start_offset"] == 0:
                    break
                assert time.monotonic() < deadline, f"the local tail was never trimmed: {offs}"
                time.sleep(0.3)
            rows = batch_reader(spark, node.url, subscribe=topic).collect()
            assert sorted((r.offset, r.value) for r in rows) == list(enumerate(values))
        finally:
            node.stop()
