"""QuorumController decisions applied through the MetadataStateMachine (no raft, no sockets)."""
import collections
import random

import pytest

from partitions.errors import ErrorCode, KraftlogError
from metadata_quorum.placement import assign_replicas
from metadata_quorum.records import (
    FenceBrokerRecord, LeaderChangeRecord, PartitionChangeRecord, RegisterBrokerRecord, TopicRecord,
)
from metadata_harness import Harness


def codes(fn, *args, **kwargs):
    with pytest.raises(KraftlogError) as exc:
        fn(*args, **kwargs)
    return exc.value.code


# ------------------------------------------------------------------ placement
def test_round_robin_placement_spreads_leaders_and_replicas_evenly():
    brokers = {b: None for b in range(1, 7)}
    assignment = assign_replicas(brokers, 60, 3, random.Random(3))
    leaders = collections.Counter(r[0] for r in assignment)
    assert set(leaders.values()) == {10}
    assert all(len(set(r)) == 3 for r in assignment)
    counts = collections.Counter(b for r in assignment for b in r)
    assert set(counts.values()) == {30}


def test_placement_start_is_random_but_seeded():
    brokers = {b: None for b in range(1, 6)}
    starts = {assign_replicas(brokers, 1, 1, random.Random(s))[0][0] for s in range(20)}
    assert len(starts) > 1
    assert assign_replicas(brokers, 5, 2, random.Random(1)) == assign_replicas(brokers, 5, 2, random.Random(1))


def test_rack_aware_placement_puts_replicas_on_distinct_racks():
    brokers = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
    for seed in range(5):
        for replicas in assign_replicas(brokers, 30, 3, random.Random(seed)):
            assert len({brokers[b] for b in replicas}) == 3, replicas


# ------------------------------------------------------------------ topics
def test_create_topic_writes_topic_configs_and_partitions_atomically():
    h = Harness()
    records = h.create("orders", 4, 2, {"retention.ms": "60000"})
    assert isinstance(records[0], TopicRecord)
    t = h.image.topic("orders")
    assert len(t.partitions) == 4 and t.configs == {"retention.ms": "60000"}
    for p in t.partitions.values():
        assert len(p.replicas) == 2 and p.isr == p.replicas and p.leader == p.replicas[0]


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "bad name", "x/y", 5])
def test_invalid_topic_names(name):
    h = Harness()
    assert codes(h.controller.create_topic, h.image, name, 1, 1) is ErrorCode.INVALID_TOPIC_EXCEPTION


def test_create_topic_validation_errors():
    h = Harness()
    h.create("t", 1, 1)
    c, img = h.controller, h.image
    assert codes(c.create_topic, img, "t", 1, 1) is ErrorCode.TOPIC_ALREADY_EXISTS
    assert codes(c.create_topic, img, "u", 0, 1) is ErrorCode.INVALID_PARTITIONS
    assert codes(c.create_topic, img, "u", "3", 1) is ErrorCode.INVALID_PARTITIONS
    assert codes(c.create_topic, img, "u", 1, 4) is ErrorCode.INVALID_REPLICATION_FACTOR
    assert codes(c.create_topic, img, "u", 1, 0) is ErrorCode.INVALID_REPLICATION_FACTOR
    assert codes(c.create_topic, img, "u", 1, 1, {"no.such.key": "1"}) is ErrorCode.INVALID_CONFIG
    assert codes(c.create_topic, img, "u", 1, 1, {"retention.ms": "soon"}) is ErrorCode.INVALID_CONFIG
    assert codes(c.create_topic, img, "u", 1, 1, ["x"]) is ErrorCode.INVALID_CONFIG


def test_replication_factor_counts_only_unfenced_brokers():
    h = Harness()
    h.run(h.controller.fence_broker(h.image, 3))
    assert codes(h.controller.create_topic, h.image, "t", 1, 3) is ErrorCode.INVALID_REPLICATION_FACTOR
    h.create("t", 1, 2)


def test_delete_create_partitions_and_alter_configs():
    h = Harness()
    h.create("t", 2, 2)
    assert codes(h.controller.create_partitions, h.image, "t", 2) is ErrorCode.INVALID_PARTITIONS
    h.run(h.controller.create_partitions(h.image, "t", 5))
    assert sorted(h.image.topic("t").partitions) == [0, 1, 2, 3, 4]
    assert all(len(p.replicas) == 2 for p in h.image.topic("t").partitions.values())
    h.run(h.controller.alter_configs(h.image, "t", {"cleanup.policy": "compact"}))
    h.run(h.controller.alter_configs(h.image, "t", {"cleanup.policy": None, "retention.ms": "5"}))
    assert h.image.topic("t").configs == {"retention.ms": "5"}
    assert codes(h.controller.alter_configs, h.image, "t", {"retention.ms": "x"}) is ErrorCode.INVALID_CONFIG
    h.run(h.controller.delete_topic(h.image, "t"))
    assert h.image.topic("t") is None
    assert codes(h.controller.delete_topic, h.image, "t") is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# ------------------------------------------------------------------ brokers
def test_registration_is_idempotent_per_incarnation_and_epoch_is_the_record_offset():
    h = Harness(brokers=())
    before = h.image.offset
    recs = h.controller.register_broker(h.image, 1, "inc-a", "http://h:1", None, 0)
    h.run(recs)
    assert h.image.brokers[1].epoch == before and h.image.brokers[1].fenced
    assert h.controller.register_broker(h.image, 1, "inc-a", "http://h:1", None, 0) == []
    h.run(h.controller.register_broker(h.image, 1, "inc-b", "http://h:1", None, 0))
    assert h.image.brokers[1].epoch > before and h.image.brokers[1].incarnation_id == "inc-b"


def test_restart_with_new_incarnation_fences_old_isr_membership_in_the_same_batch():
    h = Harness()
    h.create("t", 3, 3)
    recs = h.controller.register_broker(h.image, 1, "inc-new", "http://h:1", None, 0)
    assert isinstance(recs[-1], RegisterBrokerRecord)
    h.run(recs)
    for p in h.image.topic("t").partitions.values():
        assert 1 not in p.isr and p.leader != 1


def test_unfence_only_after_metadata_caught_up():
    h = Harness(brokers=())
    h.run(h.controller.register_broker(h.image, 1, "i", "http://h:1", None, 0))
    epoch = h.image.brokers[1].epoch
    assert h.controller.heartbeat(h.image, 1, epoch, epoch, 0) == []  # has not seen its registration
    assert h.image.brokers[1].fenced
    h.heartbeat(1, offset=epoch + 1)
    assert not h.image.brokers[1].fenced


def test_heartbeat_with_stale_or_unknown_epoch_is_refused():
    h = Harness()
    epoch = h.image.brokers[1].epoch
    assert codes(h.controller.heartbeat, h.image, 1, epoch - 1, 100, 0) is ErrorCode.STALE_BROKER_EPOCH
    assert codes(h.controller.heartbeat, h.image, 9, 0, 100, 0) is ErrorCode.STALE_BROKER_EPOCH
    assert codes(h.controller.heartbeat, h.image, "1", 0, 100, 0) is ErrorCode.INVALID_REQUEST


def test_lease_expiry_fences_removes_from_isr_and_reelects_in_one_batch():
    h = Harness(broker_session_timeout_ms=9000)
    h.create("t", 6, 3)
    led_by_1 = [p.partition for p in h.image.topic("t").partitions.values() if p.leader == 1]
    assert led_by_1
    h.now = 5000
    h.heartbeat(2)
    h.heartbeat(3)
    assert h.controller.maintenance(h.image, 9000) == []
    h.now = 9500
    h.heartbeat(2)
    h.heartbeat(3)
    batch = h.controller.maintenance(h.image, 9500)
    assert isinstance(batch[0], FenceBrokerRecord) and batch[0].broker_id == 1
    assert all(isinstance(r, PartitionChangeRecord) for r in batch[1:])
    h.run(batch)
    assert h.image.brokers[1].fenced
    for p in h.image.topic("t").partitions.values():
        assert 1 not in p.isr
        assert p.leader in (2, 3) and p.leader in p.isr
        if p.partition in led_by_1:
            assert p.leader_epoch == 1
    # it comes back: unfenced once caught up, rejoins ISRs only through AlterPartition
    h.heartbeat(1)
    assert not h.image.brokers[1].fenced


def test_last_isr_member_fenced_leaves_partition_leaderless_until_it_returns():
    h = Harness()
    h.create("solo", 1, 1)
    leader = h.image.partition("solo", 0).leader
    h.run(h.controller.fence_broker(h.image, leader))
    p = h.image.partition("solo", 0)
    assert p.leader == -1 and p.isr == (leader,)
    h.heartbeat(leader)  # unfence: it becomes leader again in the same batch
    p = h.image.partition("solo", 0)
    assert p.leader == leader and p.leader_epoch == 2


def test_unclean_leader_election_picks_a_live_out_of_sync_replica():
    h = Harness()
    h.create("u", 1, 2, {"unclean.leader.election.enable": "true"})
    p = h.image.partition("u", 0)
    leader, follower = p.replicas
    h.run(h.controller.alter_partition(h.image, leader, h.image.brokers[leader].epoch, "u", 0, 0, 0, [leader]))
    h.run(h.controller.fence_broker(h.image, leader))
    p = h.image.partition("u", 0)
    assert p.leader == follower and p.isr == (follower,)


def test_controlled_shutdown_moves_leadership_then_fences():
    h = Harness()
    h.create("t", 6, 3)
    h.create("solo", 1, 1)
    solo_leader = h.image.partition("solo", 0).leader
    b = solo_leader
    batch = h.heartbeat(b, want_shutdown=True)
    assert h.image.brokers[b].in_controlled_shutdown and h.image.brokers[b].fenced
    assert isinstance(batch[-1], FenceBrokerRecord)
    assert not h.controller.leaderships(h.image, b)
    for p in h.image.topic("t").partitions.values():
        assert b not in p.isr and p.leader != b
    assert h.image.partition("solo", 0).leader == -1
    from metadata_quorum.controller import QuorumController
    assert QuorumController.should_shutdown(h.image, b)
    assert h.heartbeat(b, want_shutdown=True) == []  # idempotent
    h.run(h.controller.register_broker(h.image, b, "next-start", "http://h", None, 0))
    assert not h.image.brokers[b].in_controlled_shutdown


# ------------------------------------------------------------------ AlterPartition
def _alter(h, broker, **kw):
    p = h.image.partition("t", 0)
    args = dict(broker_id=broker, broker_epoch=h.image.brokers[broker].epoch, topic="t", partition=0,
                leader_epoch=p.leader_epoch, partition_epoch=p.partition_epoch, new_isr=[p.leader])
    args.update(kw)
    return h.controller.alter_partition(h.image, **args)


def test_alter_partition_shrinks_and_expands_isr_with_epoch_checks():
    h = Harness()
    h.create("t", 1, 3)
    p = h.image.partition("t", 0)
    leader = p.leader
    others = [r for r in p.replicas if r != leader]
    h.run(_alter(h, leader, new_isr=[leader]))
    p2 = h.image.partition("t", 0)
    assert p2.isr == (leader,) and p2.partition_epoch == 1 and p2.leader_epoch == 0
    # stale partition epoch
    assert codes(_alter, h, leader, partition_epoch=0, new_isr=[leader, others[0]]) is ErrorCode.INVALID_UPDATE_VERSION
    # stale broker epoch
    assert codes(_alter, h, leader, broker_epoch=0) is ErrorCode.STALE_BROKER_EPOCH
    # a leader epoch from the future
    assert codes(_alter, h, leader, leader_epoch=5) is ErrorCode.UNKNOWN_LEADER_EPOCH
    # not the leader
    assert codes(_alter, h, others[0]) is ErrorCode.NOT_LEADER_OR_FOLLOWER
    # expand back
    h.run(_alter(h, leader, new_isr=[leader] + others))
    assert set(h.image.partition("t", 0).isr) == set(p.replicas)


def test_alter_partition_fenced_leader_epoch_and_ineligible_replica():
    h = Harness(brokers=(1, 2, 3, 4))
    h.create("t", 1, 3)
    p = h.image.partition("t", 0)
    leader = p.leader
    outsider = next(b for b in (1, 2, 3, 4) if b not in p.replicas)
    assert codes(_alter, h, leader, new_isr=[leader, outsider]) is ErrorCode.INELIGIBLE_REPLICA
    follower = p.replicas[1]
    h.run(_alter(h, leader, new_isr=[leader, p.replicas[2]]))  # drop follower
    h.run(h.controller.fence_broker(h.image, follower))
    assert codes(_alter, h, leader, new_isr=[leader, p.replicas[2], follower]) is ErrorCode.INELIGIBLE_REPLICA
    # leadership moves: the old leader's epoch is fenced
    old_epoch = h.image.partition("t", 0).leader_epoch
    h.run(h.controller.fence_broker(h.image, leader))
    new_leader = h.image.partition("t", 0).leader
    assert new_leader != leader
    h.heartbeat(leader)
    assert codes(_alter, h, leader, leader_epoch=old_epoch) is ErrorCode.FENCED_LEADER_EPOCH


def test_stale_broker_epoch_cannot_change_isr():
    h = Harness()
    h.create("t", 1, 3)
    leader = h.image.partition("t", 0).leader
    old = h.image.brokers[leader].epoch
    h.run(h.controller.register_broker(h.image, leader, "restarted", "http://h", None, 0))
    assert codes(_alter, h, leader, broker_epoch=old) is ErrorCode.STALE_BROKER_EPOCH


# ------------------------------------------------------------------ preferred leaders, producer ids
def test_preferred_leader_election_when_preferred_replica_back_in_isr():
    h = Harness()
    h.create("t", 1, 3)
    pref = h.image.partition("t", 0).replicas[0]
    h.run(h.controller.fence_broker(h.image, pref))
    assert h.image.partition("t", 0).leader != pref
    h.heartbeat(pref)
    assert h.controller.maintenance(h.image, 0, rebalance=True) == []  # not in ISR yet
    p = h.image.partition("t", 0)
    h.run(h.controller.alter_partition(h.image, p.leader, h.image.brokers[p.leader].epoch, "t", 0,
                                       p.leader_epoch, p.partition_epoch, list(p.isr) + [pref]))
    h.run(h.controller.maintenance(h.image, 0, rebalance=True))
    assert h.image.partition("t", 0).leader == pref


def test_producer_id_blocks_do_not_overlap():
    h = Harness()
    blocks = []
    for b in (1, 2, 1):
        recs, first, size = h.controller.allocate_producer_ids(h.image, b, h.image.brokers[b].epoch)
        h.run(recs)
        blocks.append((first, size))
    assert blocks == [(0, 1000), (1000, 1000), (2000, 1000)]
    assert codes(h.controller.allocate_producer_ids, h.image, 1, 0) is ErrorCode.STALE_BROKER_EPOCH


# ------------------------------------------------------------------ state machine guards
def test_state_machine_rejects_conflicts_stale_epochs_and_replayed_requests():
    h = Harness()
    h.create("t", 1, 3)
    p = h.image.partition("t", 0)
    a = h.controller.alter_partition(h.image, p.leader, h.image.brokers[p.leader].epoch, "t", 0, 0, 0, [p.leader])
    b = h.controller.fence_broker(h.image, p.replicas[1])
    assert h.propose(a)["ok"]
    res = h.propose(b)  # decided on the old partition epoch
    assert not res["ok"] and res["conflict"]
    offset = h.image.offset
    stale = h.propose(h.controller.create_topic(h.image, "x", 1, 1), epoch=0)
    assert not stale["ok"] and stale["stale_epoch"] and h.image.offset == offset
    assert not h.propose([LeaderChangeRecord(2, 1)])["ok"]  # not a newer epoch
    first = h.propose(h.controller.create_topic(h.image, "y", 1, 1), request_id="r1")
    again = h.propose([TopicRecord("y2", "zz")], request_id="r1")
    assert first["ok"] and again["duplicate"] and h.image.topic("y2") is None


def test_state_machine_snapshot_restores_image_and_request_ids():
    from metadata_quorum.state_machine import MetadataStateMachine

    h = Harness()
    h.create("t", 3, 2)
    h.propose(h.controller.create_topic(h.image, "y", 1, 1), request_id="r1")
    copy = MetadataStateMachine("test-cluster")
    copy.restore(h.sm.snapshot())
    assert copy.image.to_metadata_json() == h.image.to_metadata_json()
    assert copy.seen_request("r1")
    assert copy.records_since(0, 10) is None  # too old for the tail: needs a snapshot
    assert h.sm.records_since(h.image.offset - 1, 10)[0]["offset"] == h.image.offset - 1


def test_unreachable_broker_is_fenced_at_once_but_only_the_probed_incarnation():
    h = Harness()
    h.create("t", 6, 3)
    epoch = h.image.brokers[1].epoch
    assert h.controller.fence_unreachable(h.image, 1, epoch - 1) == []   # a newer incarnation: leave it
    batch = h.controller.fence_unreachable(h.image, 1, epoch)
    assert isinstance(batch[0], FenceBrokerRecord) and batch[0].broker_id == 1
    h.run(batch)
    assert h.image.brokers[1].fenced
    assert all(p.leader != 1 and 1 not in p.isr for p in h.image.topic("t").partitions.values())
    assert h.controller.fence_unreachable(h.image, 1, epoch) == []       # already fenced
