"""FsyncFileJournal: group-committed msync of pysyncobj's journal, fsync'd term/vote."""
from raft.fsync_journal import FsyncFileJournal, fsyncing_journal, install_group_commit


def test_appends_are_synced_once_per_group_and_survive_reopen(tmp_path):
    path = str(tmp_path / "raft.journal")
    j = FsyncFileJournal(path)
    for i in range(1, 6):
        j.add(b"cmd%d" % i, i, 1)
    assert j.syncs == 0
    j.sync()
    j.sync()  # nothing new: no second msync
    assert j.syncs == 1
    j.setCurrentTerm(7, "node-2")
    j._destroy()
    again = FsyncFileJournal(path)
    assert [e[1] for e in [again[i] for i in range(len(again))]] == [1, 2, 3, 4, 5]
    assert again.getCurrentTerm() == 7 and again.getVotedForNodeId() == "node-2"
    again._destroy()


def test_follower_ack_syncs_first_and_the_syncobj_stays_picklable():
    order = []

    class FakeTransport:
        def send(self, node, message):
            order.append(message["type"])

    class FakeSyncObj:
        def __init__(self, journal):
            self._SyncObj__raftLog = journal
            self._SyncObj__transport = FakeTransport()

    class J(FsyncFileJournal):
        def __init__(self):
            self._dirty = True
            self.syncs = 0

        def flush(self):
            order.append("sync")

    so = FakeSyncObj(J())
    attrs_before = set(vars(so))
    assert install_group_commit(so) is so._SyncObj__raftLog
    so._SyncObj__transport.send("node", {"type": "append_entries"})
    so._SyncObj__transport.send("node", {"type": "next_node_idx"})
    assert order == ["append_entries", "sync", "next_node_idx"]
    # nothing added to the SyncObj itself: pysyncobj pickles such attributes into its dump
    assert set(vars(so)) == attrs_before


def test_context_swaps_the_journal_factory_only_while_active(tmp_path):
    import pysyncobj.syncobj as m

    original = m.createJournal
    with fsyncing_journal():
        j = m.createJournal(str(tmp_path / "j"))
        assert isinstance(j, FsyncFileJournal)
        j._destroy()
    assert m.createJournal is original
