"""Entry runs (issue 25): the raft entry of a metadata write carries consecutive partition
records of one topic as one run of columns (`records.entry_items`), as the feed does.
A fencing at 100,000 partitions is 33,335 records; as one dict per record the active
controller built them (74 ms), pickled them, and each of the three controllers unpickled
and decoded them one by one (60 + 180 ms) while the failover waited for the commit. Only
the encoding changes: the state machine builds the same records, image and feed from
either form (older journals hold entries record by record). Pure: no raft, no sockets."""
from __future__ import annotations

import json
import pickle

from metadata_quorum import records as records_module
from metadata_quorum.controller_server import feed_page_text
from metadata_quorum.records import (ConfigRecord, PartitionChangeRecord, PartitionRecord, TopicRecord,
                                     entry_items, entry_record_count, entry_records, record_to_dict)
from tests.unit.metadata.metadata_harness import Harness


def _cluster() -> Harness:
    h = Harness()
    h.create("a", partitions=120, rf=3)
    h.run([ConfigRecord("topic", "a", "retention.ms", "1000")])
    h.create("b", partitions=80, rf=3)
    return h


def _feed(h: Harness, runs: bool) -> list:
    out, after = [], 0
    while after < h.sm.feed_end:
        texts, end, ends = h.sm.feed_page(after, 97, runs=runs)
        out.append(feed_page_text(h.sm.image.cluster_id, texts, end, ends))
        after += sum(len(json.loads(t)["run"]["partition"]) if '"run"' in t[:40] else 1 for t in texts)
    return out


def test_a_fencing_entry_in_runs_applies_exactly_as_record_by_record():
    as_runs, as_dicts = _cluster(), _cluster()
    fencing = as_runs.controller.fence_broker(as_runs.image, 2)
    assert fencing == as_dicts.controller.fence_broker(as_dicts.image, 2)   # same history, same decision
    items = entry_items(fencing)
    dicts = [record_to_dict(r) for r in fencing]
    assert entry_record_count(items) == len(fencing) == len(dicts)
    assert len(items) <= 6 < len(fencing)   # the fence record and a run per topic and type
    assert len(pickle.dumps(items)) * 3 < len(pickle.dumps(dicts))
    for h, entry_records_ in ((as_runs, items), (as_dicts, dicts)):
        res = h.sm.apply([{"request_id": None, "controller_epoch": h.epoch,
                           "records": pickle.loads(pickle.dumps(entry_records_))}])[0]
        assert res["ok"], res
    assert as_runs.image.to_snapshot() == as_dicts.image.to_snapshot()
    assert as_runs.sm.tail == as_dicts.sm.tail          # the same records at the same offsets
    assert as_runs.sm.batch_ends == as_dicts.sm.batch_ends
    for runs in (True, False):                          # and the same feed, both encodings
        assert _feed(as_runs, runs) == _feed(as_dicts, runs)
    assert as_runs.sm.records_since(0, 10 ** 6) == as_dicts.sm.records_since(0, 10 ** 6)


def test_entry_records_reads_back_every_record_in_order():
    moving = PartitionChangeRecord("a", "ida", 5, (1, 2, 3), (1, 2), 1, 3, 4, adding_replicas=(3,))
    recs = [
        PartitionRecord("a", "ida", 0, (1, 2, 3), (1, 2, 3), 1),
        PartitionRecord("a", "ida", 1, (2, 3, 1), (2, 3, 1), 2),
        PartitionRecord("a", "ida", 2, (3, 1, 2), (3, 1, 2), 3),
        ConfigRecord("topic", "a", "retention.ms", "5"),
        moving,                                                                # not compact: a record
        PartitionChangeRecord("a", "ida", 6, (1, 2), (1,), 1, 2, 3),
        PartitionChangeRecord("a", "ida", 7, (1, 2), (1,), 1, 2, 3),
        PartitionChangeRecord("b", "idb", 0, (1, 2), (2,), 2, 2, 3),          # another topic: another run
        PartitionChangeRecord("b", "idb", 1, (1, 2), (2,), 2, 2, 3),
        PartitionChangeRecord("a", "ida", 8, (1, 2), (1,), 1, 2, 3),          # alone: a record
        TopicRecord("c", "idc"),
    ]
    items = entry_items(recs)
    assert [("run" in i) for i in items] == [True, False, False, True, True, False, False]
    for form in (items, pickle.loads(pickle.dumps(items)), json.loads(json.dumps(items))):
        assert entry_records(form) == recs
    assert entry_records([record_to_dict(r) for r in recs]) == recs   # an entry of an older journal
    assert entry_record_count(items) == len(recs)


def test_a_malformed_run_in_an_entry_is_rejected_and_changes_nothing():
    h = _cluster()
    offset, tail, rejected = h.image.offset, list(h.sm.tail), h.sm.rejected_batches
    items = entry_items(h.controller.fence_broker(h.image, 2))
    run = next(i["run"] for i in items if "run" in i)
    run["leader"] = run["leader"][:-1]   # columns of two lengths
    res = h.sm.apply([{"request_id": None, "controller_epoch": h.epoch, "records": items}])[0]
    assert res["ok"] is False and "malformed" in res["reason"]
    assert h.image.offset == offset and h.sm.tail == tail and h.sm.rejected_batches == rejected + 1
    assert not h.image.brokers[2].fenced


def test_a_fencing_entry_is_built_and_applied_without_a_dict_per_record(monkeypatch):
    h = _cluster()
    fencing = h.controller.fence_broker(h.image, 2)
    assert len(fencing) > 150
    to_dict, from_dict = [], []
    real_to, real_from = records_module.record_to_dict, records_module.record_from_dict
    monkeypatch.setattr(records_module, "record_to_dict", lambda r: to_dict.append(r) or real_to(r))
    monkeypatch.setattr(records_module, "record_from_dict", lambda d: from_dict.append(d) or real_from(d))
    items = entry_items(fencing)
    res = h.sm.apply([{"request_id": None, "controller_epoch": h.epoch, "records": pickle.loads(pickle.dumps(items))}])
    assert res[0]["ok"], res
    assert len(to_dict) == 1 and len(from_dict) == 1   # the FenceBrokerRecord alone
    assert h.image.brokers[2].fenced
