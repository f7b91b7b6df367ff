"""A leader takes a follower's full fetch (a new fetch session naming every partition it
follows here) in slices of the event loop's time (issue 25): at 100,000 partitions a full
fetch of 30,000-60,000 partitions held a leader's loop 2-4 s in one go, other followers'
requests timed out meanwhile and started full fetches of their own. A full fetch that a
newer one of the same follower replaced while it was being built answers
FETCH_SESSION_ID_NOT_FOUND and leaves the session cache consistent."""
from __future__ import annotations

import asyncio

from partitions.replication import replica_manager
from partitions.replication.fetch_session import NO_SESSION, SESSION_NOT_FOUND
from partitions.replication.loop_share import LoopSlice
from partitions.replication.replica_manager import ReplicaManager
from partitions.replication.replica_state import ReplicaFetchRequest
from tests.unit.replication.fake_log import MemoryLogManager
from tests.unit.replication.loop_turns import LoopTurns
from tests.unit.replication.test_replica_fetcher import batch, image

N = 600


async def _leader() -> ReplicaManager:
    rm = ReplicaManager(1, MemoryLogManager())
    await rm.apply_metadata(image(leader=1, epoch=1, partitions=N))
    return rm


def _full_fetch(n: int = N) -> list:
    return [ReplicaFetchRequest("t", p, 0, 1, 0) for p in range(n)]


async def test_a_full_fetch_builds_its_session_in_slices(monkeypatch):
    monkeypatch.setattr(replica_manager, "SESSION_ADD_CHUNK_PARTITIONS", 50)
    monkeypatch.setattr(replica_manager, "LoopSlice", lambda: LoopSlice(0))   # yield at every chunk
    rm = await _leader()
    async with LoopTurns() as turns:
        before = turns.count
        sid, error, answered = await rm.replica_fetch_session(2, NO_SESSION, 0, _full_fetch(), [],
                                                              max_bytes=1 << 20, partition_max_bytes=1 << 16)
        during = turns.count - before
    assert error is None and sid != NO_SESSION
    assert len(rm.fetch_sessions.sessions[sid].partitions) == N
    assert during >= N // 50 - 1, during


async def test_a_full_fetch_replaced_while_it_is_built_answers_session_not_found(monkeypatch):
    monkeypatch.setattr(replica_manager, "SESSION_ADD_CHUNK_PARTITIONS", 50)
    monkeypatch.setattr(replica_manager, "LoopSlice", lambda: LoopSlice(0))
    rm = await _leader()
    first = asyncio.ensure_future(rm.replica_fetch_session(2, NO_SESSION, 0, _full_fetch(), [],
                                                           max_bytes=1 << 20, partition_max_bytes=1 << 16))
    await asyncio.sleep(0)
    await asyncio.sleep(0)            # the first is part-way through its partitions
    sid2, error2, _ = await rm.replica_fetch_session(2, NO_SESSION, 0, _full_fetch(), [],
                                                     max_bytes=1 << 20, partition_max_bytes=1 << 16)
    sid1, error1, answered1 = await first
    assert (sid1, error1, answered1) == (NO_SESSION, SESSION_NOT_FOUND, [])
    assert error2 is None and list(rm.fetch_sessions.sessions) == [sid2]
    assert len(rm.fetch_sessions.sessions[sid2].partitions) == N
    # an append marks the partition in the live session only (no stale session id left behind)
    await rm.append("t", 7, batch(b"x"), acks=1)
    assert all(ids == {sid2} for ids in rm.fetch_sessions._by_partition.values())
