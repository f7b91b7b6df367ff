"""An isolated leader stops taking writes it cannot replicate (issue 24, docs/AVAILABILITY.md
part D; KIP-966's rule), on the pure replica core with a `ManualClock`.

A led partition is suspended while the broker's heartbeats have failed for the leader lease
(session timeout minus one heartbeat interval) AND one of its ISR followers stopped fetching:
produce answers NOT_LEADER_OR_FOLLOWER (acks=1 included: such writes would be truncated once
the controller moves the leadership), waiting acks=all produces fail with it. A controller
quorum that is down while followers replicate does not stop the partition, nor does anything
stop a partition without followers."""
from __future__ import annotations

import pytest

from partitions.clock import ManualClock
from partitions.errors import ErrorCode, KraftlogError
from partitions.log import record_batch as rb
from partitions.log.protocols import TopicPartition
from partitions.replication.replica_state import LeaderAndIsr, ReplicaState
from tests.unit.replication.fake_log import MemoryLog

TP = TopicPartition("t", 0)
SOLO = TopicPartition("solo", 0)
LEASE_MS = 7000
SILENCE_MS = 1000


def batch() -> bytes:
    return rb.build_batch([rb.Record(None, b"v", timestamp=1)])


def leader_core(clock: ManualClock) -> ReplicaState:
    core = ReplicaState(1, min_isr_for=lambda topic: 2 if topic == "t" else 1)
    core.add_replica(TP, MemoryLog())
    core.add_replica(SOLO, MemoryLog())
    core.apply_leader_and_isr(TP, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 0), now_ms=clock.now_ms())
    core.apply_leader_and_isr(SOLO, LeaderAndIsr(1, 0, (1,), (1,), 0), now_ms=clock.now_ms())
    return core


def fetch(core: ReplicaState, clock: ManualClock, *followers: int) -> None:
    for r in followers:
        core.replica_read(TP, replica_id=r, offset=core.logs[TP].log_end_offset, leader_epoch=0,
                          max_bytes=1 << 20, now_ms=clock.now_ms())


def isolate(core: ReplicaState, clock: ManualClock, heartbeat_silence_ms):
    return core.update_isolation(clock.now_ms(), heartbeat_silence_ms, leader_lease_ms=LEASE_MS,
                                 replica_silence_report_ms=SILENCE_MS)


def code_of(fn) -> ErrorCode:
    with pytest.raises(KraftlogError) as e:
        fn()
    return e.value.code


def test_cut_off_from_controller_and_followers_the_leader_suspends_and_fails_its_waiters():
    clock = ManualClock()
    core = leader_core(clock)
    fetch(core, clock, 2, 3)
    info, _ = core.append_as_leader(TP, batch(), required_min_isr=2)
    waiter = object()
    core.add_ack_waiter(TP, waiter, info.last_offset)
    clock.advance(LEASE_MS)                 # the host is cut: no heartbeat, no fetch since
    eff = isolate(core, clock, LEASE_MS - 1)
    assert core.suspended == set() and eff.failed == []      # the lease is not over yet
    eff = isolate(core, clock, LEASE_MS)
    assert core.suspended == {TP}
    assert [(w, e.code) for w, e in eff.failed] == [(waiter, ErrorCode.NOT_LEADER_OR_FOLLOWER)]
    assert code_of(lambda: core.append_as_leader(TP, batch())) is ErrorCode.NOT_LEADER_OR_FOLLOWER   # acks=1 too
    core.append_as_leader(SOLO, batch())    # no followers to lose: it keeps leading
    # the heal: a heartbeat succeeds again
    isolate(core, clock, 100)
    assert core.suspended == set()
    core.append_as_leader(TP, batch())


def test_a_controller_quorum_down_while_followers_replicate_does_not_stop_the_leader():
    clock = ManualClock()
    core = leader_core(clock)
    for _ in range(30):
        clock.advance(500)
        fetch(core, clock, 2, 3)
        isolate(core, clock, clock.now_ms())   # no heartbeat succeeded for 15 s
        assert core.suspended == set()
    core.append_as_leader(TP, batch(), required_min_isr=2)


def test_silent_followers_alone_do_not_suspend_a_leader_the_controller_hears():
    clock = ManualClock()
    core = leader_core(clock)
    clock.advance(20_000)                      # followers dead, heartbeats fine
    isolate(core, clock, 1500)
    isolate(core, clock, None)
    assert core.suspended == set()


def test_new_metadata_lifts_the_suspension_and_a_follower_is_never_suspended():
    clock = ManualClock()
    core = leader_core(clock)
    clock.advance(LEASE_MS + 1)
    isolate(core, clock, LEASE_MS + 1)
    assert core.suspended == {TP}
    # the metadata feed brought a newer state (the controller moved the leadership)
    core.apply_leader_and_isr(TP, LeaderAndIsr(2, 1, (1, 2, 3), (2, 3), 1), now_ms=clock.now_ms())
    assert core.suspended == set()
    isolate(core, clock, LEASE_MS + 5000)
    assert core.suspended == set()
