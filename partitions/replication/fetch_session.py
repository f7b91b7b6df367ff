"""Incremental replica fetch sessions (Kafka's KIP-227), both sides; pure (no IO, no event loop).

A follower fetches every partition it follows from one leader in one long poll. Without a
session each poll names every partition, and the leader reads every one of them, even
when nothing changed: at thousands of partitions per leader that walk was most of the
leader's CPU (issue 25). With a session:

- the follower's first fetch is FULL (session id 0, epoch 0): the leader creates a
  `FetchSession` holding each partition's fetch offset and leader epoch and answers with
  its id; the follower numbers its next request epoch 1, then 2, ...;
- an INCREMENTAL fetch (the session's id and next epoch) names only partitions that are
  new or whose fetch offset / leader epoch changed, and `forgotten` ones it no longer
  fetches; the others keep what the session holds;
- the leader reads only the partitions named in the request plus those that changed on
  its side since the last answer (`partition_changed`: an append, a high watermark move, a
  role change), and answers only partitions with records, an error, or a high watermark /
  log start offset the follower has not been told;
- a long poll parked on a session is woken by a change of any of its partitions, without
  looking at the others (`partition_changed` returns the sessions to wake).

Follower progress of the partitions a request does not name is restated as of that
request (their fetch offset is unchanged), but at most once per `refresh_ms` per session
(`due_for_refresh`): that keeps a caught-up follower in the ISR and not "silent". Caught-up
partitions that did not change are restated by the session's clock alone
(`FetchSession.liveness`, a `partition.FollowerLiveness`, issue 25): a restate visits only
the session's other (`loose`) partitions, so an idle session costs next to nothing.

An unknown session or an epoch other than the expected one is answered with a session
error (`FETCH_SESSION_ID_NOT_FOUND`, `INVALID_FETCH_SESSION_EPOCH`) and no partitions; the
follower then starts over with a full fetch. So does a follower after any failed or
cancelled request (it cannot know whether the leader saw it), a follower that restarted
(a new full fetch replaces the replica's old session), and a follower whose leader answers
without a session id (a leader without sessions: every fetch stays full, as before).

Invariants: a replica has at most one session per leader; a session's epoch only moves
forward by one per answered request; the follower's view (`FollowerSession.sent`) equals
the leader's (`FetchSession.partitions`) after every answered request.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable

NO_SESSION = 0
INITIAL_EPOCH = 0
FETCH_SESSIONS_MAX = 1000          # sessions a leader keeps; the least recently used is evicted
FETCH_SESSION_IDLE_MS = 120_000    # a session unused this long is evicted
FETCH_SESSION_REFRESH_MS = 250     # restate unnamed partitions' follower progress at most this often
SESSION_NOT_FOUND = "FETCH_SESSION_ID_NOT_FOUND"
INVALID_EPOCH = "INVALID_FETCH_SESSION_EPOCH"
UNSENT = -2                        # a high watermark / log start offset never told to the follower

Key = Hashable   # (topic, partition)


@dataclass(slots=True)
class CachedPartition:
    """One partition of a leader-side session: what the follower last stated, and what
    the answers last told it."""

    fetch_offset: int
    leader_epoch: int
    high_watermark_sent: int = UNSENT
    log_start_offset_sent: int = UNSENT


@dataclass
class FetchSession:
    """One follower's session on this leader (see the module docstring). `dirty`: partitions
    that changed on the leader since they were last read for this session."""

    session_id: int
    replica_id: int
    epoch: int                      # the epoch the next incremental request must carry
    last_used_ms: int
    partitions: dict = field(default_factory=dict)     # key -> CachedPartition
    dirty: set = field(default_factory=set)
    refreshed_ms: int = -1          # when unnamed partitions' progress was last restated
    liveness: Any = None            # the follower's FollowerLiveness on this leader (None: none)

    def due_for_refresh(self, now_ms: int, refresh_ms: int) -> bool:
        """True (and the refresh time reset) when the unnamed partitions' follower progress
        should be restated now."""
        if self.refreshed_ms >= 0 and now_ms - self.refreshed_ms < refresh_ms:
            return False
        self.refreshed_ms = now_ms
        return True

    def wants_answer(self, key: Key, *, has_records: bool, error: bool, high_watermark: int,
                     log_start_offset: int) -> bool:
        """Whether `key`'s read result goes into the answer (KIP-227: records, an error, or a
        high watermark / log start offset the follower has not been told)."""
        c = self.partitions.get(key)
        return (c is None or has_records or error or c.high_watermark_sent != high_watermark
                or c.log_start_offset_sent != log_start_offset)

    def told(self, key: Key, high_watermark: int, log_start_offset: int) -> None:
        """The answer carries `key` with these offsets."""
        c = self.partitions.get(key)
        if c is not None:
            c.high_watermark_sent = high_watermark
            c.log_start_offset_sent = log_start_offset

    def still_changed(self, key: Key) -> None:
        """`key` has more to send than this answer took (a byte budget or throttle): read it
        again next time even if nothing else changes."""
        if key in self.partitions:
            self.dirty.add(key)


class FetchSessionCache:
    """The leader's fetch sessions, by id, with a partition -> sessions index for wake-ups.
    At most `sessions_max` (least recently used evicted first) and none idle for longer
    than `idle_ms`; one per replica (a new full fetch from a replica replaces its old one)."""

    def __init__(self, *, sessions_max: int = FETCH_SESSIONS_MAX, idle_ms: int = FETCH_SESSION_IDLE_MS,
                 first_id: int = 1) -> None:
        if sessions_max < 1:
            raise ValueError(f"sessions_max={sessions_max} must be at least 1")
        self.sessions_max = sessions_max
        self.idle_ms = idle_ms
        self.sessions: dict[int, FetchSession] = {}
        self._by_replica: dict[int, int] = {}
        self._by_partition: dict[Key, set[int]] = {}
        self._next_id = max(1, first_id)

    def __len__(self) -> int:
        return len(self.sessions)

    def session_of(self, replica_id: int) -> FetchSession | None:
        """The replica's current session (at most one per replica), else None."""
        sid = self._by_replica.get(replica_id)
        return self.sessions.get(sid) if sid is not None else None

    def _new_id(self) -> int:
        while True:
            sid = self._next_id
            self._next_id = self._next_id + 1 if self._next_id < 2**31 - 1 else 1
            if sid != NO_SESSION and sid not in self.sessions:
                return sid

    def new_session(self, replica_id: int, partitions: Iterable[tuple[Key, int, int]], now_ms: int,
                    liveness: Any = None) -> FetchSession:
        """A full fetch: a new session holding [(key, fetch_offset, leader_epoch)]; the
        replica's previous session (a restarted follower) is dropped, and the least recently
        used one when the cache is full."""
        old = self._by_replica.get(replica_id)
        if old is not None:
            self.remove(old)
        self.evict_idle(now_ms)
        while len(self.sessions) >= self.sessions_max:
            self.remove(min(self.sessions.values(), key=lambda s: s.last_used_ms).session_id)
        s = FetchSession(self._new_id(), replica_id, INITIAL_EPOCH, now_ms)   # answered() makes it 1
        s.liveness = liveness
        self.sessions[s.session_id] = s
        self._by_replica[replica_id] = s.session_id
        for key, offset, epoch in partitions:
            self._add(s, key, offset, epoch)
        return s

    def add_partitions(self, s: FetchSession, partitions: Iterable[tuple[Key, int, int]]) -> bool:
        """Add [(key, fetch_offset, leader_epoch)] to the new session `s` (a full fetch of
        thousands of partitions is added in slices, the event loop serving between them).
        False, adding nothing, when `s` is no longer in the cache (its replica's next full
        fetch replaced it meanwhile)."""
        if self.sessions.get(s.session_id) is not s:
            return False
        for key, offset, epoch in partitions:
            self._add(s, key, offset, epoch)
        return True

    def lookup(self, session_id: int, epoch: int, replica_id: int, now_ms: int) -> FetchSession | str:
        """The session an incremental fetch names, or the session error to answer with."""
        s = self.sessions.get(session_id)
        if s is None or s.replica_id != replica_id:
            return SESSION_NOT_FOUND
        if epoch != s.epoch:
            self.remove(session_id)   # the follower lost track of it: it starts over with a full fetch
            return INVALID_EPOCH
        s.last_used_ms = now_ms
        return s

    def update(self, s: FetchSession, partitions: Iterable[tuple[Key, int, int]], forgotten: Iterable[Key]) -> list:
        """Apply an incremental request to `s`: [(key, fetch_offset, leader_epoch)] added or
        changed, `forgotten` removed. -> the keys to read now: those named plus the dirty
        ones (the dirty set is cleared)."""
        for key in forgotten:
            self._discard(s, key)
        named = []
        for key, offset, epoch in partitions:
            c = s.partitions.get(key)
            if c is None:
                self._add(s, key, offset, epoch)
            else:
                if s.liveness is not None:
                    s.liveness.detach(key)   # restated from its new offset / epoch from now on
                # named again: its last answer may not have been taken (the follower
                # truncated, or skipped it); answer it this time whatever it holds
                c.fetch_offset, c.leader_epoch = offset, epoch
                c.high_watermark_sent = c.log_start_offset_sent = UNSENT
            named.append(key)
        return self.take_dirty(s, named)

    @staticmethod
    def take_dirty(s: FetchSession, first: list | None = None) -> list:
        """`first` (keys named by the request) then the session's dirty keys, each once; the
        dirty set is cleared."""
        out = list(first or [])
        if s.dirty:
            seen = set(out)
            out.extend(k for k in s.dirty if k not in seen and k in s.partitions)
            s.dirty.clear()
        return out

    def answered(self, s: FetchSession) -> None:
        """An answer went out for `s`'s current epoch: the next request carries the next one."""
        s.epoch += 1

    def partition_changed(self, key: Key) -> list[int]:
        """`key` changed on the leader (data, high watermark, role): mark it in every session
        holding it; -> those sessions' ids (their parked long polls should wake)."""
        ids = self._by_partition.get(key)
        if not ids:
            return []
        for sid in ids:
            self.sessions[sid].dirty.add(key)
        return list(ids)

    def evict_idle(self, now_ms: int) -> list[int]:
        gone = [sid for sid, s in self.sessions.items() if now_ms - s.last_used_ms > self.idle_ms]
        for sid in gone:
            self.remove(sid)
        return gone

    def remove(self, session_id: int) -> None:
        s = self.sessions.pop(session_id, None)
        if s is None:
            return
        if self._by_replica.get(s.replica_id) == session_id:
            del self._by_replica[s.replica_id]
        for key in s.partitions:
            ids = self._by_partition.get(key)
            if ids is not None:
                ids.discard(session_id)
                if not ids:
                    del self._by_partition[key]
        s.partitions.clear()   # a long poll still parked on it answers from nothing more
        s.dirty.clear()
        if s.liveness is not None:
            s.liveness.close()

    def _add(self, s: FetchSession, key: Key, offset: int, epoch: int) -> None:
        s.partitions[key] = CachedPartition(offset, epoch)
        if s.liveness is not None:
            s.liveness.loose.add(key)
        self._by_partition.setdefault(key, set()).add(s.session_id)

    def _discard(self, s: FetchSession, key: Key) -> None:
        if s.partitions.pop(key, None) is None:
            return
        if s.liveness is not None:
            s.liveness.detach(key)
            s.liveness.loose.discard(key)
        s.dirty.discard(key)
        ids = self._by_partition.get(key)
        if ids is not None:
            ids.discard(s.session_id)
            if not ids:
                del self._by_partition[key]


@dataclass
class FollowerSession:
    """The follower's side of its session with one leader: what the leader's session holds
    (`sent`: key -> (fetch_offset, leader_epoch)) and the next request's id and epoch.

    `build(wanted)` makes a request; `answered(...)` commits it once the leader answered;
    `reset()` (any failed or cancelled request, a session error) makes the next one full."""

    session_id: int = NO_SESSION
    epoch: int = INITIAL_EPOCH
    sent: dict = field(default_factory=dict)
    _pending: dict | None = None
    full_fetches: int = 0
    incremental_fetches: int = 0
    # the last request went unanswered (timed out): the next one re-sends this epoch and names
    # every partition that differs from the last answered request (`unanswered`)
    _resend: bool = False
    resent_fetches: int = 0

    def build(self, wanted: dict, candidates: set | None = None) -> tuple[int, int, list, list]:
        """`wanted`: key -> (fetch_offset, leader_epoch) of every partition to fetch now.
        `candidates`: the only keys whose entry may differ from the last request's (issue 25:
        the caller tracks them, so no walk of `wanted`); None: compare them all.
        -> (session_id, epoch, keys to name in the request, forgotten keys). A full fetch
        (no session yet) names them all."""
        self._pending = dict(wanted)
        if self.session_id == NO_SESSION:
            self.full_fetches += 1
            return NO_SESSION, INITIAL_EPOCH, list(wanted), []
        self.incremental_fetches += 1
        if self._resend:
            self._resend = False
            self.resent_fetches += 1
            candidates = None   # what the unanswered request named may not have reached the leader
        if candidates is None:
            named = [k for k, v in wanted.items() if self.sent.get(k) != v]
            forgotten = [k for k in self.sent if k not in wanted]
        else:
            named = [k for k in candidates if k in wanted and self.sent.get(k) != wanted[k]]
            forgotten = [k for k in candidates if k in self.sent and k not in wanted]
        return self.session_id, self.epoch, named, forgotten

    def view(self) -> dict:
        """key -> (fetch_offset, leader_epoch) the leader holds once the pending request is
        answered: an answer's partitions are read from these offsets."""
        return self._pending if self._pending is not None else self.sent

    def answered(self, session_id: int | None, session_error: str | None = None) -> bool:
        """The leader answered the pending request with `session_id` (None: a leader without
        sessions) or a session error. -> False when the answer's partitions must be ignored
        (a session error: nothing was read)."""
        pending, self._pending = self._pending, None
        if session_error:
            self.reset()
            return False
        if not session_id:
            self.reset()   # no session on the leader: the next fetch is full again
            return True
        if self.session_id == NO_SESSION or session_id != self.session_id:
            self.session_id, self.epoch = session_id, INITIAL_EPOCH + 1
        else:
            self.epoch += 1
        self.sent = pending if pending is not None else {}
        return True

    def reset(self) -> None:
        self.session_id, self.epoch, self._pending = NO_SESSION, INITIAL_EPOCH, None
        self.sent = {}
        self._resend = False

    def unanswered(self) -> None:
        """The pending request timed out (no answer, the leader may be alive but busy): keep
        the session. The next request re-sends the same epoch, naming every partition that
        differs from the last answered request, so it is complete whether or not the leader
        saw the lost one. A leader that did answer it has moved on to the next epoch and
        answers INVALID_FETCH_SESSION_EPOCH: a full fetch then, as after `reset` (issue 25:
        resetting on every timeout made a busy leader take a full fetch of tens of thousands
        of partitions, which made it busier)."""
        self._pending = None
        if self.session_id != NO_SESSION:
            self._resend = True

    def forget(self, key: Key) -> None:
        """`key` must be named again in the next request (e.g. its state moved locally in a
        way its fetch offset alone does not show)."""
        self.sent.pop(key, None)
