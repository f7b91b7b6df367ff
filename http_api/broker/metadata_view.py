"""The broker's current view of cluster metadata, with a way to await changes.

Job: hold the latest `MetadataImage` the broker has applied, apply each new image to the
ReplicaManager *before* publishing it (so a request that sees a partition in the image
also finds its local replica), and let handlers wait — on futures, not sleeps — until a
condition holds (a topic just created by the controller becomes visible, ...).

Atomic publication (issue 25): `update(image)` swaps `self.image` in one assignment after
the replica manager applied the whole change, so every reader (`GET /v1/topics/{t}`,
`/v1/metadata`, the Kafka listener's Metadata) sees a change whole or not at all. An image
made by the MetadataFollower's feed (`metadata_quorum.feed.change_of`: copy-on-write, never
mutated once made) is published as is, and when it was made from the image published now,
the replica manager looks only at what its records touched; any other image (tests, a
fake controller) is deep-copied and applied whole.

Held produces: a produce waiting for a partition's new leader (`partition_change`) is woken
by a published update touching the partition, or earlier, when the replica manager took up
that leadership during the apply (`ReplicaManager.leadership_listeners`), 200 per loop turn.

Lag: `lag()` is (records behind the controller, ms behind without catching up) of the
feed that made the published image, for `/healthz` and `/metrics`.

Security (users, bearer tokens, ACLs, kept in the metadata quorum): `view.security` is the
current `SecurityImage` (metadata_quorum/security/image.py; immutable, its `version` changes
on every change), `view.add_security_listener(fn)` calls `fn(security_image)` after every
update that changed it. A change reaches every broker's view with the metadata feed's long
poll (milliseconds; the test asserts < 1 s on 3 brokers).
"""
from __future__ import annotations

import asyncio
import collections
import copy
import inspect
import time
from typing import Any, Callable, Optional

from metadata_quorum.feed import change_of
from metadata_quorum.records import (ConfigRecord, LeaderChangeRecord, NoOpRecord, PartitionChangeRecord,
                                     PartitionRecord, ProducerIdsRecord, TopicRecord)
from metadata_quorum.security.image import SecurityImage

_NO_SECURITY = SecurityImage()


# partition waiters woken per turn of the loop (MetadataView._wake)
WAKE_SLICE_WAITERS = 200

# records that never move a partition's leader or its route: they wake no partition waiter
_ROUTE_NEUTRAL = (ConfigRecord, LeaderChangeRecord, NoOpRecord, ProducerIdsRecord, TopicRecord)


class MetadataView:
    """Latest applied MetadataImage (`image`) plus `wait_until(predicate, timeout_s)` and
    `partition_change(topic, partition, timeout_s)`: a future woken only by an update whose
    records touch that partition (or may move its route: a broker record, a snapshot), so
    thousands of produces waiting for new leaders are not all woken by every ISR change
    (issue 25: after a kill -9 at 30,000 partitions each of ~30 updates woke 10,000 of them)."""

    def __init__(self, replica_manager: Any, image: Any = None) -> None:
        self.replica_manager = replica_manager
        self.image = image
        self.version = 0
        self.published_at: Optional[float] = None   # time.monotonic() of the last publication
        self._waiters: list[asyncio.Future] = []
        self._partition_waiters: dict[tuple[str, int], list[asyncio.Future]] = {}
        self._listeners: list[Callable[[Any], None]] = []
        self._security_listeners: list[Callable[[SecurityImage], None]] = []
        self._lock = asyncio.Lock()
        # woken partition waiters not yet resumed, WAKE_SLICE_WAITERS per turn (_wake)
        self._wake_queue: collections.deque = collections.deque()
        self._wake_scheduled = False   # a _next_wake_turn is due
        self._wake_budget = WAKE_SLICE_WAITERS   # wakes left in this turn
        self._wake_idle: Optional[asyncio.Future] = None   # done once the queue drained
        self.woken_during_apply = 0   # produces woken by `_wake_taken` during the last update's apply
        self._woken_taken = 0
        # a leadership the replica manager takes up during an apply wakes its held produces
        # before the change is published (`_wake_taken`)
        taken = getattr(replica_manager, "leadership_listeners", None)
        if isinstance(taken, list):
            taken.append(self._wake_taken)
        # a replica manager that can apply just a change (test doubles may not)
        apply = getattr(replica_manager, "apply_metadata", None)
        self._apply_takes_changed = apply is not None and "changed" in inspect.signature(apply).parameters

    def lag(self) -> tuple[int, int]:
        """(records behind the controller's applied offset, ms this broker has been behind
        without catching up); (0, 0) for an image no feed made."""
        info = change_of(self.image)
        return (0, 0) if info is None else info.source.lag()

    def add_listener(self, fn: Callable[[Any], None]) -> None:
        self._listeners.append(fn)

    @property
    def security(self) -> SecurityImage:
        """Users, tokens and ACLs of the current image (empty before metadata is loaded)."""
        return self.image.security if self.image is not None else _NO_SECURITY

    def add_security_listener(self, fn: Callable[[SecurityImage], None]) -> None:
        """`fn(security_image)` after each update whose SecurityImage changed (version differs)."""
        self._security_listeners.append(fn)

    async def update(self, image: Any, _changed: Optional[list] = None) -> None:
        """Apply `image` to the replica manager, publish it, wake waiters (see the module
        docstring; `_changed` is the follower callback's second argument, unused: a feed
        image carries its own records)."""
        info = change_of(image)
        if info is None:
            image = copy.deepcopy(image)   # the caller may change its image later
        waking = None
        async with self._lock:
            self._woken_taken = 0
            current = self.image
            if (info is not None and info.records is not None and current is not None
                    and info.base_offset == current.offset and self._apply_takes_changed):
                await self.replica_manager.apply_metadata(image, changed=info.records)
            else:
                await self.replica_manager.apply_metadata(image)
            self.woken_during_apply = self._woken_taken
            old_security = self.security
            self.image = image
            self.published_at = time.monotonic()
            self.version += 1
            for fn in self._listeners:
                fn(image)
            if image.security.version != old_security.version:
                for sfn in self._security_listeners:
                    sfn(image.security)
            waiters, self._waiters = self._waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
            self._wake_partition_waiters(info.records if info is not None else None)
            waking = self._wake_idle   # produces woken by this change or during its apply, not all gone on yet
        if waking is not None:
            # the next change waits until every produce held for this one went on: after a
            # fencing they are what clients wait for, and the ISR removals that follow it
            # took the new leaders' loop from them (issue 25)
            await waking

    def _wake_partition_waiters(self, records: Optional[list]) -> None:
        """Wake the `partition_change` waiters of the partitions `records` touch; all of them
        when `records` is None (a whole image) or holds a record that may move any route
        (`_wake`: `_wake_idle` is done once the last of them went on)."""
        pw = self._partition_waiters
        if not pw:
            return
        keys: Optional[set] = set()
        if records is None:
            keys = None
        else:
            for r in records:
                if isinstance(r, (PartitionChangeRecord, PartitionRecord)):
                    keys.add((r.topic, r.partition))
                elif not isinstance(r, _ROUTE_NEUTRAL):
                    keys = None      # a broker fenced or moved, a topic removed: everyone looks again
                    break
        if keys is None:
            woken = list(pw.values())
            pw.clear()
        else:
            woken = [pw.pop(k) for k in keys if k in pw]
        self._wake([fut for futs in woken for fut in futs])

    def _wake_taken(self, keys: list) -> None:
        """The replica manager took up the leadership of `keys` ((topic, partition)) while
        applying a change not published yet: the produces held for them may append now (the
        local replica leads with the committed leader epoch; a produce checks the replica
        manager, not the published image). After a fencing the new leader's produces then go
        on during the rest of the apply (the partitions it now follows) instead of after it."""
        pw = self._partition_waiters
        if pw:
            futs = [fut for k in keys if k in pw for fut in pw.pop(k)]
            self._woken_taken += len(futs)
            self._wake(futs)

    def _wake(self, futs: list) -> None:
        """Wake `futs` (oldest waiter first) at most WAKE_SLICE_WAITERS per turn of the
        loop, after those woken before them (a publication and the leaderships announced
        during an apply share the budget): each woken produce appends before its first
        await (issue 25: after a kill -9 at 100,000 partitions, the 16,667 held produces a
        new leader woke at once held its loop for 2 s, so heartbeats and replica fetch
        answers waited that long and its followers were reported silent). What the budget
        of this turn allows is woken now, the rest by a callback in later turns, with the
        loop's I/O polled in between. While some are queued, `_wake_idle` is a future done
        after the steps of the last slice of everything queued (None once all were woken)."""
        queue = self._wake_queue
        queue.extend(futs)
        if not self._wake_scheduled:
            self._wake_scheduled = True
            self._wake_budget = WAKE_SLICE_WAITERS
            asyncio.get_running_loop().call_soon(self._next_wake_turn)
        self._wake_some()
        if queue and self._wake_idle is None:
            self._wake_idle = asyncio.get_running_loop().create_future()

    def _wake_some(self) -> None:
        queue = self._wake_queue
        n = min(self._wake_budget, len(queue))
        self._wake_budget -= n
        for _ in range(n):
            fut = queue.popleft()
            if not fut.done():
                fut.set_result(None)

    def _next_wake_turn(self) -> None:
        """A new turn of the loop: a new budget; ends the chain once the queue is empty."""
        self._wake_budget = WAKE_SLICE_WAITERS
        self._wake_some()
        loop = asyncio.get_running_loop()
        if self._wake_queue:
            loop.call_soon(self._next_wake_turn)
            return
        self._wake_scheduled = False
        idle, self._wake_idle = self._wake_idle, None
        if idle is not None:
            loop.call_soon(_expire, idle)   # after the last slice's steps

    def partition_change(self, topic: str, partition: int, timeout_s: float) -> asyncio.Future:
        """A future done at the next published update that touches `topic`-`partition` (see
        `_wake_partition_waiters`) or after `timeout_s`, whichever comes first. Register it
        right after reading the state it waits to see change (no await in between)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        key = (topic, partition)
        self._partition_waiters.setdefault(key, []).append(fut)
        handle = loop.call_later(timeout_s, _expire, fut)

        def done(_f: asyncio.Future) -> None:   # woken, expired or cancelled: leave no trace
            handle.cancel()
            futs = self._partition_waiters.get(key)
            if futs is not None and fut in futs:
                futs.remove(fut)
                if not futs:
                    del self._partition_waiters[key]
        fut.add_done_callback(done)
        return fut

    async def wait_until(self, predicate: Callable[[Any], bool], timeout_s: float) -> bool:
        """True once predicate(image) holds; False if it still does not after timeout_s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if self.image is not None and predicate(self.image):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            fut = loop.create_future()
            self._waiters.append(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                pass


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
