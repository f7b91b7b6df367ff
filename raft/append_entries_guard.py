"""Guard against pysyncobj 0.3.17 truncating a follower's log needlessly.

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
"""
from __future__ import annotations

from typing import Optional


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


def install_append_entries_guard(syncobj) -> bool:
    """Filter the messages `syncobj` receives through `rewrite_append_entries`. Runs on the
    raft thread, like the handler it wraps; adds no attribute to the SyncObj."""
    transport = getattr(syncobj, "_SyncObj__transport", None)
    journal = getattr(syncobj, "_SyncObj__raftLog", None)
    if transport is None or journal is None:
        return False
    handler = transport._onMessageReceivedCallback
    if handler is None:
        return False

    def guarded(node, message):
        if isinstance(message, dict) and message.get("type") == "append_entries" and len(journal):
            last = journal[len(journal) - 1]
            rewritten = rewrite_append_entries(message, last[1], last[2])
            if rewritten is not None:
                message = rewritten
        return handler(node, message)

    transport.setOnMessageReceivedCallback(guarded)
    return True
