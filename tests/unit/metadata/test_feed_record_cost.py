"""The metadata path's CPU per record on a failover's critical path (issue 25, failover at
100,000 partitions; docs/METADATA_FEED.md). These tests count work (encoder calls, full
garbage collections) or check that a cheaper path gives exactly what the general one gave.
Pure: state machine, records, image and FeedState, no raft, no sockets."""
from __future__ import annotations

import json

from metadata_quorum import state_machine as sm_module
from metadata_quorum.controller_server import feed_page_text
from metadata_quorum.records import PartitionChangeRecord, PartitionRecord, record_to_dict
from metadata_quorum.state_machine import feed_item_text
from tests.unit.metadata.metadata_harness import Harness


def _item_encodes(monkeypatch) -> list:
    calls = []
    real = sm_module.json.dumps

    def counting(obj, *a, **kw):
        if isinstance(obj, dict) and "record" in obj:   # a feed item through the general encoder
            calls.append(obj["record"]["type"])
        return real(obj, *a, **kw)
    monkeypatch.setattr(sm_module.json, "dumps", counting)
    return calls


def test_a_fencings_feed_page_formats_its_partition_records_without_the_json_encoder(monkeypatch):
    h = Harness()
    h.create("test", partitions=200, rf=3)
    h.create("other", partitions=100, rf=2)
    h.now = 10 ** 9
    base = h.sm.image.offset
    fenced = h.run(h.controller.fence_broker(h.image, 2))
    assert sum(isinstance(r, PartitionChangeRecord) for r in fenced) > 100
    before = json.dumps({"cluster_id": h.sm.image.cluster_id, "records": h.sm.records_since(base, 5000),
                         "metadata_offset": h.sm.image.offset})
    calls = _item_encodes(monkeypatch)
    texts = h.sm.records_since_json(base, 5000)
    assert feed_page_text(h.sm.image.cluster_id, texts, h.sm.image.offset) == before
    assert "PartitionChange" not in calls and "Partition" not in calls, calls
    assert len(calls) == len(fenced) - sum(isinstance(r, PartitionChangeRecord) for r in fenced)


def test_feed_item_text_is_exactly_json_dumps_for_every_shape():
    base = PartitionChangeRecord("t", "id-\u2603", 3, (1, 2, 3), (1, 3), 1, 4, 9)
    shapes = [
        record_to_dict(base),
        record_to_dict(PartitionChangeRecord("t\"\\\n", "x", 0, (2,), (), -1, 0, 1)),   # leaderless, escapes
        record_to_dict(PartitionRecord("big", "id", 10 ** 12, (1, 2), (1, 2), 2, 2 ** 40, 7)),
        record_to_dict(PartitionChangeRecord("t", "x", 0, (1, 2), (1,), 1, 2, 3, elr=(2,))),   # longer form
        {**record_to_dict(base), "elr": [], "last_known_elr": [], "adding_replicas": [], "removing_replicas": []},
        {**record_to_dict(base), "isr": [True, 3]},       # not plain ints: json writes true
        {**record_to_dict(base), "leader": 1.5},
        {**record_to_dict(base), "replicas": (1, 2, 3)},  # a tuple: the general encoder's business
        {**record_to_dict(base), "topic": None},
        {"type": "Topic", "name": "t", "topic_id": "x"},
        dict(reversed(list(record_to_dict(base).items()))),   # other key order: kept as written
    ]
    for record in shapes:
        for offset in (0, 7, 123456789):
            assert feed_item_text(offset, record) == json.dumps({"offset": offset, "record": record}), record
