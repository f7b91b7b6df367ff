"""Tiered storage in the broker (issue 19; docs/TIERED_STORAGE.md): starts the
`RemoteLogManager` when `[remote_storage] enable` is set, and the fetch/offsets hooks.

- `install_tiered_storage(app, ctx)`: on app startup the S3 store and the remote log
  manager's thread (partitions/log/remote/), the metadata listener (topic deletion), the
  /metrics collector; stopped on app cleanup (before the logs close).
- `remote_fetch(ctx, ...)`: a fetch below the leader's local log start is read from the
  store, in the remote log manager's own thread pool with a deadline
  (`remote_fetch_max_wait_ms`): a slow store never holds the event loop, so fetches of
  local data go on. Same route, same answer shape.
- `offsets_doc(ctx, ...)`: `log_start_offset` is the remote log start of a tiered partition,
  `local_log_start_offset` the local one (API.md, Tiered storage).
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from partitions.errors import ErrorCode, KraftlogError

log = logging.getLogger(__name__)

RLM_KEY: web.AppKey = web.AppKey("remote_log_manager", object)


@dataclass
class RemoteFetchResult:
    """Same fields as a local fetch result (replica_state.FetchResult)."""

    records: bytes
    fetch_offset: int
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    next_offset: int
    aborted: list = field(default_factory=list)   # read_committed: the store's aborted transactions


def remote_log_manager(ctx: Any):
    return getattr(ctx, "remote_log_manager", None)


class RemoteLogCollector:
    """Prometheus collector over RemoteLogManager.metrics (no IO while scraping)."""

    def __init__(self, rlm) -> None:
        self.rlm = rlm

    def collect(self):
        s = self.rlm.metrics.snapshot()
        for name, doc, key in [
            ("kraftlog_remote_copy_bytes", "Bytes copied to the remote store", "copied_bytes_total"),
            ("kraftlog_remote_copy_segments", "Segments copied to the remote store", "copied_segments_total"),
            ("kraftlog_remote_copy_errors", "Failed remote store passes (copy, list, delete); retried with backoff",
             "copy_errors_total"),
            ("kraftlog_remote_delete_segments", "Remote segments deleted (total retention, orphans)",
             "deleted_segments_total"),
            ("kraftlog_remote_fetch_requests", "Fetches served from the remote store", "fetch_requests_total"),
            ("kraftlog_remote_fetch_bytes", "Bytes served from the remote store", "fetch_bytes_total"),
            ("kraftlog_remote_fetch_errors", "Fetches from the remote store that failed", "fetch_errors_total"),
        ]:
            yield CounterMetricFamily(name, doc, value=s[key])
        lag = GaugeMetricFamily("kraftlog_remote_copy_lag_segments",
                                "Closed segments below the high watermark not yet in the remote store",
                                labels=["topic", "partition"])
        lag_b = GaugeMetricFamily("kraftlog_remote_copy_lag_bytes", "Bytes of those segments",
                                  labels=["topic", "partition"])
        for (t, p), n in sorted(s["copy_lag_segments"].items()):
            lag.add_metric([t, str(p)], n)
            lag_b.add_metric([t, str(p)], s["copy_lag_bytes"].get((t, p), 0))
        yield lag
        yield lag_b
        yield GaugeMetricFamily("kraftlog_remote_fetch_cache_bytes", "Bytes in the on-disk remote chunk cache",
                                value=self.rlm.cache.size_bytes)


def install_tiered_storage(app: web.Application, ctx: Any) -> None:
    """Start the remote log manager with the app when `[remote_storage] enable` is set."""
    cfg = ctx.config
    rs = cfg.remote_storage
    if not rs.remote_storage_enable:
        return
    deps = ctx.deps

    async def _tiering(app: web.Application):
        from partitions.log.remote.remote_log_manager import Leadership, RemoteLogManager
        from partitions.log.remote.s3 import S3RemoteStorage

        rm = deps.replica_manager

        def leadership(topic: str, partition: int):
            part = rm.partitions.get((topic, partition))
            image = deps.metadata.image
            topic_md = image.topics.get(topic) if image is not None else None
            if part is None or topic_md is None:
                return None
            return Leadership(part.is_leader, part.leader_epoch, part.high_watermark, topic_md.topic_id)

        rlm = RemoteLogManager(rs, S3RemoteStorage(rs), rm.log_manager, cfg.broker_id,
                               os.path.join(cfg.state_dir, "remote-log-cache"), leadership)
        ctx.remote_log_manager = rlm
        app[RLM_KEY] = rlm
        deps.metadata.add_listener(rlm.on_metadata)
        if deps.metadata.image is not None:
            rlm.on_metadata(deps.metadata.image)
        deps.registry.register(RemoteLogCollector(rlm))

        def on_follower_reset(topic: str, partition: int, start_offset: int) -> None:
            # a follower restarted at the leader's local log start: its producer state comes
            # from the store (in the remote read pool: never on the event loop)
            image = deps.metadata.image
            topic_md = image.topics.get(topic) if image is not None else None
            lg = rm.log_manager.get(topic, partition)
            if topic_md is None or lg is None or not lg.config.remote_storage_enable:
                return

            def restore() -> None:
                try:
                    rlm.restore_follower_state(topic, partition, topic_md.topic_id, start_offset)
                except Exception as exc:  # noqa: BLE001 - a missing snapshot only loses dedup of old batches
                    log.warning("restoring the producer state of %s-%d from the remote store failed: %s",
                                topic, partition, exc)
            rlm.read_pool.submit(restore)

        rm.follower_reset_listeners.append(on_follower_reset)
        rlm.start()
        log.info("tiered storage on: bucket %s at %s", rs.remote_storage_s3_bucket,
                 rs.remote_storage_s3_endpoint or "AWS S3")
        yield
        ctx.remote_log_manager = None
        await asyncio.get_running_loop().run_in_executor(None, rlm.stop)

    app.cleanup_ctx.append(_tiering)


def _tiered(ctx: Any, topic: str, partition: int):
    lg = ctx.deps.replica_manager.log_manager.get(topic, partition)
    return lg if lg is not None and lg.config.remote_storage_enable else None


async def _in_pool(rlm, timeout_s: float, fn, *args):
    loop = asyncio.get_running_loop()
    try:
        return await asyncio.wait_for(loop.run_in_executor(rlm.read_pool, fn, *args), timeout_s)
    except asyncio.TimeoutError:
        rlm.metrics.add(fetch_errors_total=1)
        raise KraftlogError(ErrorCode.REQUEST_TIMED_OUT,
                            f"the remote store did not answer within remote_fetch_max_wait_ms "
                            f"({int(timeout_s * 1000)}); retry the fetch") from None


async def _ensure_loaded(ctx: Any, rlm, topic: str, partition: int) -> None:
    from partitions.log.remote.storage import RemoteStorageError
    image = ctx.deps.metadata.image
    topic_md = image.topics.get(topic) if image is not None else None
    if topic_md is None or rlm.remote_log_start_offset(topic, partition) is not None:
        return
    try:
        await _in_pool(rlm, rlm.cfg.remote_fetch_max_wait_ms / 1000, rlm.ensure_loaded, topic, partition,
                       topic_md.topic_id)
    except RemoteStorageError as exc:
        raise KraftlogError(ErrorCode.KAFKA_STORAGE_ERROR,
                            f"the remote store is unavailable ({exc}); retry the fetch") from None


async def remote_fetch(ctx: Any, topic: str, partition: int, offset: int, max_bytes: int) -> RemoteFetchResult | None:
    """The fetch answer from the remote store when `offset` is below the leader's local log
    start of a tiered partition; None when the local log serves it."""
    rlm = remote_log_manager(ctx)
    if rlm is None or _tiered(ctx, topic, partition) is None:
        return None
    rm = ctx.deps.replica_manager
    offs = rm.offsets(topic, partition)   # NOT_LEADER_OR_FOLLOWER unless we lead it
    local_start = offs["log_start_offset"]
    if offset >= local_start:
        return None
    from partitions.log.remote.storage import RemoteStorageError
    await _ensure_loaded(ctx, rlm, topic, partition)
    try:
        got = await _in_pool(rlm, rlm.cfg.remote_fetch_max_wait_ms / 1000, rlm.read, topic, partition, offset,
                             max_bytes)
    except RemoteStorageError as exc:
        raise KraftlogError(ErrorCode.KAFKA_STORAGE_ERROR,
                            f"reading offset {offset} of {topic}-{partition} from the remote store failed ({exc}); "
                            "retry the fetch") from None
    remote_start = rlm.remote_log_start_offset(topic, partition)
    log_start = local_start if remote_start is None else min(remote_start, local_start)
    hw = offs["high_watermark"]
    if got is None:
        raise KraftlogError(ErrorCode.OFFSET_OUT_OF_RANGE,
                            f"offset {offset} is outside [{log_start}, {hw}] of {topic}-{partition}; fetch from the "
                            f"log start offset {log_start}", log_start_offset=log_start, high_watermark=hw)
    return RemoteFetchResult(got.records, offset, hw, log_start, hw, got.next_offset)


async def offsets_doc(ctx: Any, topic: str, partition: int, doc: dict) -> dict:
    """`doc` (the local offsets) with `local_log_start_offset`, and the remote log start as
    `log_start_offset` of a tiered partition."""
    doc = dict(doc)
    doc["local_log_start_offset"] = doc["log_start_offset"]
    rlm = remote_log_manager(ctx)
    if rlm is None or _tiered(ctx, topic, partition) is None:
        return doc
    try:
        await _ensure_loaded(ctx, rlm, topic, partition)
    except KraftlogError:
        return doc   # store down: the local view, still correct for local reads
    remote_start = rlm.remote_log_start_offset(topic, partition)
    if remote_start is not None and remote_start < doc["log_start_offset"]:
        doc["log_start_offset"] = remote_start
    return doc


async def remote_aborted_transactions(ctx: Any, topic: str, partition: int, start: int, end: int) -> list:
    """The aborted transactions with records in [start, end) that only the remote segments'
    transaction indexes hold (read_committed over data served from the store); [] when the
    partition is not tiered."""
    rlm = remote_log_manager(ctx)
    if rlm is None or _tiered(ctx, topic, partition) is None or end <= start:
        return []
    from partitions.log.remote.storage import RemoteStorageError
    try:
        return await _in_pool(rlm, rlm.cfg.remote_fetch_max_wait_ms / 1000, rlm.aborted_transactions, topic,
                              partition, start, end)
    except RemoteStorageError as exc:
        raise KraftlogError(ErrorCode.KAFKA_STORAGE_ERROR,
                            f"reading the transaction index of {topic}-{partition} from the remote store failed "
                            f"({exc}); retry the fetch") from None


def merge_aborted(*lists) -> list:
    """Aborted transactions from both tiers, each once, ordered by marker offset."""
    return sorted({a for lst in lists for a in lst}, key=lambda a: (a.last_offset, a.producer_id))


async def offset_for_timestamp(ctx: Any, topic: str, partition: int, timestamp_ms: int, local: int) -> int:
    """ListOffsets by time over both tiers: EARLIEST (-2) is the remote log start; a time
    earlier than the local records is looked up in the remote segments. `local` is the
    local log's answer."""
    rlm = remote_log_manager(ctx)
    if rlm is None or _tiered(ctx, topic, partition) is None or timestamp_ms == -1:
        return local
    try:
        await _ensure_loaded(ctx, rlm, topic, partition)
    except KraftlogError:
        if timestamp_ms == -2:
            raise
        return local
    remote_start = rlm.remote_log_start_offset(topic, partition)
    if remote_start is None:
        return local
    if timestamp_ms == -2:
        return min(remote_start, local)
    from partitions.log.remote.storage import RemoteStorageError
    try:
        found = await _in_pool(rlm, rlm.cfg.remote_fetch_max_wait_ms / 1000, rlm.offset_for_timestamp, topic,
                               partition, timestamp_ms)
    except RemoteStorageError as exc:
        raise KraftlogError(ErrorCode.KAFKA_STORAGE_ERROR,
                            f"looking up timestamp {timestamp_ms} of {topic}-{partition} in the remote store failed "
                            f"({exc}); retry") from None
    return local if found is None else min(found, local)


async def delete_records(ctx: Any, topic: str, partition: int, before_offset: int) -> int | None:
    """DeleteRecords on a tiered partition: the floor goes to the store first (records below
    it are never read from the store again; the leader deletes the remote segments wholly
    below it), then the caller moves the local log start. Returns the remote log start after
    it, or None (not tiered, or nothing remote is readable)."""
    rlm = remote_log_manager(ctx)
    if rlm is None or _tiered(ctx, topic, partition) is None:
        return None
    offs = ctx.deps.replica_manager.offsets(topic, partition)   # NOT_LEADER_OR_FOLLOWER unless we lead it
    hw = offs["high_watermark"]
    before = hw if before_offset == -1 else before_offset
    if before > hw:
        return None   # the replica manager answers OFFSET_OUT_OF_RANGE
    image = ctx.deps.metadata.image
    topic_md = image.topics.get(topic) if image is not None else None
    if topic_md is None:
        return None
    from partitions.log.remote.storage import RemoteStorageError
    try:
        return await _in_pool(rlm, rlm.cfg.remote_fetch_max_wait_ms / 1000, rlm.delete_records, topic, partition,
                              topic_md.topic_id, before)
    except RemoteStorageError as exc:
        raise KraftlogError(ErrorCode.KAFKA_STORAGE_ERROR,
                            f"recording the new log start of {topic}-{partition} in the remote store failed ({exc}); "
                            "nothing was deleted: retry") from None


__all__ = ["install_tiered_storage", "remote_fetch", "offsets_doc", "offset_for_timestamp", "delete_records",
           "remote_aborted_transactions", "merge_aborted",
           "RemoteLogCollector"]
