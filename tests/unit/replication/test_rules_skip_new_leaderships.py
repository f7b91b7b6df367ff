"""Issue 25: after a fencing, a survivor takes thousands of leaderships (ISR = itself and the
other survivor, the dead broker fenced) that the other survivor's fetch session names only
seconds later. Until then the ISR check judged every one of them at every check (300 ms) and
the silence scan once a second each: at 16,667 leaderships 0.4-0.5 s and 0.2 s of CPU per
second. Now the ISR check leaves out the partitions only the lag rule can change, until it
can (`ReplicaState._isr_due`), and the silence scan reads the clock of the member's broker
instead of judging the partition again (`_silence_due_entry`). Each test drives two leaders
alike, one checked the lazy way and one by walking every led partition, and asserts the same
answers at every check, with the lazy one judging each partition once."""
from __future__ import annotations

import asyncio

from partitions.clock import ManualClock
from partitions.log.protocols import TopicPartition
from partitions.replication import replica_state as replica_state_mod
from partitions.replication.replica_manager import ReplicaManager
from partitions.replication.replica_state import LeaderAndIsr
from tests.unit.replication.test_replication_idle_cost import count_calls
from tests.unit.replication.fake_log import MemoryLogManager

LAG_MS = 3000
CHECK_MS = 300
N = 2000


class Twins:
    """Two leaders of t-0..t-(n-1) with the same state: `lazy` checked as the broker does,
    `full` by the per-partition walk (no lag floor: every led partition, nothing skipped)."""

    def __init__(self, n: int, isr: tuple, fenced: set, silence_ms: int | None = None) -> None:
        self.clock = ManualClock()
        self.n = n
        self.lazy, self.full = (ReplicaManager(1, MemoryLogManager(), clock=self.clock,
                                               replica_fetch_silence_max_ms=silence_ms) for _ in range(2))
        for rm in self.both:
            rm.core.set_fenced_brokers(fenced)
            for p in range(n):
                tp = TopicPartition("t", p)
                rm.core.add_replica(tp, rm.log_manager.get_or_create("t", p))
                rm.core.apply_leader_and_isr(tp, LeaderAndIsr(1, 1, (1, 2, 3), isr, 1), now_ms=self.clock.now_ms())

    @property
    def both(self) -> tuple:
        return self.lazy, self.full

    def check(self) -> list:
        """Both checks now: the lazy one's proposals (asserted equal to the full walk's)."""
        lazy = sorted(((p.topic, p.partition), tuple(i)) for p, i in self.lazy.isr_changes(LAG_MS))
        full = sorted(((p.topic, p.partition), tuple(i)) for p, i in self.full.core.isr_changes(
            self.clock.now_ms(), lambda topic: LAG_MS, replica_fetch_silence_max_ms=self.full.replica_fetch_silence_max_ms))
        assert lazy == full
        return lazy

    def broker_fetching_elsewhere(self, broker: int) -> None:
        """`broker` keeps sending fetch requests (for other partitions) to both leaders."""
        for rm in self.both:
            rm.core.fetch_request_from(broker, self.clock.now_ms())


def test_new_leaderships_of_a_fencing_are_judged_once_until_the_lag_rule_can_act():
    """ISR (1, 2), broker 3 fenced, broker 2 alive but not fetching these yet: no check
    before the lag time visits them again, and the shrink comes at the same check as the
    full walk's (broker 2 never fetched them)."""
    t = Twins(N, (1, 2), {3})
    visits = []
    proposals_at = None
    for step in range(1, (LAG_MS + 2 * CHECK_MS) // CHECK_MS + 1):
        t.clock.advance(CHECK_MS)
        t.broker_fetching_elsewhere(2)
        before = t.lazy.core.rule_visits
        got = t.check()
        visits.append(t.lazy.core.rule_visits - before)
        if got and proposals_at is None:
            proposals_at = step * CHECK_MS
            assert got == [(("t", p), (1,)) for p in range(N)]
            break
    assert proposals_at is not None and LAG_MS < proposals_at <= LAG_MS + CHECK_MS
    assert visits[0] == N                   # judged once...
    assert sum(visits[1:-1]) == 0, visits   # ...then left out until the lag rule can act
    assert visits[-1] == N


def test_a_fetch_of_a_replica_outside_the_isr_is_judged_at_the_next_check():
    """Broker 3 out of the ISR but not fenced (a live follower that fell behind): no
    partition is left out, so its catching up is proposed at once."""
    t = Twins(20, (1, 2), set())
    t.clock.advance(CHECK_MS)
    assert t.check() == []
    t.clock.advance(CHECK_MS)
    for rm in t.both:
        for p in range(5):
            rm.core.follower_fetched(TopicPartition("t", p), 2, 0, t.clock.now_ms())
            rm.core.follower_fetched(TopicPartition("t", p), 3, 0, t.clock.now_ms())
    assert t.check() == [(("t", p), (1, 2, 3)) for p in range(5)]


def test_an_acks_all_waiter_and_a_broker_unfenced_end_the_skip():
    """The silence rule acts while an acks=all produce waits (the skip ends when a waiter
    comes), and a fenced broker back may fetch and rejoin (every skip ends)."""
    t = Twins(10, (1, 2), {3}, silence_ms=1000)
    t.clock.advance(CHECK_MS)
    assert t.check() == []
    assert len(t.lazy.core._isr_due) == 10
    loop = asyncio.new_event_loop()
    try:
        waiter = loop.create_future()
        t.clock.advance(2000)   # broker 2 silent for 2.3 s, inside the lag time
        for rm in t.both:
            rm._carry_out(rm.core.add_ack_waiter(TopicPartition("t", 4), waiter, 0))
        assert 4 not in {p for _, p in t.lazy.core._isr_due}
        # the waiter's partition alone leaves (the silence rule), the others wait for the lag
        assert t.check() == [(("t", 4), (1,))]
        for rm in t.both:
            rm.core.set_fenced_brokers(set())
        assert not t.lazy.core._isr_due
    finally:
        waiter.cancel()
        loop.close()


def test_the_silence_scan_reads_the_brokers_clock_of_new_leaderships_and_still_hears_it_stop(monkeypatch):
    """Broker 2 sends fetch requests (for other partitions) every 100 ms, the scan runs every
    125 ms: each new leadership is judged once in 5 s (was: once a second); when broker 2
    stops, the scan reports it as the per-partition walk does, at the same pass."""
    t = Twins(N, (1, 2), {3})
    judged = count_calls(monkeypatch, replica_state_mod.ReplicaState, "_silent_isr_members")
    limit = 1000

    def scan() -> dict:
        now = t.clock.now_ms()
        lazy = t.lazy.core.silent_followers_by_clock(now, limit)
        n = len(judged)
        full: dict = {}   # the per-partition answer: every led partition judged
        for part in t.full.core.led.values():
            for r, ms in t.full.core._silent_isr_members(part, now, limit).items():
                full[r] = max(full.get(r, 0), ms)
        assert lazy == full
        del judged[n:]   # count the lazy scan's judgments only
        return lazy

    for ms in range(25, 5001, 25):
        t.clock.advance(25)
        if ms % 100 == 0:
            t.broker_fetching_elsewhere(2)
        if ms % 125 == 0:
            assert scan() == {}
    assert len(judged) == N, len(judged)
    stopped = t.clock.now_ms()   # broker 2's last request was at 5000 ms
    reported = None
    while reported is None:
        t.clock.advance(125)
        silent = scan()
        if silent:
            reported = t.clock.now_ms()
            assert set(silent) == {2}
    assert stopped + limit < reported <= stopped + limit + 125
