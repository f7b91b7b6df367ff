"""ReplicaFetcherManager: followers copy their leaders' logs by fetching, as consumers do.

One asyncio task per followed partition (keyed by (topic, partition, leader, epoch); a
metadata change that moves the leader or bumps the epoch replaces the task). A task:

1. truncates to the divergence point: asks the leader for the end offset of our latest
   leader epoch (OffsetsForLeaderEpoch) and truncates above it — never to our own HW;
2. long-polls the leader from our log end offset (that fetch offset is also how the leader
   learns our progress, moving the HW and the ISR), appends the batches with the leader's
   offsets, adopts the leader's HW;
3. on OFFSET_OUT_OF_RANGE below the leader's log start, restarts empty at that offset.

The HTTP transport is injected (`transport.fetch`, `transport.epoch_end_offset`), so tests
can run leader and follower in one process.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from http_api.errors import ErrorCode, KraftlogError
from partitions.log import errors as log_errors

log = logging.getLogger(__name__)

REPLICA_FETCH_MAX_BYTES = 1024 * 1024
REPLICA_FETCH_WAIT_MAX_MS = 500
REPLICA_FETCH_BACKOFF_MS = 200


class ReplicaFetcherManager:
    """Keeps one fetch task per followed partition (see module docstring)."""

    def __init__(self, replica_manager: Any, transport: Any, broker_id: int, *,
                 fetch_max_bytes: int = REPLICA_FETCH_MAX_BYTES, fetch_wait_max_ms: int = REPLICA_FETCH_WAIT_MAX_MS,
                 backoff_ms: int = REPLICA_FETCH_BACKOFF_MS) -> None:
        self.rm = replica_manager
        self.transport = transport
        self.broker_id = broker_id
        self.fetch_max_bytes = fetch_max_bytes
        self.fetch_wait_max_ms = fetch_wait_max_ms
        self.backoff_s = backoff_ms / 1000
        self.tasks: dict[tuple[str, int], tuple[tuple[int, int], asyncio.Task]] = {}
        self._closed = False

    def sync(self, image) -> None:
        """Start/stop/restart fetch tasks to match the replica manager's follower set."""
        if self._closed:
            return
        wanted = {}
        for topic, p, leader, epoch in self.rm.followed_partitions():
            b = image.brokers.get(leader) if image is not None else None
            if b is not None:
                wanted[(topic, p)] = (leader, epoch, b.url)
        for key in list(self.tasks):
            ident, task = self.tasks[key]
            w = wanted.get(key)
            if w is None or (w[0], w[1]) != ident or task.done():
                task.cancel()
                del self.tasks[key]
        for key, (leader, epoch, url) in wanted.items():
            if key not in self.tasks:
                task = asyncio.ensure_future(self._run(key[0], key[1], leader, epoch, url))
                self.tasks[key] = ((leader, epoch), task)

    async def close(self) -> None:
        self._closed = True
        tasks = [t for _, t in self.tasks.values()]
        self.tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, topic: str, partition: int, leader: int, epoch: int, url: str) -> None:
        truncated = False
        while not self._closed:
            try:
                if not truncated:
                    await self._truncate(topic, partition, epoch, url)
                    truncated = True
                await self._fetch_once(topic, partition, epoch, url)
            except asyncio.CancelledError:
                raise
            except KraftlogError as e:
                if e.code is ErrorCode.NOT_LEADER_OR_FOLLOWER and self._no_longer_following(topic, partition, epoch):
                    return  # metadata moved on; sync() starts the right task
                if e.code is ErrorCode.OFFSET_OUT_OF_RANGE and "log_start_offset" in e.extra:
                    lso = int(e.extra["log_start_offset"])
                    part, lg = self.rm.follower_partition(topic, partition, epoch)
                    if lg.log_end_offset < lso:
                        log.info("%s-%s: behind the leader's log start %d; restarting there", topic, partition, lso)
                        self.rm.follower_reset(topic, partition, epoch, lso)
                        continue
                    truncated = False  # ahead of the leader: find the divergence point again
                log.debug("replica fetch %s-%s from %s failed: %s", topic, partition, url, e)
                await asyncio.sleep(self.backoff_s)
            except log_errors.OffsetMismatchError:
                truncated = False
                await asyncio.sleep(self.backoff_s)
            except Exception as e:  # noqa: BLE001 - keep replicating; say why
                log.warning("replica fetch %s-%s from %s failed: %s", topic, partition, url, e)
                await asyncio.sleep(self.backoff_s)

    def _no_longer_following(self, topic: str, partition: int, epoch: int) -> bool:
        try:
            self.rm.follower_partition(topic, partition, epoch)
            return False
        except KraftlogError:
            return True

    async def _truncate(self, topic: str, partition: int, epoch: int, url: str) -> None:
        part, lg = self.rm.follower_partition(topic, partition, epoch)
        latest = lg.latest_epoch
        if latest < 0 or lg.log_end_offset == lg.log_start_offset:
            return
        leader_epoch, end_offset = await self.transport.epoch_end_offset(url, topic, partition, latest)
        if leader_epoch < 0 or end_offset < 0:
            return
        if end_offset < lg.log_end_offset:
            log.info("%s-%s: truncating from %d to %d (leader's end of epoch %d)", topic, partition,
                     lg.log_end_offset, end_offset, latest)
            self.rm.follower_truncate(topic, partition, epoch, end_offset)

    async def _fetch_once(self, topic: str, partition: int, epoch: int, url: str) -> None:
        part, lg = self.rm.follower_partition(topic, partition, epoch)
        offset = lg.log_end_offset
        data, hw, lso = await self.transport.fetch(url, topic, partition, offset=offset, replica_id=self.broker_id,
                                                   leader_epoch=epoch, max_bytes=self.fetch_max_bytes,
                                                   max_wait_ms=self.fetch_wait_max_ms)
        part, lg = self.rm.follower_partition(topic, partition, epoch)
        if lg.log_end_offset != offset:
            return  # truncated meanwhile: fetch again
        self.rm.follower_append(topic, partition, epoch, data, hw, lso)
