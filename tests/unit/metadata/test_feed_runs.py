"""Feed runs (issue 25): a broker's feed answer carries consecutive partition records of one
topic as one item of columns (`state_machine.feed_runs`, `records.records_of_run`). A
fencing at 100,000 partitions was 7.7 MB of feed JSON (233 bytes a record) that each
surviving broker downloaded and json.loads-ed (0.1-0.5 s) before it could apply the new
leaderships. Only the encoding changes: a broker that reads runs builds the same records,
image and change as one that reads records one by one. Pure: state machine and FeedState."""
from __future__ import annotations

import json

import pytest

from metadata_quorum.controller_server import feed_page_text
from metadata_quorum.feed import FeedState
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import ConfigRecord, records_of_run, record_from_dict
from tests.unit.metadata.metadata_harness import Harness


def _cluster() -> Harness:
    """Two topics created, a config change between them, then broker 2 fenced (the
    fencing moves its leaderships and ISR memberships: partition changes of both topics)."""
    h = Harness()
    h.create("a", partitions=120, rf=3)
    h.run([ConfigRecord("topic", "a", "retention.ms", "1000")])
    h.create("b", partitions=80, rf=3)
    h.run(h.controller.fence_broker(h.image, 2))
    return h


def _body(h: Harness, after: int, max_records: int, runs: bool) -> dict:
    texts, end, ends = h.sm.feed_page(after, max_records, runs=runs)
    return json.loads(feed_page_text(h.sm.image.cluster_id, texts, end, ends))


def _follow(h: Harness, max_records: int, runs: bool) -> tuple:
    """A broker's FeedState fed page by page from offset 0: (its image, the records of each
    change it released, the answers' sizes in bytes)."""
    feed = FeedState(MetadataImage())
    changes, sizes = [], []
    while feed.next_offset < h.sm.feed_end:
        texts, end, ends = h.sm.feed_page(feed.next_offset, max_records, runs=runs)
        text = feed_page_text(h.sm.image.cluster_id, texts, end, ends)
        sizes.append(len(text))
        change = feed.accept(json.loads(text))
        if change is not None:
            changes.append(change.records)
    return feed.image, changes, sizes


@pytest.mark.parametrize("max_records", [5000, 97, 1])
def test_runs_give_the_same_records_changes_and_image_as_single_records(max_records):
    h = _cluster()
    image_runs, changes_runs, sizes_runs = _follow(h, max_records, runs=True)
    image_one, changes_one, sizes_one = _follow(h, max_records, runs=False)
    assert changes_runs == changes_one            # the same records, released as the same changes
    assert image_runs.to_snapshot() == image_one.to_snapshot() == h.image.to_snapshot()
    if max_records == 5000:
        assert sum(sizes_runs) * 4 < sum(sizes_one), (sum(sizes_runs), sum(sizes_one))


def test_a_run_holds_one_topic_and_type_and_other_records_stay_single():
    h = _cluster()
    body = _body(h, 0, 5000, runs=True)
    runs = [item for item in body["records"] if "run" in item]
    singles = [item for item in body["records"] if "record" in item]
    assert {(r["run"]["type"], r["run"]["topic"]) for r in runs} == {
        ("Partition", "a"), ("Partition", "b"), ("PartitionChange", "a"), ("PartitionChange", "b")}
    assert any(s["record"]["type"] == "Config" for s in singles)
    # every offset is covered exactly once, in order
    offsets = []
    for item in body["records"]:
        n = len(item["run"]["partition"]) if "run" in item else 1
        offsets.extend(range(item["offset"], item["offset"] + n))
    assert offsets == list(range(h.sm.feed_end))
    # each record of a run equals the record one by one
    flat = {item["offset"]: record_from_dict(item["record"]) for item in _body(h, 0, 5000, runs=False)["records"]}
    for item in runs:
        for i, record in enumerate(records_of_run(item["run"])):
            assert record == flat[item["offset"] + i]


def test_a_run_page_is_encoded_once_for_every_reader(monkeypatch):
    from metadata_quorum import state_machine as sm_module
    h = _cluster()
    calls = []
    real = sm_module.feed_runs
    monkeypatch.setattr(sm_module, "feed_runs", lambda *a: calls.append(1) or real(*a))
    first = h.sm.feed_page(0, 5000, runs=True)
    for _ in range(2):   # the other brokers read the same page
        assert h.sm.feed_page(0, 5000, runs=True) == first
    assert len(calls) == 1


@pytest.mark.parametrize("bad", [
    {"type": "Topic", "topic": "a", "topic_id": "x", "partition": [0], "replicas": [[1]], "isr": [[1]],
     "leader": [1], "leader_epoch": [0], "partition_epoch": [0]},                     # not a partition type
    {"type": "Partition", "topic": "a", "topic_id": "x", "partition": [0, 1], "replicas": [[1]], "isr": [[1]],
     "leader": [1], "leader_epoch": [0], "partition_epoch": [0]},                     # columns of two lengths
    {"type": "Partition", "topic": "a", "partition": [0], "replicas": [[1]], "isr": [[1]],
     "leader": [1], "leader_epoch": [0], "partition_epoch": [0]},                     # no topic_id
    {"type": "Partition", "topic": "a", "topic_id": "x", "partition": [0], "replicas": [[[1]]], "isr": [[1]],
     "leader": [1], "leader_epoch": [0], "partition_epoch": [0]},                     # a replica that is a list
    {"type": "Partition", "topic": "a", "topic_id": "x", "partition": 0, "replicas": [1], "isr": [1],
     "leader": 1, "leader_epoch": 0, "partition_epoch": 0},                           # not columns
    "not a run",
])
def test_a_malformed_run_is_refused_and_the_feed_state_is_unchanged(bad):
    with pytest.raises(ValueError):
        records_of_run(bad)
    feed = FeedState(MetadataImage())
    with pytest.raises(ValueError):
        feed.accept({"records": [{"offset": 0, "run": bad}], "metadata_offset": 1})
    assert feed.image.offset == 0 and feed.pending == []


def _follow_runs(h: Harness, singles_max: int) -> tuple:
    """`_follow` in pages of up to 10**6 records of which at most `singles_max` outside runs."""
    feed = FeedState(MetadataImage())
    changes, pages = [], []
    while feed.next_offset < h.sm.feed_end:
        texts, end, ends = h.sm.feed_page(feed.next_offset, 10 ** 6, runs=True, singles_max=singles_max)
        body = json.loads(feed_page_text(h.sm.image.cluster_id, texts, end, ends))
        pages.append(body)
        change = feed.accept(body)
        if change is not None:
            changes.append(change.records)
    return feed.image, changes, pages


def test_a_page_of_runs_holds_many_records_but_few_outside_runs():
    h = _cluster()
    for i in range(7):   # single records between the runs
        h.run([ConfigRecord("topic", "b", "retention.ms", str(1000 + i))])
    h.create("c", partitions=50, rf=2)   # broker 2 is fenced: two brokers left
    singles_total = sum(1 for item in _body(h, 0, 10 ** 6, runs=True)["records"] if "record" in item)
    assert singles_total > 12
    image, changes, pages = _follow_runs(h, singles_max=4)
    for body in pages:
        assert sum(1 for item in body["records"] if "record" in item) <= 4
        covered = body["records"][0]["offset"] + sum(
            len(item["run"]["partition"]) if "run" in item else 1 for item in body["records"])
        assert all(e <= covered for e in body.get("batch_ends") or ())   # no boundary beyond what it holds
    assert len(pages) >= singles_total // 4
    assert max(sum(len(i["run"]["partition"]) for i in b["records"] if "run" in i) for b in pages) > 100
    image_one, changes_one, _ = _follow(h, 5000, runs=False)
    # the same records (released in other groups: pages end elsewhere), the same image
    assert [r for c in changes for r in c] == [r for c in changes_one for r in c]
    assert image.to_snapshot() == image_one.to_snapshot() == h.image.to_snapshot()
