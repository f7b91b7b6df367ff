"""Pure state of one partition replica on this broker (no IO, no event loop).

A `Partition` knows its role (leader or follower), the leader epoch and partition epoch it
was given by the controller, the assigned replicas and the ISR, and — as leader — the log
end offset (LEO) each follower last reported plus when it was last caught up. From those
it derives the high watermark.

Invariants:
- the high watermark is min(LEO) over the ISR (the leader's own LEO included) and never
  moves backwards while this replica stays leader; it does not move at all while the ISR
  (from metadata) is smaller than min.insync.replicas (KIP-966), so a replica that left the
  ISR then still holds every committed record and may be elected from the ELR; while an ISR expansion proposed to the
  controller is not yet in the metadata, the proposed members count too (Kafka's "maximal
  ISR", KIP-497): the controller may already have committed them, and a new leader may be
  elected among them, so the HW must not pass their LEO;
- a leader epoch or partition epoch older than the current one is ignored (stale metadata);
- only the leader tracks followers; a follower keeps the high watermark the leader sent it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from partitions.errors import ErrorCode, KraftlogError


def effective_min_insync_replicas(configured: int, replication_factor: int) -> int:
    """min.insync.replicas as the HW rule applies it: capped at the replication factor. The
    controller's ELR decisions must use this very value (KIP-966)."""
    return max(1, min(configured, replication_factor))


class ReplicaState:
    """What the leader knows about one follower replica.

    While `liveness` is set, the follower's fetch session restates this partition lazily
    (issue 25, `FollowerLiveness`): its last fetch and last caught-up times are the
    session's `heard_ms`, read through the properties below; every writer detaches it
    first (`FollowerLiveness.detach` writes the times down)."""

    __slots__ = ("broker_id", "log_end_offset", "_fetch_ms", "last_fetch_leader_log_end_offset",
                 "_caught_up_ms", "broker_epoch", "left_isr_ms", "liveness")

    def __init__(self, broker_id: int, log_end_offset: int = -1, last_fetch_time_ms: int = -1,
                 last_fetch_leader_log_end_offset: int = -1, last_caught_up_time_ms: int = -1,
                 broker_epoch: int = -1, left_isr_ms: int = -1) -> None:
        self.broker_id = broker_id
        self.log_end_offset = log_end_offset
        self._fetch_ms = last_fetch_time_ms
        self.last_fetch_leader_log_end_offset = last_fetch_leader_log_end_offset
        self._caught_up_ms = last_caught_up_time_ms
        self.broker_epoch = broker_epoch      # registration of the process that fetched last (KIP-903)
        self.left_isr_ms = left_isr_ms        # when the metadata last took it out of this leader's ISR
        self.liveness: FollowerLiveness | None = None

    @property
    def last_fetch_time_ms(self) -> int:
        lv = self.liveness
        return self._fetch_ms if lv is None else lv.heard_ms

    @last_fetch_time_ms.setter
    def last_fetch_time_ms(self, value: int) -> None:
        self._fetch_ms = value

    @property
    def last_caught_up_time_ms(self) -> int:
        lv = self.liveness
        return self._caught_up_ms if lv is None else lv.heard_ms

    @last_caught_up_time_ms.setter
    def last_caught_up_time_ms(self, value: int) -> None:
        self._caught_up_ms = value

    def last_heard_ms(self, fetch_requests_ms: Mapping[int, int] | None = None, in_session: bool = False) -> int:
        """When the silence rules last heard of this follower: its last fetch or caught-up
        time (a new leader epoch starts an ISR member caught up). While it has not fetched
        this partition in this leader epoch (`last_fetch_time_ms` < 0: every fetch and
        restate sets it, a new epoch resets it), also its broker's last fetch request to
        this leader (`fetch_requests_ms`, broker id -> ms): that broker is alive and fetching
        other partitions, it has not applied this epoch's metadata yet (issue 25: seconds
        after a 10,000-partition create). A follower that did fetch this partition and then
        stopped is judged by its own times alone, unless `in_session`: the partition is in its
        broker's fetch session with this leader, which every request of that session
        restates, so the broker's last request counts for it too (the ISR rules, issue 25: a
        loaded leader's restate of a request comes seconds after the request)."""
        heard = self.last_fetch_time_ms
        if heard >= 0 and not in_session:
            return max(heard, self.last_caught_up_time_ms)
        heard = max(heard, self.last_caught_up_time_ms)
        if fetch_requests_ms:
            heard = max(heard, fetch_requests_ms.get(self.broker_id, -1))
        return heard

    def _fields(self) -> tuple:
        return (self.broker_id, self.log_end_offset, self.last_fetch_time_ms, self.last_fetch_leader_log_end_offset,
                self.last_caught_up_time_ms, self.broker_epoch, self.left_isr_ms)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReplicaState) and self._fields() == other._fields()

    __hash__ = None   # mutable

    def __repr__(self) -> str:
        return ("ReplicaState(broker_id=%r, log_end_offset=%r, last_fetch_time_ms=%r, "
                "last_fetch_leader_log_end_offset=%r, last_caught_up_time_ms=%r, broker_epoch=%r, "
                "left_isr_ms=%r)" % self._fields())


# The ISR's silence rule (`Partition.silent_replicas`) judges a follower broker against its
# own rhythm too: one whose fetch requests reach this leader every `gap` ms on average
# (smoothed, `ReplicaState.fetch_request_gap_ms`) is silent only after SILENCE_GAP_FACTOR x
# gap, and at most SILENCE_STRETCH_MAX x the rule's limit. Issue 25: during a 10,000-partition
# create a loaded leader answered each request of a live follower in 2-5 s, the 1.5 s rule
# dropped it from thousands of ISRs, and it rejoined them moments later (26,000 ISR changes
# through the controller for one create).
SILENCE_GAP_FACTOR = 3
SILENCE_STRETCH_MAX = 6


def silence_limit_ms(limit_ms: int, gap_ms: float | None) -> float:
    """The silence limit for a follower broker whose requests come every `gap_ms` (None:
    unknown): `limit_ms`, stretched to SILENCE_GAP_FACTOR gaps, capped (see above)."""
    if gap_ms is None:
        return limit_ms
    return min(max(limit_ms, SILENCE_GAP_FACTOR * gap_ms), SILENCE_STRETCH_MAX * limit_ms)


class FollowerLiveness:
    """One follower's fetch session on this leader as one clock (issue 25).

    A session's request restates the progress of every partition it does not name (the
    follower fetches again at the same offset: `Partition.restate_follower_fetch`). For a
    partition whose follower is caught up (its fetch offset is the leader's LEO) and whose
    state has not changed since, that restate only sets the fetch and caught-up times to the
    request's time. Such partitions are `attached` here: a restate moves `heard_ms` once
    instead of visiting them, and their times read as `heard_ms`.

    Anything that would make the next restate of an attached partition do more (an append
    moves the LEO, a fetch at another offset or from another registration, a role change,
    a suspension, the session naming, forgetting or dropping it) detaches it first:
    `detach` writes `heard_ms` into its times (exactly what the restates would have left),
    puts it back into `loose` (the session's partitions a restate visits) and into the
    owner's `loud` set (led partitions the ISR and silence rules must look at).

    Invariants: a partition is attached to at most one liveness per follower; an attached
    partition is in its session and not in `loose`; once `close`d nothing attaches again."""

    __slots__ = ("replica_id", "broker_epoch", "heard_ms", "attached", "loose", "closed", "_loud", "_registry")

    def __init__(self, replica_id: int, broker_epoch: int = -1, *, loud: set | None = None,
                 registry: set | None = None) -> None:
        self.replica_id = replica_id
        self.broker_epoch = broker_epoch
        self.heard_ms = -1
        self.attached: dict = {}      # key -> ReplicaState
        self.loose: set = set()       # the session's partitions not attached
        self.closed = False
        self._loud = loud
        self._registry = registry
        if registry is not None:
            registry.add(self)

    def holds(self, key) -> bool:
        """`key` is one of the open session's partitions (attached or loose)."""
        return not self.closed and (key in self.attached or key in self.loose)

    def heard(self, now_ms: int) -> None:
        """A request of the session restates every attached partition at `now_ms`."""
        self.heard_ms = now_ms

    def attach(self, key, state: ReplicaState) -> None:
        if self.closed or state.liveness is self:
            return
        if state.liveness is not None:
            state.liveness.detach(key)
        state.liveness = self
        self.attached[key] = state
        self.loose.discard(key)

    def detach(self, key) -> None:
        """`key` is no longer restated by moving `heard_ms` (see the class docstring)."""
        state = self.attached.pop(key, None)
        if state is None:
            return
        if state.liveness is self:
            state._fetch_ms = state._caught_up_ms = self.heard_ms
            state.liveness = None
        if not self.closed:
            self.loose.add(key)
        if self._loud is not None:
            self._loud.add(key)

    def detach_all(self) -> None:
        for key in list(self.attached):
            self.detach(key)

    def close(self) -> None:
        """The session is gone: its partitions keep the times of its last request."""
        self.closed = True
        self.detach_all()
        self.loose.clear()
        if self._registry is not None:
            self._registry.discard(self)


@dataclass
class Partition:
    """Role, epochs, ISR and high watermark of one local partition replica."""

    topic: str
    partition: int
    local_broker_id: int
    replicas: list[int] = field(default_factory=list)
    isr: list[int] = field(default_factory=list)
    leader_id: int = -1
    leader_epoch: int = -1
    partition_epoch: int = -1
    high_watermark: int = 0
    local_log_end_offset: int = 0
    remote_replicas: dict[int, ReplicaState] = field(default_factory=dict)
    pending_isr_additions: set[int] = field(default_factory=set)   # proposed, not yet in metadata
    leader_epoch_start_offset: int = 0    # our LEO when we became leader of this epoch
    min_insync_replicas: int = 1          # effective (capped at the replication factor)

    # ---- role changes -------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_broker_id

    def is_stale(self, leader_epoch: int, partition_epoch: int) -> bool:
        """True when (leader_epoch, partition_epoch) is older than what we already hold."""
        return (leader_epoch, partition_epoch) < (self.leader_epoch, self.partition_epoch)

    def make_leader(self, *, replicas: list[int], isr: list[int], leader_epoch: int,
                    partition_epoch: int, log_end_offset: int, high_watermark: int,
                    now_ms: int) -> bool:
        """Become (or stay) leader. Returns False for stale metadata (nothing changed).

        A new leader epoch resets follower state: followers must fetch again before
        they count towards the high watermark beyond what the log already had.
        """
        self.settle_followers()
        if self.is_stale(leader_epoch, partition_epoch):
            return False
        new_epoch = leader_epoch != self.leader_epoch or not self.is_leader
        if new_epoch or partition_epoch != self.partition_epoch:
            self.pending_isr_additions = set()   # the metadata now says what the controller decided
        old_isr = self.isr if not new_epoch else []
        self.replicas = list(replicas)
        self.isr = list(isr)
        self.leader_id = self.local_broker_id
        self.partition_epoch = partition_epoch
        self.leader_epoch = leader_epoch
        self.local_log_end_offset = log_end_offset
        if new_epoch:
            self.leader_epoch_start_offset = log_end_offset
            self.high_watermark = min(high_watermark, log_end_offset)
            self.remote_replicas = {
                r: ReplicaState(r, last_caught_up_time_ms=now_ms if r in isr else -1)
                for r in replicas if r != self.local_broker_id
            }
        else:
            for r in replicas:
                if r != self.local_broker_id and r not in self.remote_replicas:
                    self.remote_replicas[r] = ReplicaState(r)
            for r in old_isr:
                if r not in isr and r in self.remote_replicas:
                    self.remote_replicas[r].left_isr_ms = now_ms
            for r in list(self.remote_replicas):
                if r not in replicas:
                    del self.remote_replicas[r]
        self.maybe_increment_high_watermark()
        return True

    def make_follower(self, *, replicas: list[int], isr: list[int], leader_id: int,
                      leader_epoch: int, partition_epoch: int, log_end_offset: int,
                      high_watermark: int) -> bool:
        """Become (or stay) a follower of `leader_id`. Returns False for stale metadata."""
        if self.remote_replicas:
            self.settle_followers()
        if self.is_stale(leader_epoch, partition_epoch):
            return False
        self.replicas = list(replicas)
        self.isr = list(isr)
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.partition_epoch = partition_epoch
        self.local_log_end_offset = log_end_offset
        self.high_watermark = min(high_watermark, log_end_offset)
        self.remote_replicas = {}
        self.pending_isr_additions = set()
        return True

    def settle_followers(self) -> None:
        """Detach every follower from its session's liveness (`FollowerLiveness.detach`):
        its times are written down before this partition's state changes."""
        key = None
        for state in self.remote_replicas.values():
            if state.liveness is not None:
                key = key or (self.topic, self.partition)
                state.liveness.detach(key)

    # ---- offsets ------------------------------------------------------------------------

    def update_local_log_end_offset(self, log_end_offset: int) -> bool:
        """Record the local LEO after an append; returns True when the HW moved."""
        if log_end_offset != self.local_log_end_offset:
            self.settle_followers()   # the next restate of a follower differs now
        self.local_log_end_offset = log_end_offset
        return self.maybe_increment_high_watermark()

    def update_follower_fetch(self, broker_id: int, fetch_offset: int, now_ms: int, broker_epoch: int = -1) -> bool:
        """A follower fetched from `fetch_offset` (= its LEO). Returns True when the HW moved.

        Caught up (Kafka's rule): it has everything the leader has now, or everything the
        leader had at its previous fetch (then it was caught up as of that fetch) — so a
        follower keeping pace with a steady stream of appends stays in the ISR. A fetch from
        a new registration of the follower (`broker_epoch`: it restarted, maybe with a
        shorter log) forgets what its previous process had fetched.
        """
        if not self.is_leader:
            raise KraftlogError(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                f"broker {self.local_broker_id} is not the leader of "
                                f"{self.topic}-{self.partition}; fetch from broker {self.leader_id}")
        state = self.remote_replicas.get(broker_id)
        if state is None:
            raise KraftlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"broker {broker_id} is not a replica of {self.topic}-{self.partition}")
        if state.liveness is not None:
            state.liveness.detach((self.topic, self.partition))
        if broker_epoch != state.broker_epoch:
            state.broker_epoch = broker_epoch
            state.last_fetch_leader_log_end_offset = -1
        if fetch_offset >= self.local_log_end_offset:
            state.last_caught_up_time_ms = now_ms
        elif fetch_offset >= state.last_fetch_leader_log_end_offset >= 0:
            state.last_caught_up_time_ms = max(state.last_caught_up_time_ms, state.last_fetch_time_ms)
        state.log_end_offset = fetch_offset
        state.last_fetch_time_ms = now_ms
        state.last_fetch_leader_log_end_offset = self.local_log_end_offset
        return self.maybe_increment_high_watermark()

    def restate_follower_fetch(self, broker_id: int, fetch_offset: int, now_ms: int, broker_epoch: int = -1) -> bool:
        """A fetch-session request left this partition unnamed: the follower fetches again
        from the same offset. Records it exactly as `update_follower_fetch` would and returns
        True, or does nothing and returns False when that would do more than refresh the
        follower's liveness (another offset or registration, not leader): call it then."""
        state = self.remote_replicas.get(broker_id)
        if state is not None and state.liveness is not None:
            state.liveness.detach((self.topic, self.partition))
        if (not self.is_leader or state is None or broker_epoch != state.broker_epoch
                or fetch_offset != state.log_end_offset):
            return False
        if fetch_offset >= self.local_log_end_offset:
            state.last_caught_up_time_ms = now_ms
        elif fetch_offset >= state.last_fetch_leader_log_end_offset >= 0:
            state.last_caught_up_time_ms = max(state.last_caught_up_time_ms, state.last_fetch_time_ms)
        state.last_fetch_time_ms = now_ms
        state.last_fetch_leader_log_end_offset = self.local_log_end_offset
        return True

    def maybe_increment_high_watermark(self) -> bool:
        """Move the HW to min LEO over the ISR if that is higher. Leader only; never while
        the metadata ISR is below min.insync.replicas (pending additions do not count: the
        controller's ELR decisions go by the committed ISR)."""
        if not self.is_leader or len(self.isr) < self.min_insync_replicas:
            return False
        candidate = self.local_log_end_offset
        # the maximal ISR; the metadata ISR alone when no addition is pending (no list built)
        for r in (self.maximal_isr() if self.pending_isr_additions else self.isr):
            if r == self.local_broker_id:
                continue
            state = self.remote_replicas.get(r)
            leo = state.log_end_offset if state is not None else -1
            candidate = min(candidate, leo)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    def set_follower_high_watermark(self, leader_high_watermark: int) -> None:
        """Follower: adopt the leader's HW, capped at the local LEO."""
        self.high_watermark = max(self.high_watermark,
                                  min(leader_high_watermark, self.local_log_end_offset))

    # ---- ISR ----------------------------------------------------------------------------

    def maximal_isr(self) -> list[int]:
        """The ISR from metadata plus members of a pending expansion (what the HW counts)."""
        return list(self.isr) + sorted(r for r in self.pending_isr_additions if r not in self.isr)

    def propose_isr_change(self, now_ms: int, replica_lag_time_max_ms: int, *,
                           replica_fetch_silence_max_ms: int | None = None,
                           acks_waiting_offset: int | None = None,
                           fetch_requests_ms: Mapping[int, int] | None = None,
                           fetch_gaps_ms: Mapping[int, float] | None = None,
                           sessions: Mapping[int, "FollowerLiveness"] | None = None) -> list[int] | None:
        """The ISR the leader should ask the controller for (lagging members out, caught-up
        replicas in), or None. Proposed additions count for the HW from now on (until the
        metadata brings a new partition epoch, or `isr_change_rejected`).

        `acks_waiting_offset`: the highest offset acks=all produces wait for (None: none
        waits); members silent for `replica_fetch_silence_max_ms` that hold such a produce
        back leave too (`silent_replicas`; `fetch_requests_ms`: each follower broker's last
        fetch request to this leader; `fetch_gaps_ms`: the usual time between them, which
        stretches the limit, `silence_limit_ms`; `sessions`: each follower broker's fetch
        session clock, `last_heard_ms`'s `in_session`), but never so many that the ISR drops below
        min.insync.replicas on silence alone (the lag rule still applies to them).

        The two directions agree (issue 24, one-way-answers): a replica is proposed in only
        if the shrink rules would keep it at this very moment (`in_sync_candidates`). A
        follower whose fetch requests arrive while the answers are lost fetches at a stale
        offset that may still reach a frozen HW; adding it on its LEO alone and dropping it
        on its caught-up time at the next check flapped the ISR every check."""
        if not self.is_leader:
            return None
        drop = self.out_of_sync_replicas(now_ms, replica_lag_time_max_ms)
        if replica_fetch_silence_max_ms is not None and acks_waiting_offset is not None:
            may_leave = max(0, len(self.isr) - len(drop) - self.min_insync_replicas)
            silent = self.silent_replicas(now_ms, replica_fetch_silence_max_ms, acks_waiting_offset,
                                          fetch_requests_ms=fetch_requests_ms, fetch_gaps_ms=fetch_gaps_ms,
                                          sessions=sessions) - drop
            drop |= set(self._longest_silent(silent, may_leave, fetch_requests_ms, sessions))
        add = self.in_sync_candidates(now_ms, replica_lag_time_max_ms,
                                      replica_fetch_silence_max_ms=replica_fetch_silence_max_ms,
                                      acks_waiting_offset=acks_waiting_offset,
                                      fetch_requests_ms=fetch_requests_ms, fetch_gaps_ms=fetch_gaps_ms,
                                      sessions=sessions)
        if not drop and not add:
            return None
        self.pending_isr_additions |= add
        return [r for r in self.isr if r not in drop] + sorted(add)

    def _longest_silent(self, silent: set[int], limit: int, fetch_requests_ms: Mapping[int, int] | None = None,
                        sessions: Mapping[int, "FollowerLiveness"] | None = None) -> list[int]:
        """Up to `limit` of `silent`, the longest silent first (ties: lowest broker id)."""
        return sorted(silent, key=lambda r: (self._heard_ms(r, self.remote_replicas[r], fetch_requests_ms,
                                                             sessions), r))[:limit]

    def _heard_ms(self, r: int, state: ReplicaState, fetch_requests_ms: Mapping[int, int] | None,
                  sessions: Mapping[int, "FollowerLiveness"] | None) -> int:
        """`state.last_heard_ms` for the ISR rules: `in_session` when this partition is in
        broker `r`'s open fetch session with this leader (`sessions`)."""
        lv = sessions.get(r) if sessions else None
        return state.last_heard_ms(fetch_requests_ms, lv is not None and lv.holds((self.topic, self.partition)))

    def in_sync_candidates(self, now_ms: int, replica_lag_time_max_ms: int, *,
                           replica_fetch_silence_max_ms: int | None = None,
                           acks_waiting_offset: int | None = None,
                           fetch_requests_ms: Mapping[int, int] | None = None,
                           fetch_gaps_ms: Mapping[int, float] | None = None,
                           sessions: Mapping[int, "FollowerLiveness"] | None = None) -> set[int]:
        """Replicas outside the ISR to propose in: `caught_up_out_of_isr` (LEO at the HW and
        the epoch start), caught up (Kafka's rule, `update_follower_fetch`) since the
        metadata took them out of the ISR, and in sync by the shrink rules now: caught up
        within `replica_lag_time_max_ms` and, while acks=all waits for a record they lack,
        not silent for `replica_fetch_silence_max_ms`.

        A follower whose answers are lost fetches again and again at the offset it had: that
        offset may reach a HW frozen by the shrink (KIP-966), and its requests make it look
        alive, but it is never caught up (the leader's LEO moved since its previous fetch),
        so it stays out until an answer reaches it; and an addition is never undone by the
        next check (no expand/shrink flapping through the controller)."""
        out: set[int] = set()
        for r in self.caught_up_out_of_isr():
            s = self.remote_replicas[r]
            if s.last_caught_up_time_ms < 0 or s.last_caught_up_time_ms <= s.left_isr_ms:
                continue
            if now_ms - s.last_caught_up_time_ms > replica_lag_time_max_ms:
                continue
            if (replica_fetch_silence_max_ms is not None and acks_waiting_offset is not None
                    and now_ms - self._heard_ms(r, s, fetch_requests_ms, sessions) > silence_limit_ms(
                        replica_fetch_silence_max_ms, fetch_gaps_ms.get(r) if fetch_gaps_ms else None)
                    and s.log_end_offset <= acks_waiting_offset):
                continue
            out.add(r)
        return out

    def broker_epochs(self, isr: list[int]) -> dict[int, int]:
        """The registration (broker epoch) whose fetches make each proposed follower look
        in sync: AlterPartition carries them and the controller refuses a member that has
        re-registered since (KIP-903: its new process may have a shorter log)."""
        return {r: self.remote_replicas[r].broker_epoch for r in isr
                if r != self.local_broker_id and r in self.remote_replicas}

    def isr_change_rejected(self, partition_epoch: int) -> None:
        """The controller refused the proposal made at `partition_epoch` for good: its
        additions no longer hold the HW back."""
        if partition_epoch == self.partition_epoch:
            self.pending_isr_additions = set()

    def out_of_sync_replicas(self, now_ms: int, replica_lag_time_max_ms: int) -> set[int]:
        """ISR members (other than the leader) not caught up within the lag time."""
        out: set[int] = set()
        if not self.is_leader:
            return out
        for r in self.isr:
            if r == self.local_broker_id:
                continue
            state = self.remote_replicas.get(r)
            if state is None or now_ms - state.last_caught_up_time_ms > replica_lag_time_max_ms:
                out.add(r)
        return out

    def silent_replicas(self, now_ms: int, replica_fetch_silence_max_ms: int,
                        acks_waiting_offset: int, *,
                        fetch_requests_ms: Mapping[int, int] | None = None,
                        fetch_gaps_ms: Mapping[int, float] | None = None,
                        sessions: Mapping[int, "FollowerLiveness"] | None = None) -> set[int]:
        """ISR members (other than the leader) that sent no fetch request for
        `replica_fetch_silence_max_ms` (counted from this leader epoch's start at the
        earliest) and lack the record at `acks_waiting_offset` an acks=all produce waits
        for: a stopped or cut-off follower leaves in about that time instead of
        `replica.lag.time.max.ms`. A follower that fetches, however far behind, is never
        silent (the lag rule alone judges it). One that has not fetched this partition in
        this leader epoch yet is silent only while its broker's last fetch request to this
        leader (`fetch_requests_ms`) is that old too (`ReplicaState.last_heard_ms`). A broker
        whose requests usually come further apart than the limit allows (`fetch_gaps_ms`: a
        loaded leader answers each in seconds) gets a longer one (`silence_limit_ms`)."""
        out: set[int] = set()
        if not self.is_leader:
            return out
        for r in self.isr:
            if r == self.local_broker_id:
                continue
            state = self.remote_replicas.get(r)
            if state is None:
                continue   # the lag rule drops it
            last_heard = self._heard_ms(r, state, fetch_requests_ms, sessions)
            limit = silence_limit_ms(replica_fetch_silence_max_ms, fetch_gaps_ms.get(r) if fetch_gaps_ms else None)
            if now_ms - last_heard > limit and state.log_end_offset <= acks_waiting_offset:
                out.add(r)
        return out

    def caught_up_out_of_isr(self) -> set[int]:
        """Replicas outside the ISR that may rejoin: their LEO reached the high watermark
        and the offset where this leader epoch began (Kafka). A new leader's HW may still
        be below what the previous leader had committed; the epoch start offset is not, so
        a replica lacking committed records never becomes electable."""
        floor = max(self.high_watermark, self.leader_epoch_start_offset)
        return {
            r for r, s in self.remote_replicas.items()
            if r not in self.isr and s.log_end_offset >= floor
        }

    def check_enough_replicas(self, min_insync_replicas: int) -> None:
        """acks=all is refused with NOT_ENOUGH_REPLICAS while ISR < min.insync.replicas."""
        if len(self.isr) < min_insync_replicas:
            raise KraftlogError(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                f"{self.topic}-{self.partition} has {len(self.isr)} in-sync replicas "
                f"{sorted(self.isr)}, fewer than min.insync.replicas={min_insync_replicas}; "
                "retry later, use acks=1, or lower min.insync.replicas")
