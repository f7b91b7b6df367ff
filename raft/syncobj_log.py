"""SyncObjReplicatedLog: the ReplicatedLog over pysyncobj 0.3.17, bridged to asyncio.

Rules this module enforces (measured pitfalls, see metadata_quorum/README.md):

- exactly one replicated method, `apply(entries)`, on a consumer built before the SyncObj
  (replicated method ids are positional; state assigned after SyncObj.__init__ can wipe a
  restored snapshot); `apply` never raises;
- journalFile and fullDumpFile are always set (journal alone + compaction loses data);
- a password is always set (the raft port unpickles network input); a multi-node quorum
  refuses to start without one;
- the SyncObj is built on the main thread (its tick thread exits with the thread that
  built it); every callback crosses to the event loop with loop.call_soon_threadsafe;
- every proposal is wrapped in asyncio.wait_for; NOT_LEADER / MISSING_LEADER before
  appending -> NotLeaderError; LEADER_CHANGED / UNKNOWN_OUTCOME / timeouts ->
  OutcomeUnknownError;
- a tick callback pings every peer every `peer_ping_interval_s` so idle links are
  detected dead before they are needed (otherwise the first use after a failure wastes an
  election round);
- followers never truncate entries that match the leader's, and reassemble large entries
  (pysyncobj's chunked "transmissions") themselves (raft/append_entries_guard.py);
- a peer announcing a frame over `frame_max_bytes` is dropped before its frame is buffered,
  and frames failing the password's check are counted (raft/frame_guard.py, `peer_stats`);
- pre-vote (raft/prevote.py, opt-in with RaftConfig.prevote): a node starts an election only
  once a majority says it would vote for it, so an isolated node keeps its term and rejoins
  without forcing elections;
- election backoff (raft/election_backoff.py, KRaft's election backoff): a node that knows no
  leader stretches each election timeout after a failed election (2x, 4x, ... up to
  `election_backoff_max_s`), so votes slower than 0.3-0.6 s on a loaded machine still elect
  a leader; the first election after a leader is lost keeps the short timeout;
- election guard (raft/election_guard.py): a node whose raft thread was stalled past its
  election timeout reads the messages that arrived meanwhile before it campaigns, so a
  stalled follower does not depose a live leader and a stalled candidate counts its votes;
- dynamic membership (pysyncobj's single-server changes, DESIGN.md section 10): `add_voter`,
  `remove_voter` and `transfer_leadership` await the commit of the change; the leader refuses
  a second change while one is uncommitted (MembershipChangeError). A node started with
  `RaftConfig.join` and an empty journal does not campaign until it has heard from a leader
  (a node not yet added is refused by the others' transports, so its elections would only
  raise its term and depose the leader once it is added). Any node may `forward` entries: a
  follower's pysyncobj sends them to the leader.

Durability: pysyncobj's own file journal is an mmap that is never synced while running
(only on destroy), and its term/vote file is renamed without fsync: an acknowledged entry
survives kill -9 (the page cache survives) but not a power loss. With `fsync_journal`
(the default) the journal is msync'd after every append and the term/vote file fsync'd
before raft answers (raft/fsync_journal.py), like KRaft flushing its metadata log.
"""
from __future__ import annotations

import asyncio
import collections
import gc
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated

from raft.apply_grace import APPLY_GRACE_MIN_BYTES_DEFAULT, install_apply_grace
from raft.election_backoff import ELECTION_BACKOFF_MAX_S_DEFAULT, ElectionBackoff
from raft.frame_guard import install_frame_guard
from raft.log import (RAFT_FRAME_MAX_BYTES_DEFAULT, MembershipChangeError, NotLeaderError, OutcomeUnknownError,
                      RaftPeerStats)
from raft.tick_gaps import TickGapMonitor

log = logging.getLogger(__name__)


@dataclass
class RaftConfig:
    """Raft node settings; times in seconds (unit last). Defaults are the values measured
    to elect a new leader in 0.3-0.55 s after kill -9 on this machine."""

    node_id: int
    voters: dict  # node_id -> "host:port" raft address (includes this node)
    data_dir: str
    password: Optional[str] = None
    # interface the raft port listens on; None = every interface (pysyncobj's default).
    # The advertised address (voters entry) may differ: a NAT, or a proxy in front.
    bind_host: Optional[str] = None
    raft_min_timeout_s: float = 0.3
    raft_max_timeout_s: float = 0.6
    append_entries_period_s: float = 0.05
    auto_tick_period_s: float = 0.015
    connection_retry_time_s: float = 0.5
    connection_timeout_s: float = 1.5
    leader_fallback_timeout_s: float = 1.5
    peer_ping_interval_s: float = 0.5
    # pre-vote (raft/prevote.py): an isolated node does not raise its term, so healing it
    # forces no election; a node above the leader's term elects the old way after this grace.
    # Opt-in for now: with it on, one fresh 3-controller cluster elected no active
    # controller within 20 s (1 of 3 full-suite runs) and a metadata bench run saw 4 s
    # first writes after kill -9 in 2 of 5 failovers. Two likely causes are fixed since
    # (pre-votes lost to the handshake race, frame_guard.py; a lagging term refused for
    # ever, prevote.py), but no full-suite or long chaos run has been done with it on.
    prevote: bool = False
    prevote_stale_leader_grace_s: float = 2.0
    # the longest election timeout after failed elections (binary exponential backoff from
    # raft_max_timeout_s; raft/election_backoff.py); raft_max_timeout_s turns it off
    election_backoff_max_s: float = ELECTION_BACKOFF_MAX_S_DEFAULT
    # read the sockets before an election on an expired deadline (raft/election_guard.py): a
    # raft thread stalled past the election timeout does not campaign with its leader's
    # AppendEntries (or its votes) unread
    read_before_election: bool = True
    # Send AppendEntries as soon as a command arrives instead of on the next period:
    # commit latency ~2 ms instead of ~50 ms for low-rate metadata writes.
    append_entries_immediately: bool = True
    # msync each journal append and fsync term/vote changes before answering (see
    # raft/fsync_journal.py); False = pysyncobj's journal, durable against kill -9 only
    fsync_journal: bool = True
    log_compaction_min_entries: int = 5000
    log_compaction_min_time_s: float = 300.0
    # Stagger the voters' log compactions (pysyncobj `logCompactionSplit`): voter i of n
    # starts one only in its own window, the first 30% of the i-th n-th of each
    # `log_compaction_min_time_s` period (on one host, whose monotonic clock they share,
    # the windows never overlap). Without it every voter compacts after the same entry
    # count, at the same moment: each forks a child that pickles the whole image (about
    # 1.4 s of CPU at 100,000 partitions), three at once on a 2-core host stalled every raft
    # thread 2 s and the quorum changed leader (issue 25, docs/SCALE.md twelfth round). The
    # cost: past `log_compaction_min_entries` the journal grows until the voter's window
    # (at most one period). A quorum of one voter at start compacts when due.
    log_compaction_split: bool = True
    propose_timeout_s: float = 5.0
    # largest raft frame a peer may announce; more drops the connection before buffering
    # (raft/frame_guard.py). pysyncobj's own frames stay under ~64 KiB
    frame_max_bytes: int = RAFT_FRAME_MAX_BYTES_DEFAULT
    # a voter joining a running quorum: with an empty journal, no election before a leader
    # has been heard from (it is added by the leader first, DESIGN.md section 10)
    join: bool = False
    # a committed command at least this large is unpickled and applied inside the state
    # machine's `large_command_hold()` (full collections off; see `install_command_hold`);
    # 0: never
    apply_gc_hold_min_bytes: int = 64 * 1024
    # a tick's committed commands of at least this many bytes: a leader sends AppendEntries
    # before applying them, a follower gives its leader as long as its own apply took
    # (raft/apply_grace.py); 0: never
    apply_grace_min_bytes: int = APPLY_GRACE_MIN_BYTES_DEFAULT

    @property
    def journal_file(self) -> str:
        return os.path.join(self.data_dir, "raft.journal")

    @property
    def full_dump_file(self) -> str:
        return os.path.join(self.data_dir, "raft.dump")


class _Consumer(SyncObjConsumer):
    """Holds the state machine; its only replicated method is `apply`."""

    def __init__(self, state_machine, on_applied: Callable[[], None]):
        super().__init__()
        self._sm = state_machine
        self._on_applied = on_applied

    @replicated
    def apply(self, entries):
        try:
            result = self._sm.apply(entries)
        except BaseException:  # never let an exception wedge the quorum
            log.exception("state machine apply failed; entry skipped on this node")
            result = {"ok": False, "reason": "apply failed"}
        try:
            self._on_applied()
        except BaseException:
            log.exception("on_applied callback failed")
        return result

    def _serialize(self):
        return {"snapshot": SnapshotWhenPickled(self._sm)}

    def _deserialize(self, data):
        try:
            self._sm.restore(data["snapshot"])
        except BaseException:
            log.exception("state machine restore failed")
        try:
            self._on_applied()
        except BaseException:
            pass


class SnapshotWhenPickled:
    """The state machine's snapshot, built only when pickled.

    pysyncobj's log compaction builds the full dump's data on the raft thread, then forks
    and pickles it in the child. Building `snapshot()` there cost 1.5 s of CPU at 100,000
    partitions (3-4 s of wall time under load, plus a full collection of the million
    objects it allocated), on the raft thread of every controller at about the same
    moment (they compact after the same number of entries): the quorum lost its leader.
    This object defers the building to the pickling, that is, into the forked child: a copy
    of the process at the fork, made by the raft thread, the only thread that applies, so
    the state is the one of the dump's last applied entry. In the child the state machine's
    lock is not taken (`snapshot_unlocked`): a thread that held it at the fork does not
    exist there. Without a fork (pysyncobj's in-memory dumps) it is built as before. It
    unpickles as a plain dict (`dict(snapshot)`), so any version reads the dump."""

    __slots__ = ("_sm", "_pid")

    def __init__(self, state_machine) -> None:
        self._sm = state_machine
        self._pid = os.getpid()

    def __reduce__(self):
        unlocked = getattr(self._sm, "snapshot_unlocked", None)
        if os.getpid() != self._pid and unlocked is not None:
            return dict, (unlocked(),)
        return dict, (self._sm.snapshot(),)


def install_command_hold(syncobj, hold: Callable[[], Any], min_bytes: int) -> bool:
    """Unpickle and apply every committed command of at least `min_bytes` inside `hold()` (a
    context manager; the metadata state machine's holds full collections off). pysyncobj
    unpickles a command on the raft thread just before it calls the replicated method, on
    every node: a fencing's 33,334 records at 100,000 partitions are 2.4 MB, 30 ms to
    unpickle, but the objects it makes triggered a full collection there (about 150 ms of
    GIL), before the state machine's own hold began. False when pysyncobj's internals are
    not the expected ones (nothing installed)."""
    original = getattr(syncobj, "_SyncObj__doApplyCommand", None)
    if original is None:
        return False

    def do_apply_command(command):
        if len(command) < min_bytes:
            return original(command)
        with hold():
            return original(command)

    syncobj._SyncObj__doApplyCommand = do_apply_command
    # pysyncobj's log compaction pickles every instance attribute not in `__properies`: the
    # hook must be named there (an unpicklable closure made every full dump fail, and the
    # raft thread retried it every tick at 100,000 partitions)
    props = getattr(syncobj, "_SyncObj__properies", None)
    if props is not None:
        props.add("_SyncObj__doApplyCommand")
    return True


class SyncObjReplicatedLog:
    """ReplicatedLog over pysyncobj. Build (call `start()`) on the main thread inside or
    before the event loop given; use everything else from that loop."""

    def __init__(self, config: RaftConfig, state_machine, loop: Optional[asyncio.AbstractEventLoop] = None):
        if config.node_id not in config.voters:
            raise ValueError(f"node id {config.node_id} is not in voters {sorted(config.voters)}")
        if len(config.voters) > 1 and not config.password:
            raise ValueError(
                "a multi-node metadata quorum needs a raft password (--password): the raft "
                "port unpickles network input, so without one anyone reaching it runs code"
            )
        self.config = config
        self.state_machine = state_machine
        self._loop = loop
        self._listeners: list[Callable[[], None]] = []
        self._addr_to_id = {addr: nid for nid, addr in config.voters.items()}
        self._syncobj: Optional[SyncObj] = None
        self._last_ping = 0.0
        # raft thread ticks that came late (raft/tick_gaps.py): logged with the GC time in them
        self.tick_gaps = TickGapMonitor(config.raft_min_timeout_s)
        self._last_seen: tuple = ()
        self._notify_pending = False
        self._consumer = _Consumer(state_machine, self._on_raft_thread_event)
        self._journal = None  # FsyncFileJournal when config.fsync_journal
        self._synced_s = 0.0  # the journal's sync time at the last tick
        self._tick_cpu = (0.0, 0.0)  # (raft thread, process) CPU time at the last tick
        self._peer_stats = RaftPeerStats()
        self._waiting_to_join = False
        self._last_deadline = None
        self._backoff: Optional[ElectionBackoff] = None
        self._leader_heard_at = 0.0   # monotonic: the last AppendEntries from a leader (or our own leadership)
        self._on_raft_thread: "collections.deque[Callable[[], None]]" = collections.deque()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("build the SyncObj on the main thread (its tick thread dies with its creator)")
        if self._loop is None:
            self._loop = asyncio.get_event_loop()
        c = self.config
        os.makedirs(c.data_dir, exist_ok=True)
        conf = SyncObjConf(
            password=c.password or secrets.token_hex(16),
            journalFile=c.journal_file,
            fullDumpFile=c.full_dump_file,
            raftMinTimeout=c.raft_min_timeout_s,
            raftMaxTimeout=c.raft_max_timeout_s,
            appendEntriesPeriod=c.append_entries_period_s,
            autoTickPeriod=c.auto_tick_period_s,
            connectionRetryTime=c.connection_retry_time_s,
            # pysyncobj wants a connection timeout at least the election timeout (1.5 s
            # unless the election timeout is longer: `--raft-max-timeout-s 2`)
            connectionTimeout=max(c.connection_timeout_s, c.raft_max_timeout_s),
            leaderFallbackTimeout=c.leader_fallback_timeout_s,
            appendEntriesUseBatch=not c.append_entries_immediately,
            logCompactionMinEntries=c.log_compaction_min_entries,
            logCompactionMinTime=c.log_compaction_min_time_s,
            logCompactionSplit=c.log_compaction_split and len(c.voters) > 1,   # a lone voter compacts when due
            onStateChanged=lambda old, new: self._on_raft_thread_event(),
            dynamicMembershipChange=True,
        )
        self._waiting_to_join = c.join and not os.path.exists(c.journal_file) and not os.path.exists(c.full_dump_file)
        self_addr = c.voters[c.node_id]
        if c.bind_host:
            conf.bindAddress = f"{c.bind_host}:{self_addr.rsplit(':', 1)[1]}"
        others = [addr for nid, addr in sorted(c.voters.items()) if nid != c.node_id]
        if c.fsync_journal:
            from raft.fsync_journal import fsyncing_journal, install_group_commit

            with fsyncing_journal():
                self._syncobj = SyncObj(self_addr, others, conf=conf, consumers=[self._consumer])
            self._journal = install_group_commit(self._syncobj)
        else:
            self._syncobj = SyncObj(self_addr, others, conf=conf, consumers=[self._consumer])
        from raft.append_entries_guard import install_append_entries_guard

        install_append_entries_guard(self._syncobj)
        hold = getattr(self.state_machine, "large_command_hold", None)
        if c.apply_gc_hold_min_bytes and callable(hold):
            if not install_command_hold(self._syncobj, hold, c.apply_gc_hold_min_bytes):
                log.warning("raft command hold not installed (unexpected pysyncobj internals): full collections "
                            "may run while a large entry is unpickled")
        if c.apply_grace_min_bytes:
            from pysyncobj.monotonic import monotonic as raft_clock

            if not install_apply_grace(self._syncobj, raft_clock, c.raft_min_timeout_s, c.apply_grace_min_bytes):
                log.warning("raft apply grace not installed (unexpected pysyncobj internals): a leader busy "
                            "applying a large entry may be deposed")
        if not install_frame_guard(self._syncobj, c.frame_max_bytes, self._peer_stats):
            log.warning("raft frame guard not installed (unexpected pysyncobj internals): frames are not capped")
        if c.prevote:
            from raft.prevote import install_prevote

            if install_prevote(self._syncobj, c.raft_min_timeout_s, c.prevote_stale_leader_grace_s) is None:
                log.warning("pre-vote not installed (unexpected pysyncobj internals): elections as before")
        if c.read_before_election:
            from pysyncobj.monotonic import monotonic as raft_clock

            from raft.election_guard import install_election_guard

            def avoided(late_s: float) -> None:
                log.info("raft node %s: no election: a message read first showed a live leader or won the vote "
                         "(the raft thread was %.0f ms past its election deadline)", c.node_id, late_s * 1000)

            if not install_election_guard(self._syncobj, raft_clock, avoided):
                log.warning("raft election guard not installed (unexpected pysyncobj internals): a stalled "
                            "node may campaign with its leader's messages unread")
        self._backoff = ElectionBackoff(c.raft_max_timeout_s, max(c.election_backoff_max_s, c.raft_max_timeout_s))
        gc.callbacks.append(self.tick_gaps.gc_callback)
        self._syncobj.addOnTickCallback(self._on_tick)

    def stop(self) -> None:
        if self.tick_gaps.gc_callback in gc.callbacks:
            gc.callbacks.remove(self.tick_gaps.gc_callback)
        if self._syncobj is not None:
            self._syncobj.destroy()
            self._syncobj = None

    # ------------------------------------------------------------------ properties
    @property
    def is_leader(self) -> bool:
        return self._syncobj is not None and self._syncobj._isLeader()

    @property
    def leader_id(self) -> Optional[int]:
        if self._syncobj is None:
            return None
        leader = self._syncobj._getLeader()
        if leader is None:
            return None
        return self._addr_to_id.get(getattr(leader, "address", str(leader)))

    @property
    def term(self) -> int:
        return 0 if self._syncobj is None else self._syncobj.raftCurrentTerm

    @property
    def ready(self) -> bool:
        return self._syncobj is not None and self._syncobj.isReady()

    @property
    def peer_stats(self) -> RaftPeerStats:
        return self._peer_stats

    def status(self) -> dict:
        return {} if self._syncobj is None else self._syncobj.getStatus()

    def add_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    # ------------------------------------------------------------------ membership
    @property
    def self_address(self) -> str:
        return self.config.voters[self.config.node_id]

    def voter_addresses(self) -> list[str]:
        """This node's view of the voter set ("host:port"), itself included: the committed
        configuration plus membership entries already in its log (pysyncobj applies them on
        append)."""
        so = self._syncobj
        if so is None:
            return []
        return sorted({self.self_address} | {n.address for n in so.otherNodes})

    def set_node_id(self, node_id: int, address: str) -> None:
        """Name the voter at `address` (a voter added at run time) for `leader_id`."""
        self._addr_to_id[address] = node_id

    def match_indexes(self) -> dict:
        """On the leader: {address: index of the last entry it knows the voter holds}, itself
        at its last entry; with `commit_index` the lag of each voter. {} elsewhere."""
        so = self._syncobj
        if so is None or not so._isLeader():
            return {}
        try:
            status = so.getStatus()
        except RuntimeError:   # the raft thread changed a dict while it was read: ask again
            return {}
        out = {self.self_address: status["commit_idx"]}
        prefix = "match_idx_server_"
        for key, value in status.items():
            if key.startswith(prefix):
                out[key[len(prefix):]] = value
        return out

    @property
    def commit_index(self) -> int:
        return 0 if self._syncobj is None else self._syncobj.raftCommitIndex

    @property
    def waiting_to_join(self) -> bool:
        return self._waiting_to_join

    def leader_silence_s(self) -> float:
        """Seconds since a leader last sent this node AppendEntries (0 on the leader). A node
        cut off from every peer never campaigns in pysyncobj and keeps naming its last
        leader, so `leader_id` alone cannot tell that it was removed."""
        import time as _time

        return 0.0 if self.is_leader else max(0.0, _time.monotonic() - self._leader_heard_at)

    async def _membership_call(self, start: Callable, what: str, timeout_s: Optional[float]) -> None:
        if self._syncobj is None or not self._syncobj._isLeader():
            raise NotLeaderError(f"{what}: this node is not the raft leader", leader_id=self.leader_id)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def callback(res, err):  # raft thread
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(err))

        start(callback)
        timeout = self.config.propose_timeout_s if timeout_s is None else timeout_s
        try:
            err = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise OutcomeUnknownError(f"{what}: not committed within {timeout} s", leader_id=self.leader_id) from None
        if err == FAIL_REASON.SUCCESS:
            return
        if err == FAIL_REASON.REQUEST_DENIED:
            raise MembershipChangeError(f"{what}: refused by the leader (another voter change is not committed "
                                        "yet, or the node is already in that state)", leader_id=self.leader_id)
        if err in (FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER, FAIL_REASON.QUEUE_FULL, FAIL_REASON.DISCARDED):
            raise NotLeaderError(f"{what}: not applied (pysyncobj reason {err})", leader_id=self.leader_id)
        raise OutcomeUnknownError(f"{what}: outcome unknown (pysyncobj reason {err})", leader_id=self.leader_id)

    async def add_voter(self, address: str, timeout_s: Optional[float] = None) -> None:
        """Add the voter at `address` and wait until the change is committed. The new node
        counts in the majority at once: start it right after (or before, with `join`)."""
        await self._membership_call(lambda cb: self._syncobj.addNodeToCluster(address, callback=cb),
                                    f"adding voter {address}", timeout_s)

    async def remove_voter(self, address: str, timeout_s: Optional[float] = None) -> None:
        """Remove the voter at `address` (never this node: transfer leadership first) and wait
        until the change is committed. The removed node is not told."""
        if address == self.self_address:
            raise MembershipChangeError("the leader cannot remove itself: transfer leadership first",
                                        leader_id=self.leader_id)
        await self._membership_call(lambda cb: self._syncobj.removeNodeFromCluster(address, callback=cb),
                                    f"removing voter {address}", timeout_s)

    async def transfer_leadership(self, address: Optional[str] = None, timeout_s: Optional[float] = None) -> None:
        """Ask a caught-up voter (`address`, or the most caught-up one) to take over; returns
        once the request is sent (MembershipChangeError when no voter is caught up)."""
        # transferLeadership reads raft state and sends at once: run it on the raft thread
        await self._membership_call(
            lambda cb: self._on_raft_thread.append(lambda: self._syncobj.transferLeadership(address, callback=cb)),
            "transferring leadership", timeout_s)

    async def forward(self, entries: list, timeout_s: Optional[float] = None) -> Any:
        """Propose from any node: a follower's pysyncobj sends the entries to the leader.
        Same outcomes as `propose`."""
        if self._syncobj is None:
            raise NotLeaderError("raft is not running", leader_id=None)
        if self._syncobj._isLeader():
            return await self.propose(entries, timeout_s)
        if self._syncobj._getLeader() is None:
            raise NotLeaderError("no raft leader to forward to", leader_id=None)
        return await self._submit(entries, timeout_s)

    # ------------------------------------------------------------------ proposals
    async def propose(self, entries: list, timeout_s: Optional[float] = None) -> Any:
        if self._syncobj is None or not self._syncobj._isLeader():
            raise NotLeaderError("this node is not the raft leader", leader_id=self.leader_id)
        return await self._submit(entries, timeout_s)

    async def _submit(self, entries: list, timeout_s: Optional[float]) -> Any:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def _resolve(res, err):
            if not fut.done():
                fut.set_result((res, err))

        def callback(res, err):  # raft thread
            loop.call_soon_threadsafe(_resolve, res, err)

        self._consumer.apply(entries, callback=callback)
        timeout = self.config.propose_timeout_s if timeout_s is None else timeout_s
        try:
            res, err = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise OutcomeUnknownError(f"no commit within {timeout} s", leader_id=self.leader_id) from None
        if err == FAIL_REASON.SUCCESS:
            return res
        if err in (FAIL_REASON.NOT_LEADER, FAIL_REASON.MISSING_LEADER, FAIL_REASON.QUEUE_FULL,
                   FAIL_REASON.DISCARDED, FAIL_REASON.REQUEST_DENIED):
            raise NotLeaderError(f"proposal not applied (pysyncobj reason {err})", leader_id=self.leader_id)
        raise OutcomeUnknownError(f"proposal outcome unknown (pysyncobj reason {err})", leader_id=self.leader_id)

    # ------------------------------------------------------------------ raft thread
    def _on_tick(self) -> None:
        so = self._syncobj
        if so is None:
            return
        late = self.tick_gaps.on_tick()
        synced_s = self._journal.sync_s if self._journal is not None else 0.0
        in_sync, self._synced_s = synced_s - self._synced_s, synced_s
        # CPU time of the raft thread and of the whole process since the last tick: a gap with
        # the raft thread's CPU near the gap is a long tick (a large apply); with the process
        # busy but not this thread, another thread held the GIL; with neither, no CPU at all
        cpu = (time.thread_time(), time.process_time())
        (thread_s, process_s), self._tick_cpu = (cpu[0] - self._tick_cpu[0], cpu[1] - self._tick_cpu[1]), cpu
        if late is not None:
            log.warning("raft node %s: the raft thread did not tick for %.0f ms (%.0f ms of it in garbage "
                        "collections, %.0f ms in journal syncs; CPU meanwhile: raft thread %.0f ms, process "
                        "%.0f ms; the election timeout is %.0f-%.0f ms): the process held the GIL or had no "
                        "CPU", self.config.node_id, late[0] * 1000, late[1] * 1000, in_sync * 1000,
                        thread_s * 1000, process_s * 1000,
                        self.config.raft_min_timeout_s * 1000, self.config.raft_max_timeout_s * 1000)
        if self._journal is not None:
            self._journal.sync()  # leader: persist this tick's appends before counting itself
        while self._on_raft_thread:
            try:
                self._on_raft_thread.popleft()()
            except Exception:
                log.exception("raft thread call failed")
        import time as _time

        now = _time.monotonic()
        deadline = so._SyncObj__raftElectionDeadline   # pushed back by every AppendEntries of the leader
        if so._isLeader() or (deadline != self._last_deadline and so._getLeader() is not None):
            self._leader_heard_at = now
        self._last_deadline = deadline
        if self._waiting_to_join:
            if so._getLeader() is not None:
                self._waiting_to_join = False
                log.info("raft node %s joined the quorum (leader %s)", self.config.node_id, so._getLeader())
            else:   # not a voter of the others yet: no election until a leader sends us entries
                from pysyncobj.monotonic import monotonic as raft_clock

                so._SyncObj__raftElectionDeadline = raft_clock() + self.config.raft_max_timeout_s
        if self._backoff is not None and not so._SyncObj__transferInProgress:
            me = so._SyncObj__selfNode
            campaigning = me is not None and getattr(so, "_SyncObj__votedForNodeId", None) == me.id
            stretched = self._backoff.on_tick(now, so.raftCurrentTerm, so._isLeader() or so._getLeader() is not None,
                                              so._SyncObj__raftElectionDeadline, campaigning)
            if stretched is not None:
                so._SyncObj__raftElectionDeadline = stretched
                self._last_deadline = stretched
        if now - self._last_ping >= self.config.peer_ping_interval_s:
            self._last_ping = now
            transport = getattr(so, "_SyncObj__transport", None)
            if transport is not None:
                for node in so.otherNodes:
                    try:
                        transport.send(node, {"type": "kraftlog_ping"})
                    except Exception:
                        pass
        seen = (so._isLeader(), so._getLeader(), so.raftCurrentTerm, so.isReady())
        if seen != self._last_seen:
            if seen[:3] != self._last_seen[:3]:
                leader = seen[1]
                log.info("raft node %s: term %s, %s (leader %s)", self.config.node_id, seen[2],
                         "leader" if seen[0] else ("follower" if leader is not None else "no leader"),
                         self._addr_to_id.get(getattr(leader, "address", str(leader))) if leader is not None
                         else None)
            self._last_seen = seen
            self._on_raft_thread_event()

    def _on_raft_thread_event(self) -> None:
        loop = self._loop
        if loop is None or self._notify_pending:
            return
        self._notify_pending = True
        try:
            loop.call_soon_threadsafe(self._notify)
        except RuntimeError:  # loop closed
            self._notify_pending = False

    def _notify(self) -> None:
        self._notify_pending = False
        for cb in list(self._listeners):
            try:
                cb()
            except Exception:
                log.exception("raft listener failed")
