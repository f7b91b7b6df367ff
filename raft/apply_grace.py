"""Elections around a long apply, for pysyncobj 0.3.17 (issue 25, failover at 100,000 partitions).

A large committed entry (a broker fencing of 33,334 records at 100,000 partitions) keeps a
raft thread busy applying it for 0.3-1.5 s, more under load. pysyncobj's leader applies
what it committed in its tick and only then sends its next AppendEntries (`_onTick`:
`__applyLogEntries()` before `__sendAppendEntries()`), so its followers heard nothing for the
whole apply, past their 0.3-0.6 s election timeout, and deposed a leader that was only busy
(the controller quorum changed leader 3 times in the 7 s after a kill -9 at 100,000
partitions). Two hooks, both only around an apply of at least `min_bytes` of commands, so
the small writes of a normal cluster run as before:

- **The leader tells before it applies**: it sends AppendEntries (carrying the new commit
  index) first. Its followers' election deadlines restart, and they apply the entry at the
  same time as the leader instead of after it.
- **A follower gives its leader the time it took itself** (`deadline_after_apply`): after an
  apply that took `elapsed` seconds, its election deadline is at least `now + elapsed +
  min_timeout`. The leader applies the same entry, on the busiest process (the active
  controller also serves the brokers), and may finish later than this follower.
- **A leader does not count its own apply as its followers' silence**: pysyncobj's leader
  steps down when no majority answered within `leaderFallbackTimeout` (1.5 s), checked at
  the start of the tick after the apply, before it has read the answers that arrived
  meanwhile; each follower's last answer time moves `elapsed` later (`answers_after_apply`).

Safety is unchanged: the first hook sends what pysyncobj would send a moment later, the
others only delay an election or a step-down (liveness rules, not safety ones). What it
costs: a leader that dies during a long apply is replaced that much later (elapsed +
min_timeout after the follower's own apply ended), and a leader cut off during its own long
apply steps down `elapsed` later.
"""
from __future__ import annotations

from typing import Callable, Optional

from pysyncobj.syncobj import _RAFT_STATE

FOLLOWER = _RAFT_STATE.FOLLOWER
LEADER = _RAFT_STATE.LEADER

# an apply (one tick's committed entries) at least this large gets the hooks: pysyncobj's
# own frames are ~64 KiB; a 10,000-partition create is ~650 KB (raft/README.md)
APPLY_GRACE_MIN_BYTES_DEFAULT = 64 * 1024


def deadline_after_apply(state: int, deadline: float, now: float, elapsed_s: float,
                         min_timeout_s: float) -> Optional[float]:
    """The election deadline a node should have after an apply of `elapsed_s` seconds that
    ended at `now`, or None to keep `deadline`. Only a follower's deadline moves, only
    later, and never an "elect now" (deadline 0: pre-vote's go, a leadership transfer)."""
    if state != FOLLOWER or deadline <= 0 or elapsed_s <= 0:
        return None
    wanted = now + elapsed_s + min_timeout_s
    return wanted if wanted > deadline else None


def answers_after_apply(state: int, last_answer_times: dict, elapsed_s: float) -> Optional[dict]:
    """A leader's followers' last answer times after its own apply of `elapsed_s` seconds
    (each `elapsed_s` later: they may have answered meanwhile, unread), or None to keep them."""
    if state != LEADER or elapsed_s <= 0:
        return None
    return {node: t + elapsed_s for node, t in last_answer_times.items()}


def pending_apply_bytes(so) -> int:
    """Bytes of the committed, not yet applied commands of a pysyncobj node (0 when none)."""
    commit, applied = so._SyncObj__raftCommitIndex, so._SyncObj__raftLastApplied
    if commit <= applied:
        return 0
    entries = so._SyncObj__getEntries(applied + 1, commit - applied)
    return sum(len(e[0]) for e in entries)


def install_apply_grace(so, clock: Callable[[], float], min_timeout_s: float,
                        min_bytes: int = APPLY_GRACE_MIN_BYTES_DEFAULT, stats: Optional[dict] = None) -> bool:
    """Wrap the node's `__applyLogEntries` with both hooks (see the module docstring).
    False when pysyncobj's internals are not the expected ones (nothing installed)."""
    original = getattr(so, "_SyncObj__applyLogEntries", None)
    send = getattr(so, "_SyncObj__sendAppendEntries", None)
    if (original is None or send is None or not hasattr(so, "_SyncObj__raftElectionDeadline")
            or not isinstance(getattr(so, "_SyncObj__lastResponseTime", None), dict)):
        return False
    counts = stats if stats is not None else {}
    counts.setdefault("told_before_apply", 0)
    counts.setdefault("deadlines_moved", 0)
    counts.setdefault("answers_moved", 0)

    def apply_log_entries():
        if so._SyncObj__raftCommitIndex <= so._SyncObj__raftLastApplied:
            return original()
        size = pending_apply_bytes(so)
        if size < min_bytes:
            return original()
        if so._SyncObj__raftState == LEADER:
            send()
            counts["told_before_apply"] += 1
        start = clock()
        try:
            return original()
        finally:
            now = clock()
            moved = deadline_after_apply(so._SyncObj__raftState, so._SyncObj__raftElectionDeadline, now,
                                         now - start, min_timeout_s)
            if moved is not None:
                so._SyncObj__raftElectionDeadline = moved
                counts["deadlines_moved"] += 1
            answers = answers_after_apply(so._SyncObj__raftState, so._SyncObj__lastResponseTime, now - start)
            if answers is not None:
                so._SyncObj__lastResponseTime.update(answers)
                counts["answers_moved"] += 1

    so._SyncObj__applyLogEntries = apply_log_entries
    so.kraftlog_apply_grace_stats = counts
    # pysyncobj's full dump pickles every attribute not in `__properies` (see install_command_hold)
    getattr(so, "_SyncObj__properies", set()).update({"_SyncObj__applyLogEntries", "kraftlog_apply_grace_stats"})
    return True
