"""Reports of silent peers (issue 24, docs/AVAILABILITY.md part B), broker side.

- `LeaderFetchState.silent_ms` (pure): how long a leader has left our requests unanswered;
- `ReplicaState.silent_followers` (pure): ISR members of led partitions that stopped fetching;
- `PeerSilenceReporter` (shell) over two in-process ReplicaManagers whose link can be cut (a
  request on a cut link never gets an answer, as on a silently isolated host): each side
  reports the other within about `replica_silence_report_ms`, once per interval, and never
  while the link is up.
"""
from __future__ import annotations

import asyncio

import pytest

from partitions.clock import ManualClock
from partitions.log.protocols import TopicPartition
from partitions.replication.fetcher_state import LeaderFetchState
from partitions.replication.replica_fetcher import ReplicaFetcherManager
from partitions.replication.replica_manager import ReplicaManager
from partitions.replication.replica_state import LeaderAndIsr, ReplicaState
from partitions.replication.silence_reporter import PeerSilenceReporter
from partitions.log.config import LogConfig
from tests.unit.replication.fake_log import MemoryLog
from tests.unit.replication.test_replica_fetcher import DirectTransport, DiskLogManager, image

SILENCE_MS = 1000
TP = TopicPartition("t", 0)


def test_fetch_state_counts_silence_from_the_oldest_unanswered_request():
    s = LeaderFetchState(1, "http://b1")
    s.set_partition("t", 0, 0)
    assert s.silent_ms(1000) == 0
    s.request_sent(1000)
    s.request_sent(1400)          # a resend after a timeout keeps the first time
    assert s.silent_ms(2500) == 1500
    s.answered()
    assert s.silent_ms(9000) == 0
    s.request_sent(9000)
    s.remove("t", 0)              # nothing followed from it any more: not our business
    assert s.silent_ms(20_000) == 0


def test_silent_followers_are_isr_members_that_stopped_fetching():
    clock = ManualClock()
    core = ReplicaState(1, min_isr_for=lambda topic: 2)
    core.add_replica(TP, MemoryLog())
    core.apply_leader_and_isr(TP, LeaderAndIsr(1, 0, (1, 2, 3, 4), (1, 2, 3), 0), now_ms=clock.now_ms())

    def fetch(r):
        core.replica_read(TP, replica_id=r, offset=0, leader_epoch=0, max_bytes=1 << 20, now_ms=clock.now_ms())

    assert core.silent_followers(clock.now_ms(), SILENCE_MS) == {}
    for _ in range(6):
        clock.advance(400)
        fetch(2)                  # 2 keeps fetching (long polls); 3 stopped; 4 is out of the ISR
    assert core.silent_followers(clock.now_ms(), SILENCE_MS) == {3: 2400}
    # a follower is judged per leader epoch: a new leadership starts its clock again
    core.apply_leader_and_isr(TP, LeaderAndIsr(1, 1, (1, 2, 3, 4), (1, 2, 3), 1), now_ms=clock.now_ms())
    assert core.silent_followers(clock.now_ms(), SILENCE_MS) == {}
    # a follower replica does not judge anyone
    core.apply_leader_and_isr(TP, LeaderAndIsr(2, 2, (1, 2, 3, 4), (1, 2, 3), 2), now_ms=clock.now_ms())
    clock.advance(5000)
    assert core.silent_followers(clock.now_ms(), SILENCE_MS) == {}


class CuttableTransport(DirectTransport):
    """DirectTransport whose requests hang (no answer, no error) while `cut` is set."""

    def __init__(self, leaders: dict) -> None:
        super().__init__(leaders)
        self.cut = asyncio.Event()
        self.healed = asyncio.Event()
        self.healed.set()

    async def _hang_while_cut(self):
        while self.cut.is_set():
            await asyncio.sleep(3600)

    async def fetch(self, url, *args, **kwargs):
        await self._hang_while_cut()
        return await super().fetch(url, *args, **kwargs)

    async def epoch_end_offsets(self, url, *args):
        await self._hang_while_cut()
        return await super().epoch_end_offsets(url, *args)


@pytest.fixture
async def cut_pair(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    rms = {b: ReplicaManager(b, DiskLogManager(tmp_path / str(b)), request_timeout_ms=2000,
                             default_log_config_factory=lambda c: LogConfig()) for b in (1, 2)}
    transport = CuttableTransport({"http://b1": rms[1], "http://b2": rms[2]})
    fetchers = {b: ReplicaFetcherManager(rms[b], transport, b, fetch_wait_max_ms=200, backoff_ms=10) for b in (1, 2)}
    img = image(leader=1, epoch=0)
    for b in (1, 2):
        await rms[b].apply_metadata(img)
        fetchers[b].sync(img)
    reports = {1: [], 2: []}

    def reporter(b):
        async def report(target, silent_ms):
            reports[b].append((target, silent_ms))
            return {"suspected": True}
        return PeerSilenceReporter(rms[b], fetchers[b], b, report, lambda other: True,
                                   replica_silence_report_ms=SILENCE_MS)
    reporters = {b: reporter(b) for b in (1, 2)}
    tasks = [asyncio.ensure_future(r.run()) for r in reporters.values()]
    yield transport, reports
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for f in fetchers.values():
        await f.close()
    for rm in rms.values():
        rm.begin_shutdown()


async def test_both_sides_of_a_cut_link_report_the_other_once_per_interval(cut_pair):
    transport, reports = cut_pair
    loop = asyncio.get_running_loop()
    await asyncio.sleep(2.0)                      # link up: the follower long-polls every 200 ms
    assert reports == {1: [], 2: []}
    transport.cut.set()
    cut_at = loop.time()
    while not (reports[1] and reports[2]):
        assert loop.time() - cut_at < 5, f"no report within 5 s of the cut: {reports}"
        await asyncio.sleep(0.02)
    took = loop.time() - cut_at
    assert took < SILENCE_MS / 1000 + 1.0, f"reported {took:.2f} s after the cut"
    assert {t for t, _ in reports[1]} == {2}      # the leader: its follower stopped fetching
    assert {t for t, _ in reports[2]} == {1}      # the follower: its leader stopped answering
    assert all(ms > SILENCE_MS for _, ms in reports[1] + reports[2])
    await asyncio.sleep(2.2)
    # repeated while the silence lasts, at most once per replica_silence_report_ms
    assert 2 <= len(reports[2]) <= 4, reports[2]
