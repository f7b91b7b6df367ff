"""ReplicaState's index of led partitions (issue 25): the ISR, silence and isolation rules
walk only the partitions this broker leads, so the index must follow every role change."""
from partitions.clock import ManualClock
from partitions.log.protocols import TopicPartition
from partitions.replication.replica_state import LeaderAndIsr, ReplicaState
from tests.unit.replication.fake_log import MemoryLog

SILENCE_MS = 1000


def core_with(n: int) -> tuple[ReplicaState, list]:
    core = ReplicaState(1)
    tps = [TopicPartition("t", p) for p in range(n)]
    for tp in tps:
        core.add_replica(tp, MemoryLog())
    return core, tps


def test_led_index_follows_leader_and_follower_changes_and_removal():
    core, tps = core_with(4)
    for i, tp in enumerate(tps):   # leads 0 and 2, follows 1 and 3
        core.apply_leader_and_isr(tp, LeaderAndIsr(1 if i % 2 == 0 else 2, 0, (1, 2), (1, 2), 0), now_ms=0)
    assert set(core.led) == {tps[0], tps[2]}
    core.apply_leader_and_isr(tps[1], LeaderAndIsr(1, 1, (1, 2), (1, 2), 1), now_ms=0)   # takes over
    core.apply_leader_and_isr(tps[0], LeaderAndIsr(2, 1, (1, 2), (1, 2), 1), now_ms=0)   # hands over
    core.remove_replica(tps[2])
    assert set(core.led) == {tps[1]}
    assert all(core.partitions[tp].is_leader == (tp in core.led) for tp in core.partitions)


def test_a_partition_taken_over_counts_for_silence_and_isolation():
    clock = ManualClock()
    core, tps = core_with(2)
    core.apply_leader_and_isr(tps[0], LeaderAndIsr(2, 0, (1, 2), (1, 2), 0), now_ms=clock.now_ms())
    core.apply_leader_and_isr(tps[1], LeaderAndIsr(2, 0, (1, 2), (1, 2), 0), now_ms=clock.now_ms())
    clock.advance(100)
    core.apply_leader_and_isr(tps[1], LeaderAndIsr(1, 1, (1, 2), (1, 2), 1), now_ms=clock.now_ms())
    core.replica_read(tps[1], replica_id=2, offset=0, leader_epoch=1, max_bytes=1 << 20, now_ms=clock.now_ms())
    clock.advance(3000)            # follower 2 stopped fetching the partition we now lead
    assert core.silent_followers(clock.now_ms(), SILENCE_MS) == {2: 3000}
    core.update_isolation(clock.now_ms(), 10_000, leader_lease_ms=5000, replica_silence_report_ms=SILENCE_MS)
    assert core.suspended == {tps[1]}
    core.update_isolation(clock.now_ms(), None, leader_lease_ms=5000, replica_silence_report_ms=SILENCE_MS)
    assert core.suspended == set()  # a heartbeat succeeded: resumed, no walk needed


def test_silence_scan_answers_both_rules_in_one_walk():
    clock = ManualClock()
    core, tps = core_with(6)
    for i, tp in enumerate(tps):   # leads 0..3 with followers 2 and 3, follows 4 and 5
        core.apply_leader_and_isr(tp, LeaderAndIsr(1 if i < 4 else 2, 0, (1, 2, 3), (1, 2, 3), 0),
                                  now_ms=clock.now_ms())
    for tp in tps[:4]:
        core.replica_read(tp, replica_id=2, offset=0, leader_epoch=0, max_bytes=1 << 20, now_ms=clock.now_ms())
        core.replica_read(tp, replica_id=3, offset=0, leader_epoch=0, max_bytes=1 << 20, now_ms=clock.now_ms())
    clock.advance(2000)
    for tp in tps[:2]:             # 3 keeps fetching 0 and 1; 2 went silent everywhere
        core.replica_read(tp, replica_id=3, offset=0, leader_epoch=0, max_bytes=1 << 20, now_ms=clock.now_ms())
    walked = []
    real = core._silent_isr_members
    core._silent_isr_members = lambda part, now, ms: walked.append(part) or real(part, now, ms)
    followers, parts = core.silence_scan(clock.now_ms(), SILENCE_MS)
    assert len(walked) == 4        # the led partitions, once each
    assert followers == core.silent_followers(clock.now_ms(), SILENCE_MS) == {2: 2000, 3: 2000}
    assert parts == set(tps[:4])   # each has a silent ISR member (2)
    core.update_isolation(clock.now_ms(), 10_000, leader_lease_ms=5000, replica_silence_report_ms=SILENCE_MS,
                          silent_partitions={tps[1]})
    assert core.suspended == {tps[1]}
