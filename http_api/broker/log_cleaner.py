"""Log cleaner / retention on the broker's HTTP API and /metrics.

    POST /admin/v1/log-cleaner/run   {"topic"?: str, "compaction"?: bool, "retention"?: bool,
                                      "force"?: bool}   -> what the pass did
    GET  /admin/v1/log-cleaner       -> counters and the dirty ratio of every compacted log

The pass runs in a worker thread (never on the event loop) through the broker's
`LogScheduler` (partitions/log/log_scheduler.py), waiting for any background job on the
same log. `force` cleans every compacted log with something cleanable, whatever its dirty
ratio. Metrics come from the scheduler's counters (no IO while scraping).
"""
from __future__ import annotations

import asyncio
import functools
from typing import Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from http_api.broker.context import BrokerContext
from partitions.errors import ErrorCode, KraftlogError


def scheduler_for(deps) -> Any:
    """The broker's LogScheduler; without one (in-process test apps), an on-demand one over
    the replica manager's LogManager (no background threads)."""
    sched = getattr(deps, "log_scheduler", None)
    if sched is None:
        lm = getattr(deps.replica_manager, "log_manager", None)
        if lm is None or not hasattr(lm, "all_logs"):
            return None
        from partitions.log.log_scheduler import LogScheduler

        sched = LogScheduler(lm)
        deps.log_scheduler = sched
    return sched


class LogCleanerCollector:
    """Prometheus collector over LogScheduler.snapshot()."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler

    def collect(self):
        s = self.scheduler.snapshot()
        counters = [
            ("kraftlog_log_cleaner_passes", "Log cleaner passes", "passes_total"),
            ("kraftlog_log_cleaner_passes_aborted", "Passes given up (log truncated/closed meanwhile)",
             "passes_aborted_total"),
            ("kraftlog_log_cleaner_bytes_read", "Bytes of segments read by the log cleaner", "bytes_read_total"),
            ("kraftlog_log_cleaner_bytes_written", "Bytes of cleaned segments written", "bytes_written_total"),
            ("kraftlog_log_cleaner_records_removed", "Records removed by compaction", "records_removed_total"),
            ("kraftlog_log_cleaner_tombstones_removed", "Tombstones removed after delete.retention.ms",
             "tombstones_removed_total"),
            ("kraftlog_log_cleaner_seconds", "Time spent cleaning", "cleaning_seconds_total"),
            ("kraftlog_log_cleaner_throttled_seconds", "Time the cleaner slept to stay under "
             "log_cleaner_io_max_bytes_per_second", "throttled_seconds_total"),
            ("kraftlog_log_retention_runs", "Retention passes", "retention_runs_total"),
            ("kraftlog_log_retention_segments_deleted", "Segments deleted by retention",
             "segments_deleted_by_retention_total"),
        ]
        for name, doc, key in counters:
            yield CounterMetricFamily(name, doc, value=s[key])
        yield GaugeMetricFamily("kraftlog_log_cleaner_last_pass_seconds", "Duration of the last cleaning pass",
                                value=s["last_pass_seconds"])
        yield GaugeMetricFamily("kraftlog_log_cleaner_max_pass_seconds", "Longest cleaning pass",
                                value=s["max_pass_seconds"])
        g = GaugeMetricFamily("kraftlog_log_dirty_ratio", "Dirty bytes / cleanable bytes of a compacted log",
                              labels=["topic", "partition"])
        for (topic, partition), ratio in sorted(s["dirty_ratio"].items()):
            g.add_metric([topic, str(partition)], ratio)
        yield g


def _flag(doc: dict, name: str, default: bool) -> bool:
    v = doc.get(name, default)
    if not isinstance(v, bool):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"{name}: must be true or false, got {v!r}")
    return v


def install_log_cleaner_routes(app: web.Application, ctx: BrokerContext) -> None:
    """Add the routes above and register the metrics."""
    deps = ctx.deps
    sched = scheduler_for(deps)
    if sched is not None:
        deps.registry.register(LogCleanerCollector(sched))

    def _need():
        s = scheduler_for(deps)
        if s is None:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "this broker has no log storage to clean")
        return s

    async def run(request: web.Request) -> web.Response:
        s = _need()
        doc: Any = {}
        if request.can_read_body:
            try:
                doc = await request.json()
            except ValueError:
                raise KraftlogError(ErrorCode.INVALID_REQUEST, "body: must be a JSON object (or empty)") from None
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "body: must be a JSON object (or empty)")
        unknown = set(doc) - {"topic", "compaction", "retention", "force"}
        if unknown:
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                f"unknown fields {sorted(unknown)}; allowed: topic, compaction, retention, force")
        topic = doc.get("topic")
        if topic is not None and not isinstance(topic, str):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "topic: must be a string")
        job = functools.partial(s.run_once, topic=topic, cleaning=_flag(doc, "compaction", True),
                                retention=_flag(doc, "retention", True), force=_flag(doc, "force", False))
        result = await asyncio.get_running_loop().run_in_executor(None, job)
        return web.json_response(result)

    async def status(request: web.Request) -> web.Response:
        snap = _need().snapshot()
        snap["dirty_ratio"] = [{"topic": t, "partition": p, "dirty_ratio": r}
                               for (t, p), r in sorted(snap["dirty_ratio"].items())]
        return web.json_response(snap)

    app.router.add_post("/admin/v1/log-cleaner/run", run)
    app.router.add_get("/admin/v1/log-cleaner", status)


__all__ = ["install_log_cleaner_routes", "LogCleanerCollector", "scheduler_for"]
