"""raft/election_backoff.py (issue 24's election storms): the backoff rule, and a real 3-node
pysyncobj quorum whose raft messages all arrive 0.35 s late (a vote's round trip, 0.7 s, is
longer than any of pysyncobj's 0.3-0.6 s election timeouts, as busy processes made it in
chaos runs): without the backoff no election can complete and the terms climb for ever;
with it a leader is elected and commits."""
from __future__ import annotations

import asyncio
import collections
import time

import pytest

from raft.election_backoff import ElectionBackoff
from tests.unit.raft.test_raft_prevote import _describe, _propose_on_leader, _start_logs


def test_first_election_after_a_leader_keeps_the_timeout_then_it_doubles_up_to_the_cap():
    b = ElectionBackoff(max_timeout_s=0.6, election_backoff_max_s=2.0)
    assert b.on_tick(now=10.0, term=5, leader_known=True, deadline=10.4) is None      # leader of term 5
    assert b.on_tick(now=10.5, term=6, leader_known=False, deadline=10.9) is None     # 1st election: as drawn
    assert b.on_tick(now=11.0, term=7, leader_known=False, deadline=11.5) == pytest.approx(11.0 + 0.5 * 2)
    assert b.on_tick(now=11.1, term=7, leader_known=False, deadline=12.0) is None     # ours: not stretched twice
    assert b.on_tick(now=12.1, term=8, leader_known=False, deadline=12.4) == pytest.approx(12.1 + 0.3 * 2.0 / 0.6)
    assert b.on_tick(now=15.0, term=30, leader_known=False, deadline=15.6) == pytest.approx(15.0 + 2.0)  # the cap
    assert b.on_tick(now=16.0, term=30, leader_known=True, deadline=16.5) is None     # a leader: reset
    assert b.on_tick(now=17.0, term=31, leader_known=False, deadline=17.3) is None


def test_only_the_nodes_own_failed_campaigns_stretch_its_timeout():
    # a healed controller that campaigned alone while cut off comes back at term 9 and deposes
    # the leader of term 5 with a stale log: the majority adopts term 9 without campaigning
    # and must elect at its normal timeout (counting terms, it waited 4x: 2 s at the cap)
    b = ElectionBackoff(max_timeout_s=0.6, election_backoff_max_s=2.0)
    assert b.on_tick(now=10.0, term=5, leader_known=True, deadline=10.4, campaigning=False) is None
    assert b.on_tick(now=10.5, term=9, leader_known=False, deadline=10.9, campaigning=False) is None  # adopted
    assert b.on_tick(now=11.0, term=10, leader_known=False, deadline=11.5, campaigning=True) is None  # 1st own
    assert b.on_tick(now=11.6, term=11, leader_known=False, deadline=12.0, campaigning=False) is None  # voted for another
    assert b.on_tick(now=12.1, term=12, leader_known=False, deadline=12.5,
                     campaigning=True) == pytest.approx(12.1 + 0.4 * 2)                           # 2nd own: 2x
    assert b.on_tick(now=13.0, term=12, leader_known=True, deadline=13.5, campaigning=True) is None   # a leader
    assert b.on_tick(now=14.0, term=13, leader_known=False, deadline=14.4, campaigning=True) is None  # reset


def test_elect_now_deadlines_and_a_restarted_node_are_left_alone():
    b = ElectionBackoff(max_timeout_s=0.6)
    assert b.on_tick(now=1.0, term=40, leader_known=False, deadline=1.5) is None   # journal term: the baseline
    assert b.on_tick(now=1.6, term=41, leader_known=False, deadline=2.0) is None   # its first election
    assert b.on_tick(now=2.1, term=42, leader_known=False, deadline=0) is None     # pre-vote / transfer: elect now
    assert b.factor(0) == 1.0 and b.factor(1) == 2.0 and b.factor(50) == pytest.approx(2.0 / 0.6)
    with pytest.raises(ValueError):
        ElectionBackoff(max_timeout_s=0.6, election_backoff_max_s=0.5)


class _LateDelivery:
    """Every raft message a node receives is handed to pysyncobj `delay_s` late, in order, on
    the raft thread (its TCP links stay up and are read at once)."""

    def __init__(self, log, delay_s: float) -> None:
        so = log._syncobj
        transport = so._SyncObj__transport
        handler = transport._onMessageReceivedCallback
        queue: collections.deque = collections.deque()

        def receive(node, message):
            queue.append((time.monotonic() + delay_s, node, message))

        def deliver():
            while queue and queue[0][0] <= time.monotonic():
                _, node, message = queue.popleft()
                handler(node, message)

        transport.setOnMessageReceivedCallback(receive)
        so.addOnTickCallback(deliver)


async def test_a_quorum_whose_votes_take_longer_than_the_election_timeout_still_elects(tmp_path):
    logs = {}
    try:
        _start_logs(tmp_path, logs, each=lambda lg: _LateDelivery(lg, 0.35))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while True:   # one leader that every node follows
            ids = {lg.leader_id for lg in logs.values()}
            if len(ids) == 1 and None not in ids:
                break
            assert loop.time() < deadline, f"no leader in 60 s with 0.7 s vote round trips: {_describe(logs)}"
            await asyncio.sleep(0.05)
        await _propose_on_leader(logs, {"n": 1})
    finally:
        for lg in logs.values():
            lg.stop()
