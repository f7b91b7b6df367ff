"""A large committed command is unpickled with full collections held off (issue 25).
pysyncobj unpickles each committed command on the raft thread of every controller just
before it calls the replicated `apply`: a fencing at 100,000 partitions is a 2.4 MB command
whose 33,334 record dicts triggered a full collection there (about 150 ms of GIL on the
failover's critical path), before the state machine's own hold began. Pure: the hook on a
stand-in for pysyncobj's method, and the real pysyncobj checked to call it."""
from __future__ import annotations

import gc

from pysyncobj import SyncObj
from pysyncobj import pickle as syncobj_pickle

from metadata_quorum.records import LeaderChangeRecord, PartitionRecord, TopicRecord, record_to_dict
from metadata_quorum.state_machine import MetadataStateMachine
from raft.syncobj_log import RaftConfig, install_command_hold

_HELD = 1 << 30


class _FakeSyncObj:
    """pysyncobj's command path: unpickle the command, call the replicated apply."""

    def __init__(self, sm: MetadataStateMachine):
        self.sm = sm
        self.seen: list = []

    def _SyncObj__doApplyCommand(self, command: bytes):
        self.seen.append(gc.get_threshold()[2])
        entries = syncobj_pickle.loads(command)
        return self.sm.apply(entries)


def _command(records: list) -> bytes:
    return syncobj_pickle.dumps([{"request_id": None, "controller_epoch": 1,
                                  "records": [record_to_dict(r) for r in records]}])


def test_pysyncobj_applies_committed_commands_through_the_hooked_method():
    # the name the hook replaces is the one pysyncobj's apply loop looks up on the instance
    assert "_SyncObj__doApplyCommand" in SyncObj._SyncObj__applyLogEntries.__code__.co_names
    assert RaftConfig(node_id=1, voters={1: "a:1"}, data_dir="/x").apply_gc_hold_min_bytes == 64 * 1024


def test_a_large_command_is_unpickled_and_applied_with_full_collections_held():
    thresholds = gc.get_threshold()
    sm = MetadataStateMachine("c", gc_freeze_min_records=1000)
    fake = _FakeSyncObj(sm)
    try:
        assert install_command_hold(fake, sm.large_command_hold, 64 * 1024)
        small = _command([LeaderChangeRecord(1, 1)])
        big = _command([TopicRecord("big", "id-big")]
                       + [PartitionRecord("big", "id-big", p, (1, 2, 3), (1, 2, 3), 1, 0, 0) for p in range(2000)])
        assert len(small) < 64 * 1024 <= len(big)
        assert fake._SyncObj__doApplyCommand(small)[0]["ok"]
        assert fake._SyncObj__doApplyCommand(big)[0]["ok"]
        after = gc.get_threshold()
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    assert fake.seen == [thresholds[2], _HELD]   # held from before the unpickle, for the large one only
    assert after == thresholds
    assert len(sm.image.topics["big"].partitions) == 2000


def test_a_state_machine_that_never_touches_the_collector_is_left_alone():
    thresholds = gc.get_threshold()
    sm = MetadataStateMachine("c")   # gc_freeze_min_records 0 (in-process tests)
    with sm.large_command_hold():
        held = gc.get_threshold()
    assert held == thresholds


def test_the_hook_is_left_out_of_pysyncobj_full_dumps():
    """pysyncobj's log compaction pickles every instance attribute not in `__properies`
    (`SyncObj.__tryLogCompaction`): the hook, an unpicklable closure, must be named there,
    or every full dump fails ("Failed to store full dump", retried every tick: 3 s raft
    stalls at 100,000 partitions)."""
    import pickle

    sm = MetadataStateMachine("c")
    fake = _FakeSyncObj(sm)
    fake._SyncObj__properies = set(vars(fake)) | {"_SyncObj__properies"}   # as pysyncobj's __init__ leaves it
    assert install_command_hold(fake, sm.large_command_hold, 64 * 1024)
    dumped = {k: v for k, v in vars(fake).items() if k not in fake._SyncObj__properies}
    pickle.dumps(dumped)   # what the full dump pickles: no closure in it
    assert "_SyncObj__doApplyCommand" in fake._SyncObj__properies
