"""The journal sync releases the GIL (issue 25, controller quorum at scale).

pysyncobj's journal is an mmap; its flush (`mmap.flush`, msync) holds the GIL in CPython
3.11 for the whole call, so a journal sync waiting on a busy disk froze the controller's
event loop and every other thread as long as the disk took (measured: a 256 MiB dirty map
flushed in 662 ms left the other thread no run for 681 ms; with os.fsync, 87 ms at load 8).
FsyncFileJournal now syncs with os.fsync of the journal's file (the same write-back on
Linux) and counts the time, which the raft thread's tick-gap log names."""
from __future__ import annotations

import os

from pysyncobj.journal import ResizableFile

from raft import fsync_journal
from raft.fsync_journal import FsyncFileJournal


def test_sync_is_an_fsync_of_the_journal_file_not_an_mmap_flush(tmp_path, monkeypatch):
    path = str(tmp_path / "raft.journal")
    j = FsyncFileJournal(path)
    try:
        synced = []
        real_fsync = os.fsync

        def recording_fsync(fd):
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            real_fsync(fd)

        def no_mmap_flush(self):
            raise AssertionError("mmap.flush holds the GIL for the whole msync")

        monkeypatch.setattr(fsync_journal.os, "fsync", recording_fsync)
        monkeypatch.setattr(ResizableFile, "flush", no_mmap_flush)
        for i in range(1, 200):
            j.add(b"x" * 5000, i, 1)   # grows the mapping past its first size
        j.sync()
        assert synced == [os.path.realpath(path)]
        assert j.syncs == 1 and j.sync_s > 0
        j.sync()                       # nothing new: no second sync
        assert synced == [os.path.realpath(path)]
    finally:
        monkeypatch.undo()
        j._destroy()
    again = FsyncFileJournal(path)
    try:
        assert len(again) == 199 and again[198][1] == 199
    finally:
        again._destroy()


def test_without_known_internals_it_falls_back_to_the_mmap_flush(tmp_path, monkeypatch):
    j = FsyncFileJournal(str(tmp_path / "raft.journal"))
    flushed = []
    monkeypatch.setattr(ResizableFile, "flush", lambda self: flushed.append(1))
    inner = j._FileJournal__journalFile
    monkeypatch.delattr(inner, "_ResizableFile__f")
    j.add(b"cmd", 1, 1)
    j.sync()
    assert flushed == [1]
    monkeypatch.undo()
    j._destroy()
