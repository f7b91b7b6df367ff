"""The in-memory ReplicatedLog used to test the layers above raft."""
import asyncio

import pytest

from raft import InMemoryReplicatedLog, NotLeaderError, OutcomeUnknownError, ReplicatedLog


class Counter:
    def __init__(self):
        self.entries = []

    def apply(self, entries):
        self.entries.extend(entries)
        return len(self.entries)

    def snapshot(self):
        return {"entries": list(self.entries)}

    def restore(self, data):
        self.entries = list(data["entries"])


async def test_propose_applies_in_order_and_returns_the_result():
    sm = Counter()
    log = InMemoryReplicatedLog(sm)
    assert isinstance(log, ReplicatedLog)
    assert await log.propose(["a"]) == 1
    assert await log.propose(["b", "c"]) == 3
    assert sm.entries == ["a", "b", "c"]


async def test_follower_refuses_with_not_leader():
    log = InMemoryReplicatedLog(Counter(), leader=False)
    with pytest.raises(NotLeaderError) as exc:
        await log.propose(["a"])
    assert exc.value.outcome_known


async def test_outcome_unknown_may_still_have_applied():
    sm = Counter()
    log = InMemoryReplicatedLog(sm)
    log.fail_next(OutcomeUnknownError("lost answer"), apply=True)
    with pytest.raises(OutcomeUnknownError) as exc:
        await log.propose(["a"])
    assert not exc.value.outcome_known
    assert sm.entries == ["a"]


async def test_listeners_hear_leadership_changes_and_terms_grow():
    log = InMemoryReplicatedLog(Counter(), leader=False)
    seen = []
    log.add_listener(lambda: seen.append((log.is_leader, log.term)))
    log.become_leader()
    log.lose_leadership()
    log.become_leader()
    assert seen == [(True, 1), (False, 1), (True, 2)]


def test_syncobj_log_refuses_multi_node_quorum_without_password(tmp_path):
    from raft.syncobj_log import RaftConfig, SyncObjReplicatedLog

    cfg = RaftConfig(node_id=1, voters={1: "127.0.0.1:1", 2: "127.0.0.1:2"}, data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="password"):
        SyncObjReplicatedLog(cfg, Counter())
    # journal and dump file are always under the data dir
    assert cfg.journal_file.startswith(str(tmp_path)) and cfg.full_dump_file.startswith(str(tmp_path))


def test_syncobj_consumer_has_exactly_one_replicated_method():
    from raft.syncobj_log import _Consumer

    c = _Consumer(Counter(), lambda: None)
    replicated = [m for m in dir(c) if getattr(getattr(c, m), "replicated", False)
                  and getattr(getattr(c, m), "origName", None) != m]
    assert [getattr(c, m).origName for m in replicated] == ["apply"]


def test_syncobj_consumer_apply_never_raises():
    from raft.syncobj_log import _Consumer

    class Boom(Counter):
        def apply(self, entries):
            raise RuntimeError("bug")

    c = _Consumer(Boom(), lambda: None)
    result = c.apply(["x"], _doApply=True)
    assert result["ok"] is False
