"""Pre-vote (raft/prevote.py): the rules, and a real 3-node pysyncobj quorum in which one
follower is cut off (every raft message to and from it dropped, connections left up, as a
silent network cut looks for a while): it must not raise its term, and healing it must not
force an election (issue 24: the isolated controller's higher term cost two elections)."""
from __future__ import annotations

import asyncio
import secrets

from raft.prevote import (CANDIDATE, FOLLOWER, LEADER, PREVOTE_REQUEST, PREVOTE_RESPONSE, PreVoteRules,
                          install_prevote, log_up_to_date)
from deploy.ports import free_port


def _rules(**kw) -> PreVoteRules:
    return PreVoteRules(cluster_size=3, min_timeout_s=0.15, stale_leader_grace_s=2.0, **kw)


# ---- rules ---------------------------------------------------------------------------------

def test_voter_refuses_while_it_hears_a_leader_and_grants_once_the_leader_is_quiet():
    r = _rules()
    req = {"type": PREVOTE_REQUEST, "term": 4, "last_log_term": 3, "last_log_index": 10}
    r.on_append_entries(now=100.0, msg_term=3, my_term=3)
    assert not r.should_grant(100.1, FOLLOWER, 3, 3, 10, req)
    assert r.should_grant(100.2, FOLLOWER, 3, 3, 10, req)
    assert not r.should_grant(100.2, LEADER, 3, 3, 10, req)          # a leader never grants


def test_voter_refuses_a_stale_log_or_a_term_not_above_its_own():
    r = _rules()
    assert not r.should_grant(10.0, FOLLOWER, 3, 3, 11, {"term": 4, "last_log_term": 3, "last_log_index": 10})
    assert not r.should_grant(10.0, FOLLOWER, 3, 3, 10, {"term": 4, "last_log_term": 2, "last_log_index": 99})
    assert not r.should_grant(10.0, CANDIDATE, 4, 3, 10, {"term": 4, "last_log_term": 3, "last_log_index": 10})
    assert r.should_grant(10.0, CANDIDATE, 4, 3, 10, {"term": 5, "last_log_term": 3, "last_log_index": 10})
    assert log_up_to_date(3, 10, 3, 10) and log_up_to_date(4, 1, 3, 10) and not log_up_to_date(3, 9, 3, 10)


def test_candidate_elects_only_with_a_majority_of_grants_for_its_next_term():
    r = _rules()
    assert r.start_round(1.0, my_term=3, self_id="a") == {"type": PREVOTE_REQUEST, "term": 4}
    assert not r.may_elect(3)
    assert not r.on_response(3, "b", {"term": 4, "granted": False})
    assert not r.on_response(3, "b", {"term": 5, "granted": True})    # another round's answer
    assert r.on_response(3, "b", {"term": 4, "granted": True})
    assert r.may_elect(3) and not r.may_elect(4)
    r.on_append_entries(now=1.1, msg_term=3, my_term=3)                # a leader showed up: permission gone
    assert not r.may_elect(3)


def test_a_node_above_the_leaders_term_elects_the_old_way_after_the_grace():
    r = _rules()
    r.on_append_entries(now=10.0, msg_term=2, my_term=5)               # a live leader at a lower term
    r.on_append_entries(now=11.0, msg_term=2, my_term=5)
    assert r.start_round(11.0, my_term=5, self_id="a") is not None     # within the grace: pre-vote
    r.on_append_entries(now=12.1, msg_term=2, my_term=5)
    assert r.start_round(12.1, my_term=5, self_id="a") is None and r.may_elect(5)


def test_one_node_cluster_elects_at_once():
    r = PreVoteRules(cluster_size=1, min_timeout_s=0.15, stale_leader_grace_s=2.0)
    assert r.start_round(1.0, my_term=0, self_id="a") is None and r.may_elect(0)


# ---- wiring, on a stand-in for pysyncobj's internals -----------------------------------------

class _FakeTransport:
    def __init__(self):
        self._onMessageReceivedCallback = lambda node, message: None
        self.sent = []

    def setOnMessageReceivedCallback(self, cb):
        self._onMessageReceivedCallback = cb

    def send(self, node, message):
        self.sent.append((node, message))
        return True


class _FakeSyncObj:
    """The attributes install_prevote reads and writes, named as pysyncobj 0.3.17 has them."""

    def __init__(self, now: list):
        self.raftCurrentTerm = 0
        self.ticks = []
        transport = _FakeTransport()
        self.handled = []
        transport.setOnMessageReceivedCallback(lambda node, message: self._pysyncobj_handles(message))
        for name, value in (("transport", transport), ("raftState", FOLLOWER), ("raftElectionDeadline", now[0] + 0.1),
                            ("otherNodes", {"b", "c"}), ("raftLog", [(b"", 1, 0)]), ("selfNode", "a"),
                            ("transferInProgress", False), ("generateRaftTimeout", lambda: 0.4),
                            ("setCurrentTerm", self._set_term), ("setState", self._set_state)):
            setattr(self, "_SyncObj__" + name, value)

    def _set_term(self, term, voted_for):
        self.raftCurrentTerm = term

    def _set_state(self, state):
        self._SyncObj__raftState = state

    def _pysyncobj_handles(self, message):
        self.handled.append(message)
        if message.get("type") == "request_vote" and message["term"] > self.raftCurrentTerm:
            self.raftCurrentTerm = message["term"]   # a vote it does not grant: deadline untouched

    def addOnTickCallback(self, cb):
        self.ticks.append(cb)

    @property
    def deadline(self) -> float:
        return self._SyncObj__raftElectionDeadline

    def receive(self, node, message):
        return self._SyncObj__transport._onMessageReceivedCallback(node, message)


def _installed():
    now = [100.0]
    so = _FakeSyncObj(now)
    assert install_prevote(so, min_timeout_s=0.3, stale_leader_grace_s=2.0, clock=lambda: now[0]) is not None
    return so, now


def test_election_timer_is_held_back_until_a_majority_grants_then_released():
    so, now = _installed()
    so.ticks[0]()                                       # timer within the margin: a round, not an election
    assert so.deadline == now[0] + 0.4
    requests = [m for _, m in so._SyncObj__transport.sent]
    assert len(requests) == 2 and all(m["type"] == PREVOTE_REQUEST and m["term"] == 1 for m in requests)
    so.receive("b", {"type": PREVOTE_RESPONSE, "term": 1, "granted": False, "voter_term": 0})
    assert so.deadline == now[0] + 0.4
    so.receive("c", {"type": PREVOTE_RESPONSE, "term": 1, "granted": True, "voter_term": 0})
    assert so.deadline == 0                             # pysyncobj elects on its next tick
    assert not any(m.get("type") == PREVOTE_RESPONSE for m in so.handled)   # pre-vote stays ours


def test_an_isolated_node_keeps_pushing_its_timer_and_never_elects():
    so, now = _installed()
    for _ in range(50):
        so.ticks[0]()
        assert so.deadline > now[0]
        now[0] = so.deadline - 0.01                     # no answers ever come
    assert so.raftCurrentTerm == 0


def test_a_permission_to_elect_does_not_survive_a_term_change():
    so, now = _installed()
    so.ticks[0]()
    so.receive("b", {"type": PREVOTE_RESPONSE, "term": 1, "granted": True, "voter_term": 0})
    assert so.deadline == 0
    # before pysyncobj's next tick another candidate's vote request moves us to term 1 (we
    # do not grant it): without the guard pysyncobj would start term 2 at once
    so.receive("c", {"type": "request_vote", "term": 1, "last_log_index": 1, "last_log_term": 0})
    assert so.raftCurrentTerm == 1 and so.deadline == now[0] + 0.4


def test_a_follower_hearing_its_leader_answers_no():
    so, now = _installed()
    so.receive("b", {"type": "append_entries", "term": 0})
    now[0] += 0.05
    so.receive("c", {"type": PREVOTE_REQUEST, "term": 1, "last_log_index": 5, "last_log_term": 0})
    assert so._SyncObj__transport.sent[-1] == ("c", {"type": PREVOTE_RESPONSE, "term": 1, "granted": False, "voter_term": 0})
    now[0] += 1.0
    so.receive("c", {"type": PREVOTE_REQUEST, "term": 1, "last_log_index": 5, "last_log_term": 0})
    assert so._SyncObj__transport.sent[-1] == ("c", {"type": PREVOTE_RESPONSE, "term": 1, "granted": True, "voter_term": 0})


def test_a_node_whose_term_lags_adopts_the_voters_term_from_a_refusal():
    # a lost RequestVote left this node at term 0 while the others are at 3: asking them for
    # term 1 is refused for ever unless the answer's term is adopted
    so, now = _installed()
    now[0] = so.deadline                                   # the timer is about to run out
    so.ticks[0]()
    request = so._SyncObj__transport.sent[-1][1]
    assert request["type"] == PREVOTE_REQUEST and request["term"] == 1
    so.receive("b", {"type": PREVOTE_RESPONSE, "term": 1, "granted": False, "voter_term": 3})
    assert so.raftCurrentTerm == 3 and so._SyncObj__raftState == FOLLOWER
    now[0] = so.deadline
    so.ticks[0]()
    assert so._SyncObj__transport.sent[-1][1]["term"] == 4     # the next round asks above the voters
    assert PreVoteRules.higher_term(3, {"voter_term": 3}) is None and PreVoteRules.higher_term(3, {}) is None


def test_a_voter_answers_with_its_term():
    so, now = _installed()
    so.raftCurrentTerm = 5
    so.receive("b", {"type": PREVOTE_REQUEST, "term": 3, "last_log_term": 0, "last_log_index": 1})
    node, answer = so._SyncObj__transport.sent[-1]
    assert node == "b" and answer["granted"] is False and answer["voter_term"] == 5


# ---- a real quorum ---------------------------------------------------------------------------

class _Entries:
    def __init__(self):
        self.entries = []

    def apply(self, entries):
        self.entries.extend(entries)
        return len(self.entries)

    def snapshot(self):
        return {"entries": list(self.entries)}

    def restore(self, data):
        self.entries = list(data["entries"])


def _free_port() -> int:
    return free_port()


class _Cut:
    """Drops every raft message to and from the nodes in `cut` (their TCP links stay up)."""

    def __init__(self, logs: dict) -> None:
        self.cut: set[int] = set()
        for nid, lg in logs.items():
            so = lg._syncobj
            transport = so._SyncObj__transport
            addr_to_id = lg._addr_to_id
            send, handler = transport.send, transport._onMessageReceivedCallback

            def guarded_send(node, message, _nid=nid, _send=send, _ids=addr_to_id):
                if _nid in self.cut or _ids.get(getattr(node, "address", None)) in self.cut:
                    return True
                return _send(node, message)

            def guarded_receive(node, message, _nid=nid, _handler=handler, _ids=addr_to_id):
                if _nid in self.cut or _ids.get(getattr(node, "address", None)) in self.cut:
                    return None
                return _handler(node, message)

            transport.send = guarded_send
            transport.setOnMessageReceivedCallback(guarded_receive)


async def _until(pred, timeout_s: float, what, logs: dict):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        assert loop.time() < deadline, f"timed out waiting for {what}: {_describe(logs)}"
        await asyncio.sleep(0.02)


async def _propose_on_leader(logs: dict, entry: dict) -> None:
    from raft.log import NotLeaderError, OutcomeUnknownError

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:
        leader = next((lg for lg in logs.values() if lg.is_leader), None)
        try:
            if leader is not None:
                await leader.propose([entry], timeout_s=5)
                return
        except (NotLeaderError, OutcomeUnknownError):
            pass   # (an unknown outcome would apply twice: the test then fails on the count)
        assert loop.time() < deadline, f"no leader committed {entry}: {_describe(logs)}"
        await asyncio.sleep(0.05)


def _describe(logs: dict) -> dict:
    """node -> (leader id, term, entries applied, raft thread alive)."""
    out = {}
    for i, lg in logs.items():
        thread = getattr(lg._syncobj, "_SyncObj__thread", None) if lg._syncobj is not None else None
        out[i] = (lg.leader_id, lg.term, len(lg.state_machine.entries), thread is not None and thread.is_alive())
    return out


def _start_logs(tmp_path, logs: dict, each=None, **config) -> None:
    """Start a real 3-node raft quorum on free ports into `logs` (node id -> log, filled as each
    starts, so the caller's `finally` stops whatever started); `config` adds RaftConfig fields,
    `each(log)` runs right after each start."""
    from raft.syncobj_log import RaftConfig, SyncObjReplicatedLog

    voters = {i: f"127.0.0.1:{_free_port()}" for i in (1, 2, 3)}
    password = secrets.token_hex(8)
    for i in voters:
        cfg = RaftConfig(node_id=i, voters=voters, data_dir=str(tmp_path / f"n{i}"), password=password,
                         fsync_journal=False, **config)
        logs[i] = SyncObjReplicatedLog(cfg, _Entries(), loop=asyncio.get_running_loop())
        logs[i].start()
        if each is not None:
            each(logs[i])


async def test_isolated_follower_keeps_its_term_and_rejoins_without_an_election(tmp_path):
    logs = {}
    try:
        _start_logs(tmp_path, logs, prevote=True)
        await _propose_on_leader(logs, {"n": 1})

        def agreed():
            ids = {lg.leader_id for lg in logs.values()}
            terms = {lg.term for lg in logs.values()}
            return ids.pop() if len(ids) == 1 and None not in ids and len(terms) == 1 else None

        leader = await _until(agreed, 30, "every node following one leader in one term", logs)
        term = logs[leader].term
        follower = next(i for i in logs if i != leader)
        other = next(i for i in logs if i not in (leader, follower))
        history: list = []     # (s since the cut, {node: (term, leader)}) at every change, for failures
        t0 = asyncio.get_running_loop().time()

        async def sample():
            while True:
                state = {i: (lg.term, lg.leader_id) for i, lg in logs.items()}
                if not history or history[-1][1] != state:
                    history.append((round(asyncio.get_running_loop().time() - t0, 3), state))
                await asyncio.sleep(0.01)

        sampler = asyncio.ensure_future(sample())
        cut = _Cut(logs)
        cut.cut.add(follower)
        # several election timeouts (0.3-0.6 s) with its links up: without pre-vote it starts
        # an election on each and its term climbs (measured: 1 -> 7 in 3 s)
        await asyncio.sleep(3.0)
        assert logs[follower].term == term, f"the isolated node raised its term {term} -> {logs[follower].term}"
        await _propose_on_leader(logs, {"n": 2})                       # the majority still commits
        majority_term = max(logs[leader].term, logs[other].term)
        cut.cut.clear()
        # it rejoins by following the current leader: no election forced by a higher term (a
        # load stall may still cost the majority one election of its own, hence the + 1)
        await _until(lambda: logs[follower].leader_id is not None and logs[follower].leader_id != follower
                     and len(logs[follower].state_machine.entries) == 2,
                     10, f"the healed node {follower} follows a leader and catches up", logs)
        await asyncio.sleep(1.0)
        terms = {i: lg.term for i, lg in logs.items()}
        sampler.cancel()
        assert len(set(terms.values())) == 1 and terms[follower] <= majority_term + 1, (
            terms, majority_term, f"isolated {follower}", history)
    finally:
        for lg in logs.values():
            lg.stop()
