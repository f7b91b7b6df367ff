"""Issue 25, failover at scale: once the metadata shows a follower broker fenced, the ISR,
silence and isolation rules no longer visit the partitions it followed (the controller takes
it out of their ISRs itself); unfenced again, every led partition is looked at once more.
And a metadata change applies the leaderships this broker takes up before its other
partitions (a fencing at 30,000 partitions also carries 20,000 ISR-only changes)."""
from __future__ import annotations

import asyncio

from partitions.clock import ManualClock
from partitions.log.protocols import TopicPartition
from partitions.replication.replica_manager import ReplicaManager
from partitions.replication.replica_state import LeaderAndIsr, ReplicaFetchRequest
from tests.unit.replication.fake_log import MemoryLogManager

LAG_MS = 30_000
SILENCE_MS = 1_500
N = 300


def test_a_fenced_followers_partitions_are_not_visited_and_are_again_once_it_is_unfenced():
    clock = ManualClock()
    rm = ReplicaManager(1, MemoryLogManager(), clock=clock, min_insync_replicas=2)
    for p in range(N):
        tp = TopicPartition("t", p)
        rm.core.add_replica(tp, rm.log_manager.get_or_create("t", p))
        rm.core.apply_leader_and_isr(tp, LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 0), now_ms=clock.now_ms())
    reqs = [ReplicaFetchRequest("t", p, 0, 0) for p in range(N)]
    sessions = {}

    async def poll(b: int, named: list) -> None:
        sid, epoch = sessions.get(b, (0, 0))
        sid, err, _ = await rm.replica_fetch_session(b, sid, epoch, named, [], max_bytes=1 << 20,
                                                     partition_max_bytes=1 << 20, max_wait_ms=0)
        assert err is None
        sessions[b] = (sid, epoch + 1)

    def visits_of_one_check() -> int:
        before = rm.core.rule_visits
        rm.isr_changes(LAG_MS)
        rm.core.silence_scan(clock.now_ms(), SILENCE_MS)
        return rm.core.rule_visits - before

    async def run():
        for b in (2, 3):
            await poll(b, reqs)
        clock.advance(300)
        for b in (2, 3):
            await poll(b, [])
        assert visits_of_one_check() == 0            # all quiet
        for _ in range(10):                          # broker 3 dies: only 2 polls
            clock.advance(300)
            await poll(2, [])
        assert visits_of_one_check() == N            # its clock aged past the silence limit: all of them
        silent, _ = rm.core.silence_scan(clock.now_ms(), SILENCE_MS)
        assert set(silent) == {3}
        before = rm.core.rule_visits          # the report alone reads broker 3's clock once
        assert rm.core.silent_followers_by_clock(clock.now_ms(), SILENCE_MS) == silent
        assert rm.core.rule_visits == before
        rm.core.set_fenced_brokers({3})              # the metadata shows it fenced
        assert visits_of_one_check() == 0
        assert rm.core.silence_scan(clock.now_ms(), SILENCE_MS)[0] == {}
        rm.core.set_fenced_brokers(set())            # unfenced (it came back): looked at again
        assert visits_of_one_check() >= N
    asyncio.run(run())


def test_leaderships_taken_up_are_applied_before_the_other_partitions():
    from tests.rigs.metadata_image import ImageBuilder
    b = ImageBuilder()
    b.create("t", 60)
    rm = ReplicaManager(1, MemoryLogManager(), clock=ManualClock(), min_insync_replicas=2)
    applied = []
    real = rm.core.apply_leader_and_isr

    def recording(tp, state, **kw):
        applied.append((tp, state.leader))
        return real(tp, state, **kw)
    rm.core.apply_leader_and_isr = recording

    async def run():
        await rm.apply_metadata(b.image)
        led_before = {tp for tp, part in rm.partitions.items() if part.is_leader}
        records = b.controller.fence_broker(b.image, 2)
        b.write(records)
        applied.clear()
        await rm.apply_metadata(b.image, changed=records)
        taken = [tp for tp, leader in applied if leader == 1 and tp not in led_before]
        assert taken and len(taken) < len(applied)
        assert [tp for tp, _ in applied[:len(taken)]] == taken   # every leadership taken up comes first
        assert rm.core.fenced_brokers == {2}
    asyncio.run(run())
