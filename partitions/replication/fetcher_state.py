"""Pure state of a follower's replica fetcher for one leader broker (no IO, no event loop).

A follower keeps one `LeaderFetchState` per leader broker it follows: every partition it
follows from that leader, in one of two phases:

- TRUNCATING: just became a follower (new leader or new leader epoch). It must find the
  divergence point with the leader (OffsetsForLeaderEpoch, KIP-279 loop, see
  `truncation_step`) before fetching; never truncates blindly to its own high watermark.
- FETCHING: fetches from its log end offset (which also tells the leader its progress).

Invariants: a partition is in at most one leader's state; a change of leader epoch puts it
back to TRUNCATING; a partition in error backs off until `retry_at_ms` (others keep going).

Incremental (issue 25): the fetcher must not walk every followed partition per poll. So the
state keeps the keys of TRUNCATING partitions and of backed-off ones, and a set of keys that
changed since the fetcher last asked (`take_changed`): every add, remove, phase or epoch
change, back-off and back-off expiry, plus `log_changed` (the fetcher appended, truncated or
reset the local log). A fetch session names only partitions whose fetch offset or epoch
changed; those are a subset of the changed keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

TRUNCATING = "truncating"
FETCHING = "fetching"
UNDEFINED_EPOCH = -1


@dataclass
class PartitionFetchState:
    """One followed partition: the leader epoch it follows under and its phase."""

    topic: str
    partition: int
    leader_epoch: int
    phase: str = TRUNCATING
    retry_at_ms: int = 0
    truncation_rounds: int = 0


@dataclass
class LeaderFetchState:
    """All partitions this broker follows from one leader broker."""

    leader_id: int
    leader_url: str
    partitions: dict[tuple[str, int], PartitionFetchState] = field(default_factory=dict)
    # when the oldest request to this leader still without an answer was sent (None: every
    # request was answered); a refused or timed-out request leaves it set (issue 24 part B)
    unanswered_since_ms: int | None = None
    # the leader refused or left a request unanswered: no request before `retry_at_ms`; the
    # back-off doubles with each failure in a row and an answer ends it (`unreachable`)
    retry_at_ms: int = 0
    unreachable_backoff_ms: int = 0

    def request_sent(self, now_ms: int) -> None:
        """A fetch or OffsetsForLeaderEpoch request went out to the leader."""
        if self.unanswered_since_ms is None:
            self.unanswered_since_ms = now_ms

    def answered(self) -> None:
        """The leader answered (data, nothing, or a partition error: it is alive)."""
        self.unanswered_since_ms = None
        self.retry_at_ms = self.unreachable_backoff_ms = 0

    def unreachable(self, now_ms: int, backoff_ms: int, backoff_max_ms: int) -> None:
        """The leader refused a request or left it unanswered: the whole fetcher waits
        (no partition is touched), `backoff_ms` after the first failure, doubling up to
        `backoff_max_ms`."""
        self.unreachable_backoff_ms = min(backoff_max_ms, max(backoff_ms, 2 * self.unreachable_backoff_ms))
        self.retry_at_ms = now_ms + self.unreachable_backoff_ms

    def backing_off(self, now_ms: int) -> bool:
        """True while the leader's back-off (`unreachable`) runs."""
        return now_ms < self.retry_at_ms

    def silent_ms(self, now_ms: int) -> int:
        """How long the leader has left our requests unanswered (0: it answers). A healthy
        leader answers a fetch within its long-poll wait (`replica_fetch_wait_max_ms`)."""
        if self.unanswered_since_ms is None or not self.partitions:
            return 0
        return max(0, now_ms - self.unanswered_since_ms)

    # keys in TRUNCATING phase / with a back-off set / changed since `take_changed`
    truncating: set = field(default_factory=set)
    backed_off: set = field(default_factory=set)
    changed: set = field(default_factory=set)

    def set_partition(self, topic: str, partition: int, leader_epoch: int) -> bool:
        """Follow (topic, partition) under `leader_epoch`. A new partition or a new epoch
        starts TRUNCATING; returns True when something changed."""
        key = (topic, partition)
        cur = self.partitions.get(key)
        if cur is not None and cur.leader_epoch == leader_epoch:
            return False
        self.partitions[key] = PartitionFetchState(topic, partition, leader_epoch)
        self.truncating.add(key)
        self.backed_off.discard(key)
        self.changed.add(key)
        return True

    def remove(self, topic: str, partition: int) -> None:
        key = (topic, partition)
        if self.partitions.pop(key, None) is not None:
            self.truncating.discard(key)
            self.backed_off.discard(key)
            self.changed.add(key)

    def ready(self, phase: str, now_ms: int) -> list[PartitionFetchState]:
        """Partitions in `phase` not backing off (TRUNCATING: from its index, no walk)."""
        if phase == TRUNCATING:
            parts = (self.partitions[k] for k in self.truncating)
            return [s for s in parts if s.retry_at_ms <= now_ms]
        return [s for s in self.partitions.values() if s.phase == phase and s.retry_at_ms <= now_ms]

    def truncated(self, topic: str, partition: int, leader_epoch: int) -> None:
        """Divergence resolved: start fetching (ignored if the epoch moved on meanwhile)."""
        key = (topic, partition)
        s = self.partitions.get(key)
        if s is not None and s.leader_epoch == leader_epoch:
            s.phase = FETCHING
            s.retry_at_ms = 0
            self.truncating.discard(key)
            self.backed_off.discard(key)
            self.changed.add(key)

    def must_truncate(self, topic: str, partition: int, leader_epoch: int) -> None:
        """The leader says our log is ahead/diverged (e.g. OFFSET_OUT_OF_RANGE): truncate again."""
        key = (topic, partition)
        s = self.partitions.get(key)
        if s is not None and s.leader_epoch == leader_epoch:
            s.phase = TRUNCATING
            self.truncating.add(key)
            self.changed.add(key)

    def back_off(self, topic: str, partition: int, now_ms: int, backoff_ms: int) -> None:
        key = (topic, partition)
        s = self.partitions.get(key)
        if s is not None:
            s.retry_at_ms = now_ms + backoff_ms
            self.backed_off.add(key)
            self.changed.add(key)

    def log_changed(self, topic: str, partition: int) -> None:
        """The local log of a followed partition moved (append, truncation, reset)."""
        if (topic, partition) in self.partitions:
            self.changed.add((topic, partition))

    def take_changed(self, now_ms: int) -> set:
        """Keys changed since the last call, plus those whose back-off expired by `now_ms`
        (their back-off is cleared); empties the changed set."""
        expired = [k for k in self.backed_off if self.partitions[k].retry_at_ms <= now_ms]
        for k in expired:
            self.partitions[k].retry_at_ms = 0
            self.backed_off.discard(k)
        out, self.changed = self.changed, set()
        out.update(expired)
        return out

    def next_retry_ms(self) -> int | None:
        """Earliest retry time among backed-off partitions (None if none waits)."""
        times = [self.partitions[k].retry_at_ms for k in self.backed_off]
        return min(times) if times else None


def truncation_step(follower_log_end_offset: int, follower_end_offset_for_epoch: Callable[[int], tuple[int, int]],
                    leader_epoch: int, leader_end_offset: int) -> tuple[int, bool]:
    """One round of Kafka's (KIP-279) truncation loop.

    The follower asked the leader for the end offset of its latest epoch; the leader
    answered (`leader_epoch`, `leader_end_offset`) = (largest epoch <= the one asked, the
    offset where the leader's next epoch starts, or its LEO). Returns (offset to truncate
    to, done). Not done means: truncate, then ask again for the (new) latest epoch.

    - leader knows no epoch <= ours (-1): nothing is shared, truncate to 0 (the caller
      restarts at the leader's log start when that is higher);
    - we do not have the leader's epoch: cut back to our epochs below it and ask again;
    - both have it: the logs agree up to min(our end, leader's end) of that epoch.
    """
    if leader_end_offset < 0 or leader_epoch == UNDEFINED_EPOCH:
        return 0, True
    follower_epoch, follower_end = follower_end_offset_for_epoch(leader_epoch)
    if follower_epoch != leader_epoch:
        if follower_end < 0:
            return 0, True
        return min(follower_end, follower_log_end_offset), False
    return min(follower_end, leader_end_offset, follower_log_end_offset), True
