"""Large raft entries (>= pysyncobj's 64 KiB batch size) reach followers intact and never
truncate a follower's acknowledged entries (raft/append_entries_guard.py, raft/README.md
"Large entries")."""
from __future__ import annotations

import asyncio
import collections
import logging
import pickle
import secrets

from raft.append_entries_guard import TransmissionReassembly, install_append_entries_guard
from tests.unit.raft.test_raft_append_entries_guard import stand_in_syncobj
from tests.unit.raft.test_raft_prevote import _describe, _Entries, _free_port

BATCH = 2 ** 16   # pysyncobj's appendEntriesBatchSizeBytes default


def _chunks_as_pysyncobj_sends_them(entry: tuple, batch: int = BATCH) -> list:
    """pysyncobj 0.3.17's leader rule (syncobj.py __sendAppendEntries), 'finish' included."""
    data = pickle.dumps(entry)
    out = []
    for pos in range(0, len(data), batch):
        kind = "start" if pos == 0 else ("finish" if pos + batch >= len(entry[0]) else "process")
        out.append({"type": "append_entries", "transmission": kind, "data": data[pos:pos + batch], "term": 3,
                    "commit_index": 0, "prevLogIdx": entry[1] - 1, "prevLogTerm": 3})
    return out


def test_a_finish_before_the_last_chunk_is_handled_as_a_process():
    command = b"c" * (2 * BATCH - 3)         # the pickled entry crosses 2 * 64 KiB, the command does not
    chunks = _chunks_as_pysyncobj_sends_them((command, 11, 3))
    assert [c["transmission"] for c in chunks] == ["start", "finish", "finish"]   # pysyncobj's bug
    r = TransmissionReassembly(loads=pickle.loads)
    out = [r.receive("leader", c) for c in chunks]
    assert [m.get("transmission") for m in out] == ["start", "process", None]
    assert all(m["data"] == b"" for m in out[:2])      # pysyncobj buffers nothing
    assert out[2]["entries"] == [(command, 11, 3)] and out[2]["prevLogIdx"] == 10
    assert "data" not in out[2] and r.buffered_bytes() == 0


def test_reassembly_is_per_node_and_a_start_discards_a_partial_entry():
    r = TransmissionReassembly(loads=pickle.loads)
    a = _chunks_as_pysyncobj_sends_them((b"a" * 3 * BATCH, 5, 3))
    b = _chunks_as_pysyncobj_sends_them((b"b" * 2 * BATCH, 7, 3))
    r.receive("n1", a[0])
    r.receive("n2", b[0])
    r.receive("n1", a[1])
    r.receive("n1", a[0])                                       # the leader restarts the entry
    done = [r.receive("n1", c) for c in a[1:]][-1]
    assert done["entries"][0][1] == 5
    assert r.receive("n2", b[1])["transmission"] == "process"   # n2's entry is still partial
    assert r.receive("n2", b[2])["entries"][0][1] == 7 and r.buffered_bytes() == 0


def test_a_resent_large_entry_behind_the_log_end_truncates_nothing():
    seen = []
    so = stand_in_syncobj([(b"", 1, 3), (b"x" * BATCH, 2, 3), (b"", 3, 3), (b"", 4, 3)], seen)
    assert install_append_entries_guard(so)
    for c in _chunks_as_pysyncobj_sends_them((b"x" * BATCH, 2, 3)):   # entry 2 again, prevLogIdx 1
        so._SyncObj__transport._onMessageReceivedCallback("leader", c)
    assert seen[-1]["prevLogIdx"] == 4 and seen[-1]["entries"] == []   # was: delete 3 and 4


async def test_a_quorum_replicates_large_entries_without_errors_or_truncation(tmp_path):
    """Sizes whose pickled entry crosses a 64 KiB multiple (pysyncobj's early 'finish'), and
    large entries proposed among small ones (resent with prevLogIdx behind a follower's log
    end). In one term with one leader no follower ever has to delete an entry."""
    from raft.syncobj_log import RaftConfig, SyncObjReplicatedLog

    errors: list = []

    class Errors(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.ERROR:
                errors.append(record.getMessage() + (" " + repr(record.exc_info[1]) if record.exc_info else ""))

    handler = Errors()
    logging.getLogger("pysyncobj").addHandler(handler)
    voters = {i: f"127.0.0.1:{_free_port()}" for i in (1, 2, 3)}
    password = secrets.token_hex(8)
    logs: dict = {}
    deleted: collections.Counter = collections.Counter()
    try:
        for i in voters:
            cfg = RaftConfig(node_id=i, voters=voters, data_dir=str(tmp_path / f"n{i}"), password=password,
                             fsync_journal=False, raft_min_timeout_s=1.5, raft_max_timeout_s=3.0,
                             connection_timeout_s=3.0)
            logs[i] = SyncObjReplicatedLog(cfg, _Entries(), loop=asyncio.get_running_loop())
            logs[i].start()   # (long election timeouts: a load stall must not change the leader)
            so = logs[i]._syncobj
            delete = so._SyncObj__deleteEntriesFrom

            def counted(idx, _delete=delete, _i=i):
                deleted[_i] += 1
                return _delete(idx)

            so._SyncObj__deleteEntriesFrom = counted
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not any(lg.is_leader for lg in logs.values()):
            assert loop.time() < deadline, f"no leader in 60 s: {_describe(logs)}"
            await asyncio.sleep(0.05)
        leader = next(lg for lg in logs.values() if lg.is_leader)
        term = leader.term
        await leader.propose([{"blob": b"."}], timeout_s=30)
        so = leader._syncobj
        overhead = len(so._SyncObj__raftLog[-1][0]) - 1   # pysyncobj's command bytes around the blob
        expected = [{"blob": b"."}]
        for k in (2, 3, 5, 16):          # commands 3 bytes short of k * 64 KiB (up to 1 MiB)
            blob = b"k" * (k * BATCH - overhead - 3)
            await leader.propose([{"blob": blob}], timeout_s=30)
            command = so._SyncObj__raftLog[-1][0]
            assert len(command) == k * BATCH - 3 < len(pickle.dumps(so._SyncObj__raftLog[-1])), len(command)
            expected.append({"blob": blob})
        for r in range(10):              # large entries among small ones, proposed at once
            batch = [{"blob": bytes([r]) * size} for size in (10, 300_000, 10, 10, 200_000, 10)]
            await asyncio.gather(*[leader.propose([e], timeout_s=30) for e in batch])
            expected.extend(batch)

        def replicated():
            return all(len(lg.state_machine.entries) == len(expected) for lg in logs.values())

        deadline = loop.time() + 60
        while not replicated():
            assert loop.time() < deadline, f"followers did not apply every entry: {_describe(logs)}"
            await asyncio.sleep(0.05)
        assert {lg.term for lg in logs.values()} == {term}, _describe(logs)   # one leader throughout
        applied = [lg.state_machine.entries for lg in logs.values()]
        assert applied[0] == applied[1] == applied[2]
        assert sorted(e["blob"] for e in applied[0]) == sorted(e["blob"] for e in expected)
        assert not errors, errors[:3]
        assert not deleted, f"entries deleted from a follower's log in a single term: {dict(deleted)}"
    finally:
        logging.getLogger("pysyncobj").removeHandler(handler)
        for lg in logs.values():
            lg.stop()
