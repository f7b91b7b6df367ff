"""The voters of a quorum compact their raft logs in turn (issue 25, `RaftConfig.
log_compaction_split`). Every compaction forks a child that pickles the whole metadata
image (about 1.4 s of CPU at 100,000 partitions); all three voters used to compact after the
same entry count, at the same moment, and on a 2-core host running all three their raft
threads stalled for 2 s and the quorum changed leader during a broker failover. Three real
pysyncobj nodes in-process, compacting every few entries: each node's full dumps are written
in its own window, never two nodes' at once."""
from __future__ import annotations

import asyncio
import os
import secrets
import time

from raft.syncobj_log import RaftConfig, SyncObjReplicatedLog
from tests.unit.raft.test_raft_prevote import _Entries, _free_port, _propose_on_leader

PERIOD_S = 3.0          # log_compaction_min_time_s: each node's window is the first 30% of its third


def test_the_split_is_on_by_default():
    assert RaftConfig(node_id=1, voters={1: "a:1"}, data_dir="/x").log_compaction_split is True


async def test_voters_write_their_full_dumps_in_turn(tmp_path):
    voters = {i: f"127.0.0.1:{_free_port()}" for i in (1, 2, 3)}
    password = secrets.token_hex(8)
    logs = {}
    loop = asyncio.get_running_loop()
    dumps = {i: tmp_path / f"n{i}" / "raft.dump" for i in voters}
    writes: dict = {i: [] for i in voters}   # node -> monotonic times its dump changed
    try:
        for i in voters:
            cfg = RaftConfig(node_id=i, voters=voters, data_dir=str(tmp_path / f"n{i}"), password=password,
                             fsync_journal=False, log_compaction_min_entries=5, log_compaction_min_time_s=PERIOD_S)
            logs[i] = SyncObjReplicatedLog(cfg, _Entries(), loop=loop)
            logs[i].start()
        seen = {i: None for i in voters}
        end = loop.time() + 3 * PERIOD_S
        n = 0
        while loop.time() < end:
            await _propose_on_leader(logs, {"n": n})
            n += 1
            for i, path in dumps.items():
                try:
                    stamp = os.stat(path).st_mtime_ns
                except FileNotFoundError:
                    continue
                if stamp != seen[i]:
                    seen[i] = stamp
                    writes[i].append(time.monotonic())
            await asyncio.sleep(0.02)
    finally:
        for lg in logs.values():
            lg.stop()
    assert all(writes.values()), f"a voter wrote no full dump in {3 * PERIOD_S} s of entries: {writes}"
    # every pair of dumps by different voters is far apart (windows start PERIOD_S / 3 apart)
    closest = min(abs(a - b) for i in voters for j in voters if i < j for a in writes[i] for b in writes[j])
    assert closest >= 0.4, f"two voters wrote their dumps {closest:.3f} s apart: {writes}"


async def test_a_lone_voter_compacts_as_soon_as_due(tmp_path):
    """One voter (`kraftlog serve`) has nobody to take turns with: the split would only delay
    its compaction by up to 70% of the period."""
    cfg = RaftConfig(node_id=1, voters={1: f"127.0.0.1:{_free_port()}"}, data_dir=str(tmp_path / "lone"),
                     fsync_journal=False, log_compaction_min_entries=5)
    assert cfg.log_compaction_split
    lg = SyncObjReplicatedLog(cfg, _Entries(), loop=asyncio.get_running_loop())
    lg.start()
    try:
        for n in range(20):
            await _propose_on_leader({1: lg}, {"n": n})
        deadline = time.monotonic() + 10
        while not os.path.exists(cfg.full_dump_file):
            assert time.monotonic() < deadline, (
                f"no full dump 10 s after 20 entries (monotonic phase {time.monotonic() % 300:.0f} s of 300)")
            await asyncio.sleep(0.05)
    finally:
        lg.stop()
