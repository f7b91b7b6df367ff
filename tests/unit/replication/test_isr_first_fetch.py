"""A follower's silence counts from when it could first fetch a new partition (issue 25).

After a large create the leader's epoch of each new partition starts when the leader applies
it, but a follower fetches it only once its own (slower) apply has finished. Counting its
silence from the epoch start dropped it from the ISR while acks=all produces waited, and took
it back a moment later: 8,000-15,000 ISR changes after one 10,000-partition create
(docs/SCALE.md). Now a follower that has not fetched the partition yet in this epoch, but
whose broker keeps fetching from this leader (or that this leader has not heard from yet),
counts as silent only from the epoch start plus `REPLICA_FIRST_FETCH_MAX_MS`; a broker that
stopped fetching altogether is silent `replica_fetch_silence_max_ms` after the epoch start, as
before, and `replica.lag.time.max.ms` bounds every case.

Replica cores (`ReplicaState`) over in-memory logs, time from a `ManualClock`.
"""
from __future__ import annotations

from partitions.clock import ManualClock
from partitions.log import record_batch as rb
from partitions.log.protocols import TopicPartition
from partitions.replication.partition import REPLICA_FIRST_FETCH_MAX_MS
from partitions.replication.replica_state import LeaderAndIsr, ReplicaState
from tests.unit.replication.fake_log import MemoryLog

OLD = TopicPartition("old", 0)     # followed since before the create
NEW = TopicPartition("big", 0)     # one partition of the large create
LAG_MS = 30_000
SILENCE_MS = 1_500


def batch() -> bytes:
    return rb.build_batch([rb.Record(None, b"v", timestamp=1)])


def leader_core(clock: ManualClock) -> ReplicaState:
    core = ReplicaState(1, min_isr_for=lambda topic: 2)
    for tp in (OLD, NEW):
        core.add_replica(tp, MemoryLog())
    core.apply_leader_and_isr(OLD, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 0), now_ms=clock.now_ms())
    return core


def fetch(core: ReplicaState, tp: TopicPartition, follower: int, now_ms: int) -> None:
    core.follower_request(follower, now_ms)
    core.replica_read(tp, replica_id=follower, offset=core.logs[tp].log_end_offset, leader_epoch=0,
                      max_bytes=1 << 20, now_ms=now_ms)


def create_and_produce(core: ReplicaState, clock: ManualClock) -> None:
    """The leader applies the create (its epoch of NEW starts now) and an acks=all produce
    waits on NEW."""
    core.apply_leader_and_isr(NEW, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 0), now_ms=clock.now_ms())
    info, _ = core.append_as_leader(NEW, batch(), required_min_isr=2)
    core.add_ack_waiter(NEW, object(), info.last_offset)


def isr_changes(core: ReplicaState, clock: ManualClock):
    return {tp.topic: isr for part, isr in core.isr_changes(clock.now_ms(), lambda topic: LAG_MS,
                                                            replica_fetch_silence_max_ms=SILENCE_MS)
            for tp in [TopicPartition(part.topic, part.partition)]}


def test_a_follower_still_applying_the_create_is_not_silent_before_its_first_fetch():
    clock = ManualClock()
    core = leader_core(clock)
    fetch(core, OLD, 2, clock.now_ms())
    fetch(core, OLD, 3, clock.now_ms())
    create_and_produce(core, clock)
    # both followers keep long-polling OLD (500 ms) while they apply the create for 4 s
    for _ in range(8):
        clock.advance(500)
        fetch(core, OLD, 2, clock.now_ms())
        fetch(core, OLD, 3, clock.now_ms())
        assert isr_changes(core, clock) == {}, clock.now_ms()
    # then they fetch NEW: in sync, the produce commits, the ISR never changed
    for f in (2, 3):
        fetch(core, NEW, f, clock.now_ms())
    assert core.partitions[NEW].high_watermark == 1
    assert isr_changes(core, clock) == {}


def test_a_follower_that_never_fetches_the_partition_leaves_after_the_named_limit():
    clock = ManualClock()
    core = leader_core(clock)
    create_and_produce(core, clock)
    start = clock.now_ms()
    while clock.now_ms() - start <= REPLICA_FIRST_FETCH_MAX_MS + SILENCE_MS:
        assert isr_changes(core, clock) == {}, clock.now_ms() - start
        clock.advance(250)
        fetch(core, OLD, 2, clock.now_ms())      # 2 is alive and fetches NEW too
        fetch(core, NEW, 2, clock.now_ms())
        fetch(core, OLD, 3, clock.now_ms())      # 3 is alive but never names NEW
    assert isr_changes(core, clock) == {"big": [1, 2]}


def test_a_follower_whose_broker_stopped_fetching_is_silent_from_the_epoch_start():
    """The shrink of a follower that really stopped is not delayed: its broker fetched from
    this leader before and has sent nothing for the silence time."""
    clock = ManualClock()
    core = leader_core(clock)
    fetch(core, OLD, 2, clock.now_ms())
    fetch(core, OLD, 3, clock.now_ms())          # 3's last request; then it stops
    create_and_produce(core, clock)
    for _ in range(6):
        clock.advance(250)
        fetch(core, OLD, 2, clock.now_ms())
        fetch(core, NEW, 2, clock.now_ms())
        assert isr_changes(core, clock) == {}
    clock.advance(250)
    assert isr_changes(core, clock) == {"big": [1, 2]}   # 1.5 s after the epoch start, as before
