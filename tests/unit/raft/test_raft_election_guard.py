"""raft/election_guard.py: a raft thread stalled past its election timeout reads what has
arrived before it campaigns (issue 24: elections with no controller faulted, under load)."""
from __future__ import annotations

import asyncio
import time

from raft.election_guard import LEADER, must_read_first
from tests.unit.raft.test_raft_prevote import _describe, _Entries, _free_port, _propose_on_leader, _start_logs

FOLLOWER, CANDIDATE = 0, 1


def test_a_follower_or_candidate_past_its_deadline_reads_first():
    assert must_read_first(FOLLOWER, deadline=10.0, now=10.5, transfer_in_progress=False)
    assert must_read_first(CANDIDATE, deadline=10.0, now=10.5, transfer_in_progress=False)


def test_no_read_for_a_leader_a_live_deadline_an_elect_now_or_a_transfer():
    assert not must_read_first(LEADER, deadline=10.0, now=10.5, transfer_in_progress=False)
    assert not must_read_first(FOLLOWER, deadline=11.0, now=10.5, transfer_in_progress=False)
    assert not must_read_first(FOLLOWER, deadline=0, now=10.5, transfer_in_progress=False)   # pre-vote's go
    assert not must_read_first(FOLLOWER, deadline=10.0, now=10.5, transfer_in_progress=True)  # TimeoutNow


class _StallAfterPoll:
    """The node's raft thread stalls `stall_s` right after one socket read returned (as a
    thread waiting for the GIL or a CPU after its poll's wait does): the leader's AppendEntries
    arriving meanwhile stay unread until the next tick has begun. `campaigns` counts the stalls
    after which the node's next tick started an election of its own."""

    def __init__(self, log, stall_s: float, stalls: int) -> None:
        self.so = log._syncobj
        self.poller = self.so._poller
        self.poll = self.poller.poll
        self.stall_s = stall_s
        self.pending = stalls
        self.done = 0
        self.campaigns = 0
        self._term_after_stall = None
        self.poller.poll = self._poll

    def _poll(self, timeout):
        if timeout > 0 and self._term_after_stall is not None:   # the tick after a stall has run
            so = self.so
            if so.raftCurrentTerm > self._term_after_stall and so._SyncObj__votedForNodeId == so._SyncObj__selfNode.id:
                self.campaigns += 1
            self._term_after_stall = None
            self.done += 1
        result = self.poll(timeout)
        if self.pending and timeout > 0:   # the tick's own read, not the guard's poll(0)
            self.pending -= 1
            time.sleep(self.stall_s)
            self._term_after_stall = self.so.raftCurrentTerm
        return result


async def _stalled_follower_terms(tmp_path, read_before_election: bool) -> tuple:
    """-> (campaigns of the stalled follower, the term before, every node's term after, the
    elections its guard reported avoided)."""
    logs = {}
    try:
        _start_logs(tmp_path, logs, read_before_election=read_before_election)
        await _propose_on_leader(logs, {"n": 1})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while True:   # every node follows one leader in one term
            ids, terms = {lg.leader_id for lg in logs.values()}, {lg.term for lg in logs.values()}
            if len(ids) == 1 and None not in ids and len(terms) == 1:
                break
            assert loop.time() < deadline, f"no stable leader: {_describe(logs)}"
            await asyncio.sleep(0.02)
        leader = ids.pop()
        follower = next(i for i in logs if i != leader)
        term = logs[leader].term
        stall = _StallAfterPoll(logs[follower], stall_s=1.0, stalls=3)   # past the 0.3-0.6 s election timeout
        deadline = loop.time() + 30
        while stall.done < 3:
            assert loop.time() < deadline, "the follower's raft thread never stalled"
            await asyncio.sleep(0.05)
        stats = getattr(logs[follower]._syncobj, "kraftlog_election_guard_stats", {})
        return stall.campaigns, term, {i: lg.term for i, lg in logs.items()}, stats.get("elections_avoided", 0)
    finally:
        for lg in logs.values():
            lg.stop()


async def test_a_follower_stalled_past_its_election_timeout_does_not_depose_its_leader(tmp_path):
    campaigns, term, terms, avoided = await _stalled_follower_terms(tmp_path, read_before_election=True)
    assert campaigns == 0, f"a follower stalled 3 x 1 s campaigned {campaigns} times: terms {term} -> {terms}"
    assert avoided >= 3, f"the guard reported {avoided} elections avoided for 3 stalls"


async def test_without_the_guard_the_stalled_follower_campaigns(tmp_path):
    # the behaviour the guard removes, pinned so the stall above is known to provoke it
    campaigns, term, terms, _ = await _stalled_follower_terms(tmp_path, read_before_election=False)
    assert campaigns >= 1, f"a follower stalled 3 x 1 s never campaigned: terms {term} -> {terms}"


async def test_log_compaction_still_writes_full_dumps_with_the_guard(tmp_path):
    # pysyncobj's full dump pickles the SyncObj's attributes; the guard's wrapper must not be one
    import os

    from raft.syncobj_log import RaftConfig, SyncObjReplicatedLog

    cfg = RaftConfig(node_id=1, voters={1: f"127.0.0.1:{_free_port()}"}, data_dir=str(tmp_path / "n1"),
                     fsync_journal=False, log_compaction_min_entries=10,
                     log_compaction_split=False)   # compact as soon as due (the split waits for a window)
    lg = SyncObjReplicatedLog(cfg, _Entries(), loop=asyncio.get_running_loop())
    lg.start()
    try:
        for n in range(30):
            await _propose_on_leader({1: lg}, {"n": n})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not os.path.exists(cfg.full_dump_file):
            assert loop.time() < deadline, "no full dump written: compaction failed with the guard installed"
            await asyncio.sleep(0.05)
    finally:
        lg.stop()
