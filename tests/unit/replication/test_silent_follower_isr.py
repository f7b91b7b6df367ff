"""ISR shrink on a silent follower while acks=all waits (docs/AVAILABILITY.md, part C).

Three brokers' replica cores (`ReplicaState`, what `ReplicaManager` runs) over in-memory
logs, time from a `ManualClock`: a follower that sends no fetch for
`replica_fetch_silence_max_ms` while an acks=all produce waits for it is proposed out of the
ISR; without a waiting produce, or while it fetches (however far behind), only
`replica.lag.time.max.ms` applies.
"""
from __future__ import annotations

from partitions.clock import ManualClock
from partitions.log import record_batch as rb
from partitions.log.protocols import TopicPartition
from partitions.replication.replica_state import LeaderAndIsr
from tests.unit.replication.fake_log import ReplicaBroker

TP = TopicPartition("t", 0)
LAG_MS = 30_000
SILENCE_MS = 1_500


def batch(n: int = 1) -> bytes:
    return rb.build_batch([rb.Record(None, b"v", timestamp=1) for _ in range(n)])


def fetch(leader: ReplicaBroker, follower: ReplicaBroker, now_ms: int, max_bytes: int = 1 << 20) -> None:
    res, effects = leader.core.replica_read(TP, replica_id=follower.id, offset=follower.log.log_end_offset,
                                            leader_epoch=leader.part.leader_epoch, max_bytes=max_bytes,
                                            now_ms=now_ms)
    follower.core.follower_append(TP, follower.part.leader_epoch, res.records, res.high_watermark,
                                  res.log_start_offset)


def cluster(clock: ManualClock) -> tuple[ReplicaBroker, ReplicaBroker, ReplicaBroker]:
    brokers = ReplicaBroker(1, TP), ReplicaBroker(2, TP), ReplicaBroker(3, TP)
    for b in brokers:
        b.core.apply_leader_and_isr(TP, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 0), now_ms=clock.now_ms())
    return brokers


def isr_changes(leader: ReplicaBroker, clock: ManualClock, silence_ms: int | None = SILENCE_MS):
    return [isr for _, isr in leader.core.isr_changes(clock.now_ms(), lambda topic: LAG_MS,
                                                      replica_fetch_silence_max_ms=silence_ms)]


def produce_acks_all(leader: ReplicaBroker) -> object:
    """Append one record and park an acks=all waiter on it (as the produce route does)."""
    info, _ = leader.core.append_as_leader(TP, batch(), required_min_isr=2)
    waiter = object()
    assert leader.core.add_ack_waiter(TP, waiter, info.last_offset).completed == []
    return waiter


def test_a_silent_follower_holding_back_a_waiting_acks_all_produce_is_proposed_out_of_the_isr():
    clock = ManualClock()
    leader, f2, f3 = cluster(clock)
    fetch(leader, f2, clock.now_ms())
    fetch(leader, f3, clock.now_ms())
    # follower 3 stops (SIGSTOP, cut link); follower 2 keeps fetching every 500 ms
    waiter = produce_acks_all(leader)
    for _ in range(3):
        clock.advance(500)
        fetch(leader, f2, clock.now_ms())
        assert isr_changes(leader, clock) == []        # 3 silent for <= 1.5 s: a long poll, not yet silent
    clock.advance(100)
    fetch(leader, f2, clock.now_ms())
    assert isr_changes(leader, clock) == [[1, 2]]
    assert leader.core.ack_waiters(TP) == [waiter]     # completes once the metadata has ISR {1, 2}
    # the controller commits ISR {1, 2}: the HW passes the record, the produce is acknowledged
    eff = leader.core.apply_leader_and_isr(TP, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2), 1), now_ms=clock.now_ms())
    assert eff.completed == [waiter]


def test_without_a_waiting_produce_a_silent_follower_stays_until_the_lag_time():
    clock = ManualClock()
    leader, f2, f3 = cluster(clock)
    leader.core.append_as_leader(TP, batch())      # acks=1: nobody waits
    fetch(leader, f2, clock.now_ms())
    fetch(leader, f3, clock.now_ms())
    fetch(leader, f2, clock.now_ms())
    fetch(leader, f3, clock.now_ms())
    for _ in range(29):
        clock.advance(1_000)
        fetch(leader, f2, clock.now_ms())
        assert isr_changes(leader, clock) == [], clock.monotonic_ms()
    clock.advance(1_001)
    fetch(leader, f2, clock.now_ms())
    assert isr_changes(leader, clock) == [[1, 2]]    # replica.lag.time.max.ms, as before


def test_a_follower_that_fetches_but_lags_is_judged_by_the_lag_time_only():
    clock = ManualClock()
    leader, f2, f3 = cluster(clock)
    for _ in range(40):
        produce_acks_all(leader)
        clock.advance(1_000)
        fetch(leader, f2, clock.now_ms())
        fetch(leader, f2, clock.now_ms())              # 2 keeps up
        fetch(leader, f3, clock.now_ms(), max_bytes=0)   # 3 fetches (alive) but never gets further
        changes = isr_changes(leader, clock)
        if clock.monotonic_ms() <= LAG_MS:
            assert changes == [], clock.monotonic_ms()
        else:
            assert changes == [[1, 2]]
            break
    else:
        raise AssertionError("the lagging follower never left the ISR")


def test_the_rule_is_off_without_replica_fetch_silence_max_ms():
    clock = ManualClock()
    leader, f2, f3 = cluster(clock)
    fetch(leader, f2, clock.now_ms())
    fetch(leader, f3, clock.now_ms())
    produce_acks_all(leader)
    clock.advance(5_000)
    fetch(leader, f2, clock.now_ms())
    assert isr_changes(leader, clock, silence_ms=None) == []
    assert isr_changes(leader, clock) == [[1, 2]]


def test_a_silent_follower_that_already_holds_every_waited_for_record_stays():
    """A produce waiting for another (lagging) member is not held back by the silent one."""
    clock = ManualClock()
    leader, f2, f3 = cluster(clock)
    produce_acks_all(leader)
    fetch(leader, f3, clock.now_ms())
    fetch(leader, f3, clock.now_ms())                  # 3 has the record, then goes silent
    clock.advance(2_000)
    fetch(leader, f2, clock.now_ms(), max_bytes=0)     # 2 fetches but lacks it
    assert isr_changes(leader, clock) == []


def test_the_broker_setting_must_stay_well_above_the_followers_long_poll():
    from http_api.broker.config import BrokerConfig
    import pytest

    base = {"broker_id": 1, "log_dirs": ["/nonexistent/logs"], "state_dir": "/nonexistent"}
    assert BrokerConfig(**base).replica_fetch_silence_max_ms == 1500
    assert BrokerConfig(**base).replica_fetch_wait_max_ms == 500
    with pytest.raises(ValueError, match="replica_fetch_silence_max_ms"):
        BrokerConfig(**base, replica_fetch_silence_max_ms=600)      # a healthy long poll looks silent
    assert BrokerConfig(**base, replica_fetch_silence_max_ms=0).replica_fetch_silence_max_ms == 0   # off
