"""Guard against pysyncobj 0.3.17 truncating a follower's log needlessly, and against its
chunked transmission of large entries.

pysyncobj's follower truncates every entry after `prevLogIdx` whenever its log is longer,
even when those entries match the leader's (Raft only deletes entries that *conflict*).
The leader lowers its next index to each acknowledged position while later entries are
still in flight, so with AppendEntries sent per command (our low-latency setting) a
follower keeps receiving messages whose `prevLogIdx` is behind its log end. Usually the
message re-carries the same entries and they are re-appended (pysyncobj logs "truncating
already-applied log entries ... CRITICAL"); but a message cut at the batch size limit, or a
heartbeat, can drop entries the follower has already acknowledged - the leader may have
counted them for a commit, and that follower could later win an election without them.

`rewrite_append_entries` moves `prevLogIdx` forward to the follower's last entry when that
is safe: the follower's last entry has the leader's current term, so by Raft's Log Matching
property the follower's log up to it equals the leader's log (only the leader of a term
creates entries of that term, and a leader never truncates its own log). The message then
appends only entries the follower lacks, and truncates nothing.

Large entries (a command of `appendEntriesBatchSizeBytes`, 64 KiB, or more, sent alone) go
as a "transmission": the pickled entry cut into 'start', 'process'... 'finish' messages of
64 KiB, all with the same prevLogIdx. Two pysyncobj bugs there (raft/README.md, "Large
entries"), both handled by `TransmissionReassembly` on the follower:
- the leader marks a chunk 'finish' when `pos + batch >= len(command)`, not the pickled
  entry's length (24 bytes more), so when a multiple of 64 KiB falls between the two the
  chunk before the last is marked 'finish' too: the follower unpickles a truncated entry
  and the exception aborts its raft tick (`failed _onTick`, `pickle data was truncated`).
  Here a 'finish' whose bytes do not unpickle yet is handled as a 'process';
- a transmission's 'finish' carried its entry past `rewrite_append_entries`, so a resent
  large entry still truncated entries the follower had acknowledged. Here the reassembled
  entry is handed on as a plain AppendEntries of one entry, which the rewrite covers.
The reassembly buffers per leader connection; the 'start'/'process' messages reach
pysyncobj with empty data (it still answers them and resets its election timer), so an
entry is buffered once.
"""
from __future__ import annotations

from typing import Callable, Optional


def rewrite_append_entries(message: dict, last_idx: int, last_term: int) -> Optional[dict]:
    """A safe replacement for `message` given the follower's last entry, or None to keep it."""
    if message.get("type") != "append_entries" or "prevLogIdx" not in message:
        return None
    if message.get("transmission") is not None:
        return None
    prev = message["prevLogIdx"]
    if last_idx <= prev or last_term != message.get("term"):
        return None
    entries = message.get("entries") or []
    kept = [e for e in entries if e[1] > last_idx]
    for e in entries:
        if e[1] == last_idx and e[2] != last_term:
            return None  # cannot happen under Log Matching; keep pysyncobj's behaviour
    rewritten = dict(message)
    rewritten["prevLogIdx"] = last_idx
    rewritten["prevLogTerm"] = last_term
    rewritten["entries"] = kept
    return rewritten


class TransmissionReassembly:
    """Reassembles pysyncobj's chunked large entries per sending node (module docstring).
    `receive` maps each transmission message to the message pysyncobj should handle:
    'start'/'process' (and a premature 'finish') with their data taken out, and the last
    'finish' as a plain AppendEntries carrying the whole entry. Invariant: at most one
    partial entry is buffered per node; a 'start' discards the previous one."""

    def __init__(self, loads: Optional[Callable[[bytes], object]] = None) -> None:
        if loads is None:
            from pysyncobj import pickle as pysyncobj_pickle

            loads = pysyncobj_pickle.loads
        self._loads = loads
        self._partial: dict = {}   # node -> bytearray of the pickled entry so far

    def buffered_bytes(self) -> int:
        return sum(len(b) for b in self._partial.values())

    def receive(self, node, message: dict) -> dict:
        transmission = message.get("transmission")
        data = message.get("data")
        if transmission == "start":
            self._partial[node] = bytearray(data)
            return dict(message, data=b"")
        buffered = self._partial.get(node)
        if buffered is None or transmission not in ("process", "finish"):
            return message   # not started here: pysyncobj's own handling
        buffered += data
        if transmission == "process":
            return dict(message, data=b"")
        try:
            entry = self._loads(bytes(buffered))
        except Exception:   # a 'finish' before the last chunk (pysyncobj's length bug)
            return dict(message, transmission="process", data=b"")
        del self._partial[node]
        plain = {k: v for k, v in message.items() if k not in ("transmission", "data")}
        plain["entries"] = [entry]
        return plain


def install_append_entries_guard(syncobj) -> bool:
    """Filter the messages `syncobj` receives through `TransmissionReassembly` and
    `rewrite_append_entries`. Runs on the raft thread, like the handler it wraps; adds no
    attribute to the SyncObj."""
    transport = getattr(syncobj, "_SyncObj__transport", None)
    journal = getattr(syncobj, "_SyncObj__raftLog", None)
    if transport is None or journal is None:
        return False
    handler = transport._onMessageReceivedCallback
    if handler is None:
        return False
    transmissions = TransmissionReassembly()

    def guarded(node, message):
        if isinstance(message, dict) and message.get("type") == "append_entries":
            if message.get("transmission") is not None:
                message = transmissions.receive(node, message)
            if len(journal):
                last = journal[len(journal) - 1]
                rewritten = rewrite_append_entries(message, last[1], last[2])
                if rewritten is not None:
                    message = rewritten
        return handler(node, message)

    transport.setOnMessageReceivedCallback(guarded)
    return True
