"""Pre-vote (Raft thesis section 9.6) on top of pysyncobj 0.3.17, which has none.

Without it, a controller cut off from the others keeps timing out and starting elections,
raising its term each time (while its connections still look alive, ~1.5 s, that is 2-4
terms); once healed, its higher term makes the active controller step down and forces one
or two extra elections: about a second without an active controller after every heal
(docs/AVAILABILITY.md, measured).

With pre-vote, a follower whose election timer runs out first asks the others whether they
*would* vote for it at term + 1, without anyone changing a term or a vote. Only with a
majority of yes (itself included) does it let pysyncobj start the real election. A node
says yes when the candidate's log is at least as up to date as its own, the candidate's
next term is above its own term, and it has not heard from a leader for `min_timeout_s`
(it is not the leader itself). An isolated node gets no answers, so its term never moves;
after the heal it simply follows the current leader's AppendEntries.

Safety: pre-vote only delays or suppresses elections; votes, terms and the log are
pysyncobj's unchanged (a real election still needs real votes). Liveness corner: a node
whose term is above the leader's (it started a real election and was cut off right after)
ignores that leader's AppendEntries and would never win a pre-vote; once it has seen such
lower-term AppendEntries for `stale_leader_grace_s` it starts a real election without
pre-vote (as pysyncobj always did), so the quorum converges on one term again.

`PreVoteRules` is the pure decision logic (unit-tested); `install_prevote(syncobj, ...)`
wires it into a SyncObj: a tick callback holds back the election timer until a pre-vote
round succeeds, and a filter in front of the message handler answers and counts pre-votes.
Both run on pysyncobj's tick thread, like the code they wrap.

Terms: an answer carries the voter's term, and a node that learns a higher term from one
adopts it (as from any Raft message). Otherwise a node whose term lags, because a RequestVote
raising it was lost, asks for a term its peers have already passed and is refused for ever;
with two live voters of which the other has the shorter log, neither could be elected (the
lagging node is refused for its term, the other for its log).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

PREVOTE_REQUEST = "kraftlog_prevote"
PREVOTE_RESPONSE = "kraftlog_prevote_response"

FOLLOWER, CANDIDATE, LEADER = 0, 1, 2   # pysyncobj's _RAFT_STATE


def log_up_to_date(cand_last_term: int, cand_last_idx: int, my_last_term: int, my_last_idx: int) -> bool:
    """Raft's election restriction: the candidate's log is at least as up to date as ours."""
    return (cand_last_term, cand_last_idx) >= (my_last_term, my_last_idx)


@dataclass
class PreVoteRules:
    """Pre-vote state of one node. Times are monotonic seconds; `cluster_size` counts this node."""

    cluster_size: int
    min_timeout_s: float                         # a voter's "no leader heard for this long"
    stale_leader_grace_s: float
    last_leader_contact: float = float("-inf")   # last AppendEntries from a leader of our term or newer
    stale_leader_since: Optional[float] = None   # first lower-term AppendEntries of the current run
    stale_leader_last: float = float("-inf")     # latest one
    stale_term: Optional[int] = None             # our term when they came
    round_term: Optional[int] = None             # the term + 1 our current pre-vote round asks for
    grants: set = field(default_factory=set)
    allowed_term: Optional[int] = None           # the real election this node may start (term + 1)

    # ---- as a voter ----------------------------------------------------------------
    def should_grant(self, now: float, my_state: int, my_term: int, my_last_term: int, my_last_idx: int,
                     request: dict) -> bool:
        if my_state == LEADER:
            return False
        if now - self.last_leader_contact < self.min_timeout_s:
            return False
        if not request.get("term", -1) > my_term:
            return False
        return log_up_to_date(request.get("last_log_term", -1), request.get("last_log_index", -1),
                              my_last_term, my_last_idx)

    def on_append_entries(self, now: float, msg_term: int, my_term: int) -> None:
        if msg_term >= my_term:
            self.last_leader_contact = now
            self.stale_leader_since = None
            self.allowed_term = None     # a leader is there: the next election needs a new round
        else:
            if self.stale_leader_since is None or self.stale_term != my_term:
                self.stale_leader_since, self.stale_term = now, my_term
            self.stale_leader_last = now

    # ---- as a candidate ------------------------------------------------------------
    def may_elect(self, my_term: int) -> bool:
        """True when pysyncobj may start the election for term my_term + 1."""
        return self.allowed_term == my_term + 1

    def start_round(self, now: float, my_term: int, self_id: Any) -> Optional[dict]:
        """The election timer ran out: the pre-vote request to send (None: elect directly)."""
        if (self.stale_leader_since is not None and self.stale_term == my_term
                and now - self.stale_leader_since >= self.stale_leader_grace_s
                and now - self.stale_leader_last <= self.stale_leader_grace_s):
            self.allowed_term = my_term + 1     # our term is above a live leader's: converge the old way
            self.stale_leader_since = None
            return None
        self.round_term = my_term + 1
        self.grants = {self_id}
        if len(self.grants) * 2 > self.cluster_size:
            self.allowed_term = self.round_term
            return None
        return {"type": PREVOTE_REQUEST, "term": self.round_term}

    @staticmethod
    def higher_term(my_term: int, response: dict) -> Optional[int]:
        """The voter's term when an answer shows one above ours (adopt it), else None."""
        voter_term = response.get("voter_term")
        return voter_term if isinstance(voter_term, int) and voter_term > my_term else None

    def on_response(self, my_term: int, node: Any, response: dict) -> bool:
        """Count a pre-vote answer; True when it completes a majority for term my_term + 1."""
        term = response.get("term")
        if term != self.round_term or term != my_term + 1 or not response.get("granted"):
            return False
        self.grants.add(node)
        if len(self.grants) * 2 > self.cluster_size and self.allowed_term != term:
            self.allowed_term = term
            return True
        return False


def install_prevote(syncobj, min_timeout_s: float, stale_leader_grace_s: float,
                    clock: Callable[[], float] = time.monotonic) -> Optional[PreVoteRules]:
    """Wire pre-vote into `syncobj` (pysyncobj 0.3.17 internals); None if they are not
    there (then pysyncobj elects as before). Install after any other message filter."""
    so = syncobj
    transport = getattr(so, "_SyncObj__transport", None)
    handler = getattr(transport, "_onMessageReceivedCallback", None)
    needed = ("_SyncObj__raftState", "_SyncObj__raftElectionDeadline", "_SyncObj__otherNodes",
              "_SyncObj__raftLog", "_SyncObj__selfNode", "_SyncObj__transferInProgress",
              "_SyncObj__generateRaftTimeout", "_SyncObj__setCurrentTerm", "_SyncObj__setState")
    if transport is None or handler is None or not all(hasattr(so, a) for a in needed):
        return None
    # a round starts when the election timer is within `margin` of running out, so a voter
    # counts a leader as gone after min_timeout_s - margin without AppendEntries (3 missed
    # 50 ms heartbeats at the defaults); a healthy leader's followers always say no
    margin = min_timeout_s / 2
    rules = PreVoteRules(cluster_size=len(so._SyncObj__otherNodes) + 1, min_timeout_s=min_timeout_s - margin,
                         stale_leader_grace_s=stale_leader_grace_s)

    def last_entry() -> tuple[int, int]:
        journal = so._SyncObj__raftLog
        if not len(journal):
            return 0, 0
        e = journal[len(journal) - 1]
        return e[1], e[2]   # (index, term)

    def on_message(node, message):
        if isinstance(message, dict):
            kind = message.get("type")
            if kind == PREVOTE_REQUEST:
                idx, term = last_entry()
                granted = rules.should_grant(clock(), so._SyncObj__raftState, so.raftCurrentTerm, term, idx, message)
                transport.send(node, {"type": PREVOTE_RESPONSE, "term": message.get("term"), "granted": granted,
                                      "voter_term": so.raftCurrentTerm})
                return None
            if kind == PREVOTE_RESPONSE:
                higher = rules.higher_term(so.raftCurrentTerm, message)
                if higher is not None and so._SyncObj__raftState != LEADER:
                    so._SyncObj__setCurrentTerm(higher, None)   # the next round asks for higher + 1
                    so._SyncObj__setState(FOLLOWER)
                    return None
                if (so._SyncObj__raftState != LEADER
                        and rules.on_response(so.raftCurrentTerm, node, message)):
                    so._SyncObj__raftElectionDeadline = 0   # pysyncobj elects on its next tick
                return None
            if kind == "append_entries" and "term" in message:
                rules.on_append_entries(clock(), message["term"], so.raftCurrentTerm)
        result = handler(node, message)
        # a permission to elect (deadline 0) is for one term: when this message moved us to
        # another term (a vote request we did not grant leaves pysyncobj's deadline as it
        # was) or a leader appeared, pysyncobj must not start an election on its next tick
        if (so._SyncObj__raftElectionDeadline == 0 and not so._SyncObj__transferInProgress
                and not rules.may_elect(so.raftCurrentTerm)):
            so._SyncObj__raftElectionDeadline = clock() + so._SyncObj__generateRaftTimeout()
        return result

    def on_tick():
        if so._SyncObj__selfNode is None or not so._SyncObj__otherNodes:
            return
        if so._SyncObj__raftState == LEADER or so._SyncObj__transferInProgress:
            return   # a leadership transfer (TimeoutNow) elects at once, as in Raft
        term = so.raftCurrentTerm
        if rules.may_elect(term):
            return
        now = clock()
        # pysyncobj checks the deadline at the start of the next tick: hold it back until a
        # pre-vote round has a majority (each round as long as a fresh election timeout)
        if so._SyncObj__raftElectionDeadline - now > margin:
            return
        so._SyncObj__raftElectionDeadline = now + so._SyncObj__generateRaftTimeout()
        idx, last_term = last_entry()
        request = rules.start_round(now, term, so._SyncObj__selfNode)
        if request is None:       # a one-node majority, or the stale-term way out
            so._SyncObj__raftElectionDeadline = 0
            return
        request.update(last_log_index=idx, last_log_term=last_term)
        for node in list(so._SyncObj__otherNodes):
            try:
                transport.send(node, request)
            except Exception:   # noqa: BLE001 - a dead link: that node just does not answer
                pass

    transport.setOnMessageReceivedCallback(on_message)
    so.addOnTickCallback(on_tick)
    return rules
