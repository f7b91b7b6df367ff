"""Issue 25: no ISR churn after a large create. A follower that has not fetched a partition
since its leader epoch began is silent (the ISR silence rule `Partition.silent_replicas` and
the controller report `ReplicaState.silent_followers` / `silence_scan`) only when its broker's
last fetch request to this leader (`ReplicaState.fetch_request_from`, any partition, any
session) is older than the limit too: a follower broker applies a 10,000-partition create
seconds after the leader and keeps fetching its older partitions meanwhile.

Unchanged: a broker that sends nothing is silent as before (issue 24: stopped, SIGSTOPped,
cut off); a follower that fetched the partition in this epoch and then stopped naming it is
judged by its own times (dropped while acks=all waits), as before; the lag rule
(`replica.lag.time.max.ms`) still drops a follower that never fetches the partition.
"""
from __future__ import annotations

import asyncio

from partitions.clock import ManualClock
from partitions.log import record_batch as rb
from partitions.log.protocols import TopicPartition
from partitions.replication.replica_manager import ACKS_ALL, ReplicaManager
from partitions.replication.replica_state import LeaderAndIsr, ReplicaFetchRequest, ReplicaState
from tests.unit.replication.fake_log import MemoryLog, MemoryLogManager

OLD = TopicPartition("old", 0)
NEW = TopicPartition("new", 0)
LAG_MS = 30_000
SILENCE_MS = 1_500
POLL_MS = 400        # a follower's long polls reach the leader at least this often


def leader() -> ReplicaState:
    """Broker 1 leading OLD (epoch 0) with replicas (1, 2, 3), min.insync.replicas 2."""
    core = ReplicaState(1, min_isr_for=lambda topic: 2)
    core.add_replica(OLD, MemoryLog())
    core.apply_leader_and_isr(OLD, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 0), now_ms=0)
    return core


def create_new(core: ReplicaState, now_ms: int) -> object:
    """NEW is created led by 1 (a fresh leader epoch); an acks=all produce waits on it."""
    core.add_replica(NEW, MemoryLog())
    core.apply_leader_and_isr(NEW, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 0), now_ms=now_ms)
    info, _ = core.append_as_leader(NEW, rb.build_batch([rb.Record(None, b"v", timestamp=1)]),
                                    required_min_isr=2)
    waiter = object()
    assert core.add_ack_waiter(NEW, waiter, info.last_offset).completed == []
    return waiter


def request(core: ReplicaState, broker: int, now_ms: int, *tps: TopicPartition) -> None:
    """One fetch request of `broker` naming `tps` at their log end (as the shell records it)."""
    core.fetch_request_from(broker, now_ms)
    for tp in tps:
        core.replica_read(tp, replica_id=broker, offset=core.logs[tp].log_end_offset, leader_epoch=0,
                          max_bytes=1 << 20, now_ms=now_ms)


def isr_changes(core: ReplicaState, now_ms: int) -> dict:
    return {(p.topic, p.partition): isr for p, isr in core.isr_changes(
        now_ms, lambda topic: LAG_MS, replica_fetch_silence_max_ms=SILENCE_MS)}


def test_a_follower_whose_broker_fetches_other_partitions_is_not_silent_before_it_names_a_new_one():
    core, now = leader(), 0
    request(core, 2, now, OLD)
    request(core, 3, now, OLD)
    waiter = create_new(core, now)
    for _ in range(8):                      # 3.2 s: 2 names NEW at once, 3 only fetches OLD
        now += POLL_MS
        request(core, 2, now, OLD, NEW)
        request(core, 3, now, OLD)
        assert isr_changes(core, now) == {}
        assert core.silent_followers(now, SILENCE_MS) == {}
        assert core.silence_scan(now, SILENCE_MS) == ({}, set())
    # 3 applies the create and fetches NEW: the produce is committed, nobody left the ISR
    request(core, 3, now, OLD, NEW)
    assert core.ack_waiters(NEW) == [] and core.partitions[NEW].high_watermark == 1
    assert waiter is not None and core.partitions[NEW].isr == [1, 2, 3]


def test_a_follower_broker_silent_entirely_is_dropped_and_reported_as_before():
    core, now = leader(), 0
    request(core, 2, now, OLD)
    request(core, 3, now, OLD)            # 3's last request, then it stops (SIGSTOP, cut link)
    now += 1_000
    create_new(core, now)                 # the epoch starts after 3's last request
    for _ in range(3):                    # 1.2 s after the epoch start: not yet
        now += POLL_MS
        request(core, 2, now, OLD, NEW)
        assert isr_changes(core, now) == {}
    now += 400                            # 1.6 s since the epoch start, 2.6 s since 3's request
    request(core, 2, now, OLD, NEW)
    assert isr_changes(core, now) == {("new", 0): [1, 2]}
    # reported silent since the epoch start (the later of the two), OLD's silence is longer
    assert core.silent_followers(now, SILENCE_MS) == {3: 2_600}
    followers, parts = core.silence_scan(now, SILENCE_MS)
    assert followers == {3: 2_600} and parts == {OLD, NEW}


def test_a_broker_silent_since_its_last_request_counts_from_that_request():
    core, now = leader(), 0
    request(core, 2, now, OLD)
    request(core, 3, now, OLD)
    create_new(core, now)
    for _ in range(2):                    # 3 fetches OLD for 0.8 s after the create, then stops
        now += POLL_MS
        request(core, 2, now, OLD, NEW)
        request(core, 3, now, OLD)
    last_3 = now
    while now - last_3 <= SILENCE_MS:
        assert isr_changes(core, now) == {} and core.silent_followers(now, SILENCE_MS) == {}
        now += 100
        request(core, 2, now, OLD, NEW)
    assert isr_changes(core, now) == {("new", 0): [1, 2]}
    assert core.silent_followers(now, SILENCE_MS) == {3: now - last_3}


def test_a_follower_that_fetched_the_partition_then_stopped_naming_it_is_still_dropped():
    """Kept on purpose: it applied this epoch and fetched, so not naming the partition any
    more (its fetcher backs it off, its log failed) holds acks=all back; the per-partition
    rule drops it while acks=all waits (Kafka would wait for the lag time)."""
    core, now = leader(), 0
    create_new(core, now)
    request(core, 2, now, OLD, NEW)
    request(core, 3, now, OLD)
    core.fetch_request_from(3, now)
    core.replica_read(NEW, replica_id=3, offset=0, leader_epoch=0, max_bytes=0, now_ms=now)   # behind
    for _ in range(4):
        now += POLL_MS
        request(core, 2, now, OLD, NEW)
        request(core, 3, now, OLD)          # its broker fetches, but NEW no more
    assert isr_changes(core, now) == {("new", 0): [1, 2]}
    assert core.silent_followers(now, SILENCE_MS) == {3: 4 * POLL_MS}


def test_the_lag_rule_still_drops_a_follower_that_never_fetches_the_partition():
    core, now = leader(), 0
    core.add_replica(NEW, MemoryLog())
    core.apply_leader_and_isr(NEW, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 0), now_ms=now)
    core.append_as_leader(NEW, rb.build_batch([rb.Record(None, b"v", timestamp=1)]))   # acks=1
    while now <= LAG_MS:
        assert isr_changes(core, now) == {}
        now += 1_000
        request(core, 2, now, OLD, NEW)
        request(core, 3, now, OLD)
    assert isr_changes(core, now) == {("new", 0): [1, 2]}


def test_the_rules_visit_only_the_new_partition_while_its_follower_has_not_fetched_it():
    """R's quiet-partition optimisation (issue 25): caught-up session partitions stay
    unvisited; the new one is loud until its follower fetches it, then quiet again."""
    clock = ManualClock()
    rm = ReplicaManager(1, MemoryLogManager(), clock=clock, min_insync_replicas=2)
    n = 200
    for p in range(n):
        tp = TopicPartition("old", p)
        rm.core.add_replica(tp, rm.log_manager.get_or_create("old", p))
        rm.core.apply_leader_and_isr(tp, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 0), now_ms=clock.now_ms())
    olds = [ReplicaFetchRequest("old", p, 0, 0) for p in range(n)]
    sessions = {}

    async def poll(b: int, reqs: list) -> None:
        sid, epoch = sessions.get(b, (0, 0))
        sid, err, _ = await rm.replica_fetch_session(b, sid, epoch, reqs, [], max_bytes=1 << 20,
                                                     partition_max_bytes=1 << 20, max_wait_ms=0)
        assert err is None
        sessions[b] = (sid, epoch + 1)

    async def run():
        for b in (2, 3):
            await poll(b, olds)
        clock.advance(300)
        for b in (2, 3):
            await poll(b, [])
        assert rm.isr_changes(LAG_MS) == []
        rm.core.add_replica(NEW, rm.log_manager.get_or_create("new", 0))
        rm.core.apply_leader_and_isr(NEW, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 0), now_ms=clock.now_ms())
        produce = asyncio.ensure_future(rm.append("new", 0, rb.build_batch([rb.Record(None, b"v")]),
                                                  acks=ACKS_ALL, timeout_ms=60_000))
        await asyncio.sleep(0)
        visits = []
        for _ in range(10):               # 3 s: both followers poll their sessions, NEW unnamed
            clock.advance(300)
            for b in (2, 3):
                await poll(b, [])
            before = rm.core.rule_visits
            assert rm.isr_changes(LAG_MS) == []
            assert rm.core.silence_scan(clock.now_ms(), SILENCE_MS) == ({}, set())
            visits.append(rm.core.rule_visits - before)
        assert visits == [2] * 10          # NEW, once by each rule; the 200 quiet partitions never
        for b in (2, 3):                   # they apply the create and name NEW
            await poll(b, [ReplicaFetchRequest("new", 0, 0, 0)])
        for b in (2, 3):
            await poll(b, [ReplicaFetchRequest("new", 0, 1, 0)])
        await asyncio.wait_for(produce, 1)
        for _ in range(2):                 # the HW news is read, then the next restate attaches NEW
            clock.advance(300)
            for b in (2, 3):
                await poll(b, [])
            assert rm.isr_changes(LAG_MS) == []
        before = rm.core.rule_visits
        assert rm.isr_changes(LAG_MS) == [] and rm.core.rule_visits == before   # quiet again
    asyncio.run(run())


def test_every_fetch_request_is_recorded_with_or_without_a_session():
    clock = ManualClock()
    rm = ReplicaManager(1, MemoryLogManager(), clock=clock)
    rm.core.add_replica(OLD, rm.log_manager.get_or_create("old", 0))
    rm.core.apply_leader_and_isr(OLD, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 0), now_ms=0)

    async def run():
        clock.advance(100)
        await rm.replica_fetch(2, [ReplicaFetchRequest("old", 0, 0, 0)], max_bytes=100, partition_max_bytes=100)
        clock.advance(100)
        sid, _, _ = await rm.replica_fetch_session(3, 0, 0, [ReplicaFetchRequest("old", 0, 0, 0)], [],
                                                   max_bytes=100, partition_max_bytes=100)
        t0 = clock.now_ms() - 200
        assert rm.core.fetch_requests_ms == {2: t0 + 100, 3: t0 + 200}
        clock.advance(100)
        await rm.replica_fetch_session(3, sid, 1, [], [], max_bytes=100, partition_max_bytes=100)
        clock.advance(100)
        await rm.replica_fetch_session(2, 12345, 7, [], [], max_bytes=100, partition_max_bytes=100)  # session error
        assert rm.core.fetch_requests_ms == {2: t0 + 400, 3: t0 + 300}
    asyncio.run(run())


def test_a_long_silence_names_an_example_partition_with_its_times():
    """`ReplicaState.silence_example`: the log line of a long silence says which partition,
    how long ago the follower fetched it and its broker fetched anything (issue 25: followers
    silent on a few partitions for minutes while fetching the others)."""
    core = leader()
    create_new(core, now_ms=0)
    request(core, 2, 100, OLD, NEW)
    request(core, 3, 100, OLD, NEW)
    for t in range(500, 12_000, POLL_MS):   # 2 goes on fetching OLD only; 3 fetches both
        request(core, 2, t, OLD)
        request(core, 3, t, OLD, NEW)
    example = core.silence_example(2, 12_000, SILENCE_MS)
    assert example is not None and example.startswith("new-0 ")
    assert "last_fetch_time_ms=100" in example and "its session clock: none" in example
    assert core.silence_example(3, 12_000, SILENCE_MS) is None


def behind(core: ReplicaState, broker: int, now_ms: int) -> None:
    """One fetch request of `broker`: OLD at its end, NEW at offset 0 (it lacks the record
    the acks=all produce waits for)."""
    request(core, broker, now_ms, OLD)
    core.replica_read(NEW, replica_id=broker, offset=0, leader_epoch=0, max_bytes=0, now_ms=now_ms)


def test_a_broker_whose_requests_come_slowly_is_judged_against_its_own_rhythm():
    """A loaded leader answers each request of a live follower in seconds (issue 25: 2-5 s
    during a 10,000-partition create): the follower's requests come that far apart, and the
    1.5 s rule dropped it from thousands of ISRs it rejoined moments later. The silence
    limit stretches to SILENCE_GAP_FACTOR times the broker's usual gap between requests
    (capped at SILENCE_STRETCH_MAX times the limit); a broker that stops is still dropped."""
    from partitions.replication.partition import SILENCE_GAP_FACTOR, silence_limit_ms
    core, now = leader(), 0
    gap = 2_500
    for _ in range(4):                    # the followers' rhythm on the loaded leader
        request(core, 2, now, OLD)
        request(core, 3, now, OLD)
        now += gap
    create_new(core, now)
    for _ in range(6):                    # both followers: a request every 2.5 s, behind on NEW
        behind(core, 2, now)
        behind(core, 3, now)
        now += 2_000                      # 2 s after a request: past 1.5 s, inside 3 gaps
        assert isr_changes(core, now) == {}, core.fetch_request_gap_ms
        now += gap - 2_000
    assert abs(core.fetch_request_gap_ms[3] - gap) < 1
    # 2 goes on; 3 stops: out once 3 gaps have passed, not before
    last_3 = now - gap
    limit = silence_limit_ms(SILENCE_MS, core.fetch_request_gap_ms[3])
    assert limit == SILENCE_GAP_FACTOR * gap
    while now - last_3 <= limit:
        behind(core, 2, now)
        assert isr_changes(core, now) == {}
        now += 500
    behind(core, 2, now)
    assert isr_changes(core, now) == {("new", 0): [1, 2]}
    # the shrink and the expansion agree: caught up and fetching at its rhythm, 3 rejoins,
    # and 2 s of silence later (past 1.5 s, inside 3 gaps) it is not dropped again
    core.apply_leader_and_isr(NEW, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2), 1), now_ms=now)
    now += 1
    request(core, 3, now, OLD, NEW)
    request(core, 2, now, OLD, NEW)
    assert isr_changes(core, now) == {("new", 0): [1, 2, 3]}
    core.apply_leader_and_isr(NEW, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 2), now_ms=now)
    waiter = object()
    info, _ = core.append_as_leader(NEW, rb.build_batch([rb.Record(None, b"w", timestamp=2)]), required_min_isr=2)
    core.add_ack_waiter(NEW, waiter, info.last_offset)
    now += 2_000
    behind_at = core.logs[NEW].log_end_offset - 1
    core.fetch_request_from(2, now)
    core.replica_read(NEW, replica_id=2, offset=behind_at, leader_epoch=0, max_bytes=0, now_ms=now)
    assert isr_changes(core, now) == {}


def test_the_rhythm_ignores_outages_and_a_broker_polling_at_the_usual_pace_keeps_the_limit():
    """A gap longer than FETCH_GAP_SAMPLE_MAX_MS (the follower was stopped or cut off) is not
    its rhythm: after it comes back, a stop is judged by the usual limit again."""
    from partitions.replication.replica_state import FETCH_GAP_SAMPLE_MAX_MS
    core, now = leader(), 0
    create_new(core, now)
    for _ in range(6):
        behind(core, 2, now)
        behind(core, 3, now)
        now += POLL_MS
    now += FETCH_GAP_SAMPLE_MAX_MS + 1    # an outage of both
    for _ in range(3):
        behind(core, 2, now)
        behind(core, 3, now)
        now += POLL_MS
    assert core.fetch_request_gap_ms[3] <= POLL_MS
    last_3 = now - POLL_MS
    while now - last_3 <= SILENCE_MS:
        behind(core, 2, now)
        assert isr_changes(core, now) == {}
        now += 100
    behind(core, 2, now)
    assert isr_changes(core, now) == {("new", 0): [1, 2]}


def test_a_shrink_is_withdrawn_when_its_follower_fetched_before_it_was_sent():
    """The ISR check proposes; the AlterPartition goes out later (slices, earlier batches of
    1,000 waiting for the controller). `shrink_still_due` judges the proposal again at send
    time: a dropped follower that fetched meanwhile keeps its place; a still-silent one goes;
    a change that adds members always goes (its additions already hold the HW)."""
    core, now = leader(), 0
    request(core, 2, now, OLD)
    request(core, 3, now, OLD)
    create_new(core, now)
    now += SILENCE_MS + 100
    behind(core, 2, now)                  # 2 fetches (behind on NEW); 3 has sent nothing since
    proposed = isr_changes(core, now)
    assert proposed == {("new", 0): [1, 2]}   # 3 is dropped (one may leave: min.insync.replicas 2)
    part = core.partitions[NEW]
    assert core.shrink_still_due(part, [1, 2], now, LAG_MS, replica_fetch_silence_max_ms=SILENCE_MS)
    behind(core, 3, now + 50)             # 3 fetches before the request goes out
    assert not core.shrink_still_due(part, [1, 2], now + 60, LAG_MS, replica_fetch_silence_max_ms=SILENCE_MS)
    # lagging for the lag time: out by the lag rule, fetching or not
    assert core.shrink_still_due(part, [1, 2], now + LAG_MS + 1, LAG_MS, replica_fetch_silence_max_ms=SILENCE_MS)
    # an expansion is always still due; a partition no longer led is not
    assert core.shrink_still_due(part, [1, 2, 3, 4], now, LAG_MS)
    core.apply_leader_and_isr(NEW, LeaderAndIsr(2, 1, (1, 2, 3), (1, 2, 3), 1), now_ms=now)
    assert not core.shrink_still_due(part, [1, 2], now, LAG_MS, replica_fetch_silence_max_ms=SILENCE_MS)


def test_a_partition_in_the_followers_session_counts_as_heard_at_its_brokers_last_request():
    """Every request of a fetch session restates the partitions it does not name; a loaded
    leader restates them seconds after the request arrived (issue 25: dropped followers
    whose broker's request had come 100-600 ms before). For the ISR rules a partition in
    the follower's open session counts as heard at its broker's last request; one it
    forgot (no longer in the session) is judged by its own times, as before."""
    core, now = leader(), 0
    create_new(core, now)
    lv = core.open_liveness(3, broker_epoch=10)
    lv.loose.update({OLD, NEW})            # 3's session holds both
    behind(core, 2, now)
    behind(core, 3, now)                   # NEW fetched once, behind
    for _ in range(8):                     # 3.2 s: 3's requests arrive, NEW not restated yet
        now += POLL_MS
        behind(core, 2, now)
        core.fetch_request_from(3, now)
        assert isr_changes(core, now) == {}
    assert "in its fetch session True" in core.describe_follower(core.partitions[NEW], 3, now)
    lv.loose.discard(NEW)                  # 3 forgot NEW: its own times judge it
    assert isr_changes(core, now) == {("new", 0): [1, 2]}
    lv.loose.add(NEW)
    lv.close()                             # the session ended: no session, own times
    assert isr_changes(core, now) == {("new", 0): [1, 2]}


def test_a_follower_whose_request_the_leader_is_still_serving_is_not_silent():
    """While the leader works on a follower's session request (seconds when loaded: its
    slices, the restate, the answer), the follower can send nothing more; the ISR rules
    count it heard until the answer (`fetch_request_started` / `fetch_request_ended`).
    After the answer its silence counts from then; a partition it forgot is judged by its
    own times even meanwhile."""
    core, now = leader(), 0
    create_new(core, now)
    lv = core.open_liveness(3, broker_epoch=10)
    lv.loose.update({OLD, NEW})
    behind(core, 2, now)
    behind(core, 3, now)
    core.fetch_request_started(3, now)      # a request of 3 the leader is slow to serve
    for _ in range(10):                     # 4 s
        now += POLL_MS
        behind(core, 2, now)
        assert isr_changes(core, now) == {}
        assert core.shrink_still_due(core.partitions[NEW], [1, 2], now, LAG_MS,
                                     replica_fetch_silence_max_ms=SILENCE_MS) is False
    core.fetch_request_ended(3, now)        # answered; 3 then sends nothing (stopped)
    answered = now
    while now - answered <= SILENCE_MS:
        behind(core, 2, now)
        assert isr_changes(core, now) == {}
        now += 100
    behind(core, 2, now)
    assert isr_changes(core, now) == {("new", 0): [1, 2]}
    # forgotten while a request is being served: its own times judge it
    core.fetch_request_started(3, now)
    lv.loose.discard(NEW)
    assert isr_changes(core, now) == {("new", 0): [1, 2]}
    core.fetch_request_ended(3, now)
    assert core.fetch_requests_in_flight == {}


def test_the_example_looks_at_a_bounded_number_of_partitions(monkeypatch):
    """The example walks at most SILENCE_EXAMPLE_SCAN_MAX partitions (it walked every loud
    one: 7% of a survivor's loop after a kill -9 at 100,000 partitions, issue 25)."""
    from partitions.replication import replica_state
    core = leader()
    create_new(core, now_ms=0)
    request(core, 2, 100, OLD, NEW)
    for t in range(500, 12_000, POLL_MS):
        request(core, 2, t, OLD)
    visited = []
    real = core._silent_isr_members
    core._silent_isr_members = lambda part, *a: visited.append(part) or real(part, *a)
    assert core.silence_example(2, 12_000, SILENCE_MS) is not None
    monkeypatch.setattr(replica_state, "SILENCE_EXAMPLE_SCAN_MAX", 1)
    visited.clear()
    core.silence_example(2, 12_000, SILENCE_MS)
    assert len(visited) <= 1
