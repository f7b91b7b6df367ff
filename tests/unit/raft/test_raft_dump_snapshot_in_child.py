"""pysyncobj's log compaction builds the dump's data on the raft thread, then forks and
pickles it in the child. The metadata snapshot is now built only when pickled, in the child
(raft/syncobj_log.py SnapshotWhenPickled): at 100,000 partitions building it cost 1.5 s of
raft-thread CPU on every controller at once (issue 25, failover at 100,000 partitions)."""
from __future__ import annotations

import gzip
import os
import pickle
import threading

from metadata_quorum.image import MetadataImage
from raft.syncobj_log import SnapshotWhenPickled, _Consumer
from tests.unit.metadata.metadata_harness import Harness


def _counting_to_snapshot(monkeypatch) -> list:
    calls = []
    real = MetadataImage.to_snapshot

    def counting(self):
        calls.append(os.getpid())
        return real(self)
    monkeypatch.setattr(MetadataImage, "to_snapshot", counting)
    return calls


def test_the_consumer_serializes_without_building_the_snapshot(monkeypatch):
    h = Harness()
    h.create("t", partitions=50, rf=3)
    calls = _counting_to_snapshot(monkeypatch)
    data = _Consumer(h.sm, lambda: None)._serialize()
    assert calls == []                                   # nothing built on the raft thread
    plain = pickle.loads(pickle.dumps(data))             # no fork here: built while pickled
    assert calls == [os.getpid()]
    assert type(plain["snapshot"]) is dict and plain["snapshot"] == h.sm.snapshot()


def test_a_forked_child_pickles_it_while_another_thread_held_the_lock(tmp_path):
    """The dump child's copy of the lock is held by a thread that does not exist there:
    the child must build the snapshot without it (it hung forever with the lock)."""
    h = Harness()
    h.create("t", partitions=50, rf=3)
    want = h.sm.snapshot()
    data = _Consumer(h.sm, lambda: None)._serialize()
    held, release = threading.Event(), threading.Event()

    def holder():
        with h.sm.lock:
            held.set()
            release.wait(30)
    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    out = tmp_path / "dump"
    try:
        pid = os.fork()
        if pid == 0:   # the child, as pysyncobj's Serializer.serialize does it
            try:
                with open(out, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb") as g:
                    pickle.dump(data, g)
            finally:
                os._exit(0)
        deadline_reached = True
        for _ in range(300):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                deadline_reached = False
                break
            release.wait(0.1)
        if deadline_reached:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        assert not deadline_reached, "the dump child hung on the state machine's lock"
    finally:
        release.set()
        t.join()
    with gzip.open(out, "rb") as g:
        assert pickle.load(g)["snapshot"] == want


def test_a_state_machine_without_an_unlocked_snapshot_is_pickled_as_before():
    class Plain:
        def snapshot(self):
            return {"n": 3}
    assert pickle.loads(pickle.dumps(SnapshotWhenPickled(Plain()))) == {"n": 3}
