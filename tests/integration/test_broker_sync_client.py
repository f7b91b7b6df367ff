"""The synchronous client wrappers against a real node, with compressed batches."""
import time

import pytest

from deploy.local_node import LocalNode
from http_api.client import SyncAdminClient, SyncConsumer, SyncProducer

pytestmark = pytest.mark.integration


def test_sync_producer_consumer_with_zstd(tmp_path):
    with LocalNode(str(tmp_path / "data")) as node:
        with SyncAdminClient(node.url) as admin:
            admin.create_topic("sync", partitions=2)
            assert admin.list_topics() == ["sync"]
        with SyncProducer(node.url, compression="zstd", linger_ms=10) as producer:
            futs = [producer.send("sync", f"value-{i}" * 10, key=str(i % 3)) for i in range(100)]
            producer.flush()
            offsets = [f.result(10).offset for f in futs]
        assert all(o >= 0 for o in offsets)
        with SyncConsumer(node.url, auto_offset_reset="earliest", group_id="sg") as consumer:
            consumer.subscribe(["sync"])
            got = []
            while len(got) < 100:
                got.extend(consumer.poll(1000))
            consumer.commit()
        assert sorted(r.value for r in got) == sorted(f"value-{i}".encode() * 10 for i in range(100))
        with SyncConsumer(node.url, auto_offset_reset="earliest") as columns:   # zstd batches as columns
            columns.assign([("sync", 0), ("sync", 1)])
            batches = []
            deadline = time.monotonic() + 120
            while sum(map(len, batches)) < 100 and time.monotonic() < deadline:
                batches.extend(columns.poll_columns(1000))
        assert sorted(v for b in batches for v in b.values) == sorted(f"value-{i}".encode() * 10 for i in range(100))
        for p in (0, 1):
            offsets = [o for b in batches if b.partition == p for o in b.offsets]
            assert offsets == list(range(len(offsets)))
