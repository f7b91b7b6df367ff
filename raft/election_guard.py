"""Read what has already arrived before starting an election (pysyncobj 0.3.17).

pysyncobj checks the election deadline at the start of a raft tick and reads its sockets at
the end of the tick (`poller.poll`). When the raft thread itself is stalled past the
election timeout (no CPU, or another thread holding the GIL, on a loaded machine: tick gaps
of 0.3-1.7 s measured at load 8-12, raft/tick_gaps.py), the leader's AppendEntries that
arrived meanwhile sit unread in the socket buffer when the next tick starts. The node sees
an expired deadline and campaigns at once: a stalled *follower* deposes a healthy leader
(pre-vote cannot stop it: its hook runs after that check), and a stalled *candidate* starts
yet another term while the votes that would have elected it wait unread (issue 24: raft
leaderless stretches with no controller faulted).

`must_read_first` is the rule: a node that is not the leader, whose election deadline has
passed (a real deadline: 0 or below is an explicit "elect now" from a leadership transfer or
pre-vote) and no transfer is in progress. `install_election_guard(syncobj)` wraps the raft
thread's `_onTick`: when the rule holds, the node first reads its sockets without waiting
(`poller.poll(0)`), so queued messages are handled exactly as pysyncobj handles them (an
AppendEntries pushes the deadline back, a vote is counted), and only then ticks; if nothing
pushed the deadline back, the tick elects as before.

Safety: messages are handled as they would have been a moment later; an election is delayed
by at most one non-blocking read.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

LEADER = 2   # pysyncobj's _RAFT_STATE.LEADER


def must_read_first(state: int, deadline: float, now: float, transfer_in_progress: bool) -> bool:
    """True when the coming tick would start an election on a deadline that messages already
    received might have pushed back."""
    return state != LEADER and not transfer_in_progress and 0 < deadline < now


def install_election_guard(syncobj, clock: Callable[[], float] = time.monotonic,
                           on_avoided: Optional[Callable[[float], None]] = None) -> bool:
    """Wrap `syncobj._onTick` (pysyncobj internals); False if they are not there (then pysyncobj
    ticks as before). `clock` must be pysyncobj's monotonic clock. `on_avoided(late_s)` is
    called when a message read first made the election unnecessary (late_s: how far past
    its deadline the node was)."""
    so = syncobj
    needed = ("_SyncObj__raftState", "_SyncObj__raftElectionDeadline", "_SyncObj__transferInProgress",
              "_SyncObj__properies", "_poller", "_onTick")
    if not all(hasattr(so, a) for a in needed):
        return False
    tick = so._onTick
    stats = {"reads_before_election": 0, "elections_avoided": 0}   # avoided: a message moved the deadline or elected us
    so.kraftlog_election_guard_stats = stats

    def guarded_tick(time_to_wait=0.0):
        deadline = so._SyncObj__raftElectionDeadline
        now = clock()
        if must_read_first(so._SyncObj__raftState, deadline, now, so._SyncObj__transferInProgress):
            stats["reads_before_election"] += 1
            so._poller.poll(0)
            if not must_read_first(so._SyncObj__raftState, so._SyncObj__raftElectionDeadline, clock(),
                                   so._SyncObj__transferInProgress):
                stats["elections_avoided"] += 1
                if on_avoided is not None:
                    on_avoided(now - deadline)
        return tick(time_to_wait)

    so._onTick = guarded_tick
    # pysyncobj's full dump (log compaction) pickles the SyncObj's __dict__ except the names it
    # knew at construction: the two added here (a closure) would make every dump fail
    getattr(so, "_SyncObj__properies", set()).update({"_onTick", "kraftlog_election_guard_stats"})
    return True
