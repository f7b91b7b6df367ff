"""The follower-side AppendEntries rewrite that stops pysyncobj truncating matching entries."""
from raft.append_entries_guard import install_append_entries_guard, rewrite_append_entries


def ae(prev, entries, term=3, prev_term=3):
    return {"type": "append_entries", "term": term, "commit_index": 0, "prevLogIdx": prev,
            "prevLogTerm": prev_term, "entries": [(b"c", i, t) for i, t in entries]}


def test_overlapping_message_keeps_only_new_entries():
    msg = ae(104, [(105, 3), (106, 3), (107, 3)])
    out = rewrite_append_entries(msg, last_idx=106, last_term=3)
    assert out["prevLogIdx"] == 106 and out["prevLogTerm"] == 3
    assert [e[1] for e in out["entries"]] == [107]


def test_heartbeat_behind_the_log_end_no_longer_truncates():
    out = rewrite_append_entries(ae(100, []), last_idx=108, last_term=3)
    assert out["prevLogIdx"] == 108 and out["entries"] == []


def test_batch_cut_short_keeps_the_longer_matching_log():
    out = rewrite_append_entries(ae(100, [(101, 3), (102, 3)]), last_idx=110, last_term=3)
    assert out["prevLogIdx"] == 110 and out["entries"] == []


def test_entries_of_an_older_term_are_left_to_raft():
    # the follower's tail is from an older leader: it may conflict, so pysyncobj decides
    assert rewrite_append_entries(ae(100, [(101, 3)]), last_idx=105, last_term=2) is None
    assert rewrite_append_entries(ae(105, [(106, 3)]), last_idx=105, last_term=3) is None  # in order
    assert rewrite_append_entries({"type": "append_entries", "term": 3, "serialized": b""}, 5, 3) is None
    msg = ae(100, [(101, 3)])
    msg["transmission"] = "start"
    assert rewrite_append_entries(msg, 105, 3) is None


class _Transport:
    """pysyncobj's transport as the guard sees it: one message callback, replaceable."""

    def __init__(self, seen: list):
        self._onMessageReceivedCallback = lambda node, m: seen.append(m)

    def setOnMessageReceivedCallback(self, cb):
        self._onMessageReceivedCallback = cb


class _StandInSyncObj:
    pass


def stand_in_syncobj(raft_log: list, seen: list) -> _StandInSyncObj:
    """A stand-in SyncObj with `raft_log` whose handler appends each message it gets to `seen`."""
    so = _StandInSyncObj()
    so._SyncObj__transport = _Transport(seen)
    so._SyncObj__raftLog = raft_log
    return so


def test_installed_guard_rewrites_before_the_handler():
    seen = []
    so = stand_in_syncobj([(b"", 1, 1), (b"", 2, 3), (b"", 3, 3)], seen)
    before = set(vars(so))
    assert install_append_entries_guard(so)
    so._SyncObj__transport._onMessageReceivedCallback("n", ae(1, [(2, 3)]))
    assert seen[0]["prevLogIdx"] == 3 and seen[0]["entries"] == []
    assert set(vars(so)) == before
