"""Full collections on the active controller's write path (issue 25): a fencing at 100,000
partitions decides 33,334 records and builds their plain data on the event loop, enough
allocation to trigger a full collection (about 150 ms of GIL on the failover's critical
path). `write` holds full collections off while it decides and builds the entry, and
freezes a large entry out of later ones; holds of several threads overlap safely (the
raft thread's apply holds too). In-process controller over the in-memory raft log."""
from __future__ import annotations

import gc
import random

from metadata_quorum.controller import ControllerSettings
from metadata_quorum.controller_server import ControllerConfig, ControllerServer, Voter
from metadata_quorum.state_machine import FullCollectionHold, MetadataStateMachine
from raft import InMemoryReplicatedLog
from tests.rigs.controller_inprocess import wait_until

_HELD = 1 << 30


def test_holds_that_overlap_restore_the_thresholds_once_the_last_is_released():
    thresholds = gc.get_threshold()
    a, b = FullCollectionHold(), FullCollectionHold()
    try:
        a.hold()
        b.hold()            # e.g. the raft thread's apply while the event loop's write holds
        a.release(freeze=False)
        assert gc.get_threshold()[2] == _HELD and b.held   # b still holds
        b.release(freeze=False)
        left = gc.get_threshold()
    finally:
        gc.set_threshold(*thresholds)
    assert left == thresholds   # not b's view of a held threshold: full collections back on


async def test_write_holds_full_collections_while_deciding_and_freezes_a_large_entry():
    thresholds = gc.get_threshold()
    voters = {1: Voter(1, "127.0.0.1", 1, 2)}
    config = ControllerConfig(node_id=1, data_dir="/nonexistent", voters=voters, cluster_id="c-gc",
                              settings=ControllerSettings(broker_silence_fence_ms=0))
    sm = MetadataStateMachine("c-gc", gc_freeze_min_records=50)
    raft_log = InMemoryReplicatedLog(sm, node_id=1, leader=False)
    server = ControllerServer(config, sm, raft_log, rng=random.Random(1))
    raft_log.become_leader()
    seen: dict = {}
    try:
        await wait_until(lambda: server.is_active, 10.0)
        ctl = server.controller
        for b in (1, 2):
            await server.write(lambda img, b=b: ctl.register_broker(img, b, f"inc-{b}", f"http://127.0.0.1:{9000 + b}",
                                                                     None, 0, 0))
            epoch = sm.image.brokers[b].epoch
            await server.write(lambda img, b=b, e=epoch: ctl.heartbeat(img, b, e, 10 ** 9, 0))
        gc.unfreeze()
        propose = raft_log.propose

        async def propose_seen(entries, **kw):
            seen["propose"] = (gc.get_threshold()[2], gc.get_freeze_count())
            return await propose(entries, **kw)
        raft_log.propose = propose_seen

        def decide(img):
            seen["decide"] = gc.get_threshold()[2]
            return ctl.create_topic(img, "big", 60, 2)
        assert (await server.write(decide))["ok"]
        after = gc.get_threshold()
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    assert seen["decide"] == _HELD                  # no full collection while deciding
    assert seen["propose"][0] == thresholds[2]      # back on before the raft entry is proposed
    assert seen["propose"][1] > 60                  # the entry (61 records) frozen before the apply
    assert after == thresholds
