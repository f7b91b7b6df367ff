"""Batched AlterPartition (issue 25): a leader changes the ISRs of many partitions in one
controller write; each item is checked as a single AlterPartition is, and a refused item
does not stop the others."""
import pytest

from metadata_harness import Harness
from partitions.errors import ErrorCode, KraftlogError
from metadata_quorum.controller import ALTER_PARTITIONS_MAX
from metadata_quorum.records import PartitionChangeRecord


def _items(h, leader, shrink_to_leader=True):
    out = []
    for n, p in sorted(h.image.topic("t").partitions.items()):
        if p.leader == leader:
            out.append({"topic": "t", "partition": n, "leader_epoch": p.leader_epoch,
                        "partition_epoch": p.partition_epoch, "new_isr": [leader]})
    return out


def test_one_write_shrinks_the_isr_of_every_listed_partition():
    h = Harness()
    h.create("t", 30, 3)
    leader = 1
    items = _items(h, leader)
    assert len(items) >= 5
    records, errors = h.controller.alter_partitions(h.image, leader, h.image.brokers[leader].epoch, items)
    assert errors == {}
    assert [(r.topic, r.partition) for r in records if isinstance(r, PartitionChangeRecord)] == \
        [("t", it["partition"]) for it in items]
    h.run(records)
    for it in items:
        p = h.image.partition("t", it["partition"])
        assert p.isr == (leader,) and p.partition_epoch == it["partition_epoch"] + 1


def test_a_refused_item_changes_nothing_and_does_not_stop_the_others():
    h = Harness()
    h.create("t", 30, 3)
    leader = 1
    items = _items(h, leader)
    items[1] = dict(items[1], partition_epoch=items[1]["partition_epoch"] + 7)      # stale/unknown epoch
    items[2] = dict(items[2], new_isr=[leader, 99])                                  # not a replica
    items.append(dict(items[0]))                                                     # listed twice
    other = next(n for n, p in h.image.topic("t").partitions.items() if p.leader != leader)
    p_other = h.image.partition("t", other)
    items.append({"topic": "t", "partition": other, "leader_epoch": p_other.leader_epoch,
                  "partition_epoch": p_other.partition_epoch, "new_isr": [leader]})   # led by another broker
    records, errors = h.controller.alter_partitions(h.image, leader, h.image.brokers[leader].epoch, items)
    assert {i: e.code for i, e in errors.items()} == {
        1: ErrorCode.INVALID_UPDATE_VERSION, 2: ErrorCode.INELIGIBLE_REPLICA,
        len(items) - 2: ErrorCode.INVALID_REQUEST, len(items) - 1: ErrorCode.NOT_LEADER_OR_FOLLOWER}
    changed = {r.partition for r in records if isinstance(r, PartitionChangeRecord)}
    assert changed == {it["partition"] for i, it in enumerate(items[:-2]) if i not in (1, 2)}
    h.run(records)
    assert len(h.image.partition("t", items[1]["partition"]).isr) == 3


def test_a_stale_broker_epoch_or_an_oversized_batch_refuses_the_whole_request():
    h = Harness()
    h.create("t", 6, 3)
    items = _items(h, 1)
    with pytest.raises(KraftlogError) as e:
        h.controller.alter_partitions(h.image, 1, h.image.brokers[1].epoch + 1, items)
    assert e.value.code is ErrorCode.STALE_BROKER_EPOCH
    with pytest.raises(KraftlogError) as e:
        h.controller.alter_partitions(h.image, 1, h.image.brokers[1].epoch, items * (ALTER_PARTITIONS_MAX + 1))
    assert e.value.code is ErrorCode.INVALID_REQUEST
