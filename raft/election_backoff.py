"""Election backoff for pysyncobj 0.3.17 (KRaft's `controller.quorum.election.backoff.max.ms`).

pysyncobj draws every election timeout from [raftMinTimeout, raftMaxTimeout] (0.3-0.6 s),
also after an election that produced no leader. When a vote's round trip (the message, the
voter's fsync of its vote, the answer; through busy processes on a loaded 2-core machine,
measured 250-400 ms in chaos runs) takes longer than the candidate's remaining timeout, the
answer arrives after the candidate has moved to the next term and is ignored: no election
can complete, and the live voters campaign term after term, each answering the other's
previous term (issue 24: terms 14 -> 22 in 3.5 s with all three controllers alive, 13.5 s
without an active controller after one of three was killed).

`ElectionBackoff` stretches the election timeout of a node that knows no leader, binary
exponentially in the elections *it started itself* that failed since it last knew one (the
raft thread says whether the node voted for itself in its current term): a term adopted
from another node's RequestVote is not a failure of this node's. Counting terms instead
(before) made a healed controller that had campaigned alone while cut off (its term 3-5
above the leader's) stretch the whole majority's next timeout 4x, to the 2 s cap, once its
stale-log RequestVote had deposed the leader: 2.1-2.5 s without a raft leader in chaos runs
(issue 24). The first election after
a leader is lost keeps pysyncobj's timeout (failover stays 0.3-0.6 s), the second waits
2x, the third 4x, up to `election_backoff_max_s` (the random spread is kept: a drawn timeout
t becomes t * factor, the factor capped at election_backoff_max_s / raftMaxTimeout). A
longer timeout leaves room for slow votes, and the wider spread separates the candidates.

Pure logic: `on_tick` gets what the raft thread sees and returns the deadline to set (or
None). Safety is unchanged: it only delays elections.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

ELECTION_BACKOFF_MAX_S_DEFAULT = 2.0


@dataclass
class ElectionBackoff:
    """Backoff state of one node. `max_timeout_s` is pysyncobj's raftMaxTimeout; times are
    pysyncobj's monotonic seconds. Invariant: a deadline is stretched at most once (the
    stretched value is remembered), and never while a leader is known."""

    max_timeout_s: float
    election_backoff_max_s: float = ELECTION_BACKOFF_MAX_S_DEFAULT
    last_leader_term: Optional[int] = None   # the last term in which this node knew a leader
    _seen_deadline: Optional[float] = None   # the deadline as last seen (or set) by on_tick
    _campaign_terms: set = field(default_factory=set)   # terms this node campaigned in since its last leader

    def __post_init__(self) -> None:
        if self.max_timeout_s <= 0:
            raise ValueError(f"raft max timeout must be > 0, got {self.max_timeout_s}")
        if self.election_backoff_max_s < self.max_timeout_s:
            raise ValueError(f"election_backoff_max_s ({self.election_backoff_max_s}) must be at least the raft "
                             f"max timeout ({self.max_timeout_s})")

    def factor(self, failed_elections: int) -> float:
        """Timeout multiplier after `failed_elections` leaderless elections (0: none failed)."""
        if failed_elections <= 0:
            return 1.0
        return min(float(2 ** min(failed_elections, 16)), self.election_backoff_max_s / self.max_timeout_s)

    def failed_elections(self, term: int) -> int:
        """Elections since the last known leader that did not give this node a leader: the
        first one (last leader's term + 1) has not failed yet. Counts this node's own
        campaigns when on_tick is told them, else every term since the last leader's."""
        if self._campaign_terms:
            return len(self._campaign_terms) - 1
        if self.last_leader_term is None:
            return 0
        return max(0, term - self.last_leader_term - 1)

    def on_tick(self, now: float, term: int, leader_known: bool, deadline: float,
                campaigning: Optional[bool] = None) -> Optional[float]:
        """Called every raft tick; -> the stretched election deadline to set, or None.
        `campaigning`: this node started the election of `term` (voted for itself in it);
        given (the raft thread always gives it), only such elections count as failed ones."""
        if self.last_leader_term is None or leader_known:
            # a node starting from its journal counts its stored term as the last leader's:
            # its first election is not stretched
            self.last_leader_term = term
            self._seen_deadline = deadline
            self._campaign_terms.clear()
            return None
        if campaigning is not None:
            if campaigning:
                self._campaign_terms.add(term)
            elif not self._campaign_terms:
                self._seen_deadline = deadline   # only adopted terms so far: nothing failed of ours
                return None
        if deadline == self._seen_deadline or deadline <= now:
            self._seen_deadline = deadline   # unchanged, or "elect now" (pre-vote, leadership transfer)
            return None
        factor = self.factor(self.failed_elections(term))
        if factor <= 1.0:
            self._seen_deadline = deadline
            return None
        stretched = now + (deadline - now) * factor
        self._seen_deadline = stretched
        return stretched
