"""FsyncFileJournal: pysyncobj's file journal, made durable before raft acknowledges.

pysyncobj 0.3.17's FileJournal writes entries into an mmap and never syncs it while running
(only on destroy); its term/vote metadata is written with rename but without fsync. So an
acknowledged entry survives kill -9 (the page cache survives) but not a power loss.

This subclass syncs the journal file before the node acknowledges appended entries (group
commit: one sync per AppendEntries message on a follower, one per tick on the leader) and
fsyncs the term/vote file (and its directory) at every change, before the vote is sent
(raft's persistence rule). Measured cost: see metadata_quorum/README.md.

The sync is `os.fsync` of the journal's file, not pysyncobj's `mmap.flush()`: on Linux both
write back the file's dirty pages (msync(MS_SYNC) is an fsync of the range), but CPython
3.11's `mmap.flush` holds the GIL for the whole msync, so a sync waiting on a busy disk
froze every thread of the controller (its event loop too) for as long (issue 25: up to
hundreds of ms while brokers create 10,000 partitions' files on the same disk).
"""
from __future__ import annotations

import contextlib
import os
import time

import pysyncobj.syncobj as _syncobj_module
from pysyncobj.journal import FileJournal


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FsyncFileJournal(FileJournal):
    """Appends mark the journal dirty; `sync()` msyncs it once for everything appended
    since (group commit). The raft adapter calls `sync()` before a follower acknowledges
    entries and once per tick on the leader, before the leader counts itself in the
    commit majority (see `install_group_commit`). Term/vote changes are fsync'd at once."""

    sync_s = 0.0   # seconds spent in sync() so far (the raft thread's tick gaps name it)

    def __init__(self, journal_file: str):
        super().__init__(journal_file)
        self._meta_path = journal_file + ".meta"
        self._dirty = False
        self.syncs = 0
        _fsync_path(os.path.dirname(os.path.abspath(journal_file)) or ".")

    def add(self, command, idx, term):
        super().add(command, idx, term)
        self._dirty = True

    def clear(self):
        super().clear()
        self._dirty = True

    def deleteEntriesFrom(self, entryFrom):
        super().deleteEntriesFrom(entryFrom)
        self._dirty = True

    def sync(self) -> None:
        if self._dirty:
            self._dirty = False
            started = time.perf_counter()
            self.flush()
            took = time.perf_counter() - started
            self.sync_s += took
            self.syncs += 1

    def flush(self) -> None:
        """Write back the journal's dirty pages with the GIL released (os.fsync); pysyncobj's
        own flush (mmap.flush, which holds the GIL) only if its internals are not as known."""
        f = getattr(getattr(self, "_FileJournal__journalFile", None), "_ResizableFile__f", None)
        if f is None or f.closed:
            super().flush()
            return
        os.fsync(f.fileno())

    def setCurrentTerm(self, term, votedForNodeId):
        super().setCurrentTerm(term, votedForNodeId)
        if os.path.exists(self._meta_path):
            _fsync_path(self._meta_path)
            _fsync_path(os.path.dirname(os.path.abspath(self._meta_path)) or ".")


ACK_MESSAGE_TYPES = ("next_node_idx", "response_vote")


def install_group_commit(syncobj) -> "FsyncFileJournal | None":
    """Make `syncobj` sync its FsyncFileJournal before every acknowledgement it sends
    (pysyncobj answers AppendEntries right after appending). Returns the journal, whose
    `sync()` the caller must also run once per tick (leader side).

    The hook wraps the transport's `send` (never an attribute of the SyncObj itself:
    pysyncobj pickles every SyncObj attribute added after __init__ into its full dump, and
    a closure there makes every dump fail)."""
    journal = getattr(syncobj, "_SyncObj__raftLog", None)
    transport = getattr(syncobj, "_SyncObj__transport", None)
    if not isinstance(journal, FsyncFileJournal) or transport is None:
        return None
    send = transport.send

    def synced_send(node, message):
        if isinstance(message, dict) and message.get("type") in ACK_MESSAGE_TYPES:
            journal.sync()
        return send(node, message)

    transport.send = synced_send
    return journal


@contextlib.contextmanager
def fsyncing_journal():
    """While active, SyncObj construction uses FsyncFileJournal for its journal file."""
    original = _syncobj_module.createJournal

    def create(journal_file=None):
        return original(None) if journal_file is None else FsyncFileJournal(journal_file)

    _syncobj_module.createJournal = create
    try:
        yield
    finally:
        _syncobj_module.createJournal = original
