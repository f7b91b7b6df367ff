"""ISR under a leader whose answers are lost while its followers' requests arrive (issue 24,
chaos fault `one-way-answers`).

Three brokers' replica cores (`ReplicaState`, what `ReplicaManager` runs) over in-memory
logs, time from a `ManualClock`, the controller committing each proposal at once. During the
fault every follower request reaches the leader (its progress is recorded) but the answer is
lost, so the follower sends the same, stale, fetch offset again after its read timeout. The
chaos run at 7ea0488 saw the ISR flap 6 times in 1.6 s: the stale offset still reached the
frozen HW, so the expand rule added the followers back, and the lag rule dropped them again
at the next check. Now an addition needs what the shrink rules need (caught up within the
lag time, not silent while acks=all waits), and silence alone never takes the ISR below
min.insync.replicas.
"""
from __future__ import annotations

from partitions.clock import ManualClock
from partitions.log import record_batch as rb
from partitions.log.protocols import TopicPartition
from partitions.replication.replica_state import LeaderAndIsr
from tests.unit.replication.fake_log import ReplicaBroker

TP = TopicPartition("t", 0)
LAG_MS = 3_000            # the chaos cluster's replica_lag_time_max_ms
SILENCE_MS = 1_500        # replica_fetch_silence_max_ms (default)
CHECK_MS = 300            # the broker's ISR check interval with these settings
READ_TIMEOUT_MS = 1_800   # a lost answer: fetch wait + REPLICA_READ_TIMEOUT_MS + back-off


def batch() -> bytes:
    return rb.build_batch([rb.Record(None, b"v", timestamp=1)])


class Rig:
    """Leader 1, followers 2 and 3; `commit` plays the controller (each proposal commits at
    once, partition epoch + 1) and records every ISR the metadata held."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.brokers = {i: ReplicaBroker(i, TP) for i in (1, 2, 3)}
        self.leader = self.brokers[1]
        self.partition_epoch = 0
        self.history: list[tuple[int, list[int]]] = []
        self.completed: set = set()
        self.failed: set = set()
        self.next_fetch: dict[int, int] = {}
        self.commit([1, 2, 3])

    def now(self) -> int:
        return self.clock.now_ms()

    def commit(self, isr: list[int]) -> None:
        state = LeaderAndIsr(1, 0, (1, 2, 3), tuple(isr), self.partition_epoch)
        self.partition_epoch += 1
        for b in self.brokers.values():
            self.effects(b.core.apply_leader_and_isr(TP, state, now_ms=self.now()))
        self.history.append((self.now(), list(isr)))

    def effects(self, eff) -> None:
        self.completed.update(eff.completed)
        self.failed.update(w for w, _ in eff.failed)

    def fetch(self, follower: int, *, answer_lost: bool = False) -> None:
        """Follower `follower` fetches at its LEO; the leader records it; the answer is
        appended unless it is lost."""
        f = self.brokers[follower]
        res, eff = self.leader.core.replica_read(TP, replica_id=follower, offset=f.log.log_end_offset,
                                                 leader_epoch=0, max_bytes=1 << 20, now_ms=self.now())
        self.effects(eff)
        if not answer_lost:
            f.core.follower_append(TP, 0, res.records, res.high_watermark, res.log_start_offset)

    def produce(self) -> object:
        info, eff = self.leader.core.append_as_leader(TP, batch())
        self.effects(eff)
        waiter = object()
        self.effects(self.leader.core.add_ack_waiter(TP, waiter, info.last_offset))
        return waiter

    def check_isr(self) -> None:
        for _, new_isr in self.leader.core.isr_changes(self.now(), lambda topic: LAG_MS,
                                                       replica_fetch_silence_max_ms=SILENCE_MS):
            self.commit(new_isr)

    @property
    def isr(self) -> list[int]:
        return sorted(self.leader.part.isr)

    def run(self, until_ms: int, *, lost_until_ms: int) -> None:
        """Advance 50 ms at a time to `until_ms`: acks=all produces every 50 ms, an ISR check
        every CHECK_MS; follower f fetches at next_fetch[f]: answered (and fetching again
        50 ms later) from `lost_until_ms` on, before that lost (next try after the read timeout)."""
        next_fetch = self.next_fetch
        while self.now() < until_ms:
            self.clock.advance(50)
            self.produce()
            for f in (2, 3):
                while next_fetch[f] <= self.now():
                    lost = next_fetch[f] < lost_until_ms
                    self.fetch(f, answer_lost=lost)
                    next_fetch[f] += READ_TIMEOUT_MS if lost else 50
            if self.now() % CHECK_MS == 0:   # the clock starts at 1,000,000: checks at +200, +500, ... ms
                self.check_isr()


def caught_up(rig: Rig) -> None:
    rig.produce()
    for f in (2, 3):
        rig.fetch(f)
        rig.fetch(f)   # at the LEO: caught up, and the HW passes everything


def test_followers_whose_answers_are_lost_are_not_added_back_on_a_stale_offset():
    """A fault longer than the lag time (or followers already behind when it starts): the
    followers keep fetching at the offset the frozen HW stands at. Before the fix they were
    added back at one check and dropped at the next, every 300 ms."""
    rig = Rig()
    caught_up(rig)
    fault_ms, heal_ms = rig.now(), rig.now() + 4_000
    rig.next_fetch = {2: fault_ms + 400, 3: fault_ms + 1_000}
    rig.run(heal_ms, lost_until_ms=heal_ms)
    during = [isr for t, isr in rig.history if fault_ms < t <= heal_ms]
    assert during, "the silent, lagging followers must leave the ISR"
    sizes = [len(isr) for isr in during]
    assert sizes == sorted(sizes, reverse=True), f"the ISR grew back while answers were lost: {during}"
    assert len(during) <= 2, during          # the silence rule once, the lag rule once
    # healed: each follower's next fetch is answered; they catch up and rejoin once, for good
    last_answered = max(rig.next_fetch.values())   # the later follower's first answered fetch
    rig.run(heal_ms + 3 * READ_TIMEOUT_MS, lost_until_ms=heal_ms)
    after = [(t, isr) for t, isr in rig.history if t > heal_ms]
    assert rig.isr == [1, 2, 3]
    assert all(len(a) < len(b) for (_, a), (_, b) in zip(after, after[1:])), after   # only growth
    assert after[-1][0] <= last_answered + 2 * CHECK_MS, (last_answered, after)   # whole within two checks


def test_silence_alone_does_not_take_the_isr_below_min_insync_replicas():
    """A chaos-length fault (1.5 s): both followers go silent at once. Dropping both left
    the ISR at the leader alone (acks=all refused, every write after the heal waiting for an
    expansion through the controller); now the longest silent one leaves, the other stays,
    so the first answered fetch after the heal commits the waiting writes."""
    rig = Rig()
    caught_up(rig)
    fault_ms = rig.now()
    heal_ms = fault_ms + 1_500
    rig.next_fetch = {2: fault_ms + 100, 3: fault_ms + 150}   # both silent at the check at 1.7 s
    first_answered = fault_ms + 100 + READ_TIMEOUT_MS   # the lost requests time out; the next is answered
    rig.run(first_answered - 50, lost_until_ms=heal_ms)
    during = [isr for t, isr in rig.history if t > fault_ms]
    assert during == [[1, 3]], during               # 2, silent longest, left; never [1]
    waiting = set(rig.leader.core.ack_waiters(TP))
    assert len(waiting) >= 20 and not waiting & rig.failed   # every write of the fault waits for follower 3
    # 3's first answered fetch brings it the records, its next one (50 ms on) acknowledges them
    rig.run(fault_ms + 150 + READ_TIMEOUT_MS + 50, lost_until_ms=heal_ms)
    assert waiting <= rig.completed        # committed without waiting for an ISR change
    rig.run(heal_ms + 2 * READ_TIMEOUT_MS, lost_until_ms=heal_ms)
    assert rig.isr == [1, 2, 3]
    assert [sorted(isr) for t, isr in rig.history if t > fault_ms] == [[1, 3], [1, 2, 3]]   # one shrink, one expand
