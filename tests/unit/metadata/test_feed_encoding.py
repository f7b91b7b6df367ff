"""The controller's metadata feed encodes each record once (issue 25, controller quorum at
scale). `GET /controller/v1/metadata/records` answers were built by json.dumps of a whole
page (up to 5,000 records) per request: 8-12% of a controller's GIL samples during a
10,000-partition create under load (py-spy), once per broker for the same records, each
page one C call holding the GIL. The state machine now keeps the newest records' JSON
text. These tests count encodes (not time) and check the answer is the same JSON as before.
Pure: the state machine and the page text, no raft, no sockets."""
from __future__ import annotations

import json

from metadata_quorum import state_machine as sm_module
from metadata_quorum.controller_server import feed_page_text
from tests.unit.metadata.metadata_harness import Harness


def _encodes(monkeypatch) -> list:
    calls = []
    real = sm_module.json.dumps

    def counting(obj, *a, **kw):
        if isinstance(obj, dict) and "record" in obj:   # a feed item (not the page's cluster id)
            calls.append(1)
        return real(obj, *a, **kw)
    monkeypatch.setattr(sm_module.json, "dumps", counting)
    return calls


def test_a_page_is_the_json_it_was_and_three_readers_encode_each_record_once(monkeypatch):
    h = Harness(racks={1: "rack-\u00e9", 2: "r2", 3: None})   # non-ASCII text escaped alike
    h.create("test", partitions=300, rf=3, configs={"retention.ms": "1000"})
    sm = h.sm
    offset = sm.image.offset
    old = json.dumps({"cluster_id": sm.image.cluster_id, "records": sm.records_since(0, 5000),
                      "metadata_offset": offset})
    calls = _encodes(monkeypatch)
    for _ in range(3):   # three brokers read the same page
        texts = sm.records_since_json(0, 5000)
        assert feed_page_text(sm.image.cluster_id, texts, offset) == old
    assert len(texts) == offset
    # partition records are formatted without json.dumps (test_feed_record_cost.py): count encodes
    assert sm.records_encoded == offset, f"{sm.records_encoded} encodes for 3 reads of {offset} records"
    assert len(calls) < offset
    # a later page encodes only the new records
    h.create("more", partitions=10, rf=3)
    texts = sm.records_since_json(offset - 5, 5000)
    assert [json.loads(t) for t in texts] == sm.records_since(offset - 5, 5000)
    assert sm.records_encoded == sm.image.offset


def test_the_cache_is_bounded_and_a_restore_forgets_it():
    h = Harness()
    h.sm.feed_encoded_records = 100
    for i in range(6):
        h.create(f"t{i}", partitions=120, rf=3)
        assert [json.loads(t) for t in h.sm.records_since_json(0, 5000)] == h.sm.records_since(0, 5000)
        assert len(h.sm._encoded) <= 2 * 100 + 5000
    assert len(h.sm._encoded) <= 2 * 100 + 1 or min(h.sm._encoded) >= h.sm.image.offset - 5000 - 100
    snap = h.sm.snapshot()
    h.sm.restore(snap)
    assert h.sm._encoded == {}
    assert h.sm.records_since_json(0, 10) is None        # older than the tail: a snapshot answer
    assert h.sm.records_since_json(h.sm.image.offset, 10) == []


def test_a_snapshot_answer_is_encoded_in_slices_and_once_per_offset(monkeypatch):
    h = Harness()
    h.create("a", partitions=450, rf=3, configs={"retention.ms": "1000"})
    h.create("b", partitions=7, rf=2)
    h.create("c", partitions=1, rf=1)
    monkeypatch.setattr(sm_module, "SNAPSHOT_ENCODE_CHUNK_PARTITIONS", 100)
    sizes = []
    real = sm_module.json.dumps

    def sized(obj, *a, **kw):
        text = real(obj, *a, **kw)
        sizes.append((len(obj) if isinstance(obj, list) else 0, len(text)))
        return text
    monkeypatch.setattr(sm_module.json, "dumps", sized)
    offset, text = h.sm.snapshot_json()
    assert offset == h.sm.image.offset
    assert json.loads(text) == json.loads(real(h.sm.image.to_snapshot()))
    # no call encoded more than one slice of partitions; the largest text is a slice's
    assert max(n for n, _ in sizes) == 100
    assert max(size for _, size in sizes) < len(text) / 3
    assert h.sm.snapshots_encoded == 1
    calls = len(sizes)
    assert h.sm.snapshot_json() == (offset, text)          # a second broker: the same text, no work
    assert len(sizes) == calls and h.sm.snapshots_encoded == 1
    h.create("d", partitions=3, rf=3)
    offset2, text2 = h.sm.snapshot_json()
    assert offset2 > offset and h.sm.snapshots_encoded == 2
    assert json.loads(text2) == json.loads(real(h.sm.image.to_snapshot()))
