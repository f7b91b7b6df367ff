"""Partition reassignment (KIP-455) and broker decommission: the controller's pure decisions
applied through the MetadataStateMachine (no raft, no sockets)."""
import random

import pytest

from metadata_quorum.controller import ControllerSettings, QuorumController
from metadata_quorum.image import MetadataImage
from metadata_quorum.placement import replacement_broker
from metadata_quorum.reassignment import THROTTLE_KEYS
from metadata_quorum.records import (
    BrokerMembershipRecord, ConfigRecord, PartitionChangeRecord, PartitionRecord, TopicRecord, record_from_dict,
    record_to_dict,
)
from partitions.errors import ErrorCode, KraftlogError
from metadata_harness import Harness


def codes(fn, *args, **kwargs):
    with pytest.raises(KraftlogError) as exc:
        fn(*args, **kwargs)
    return exc.value.code


def harness(brokers=(1, 2, 3), replicas=(1, 2), partitions=1, racks=None):
    h = Harness(brokers=brokers, racks=racks)
    h.run([TopicRecord("t", "tid")] + [PartitionRecord("t", "tid", p, tuple(replicas), tuple(replicas), replicas[0])
                                       for p in range(partitions)])
    return h


def move(h, replicas, partition=0, throttle=None, topic="t"):
    doc = {"version": 1, "partitions": [{"topic": topic, "partition": partition, "replicas": replicas}]}
    if throttle is not None:
        doc["throttle"] = throttle
    return h.run(h.controller.alter_partition_reassignments(h.image, doc))


def expand_isr(h, new_isr, partition=0):
    p = h.image.partition("t", partition)
    return h.run(h.controller.alter_partition(
        h.image, p.leader, h.image.brokers[p.leader].epoch, "t", partition, p.leader_epoch, p.partition_epoch,
        list(new_isr)))


def throttle_of(image):
    return {k: image.broker_configs.get("", {}).get(k) for k in THROTTLE_KEYS}


# ------------------------------------------------------------------ the move
def test_move_runs_with_target_plus_removing_then_completes_when_isr_holds_the_target():
    h = harness()
    move(h, [2, 3])
    p = h.image.partition("t", 0)
    assert p.replicas == (2, 3, 1) and p.adding_replicas == (3,) and p.removing_replicas == (1,)
    assert set(p.isr) == {1, 2} and p.leader == 1            # nothing lost, the leader keeps leading
    assert p.target_replicas == (2, 3) and p.original_replicas == (2, 1)
    assert h.image.reassignments() == [("t", p)]
    body = p.to_json()
    assert body["adding_replicas"] == [3] and body["removing_replicas"] == [1]
    # the leader adds the caught-up replica 3 to the ISR: the same record completes the move
    records = expand_isr(h, [1, 2, 3])
    assert len(records) == 1
    done = h.image.partition("t", 0)
    assert done.replicas == (2, 3) and done.isr == (2, 3)
    assert done.adding_replicas == () and done.removing_replicas == ()
    assert done.leader == 2 and done.leader_epoch == p.leader_epoch + 1   # the first target replica leads
    assert h.image.reassignments() == []


def test_move_waits_while_a_target_replica_is_outside_the_isr():
    h = harness(brokers=(1, 2, 3, 4))
    move(h, [3, 4])
    expand_isr(h, [1, 2, 3])
    p = h.image.partition("t", 0)
    assert p.reassigning and p.replicas == (3, 4, 1, 2) and set(p.isr) == {1, 2, 3}
    assert h.controller.complete_reassignments(h.image) == []
    expand_isr(h, [1, 2, 3, 4])
    assert h.image.partition("t", 0).replicas == (3, 4) and not h.image.partition("t", 0).reassigning


def test_shrink_and_reorder_complete_at_once():
    h = harness(replicas=(1, 2, 3))
    move(h, [3, 1, 2])
    p = h.image.partition("t", 0)
    assert p.replicas == (3, 1, 2) and not p.reassigning and p.leader == 3
    move(h, [1, 2])
    p = h.image.partition("t", 0)
    assert p.replicas == (1, 2) and p.isr == (1, 2) and not p.reassigning and p.leader == 1


def test_no_leader_change_when_the_first_target_is_fenced():
    h = harness(brokers=(1, 2, 3, 4))
    move(h, [2, 3])
    h.run(h.controller.fence_broker(h.image, 2))
    p = h.image.partition("t", 0)
    assert p.reassigning and 2 not in p.isr                     # fencing kept the move's state
    assert p.adding_replicas == (3,) and p.removing_replicas == (1,)
    expand_isr(h, [1, 3])                                        # 2 is not in sync: not complete
    assert h.image.partition("t", 0).reassigning


def test_completion_with_the_leader_removed_elects_a_usable_target_replica():
    h = harness()
    move(h, [2, 3])
    h.run(h.controller.fence_broker(h.image, 2))
    # 2 is fenced but still in the ISR (say it was the last one): completion waits for a usable leader
    p = h.image.partition("t", 0)
    from metadata_quorum.records import PartitionChangeRecord as PCR
    h.run([PCR("t", "tid", 0, p.replicas, (1, 2, 3), 1, p.leader_epoch, p.partition_epoch + 1,
               adding_replicas=p.adding_replicas, removing_replicas=p.removing_replicas)])
    records = h.controller.complete_reassignments(h.image)
    assert len(records) == 1 and records[0].leader == 3 and records[0].replicas == (2, 3)


def test_replacing_a_running_move_keeps_the_original_replicas_as_base():
    h = harness(brokers=(1, 2, 3, 4))
    move(h, [2, 3])
    move(h, [2, 4])
    p = h.image.partition("t", 0)
    assert p.replicas == (2, 4, 1) and p.adding_replicas == (4,) and p.removing_replicas == (1,)
    assert 3 not in p.isr


# ------------------------------------------------------------------ cancel
def test_cancel_returns_the_original_replica_set():
    h = harness()
    move(h, [2, 3])
    h.run(h.controller.cancel_reassignments(h.image))
    p = h.image.partition("t", 0)
    assert set(p.replicas) == {1, 2} and set(p.isr) == {1, 2} and p.leader == 1
    assert not p.reassigning and h.image.reassignments() == []
    assert h.controller.cancel_reassignments(h.image) == []     # nothing left to cancel


def test_cancel_with_a_null_replicas_entry_and_after_the_adding_replica_led():
    h = harness()
    move(h, [3, 2])
    expand_isr(h, [1, 2])
    p = h.image.partition("t", 0)
    # leadership went to the adding replica 3 while it was in sync (preferred leader election)
    h.run([PartitionChangeRecord("t", "tid", 0, p.replicas, (3, 2, 1), 3, p.leader_epoch + 1,
                                 p.partition_epoch + 1, adding_replicas=(3,), removing_replicas=(1,))])
    h.run([PartitionChangeRecord("t", "tid", 0, (3, 2, 1), (3, 2), 3, p.leader_epoch + 1, p.partition_epoch + 2,
                                 adding_replicas=(3,), removing_replicas=(1,))])
    h.run(h.controller.alter_partition_reassignments(
        h.image, {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": None}]}))
    p = h.image.partition("t", 0)
    assert set(p.replicas) == {1, 2} and p.isr == (2,) and p.leader == 2 and not p.reassigning


def test_cancel_refused_when_no_original_replica_is_in_sync():
    h = harness()
    move(h, [3])
    p = h.image.partition("t", 0)
    h.run([PartitionChangeRecord("t", "tid", 0, p.replicas, (3,), 3, p.leader_epoch + 1, p.partition_epoch + 1,
                                 adding_replicas=(3,), removing_replicas=(1, 2))])
    before = h.image.offset
    assert codes(h.controller.cancel_reassignments, h.image) is ErrorCode.INVALID_REQUEST
    assert h.image.offset == before


# ------------------------------------------------------------------ throttle
def test_throttle_lives_as_long_as_the_moves_it_served():
    h = harness(partitions=2)
    move(h, [2, 3], throttle=1_000_000)
    assert throttle_of(h.image) == {k: "1000000" for k in THROTTLE_KEYS}
    move(h, [2, 3], partition=1)
    expand_isr(h, [1, 2, 3], partition=0)
    assert throttle_of(h.image) == {k: "1000000" for k in THROTTLE_KEYS}   # partition 1 still moves
    expand_isr(h, [1, 2, 3], partition=1)
    assert throttle_of(h.image) == {k: None for k in THROTTLE_KEYS}


def test_throttle_removed_by_cancel_and_not_set_for_a_move_that_completes_at_once():
    h = harness()
    move(h, [2, 3], throttle=5000)
    h.run(h.controller.cancel_reassignments(h.image))
    assert throttle_of(h.image) == {k: None for k in THROTTLE_KEYS}
    records = move(h, [2, 1], throttle=5000)
    assert not any(isinstance(r, ConfigRecord) for r in records)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("doc, code", [
    ({"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2, 9]}]}, ErrorCode.INVALID_REQUEST),
    ({"version": 1, "partitions": [{"topic": "nope", "partition": 0, "replicas": [2, 3]}]},
     ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ({"version": 1, "partitions": [{"topic": "t", "partition": 7, "replicas": [2, 3]}]},
     ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ({"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": []}]},
     ErrorCode.INVALID_REPLICATION_FACTOR),
    ({"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2, 2]}]}, ErrorCode.INVALID_REQUEST),
    ({"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2, 3]},
                                   {"topic": "t", "partition": 0, "replicas": [1, 3]}]}, ErrorCode.INVALID_REQUEST),
    ({"version": 2, "partitions": [{"topic": "t", "partition": 0, "replicas": [2, 3]}]}, ErrorCode.INVALID_REQUEST),
    ({"version": 1, "partitions": []}, ErrorCode.INVALID_REQUEST),
    ({"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2, 3]}], "throttle": 0},
     ErrorCode.INVALID_REQUEST),
    ({"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": ["2"]}]}, ErrorCode.INVALID_REQUEST),
    ({"version": 1, "partitions": [{"topic": "t", "partition": 0}]}, ErrorCode.INVALID_REQUEST),
    ([], ErrorCode.INVALID_REQUEST),
])
def test_bad_requests_are_refused_and_change_nothing(doc, code):
    h = harness(partitions=2)
    # a valid entry before the bad one must not be applied either
    if isinstance(doc, dict) and doc.get("partitions") and doc["partitions"][0].get("topic") == "t":
        doc = dict(doc, partitions=[{"topic": "t", "partition": 1, "replicas": [2, 3]}] + doc["partitions"])
    before = h.image.offset
    assert codes(h.controller.alter_partition_reassignments, h.image, doc) is code
    assert h.image.offset == before and h.image.reassignments() == []


# ------------------------------------------------------------------ failover, replay
def test_a_new_active_controller_finishes_the_move_from_the_image():
    h = harness()
    move(h, [2, 3])
    p = h.image.partition("t", 0)
    # the leader's ISR expansion was committed, then the active controller died before completing
    h.run([PartitionChangeRecord("t", "tid", 0, p.replicas, (2, 3, 1), p.leader, p.leader_epoch,
                                 p.partition_epoch + 1, adding_replicas=(3,), removing_replicas=(1,))])
    fresh = QuorumController(ControllerSettings(), random.Random(1))
    fresh.reset_sessions(h.image, 0)
    records = fresh.maintenance(h.image, 0)
    h.run(records)
    assert h.image.partition("t", 0).replicas == (2, 3) and not h.image.partition("t", 0).reassigning


def test_records_and_snapshots_carry_the_move_and_broker_states():
    h = harness(brokers=(1, 2, 3, 4))
    move(h, [2, 3])
    h.run(h.controller.decommission_broker(h.image, 4))
    rec = PartitionChangeRecord("t", "tid", 0, (2, 3, 1), (1, 2), 1, 0, 1, adding_replicas=(3,), removing_replicas=(1,))
    assert record_from_dict(record_to_dict(rec)) == rec
    old = {k: v for k, v in record_to_dict(rec).items() if k not in ("adding_replicas", "removing_replicas")}
    assert record_from_dict(old).adding_replicas == ()          # records written before replay unchanged
    copy = MetadataImage.from_snapshot(h.image.to_snapshot())
    assert copy.partition("t", 0) == h.image.partition("t", 0)
    assert copy.broker_states == {4: "draining"} and copy.brokers_json() == h.image.brokers_json()


# ------------------------------------------------------------------ decommission
def test_decommission_cordons_moves_every_replica_then_unregisters():
    h = harness(brokers=(1, 2, 3, 4), replicas=(1, 2), partitions=3)
    records = h.controller.decommission_broker(h.image, 1)
    assert records[0] == BrokerMembershipRecord(1, "draining")
    h.run(records)
    assert h.image.broker_state(1) == "draining" and 1 not in h.image.placeable_broker_ids()
    for part in range(3):
        p = h.image.partition("t", part)
        assert p.removing_replicas == (1,) and len(p.target_replicas) == 2 and 1 not in p.target_replicas
    # deterministic and spread: the replicas go to the least loaded brokers 3 and 4
    assert sorted(h.image.partition("t", q).adding_replicas[0] for q in range(3)) == [3, 3, 4]
    # cordoned: a new topic is placed on the other brokers only
    h.create("fresh", 4, 3)
    assert all(1 not in p.replicas for p in h.image.topic("fresh").partitions.values())
    assert h.controller.drain_step(h.image) == []               # moves still running
    for part in range(3):
        p = h.image.partition("t", part)
        expand_isr(h, list(p.isr) + list(p.adding_replicas), partition=part)
    assert h.image.replica_count(1) == 0
    h.run(h.controller.maintenance(h.image, 0))
    assert 1 not in h.image.brokers and h.image.broker_state(1) == "decommissioned"
    listed = {b["id"]: b for b in h.image.brokers_json()}
    assert listed[1]["state"] == "decommissioned" and listed[2]["state"] == "active"
    assert set(listed[1]) == {"id", "url", "rack", "fenced", "state"}
    assert codes(h.controller.register_broker, h.image, 1, "again", "http://h:1") is ErrorCode.POLICY_VIOLATION
    h.run(h.controller.recommission_broker(h.image, 1))
    assert h.image.broker_state(1) == "active" and 1 not in h.image.decommissioned
    h.add_broker(1, incarnation="back")
    assert 1 in h.image.placeable_broker_ids()


def test_decommission_refused_when_it_would_break_a_topics_replication_factor():
    h = harness(brokers=(1, 2), replicas=(1, 2))
    before = h.image.offset
    with pytest.raises(KraftlogError) as exc:
        h.controller.decommission_broker(h.image, 1)
    assert exc.value.code is ErrorCode.POLICY_VIOLATION and "replication factor 2" in str(exc.value)
    assert h.image.offset == before and h.image.broker_state(1) == "active"
    assert codes(h.controller.decommission_broker, h.image, 9) is ErrorCode.INVALID_REQUEST


def test_recommission_cancels_the_moves_of_a_drain():
    h = harness(brokers=(1, 2, 3), replicas=(1, 2))
    h.run(h.controller.decommission_broker(h.image, 2))
    assert h.image.partition("t", 0).removing_replicas == (2,)
    h.run(h.controller.recommission_broker(h.image, 2))
    p = h.image.partition("t", 0)
    assert set(p.replicas) == {1, 2} and not p.reassigning and h.image.broker_state(2) == "active"
    assert h.controller.recommission_broker(h.image, 2) == []


def test_drain_restarts_a_cancelled_move_and_decommissions_an_empty_broker_at_once():
    h = harness(brokers=(1, 2, 3, 4), replicas=(1, 2))
    h.run(h.controller.decommission_broker(h.image, 2))
    h.run(h.controller.cancel_reassignments(h.image))
    assert not h.image.partition("t", 0).reassigning
    h.run(h.controller.maintenance(h.image, 0))
    assert h.image.partition("t", 0).removing_replicas == (2,)
    assert h.image.partition("t", 0).adding_replicas == (3,)
    h.run(h.controller.decommission_broker(h.image, 4))          # holds nothing: only cordoned
    h.run(h.controller.maintenance(h.image, 0))
    assert h.image.broker_state(4) == "decommissioned"


def test_moves_to_a_draining_broker_are_refused():
    h = harness(brokers=(1, 2, 3, 4), replicas=(1, 2))
    h.run(h.controller.decommission_broker(h.image, 3))
    assert codes(move, h, [1, 3]) is ErrorCode.INVALID_REQUEST


def test_replacement_is_rack_aware_then_least_loaded_then_lowest_id():
    cands = {3: "a", 4: "b", 5: "b", 6: "c"}
    assert replacement_broker(cands, {3: 5, 4: 1, 5: 0, 6: 0}, removed_rack="b", used_racks={"a"}) == 5
    assert replacement_broker(cands, {3: 0, 4: 0, 5: 0, 6: 0}, removed_rack="z", used_racks={"a", "b"}) == 6
    assert replacement_broker({7: None, 8: None}, {7: 1, 8: 1}) == 7
    h = harness(brokers=(1, 2, 3, 4), replicas=(1, 2), racks={1: "a", 2: "b", 3: "a", 4: "b"})
    h.run(h.controller.decommission_broker(h.image, 1))
    assert h.image.partition("t", 0).adding_replicas == (3,)


def test_the_last_active_broker_cannot_be_decommissioned():
    h = Harness(brokers=(1,))
    assert codes(h.controller.decommission_broker, h.image, 1) is ErrorCode.POLICY_VIOLATION
    assert h.image.broker_state(1) == "active"


def test_the_index_of_running_moves_follows_replay_topic_deletion_and_snapshots():
    h = harness(brokers=(1, 2, 3, 4), partitions=3)
    move(h, [2, 3], partition=0)
    move(h, [3, 4], partition=2)
    assert h.image.moving == {("t", 0), ("t", 2)}
    assert MetadataImage.from_snapshot(h.image.to_snapshot()).moving == {("t", 0), ("t", 2)}
    expand_isr(h, [1, 2, 3], partition=0)
    assert [(n, p.partition) for n, p in h.image.reassignments()] == [("t", 2)]
    h.run(h.controller.delete_topic(h.image, "t"))
    assert h.image.moving == set() and h.image.reassignments() == []


def test_a_move_to_the_current_replicas_changes_nothing():
    h = harness(replicas=(1, 2))
    h.run([PartitionChangeRecord("t", "tid", 0, (1, 2), (1, 2), 2, 1, 1)])    # 2 leads (not preferred)
    assert h.controller.alter_partition_reassignments(
        h.image, {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2]}]}) == []
