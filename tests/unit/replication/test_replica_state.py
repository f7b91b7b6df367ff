"""The pure replica core (partitions/replication/replica_state.py): decisions come back as
Effects, the log's copy of the high watermark is written by the core alone, and the offset
invariants hold (or fire) after every mutation."""
from __future__ import annotations

import pytest

from partitions.errors import ErrorCode, KraftlogError
from partitions.invariants import InvariantViolation
from partitions.log import record_batch as rb
from partitions.log.protocols import TopicPartition
from partitions.replication.replica_state import Effects, LeaderAndIsr, ReplicaState
from tests.unit.replication.fake_log import MemoryLog

TP = TopicPartition("t", 0)


def batch(n: int = 1) -> bytes:
    return rb.build_batch([rb.Record(None, b"v", timestamp=1) for _ in range(n)])


def leader_core(isr=(1, 2), min_isr: int = 1) -> tuple[ReplicaState, MemoryLog]:
    core = ReplicaState(1, min_isr_for=lambda topic: min_isr)
    lg = MemoryLog()
    core.add_replica(TP, lg)
    core.apply_leader_and_isr(TP, LeaderAndIsr(1, 0, (1, 2), tuple(isr), 0), now_ms=0)
    return core, lg


def test_becoming_leader_and_follower_returns_effects_not_side_effects():
    core = ReplicaState(1)
    lg = MemoryLog()
    core.add_replica(TP, lg)
    eff = core.apply_leader_and_isr(TP, LeaderAndIsr(2, 3, (1, 2), (1, 2), 5), now_ms=0)
    assert eff.start_truncation == [TP] and eff.wake_fetches == [TP]
    assert core.followed_partitions() == [("t", 0, 2, 3)]
    assert core.apply_leader_and_isr(TP, LeaderAndIsr(2, 3, (1, 2), (1, 2), 4), now_ms=0) == Effects()  # stale
    eff = core.apply_leader_and_isr(TP, LeaderAndIsr(1, 4, (1, 2), (1, 2), 6), now_ms=0)
    assert core.partitions[TP].is_leader and eff.start_truncation == []


def test_acks_all_waiters_complete_when_the_hw_passes_and_fail_when_leadership_moves():
    core, lg = leader_core()
    core.append_as_leader(TP, batch(2))
    first, second = object(), object()
    assert core.add_ack_waiter(TP, first, 1) == Effects()
    core.append_as_leader(TP, batch(1))
    core.add_ack_waiter(TP, second, 2)
    eff = core.follower_fetched(TP, 2, 2, now_ms=1)              # follower has offsets 0..1
    assert eff.completed == [first] and eff.wake_fetches == [TP]
    assert core.ack_waiters(TP) == [second]
    eff = core.apply_leader_and_isr(TP, LeaderAndIsr(2, 1, (1, 2), (2,), 1), now_ms=2)
    assert [(w, e.code) for w, e in eff.failed] == [(second, ErrorCode.NOT_LEADER_OR_FOLLOWER)]
    assert core.ack_waiters(TP) == []


def test_a_waiter_whose_records_are_already_committed_completes_at_once():
    core, _ = leader_core(isr=(1,))
    core.append_as_leader(TP, batch(3))
    w = object()
    assert core.add_ack_waiter(TP, w, 2).completed == [w]


def test_removing_a_replica_fails_its_waiters_with_unknown_topic():
    core, _ = leader_core()
    core.append_as_leader(TP, batch())
    w = object()
    core.add_ack_waiter(TP, w, 0)
    eff = core.remove_replica(TP)
    assert [(x, e.code) for x, e in eff.failed] == [(w, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    assert TP not in core.partitions and TP not in core.logs


def test_the_core_writes_the_logs_copy_of_the_hw_and_no_one_else_needs_to():
    core, lg = leader_core()
    core.append_as_leader(TP, batch(4))
    assert lg.high_watermark == 0
    core.follower_fetched(TP, 2, 3, now_ms=1)
    assert core.partitions[TP].high_watermark == lg.high_watermark == 3
    # a follower adopting the leader's HW, then truncating below it
    f = ReplicaState(2)
    flog = MemoryLog()
    f.add_replica(TP, flog)
    f.apply_leader_and_isr(TP, LeaderAndIsr(1, 0, (1, 2), (1, 2), 0), now_ms=0)
    res, _ = core.replica_read(TP, replica_id=2, offset=0, leader_epoch=0, max_bytes=1 << 20, now_ms=2)
    f.follower_append(TP, 0, res.records, res.high_watermark, res.log_start_offset)
    assert f.partitions[TP].high_watermark == flog.high_watermark == 3
    f.follower_truncate(TP, 0, 2)
    assert flog.log_end_offset == 0 and f.partitions[TP].high_watermark == flog.high_watermark == 0


def test_reads_carry_the_next_offset():
    core, _ = leader_core(isr=(1,))
    core.append_as_leader(TP, batch(3))
    core.append_as_leader(TP, batch(2))
    res = core.read_committed(TP, 1, 1 << 20)
    assert (res.records != b"", res.next_offset, res.high_watermark) == (True, 5, 5)
    assert core.read_committed(TP, 5, 1 << 20).next_offset == 5       # nothing yet: where to ask again
    res, _ = core.replica_read(TP, replica_id=2, offset=3, leader_epoch=0, max_bytes=1 << 20, now_ms=0)
    assert res.next_offset == 5


def test_fetches_under_another_leader_epoch_are_fenced():
    core, _ = leader_core()
    with pytest.raises(KraftlogError) as err:
        core.replica_read(TP, replica_id=2, offset=0, leader_epoch=-1, max_bytes=1, now_ms=0)
    assert err.value.code is ErrorCode.FENCED_LEADER_EPOCH
    with pytest.raises(KraftlogError) as err:
        core.epoch_end_offset(TP, 0, leader_epoch=7)
    assert err.value.code is ErrorCode.UNKNOWN_LEADER_EPOCH


def test_the_offset_invariant_fires_when_the_hw_passes_the_log_end():
    core, lg = leader_core(isr=(1,))
    core.append_as_leader(TP, batch(2))
    core.partitions[TP].high_watermark = 7        # a broken rule: beyond the log end offset
    with pytest.raises(InvariantViolation, match="outside"):
        core.append_as_leader(TP, batch(1))


def test_the_hw_monotonic_invariant_fires_when_a_leaders_hw_goes_back_in_its_epoch():
    core, lg = leader_core(isr=(1, 2), min_isr=2)
    core.append_as_leader(TP, batch(3))
    core.follower_fetched(TP, 2, 3, now_ms=1)
    assert core.partitions[TP].high_watermark == 3
    core.partitions[TP].high_watermark = 1        # a broken rule: backwards within leader epoch 0
    with pytest.raises(InvariantViolation, match="went back"):   # (the HW holds: ISR below min.insync)
        core.apply_leader_and_isr(TP, LeaderAndIsr(1, 0, (1, 2), (1,), 1), now_ms=2)
