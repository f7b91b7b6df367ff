"""`LogScheduler`: background retention and compaction for every log of a LogManager.

Jobs (Kafka's LogManager retention task + LogCleaner threads):
- retention: every `retention_check_interval_ms`, `Log.apply_retention` on every log
  (cleanup.policy `delete` / `compact,delete`: closed segments past retention.ms or
  beyond retention.bytes; any policy: segments below the log start offset), in slices of
  `RETENTION_SLICE_LOGS` logs with a pause between them that lets the other threads (the
  broker's event loop) take the GIL: ~1 s of CPU at 100,000 logs is not one hold;
- cleaning: `cleaner_threads` threads each pick the filthiest compacted log that
  `LogCleaner.needs_cleaning` (dirty ratio >= min.cleanable.dirty.ratio,
  max.compaction.lag.ms passed, or tombstones past their horizon) and run one pass; with
  nothing to do they sleep `cleaner_backoff_ms`. The scan visits only the compacted logs
  (`LogManager.compacted_logs`, an index kept as logs come, go and change cleanup.policy),
  not every log of the broker.

Threads only, never the caller's event loop. With `cleaner_process=True` (the broker's
default) each cleaner thread hands the CPU-heavy part of a pass (offset map, rewriting
segments) to its own worker process, so compaction does not take the GIL from the
threads serving produce and fetch; the thread keeps only planning and the swap.

Locking: one job at a time per log (a per-log lock: background jobs skip a busy log,
`run_once` waits for it). Against appends, reads and truncation the Log protects itself:
plans are snapshots taken under its lock, swaps happen under its locks and are refused if
the log was truncated or its segments changed (cleaner.py, Log.replace_segments).

`run_once` runs a pass synchronously (tests, operators: POST /admin/v1/log-cleaner/run)
and returns what was done; `snapshot()` gives the metrics (bytes cleaned, cleaning time,
dirty ratio per log, segments deleted by retention).
"""
from __future__ import annotations

import concurrent.futures as cf
import itertools
import logging
import os
import threading
import time
import weakref

from ..clock import SYSTEM_CLOCK, Clock
from .cleaner import (
    DEFAULT_DEDUPE_BUFFER_SIZE_BYTES,
    CleanerStats,
    CleanerWorker,
    CleaningPlan,
    GroupResult,
    LogCleaner,
    MapResult,
    SegmentRef,
)
from .log_manager import pause_between_slices as _pause

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- cleaner processes

_jobs: dict[int, CleanerWorker] = {}
_job_ids = itertools.count(1)
CLEANER_PROCESS_NICE = 10  # background work yields the CPU to the request path when cores are busy


PARENT_WATCH_INTERVAL_S = 0.5  # how often the cleaner child checks that its broker lives
RETENTION_SLICE_LOGS = 256     # logs per retention slice (~2.5 ms of CPU: ~10 us per log)
RETENTION_PAUSE_S = 0.001      # pause between retention slices: the GIL goes to the other threads


def _proc_init(nice: int, parent_pid: int | None = None) -> None:
    try:
        os.nice(nice)
    except OSError:  # pragma: no cover - not permitted: run at normal priority
        pass
    if parent_pid is not None:
        _watch_parent(parent_pid)


def _watch_parent(parent_pid: int) -> None:
    """The cleaner child dies with its broker: after a kill -9 of the broker nothing else
    would stop it (nor the multiprocessing resource tracker that waits for it). A daemon
    thread polls the parent pid; reparenting means the broker is gone."""
    if os.getppid() != parent_pid:
        os._exit(0)

    def watch() -> None:
        while True:
            time.sleep(PARENT_WATCH_INTERVAL_S)
            if os.getppid() != parent_pid:
                os._exit(0)  # nothing to flush: a pass only ever writes `.cleaned` files

    threading.Thread(target=watch, name="cleaner-parent-watch", daemon=True).start()


def _proc_start(plan: CleaningPlan) -> int:
    job = next(_job_ids)
    _jobs[job] = CleanerWorker(plan)
    return job


def _proc_build(job: int) -> MapResult:
    return _jobs[job].build_offset_map()


def _proc_clean_group(job: int, refs: list[SegmentRef]) -> GroupResult:
    return _jobs[job].clean_group(refs)


def _proc_close(job: int) -> None:
    worker = _jobs.pop(job, None)
    if worker is not None:
        worker.close()


class _ProcessJob:
    def __init__(self, pool: cf.ProcessPoolExecutor, plan: CleaningPlan):
        self._pool = pool
        self._job = pool.submit(_proc_start, plan).result()

    def build_offset_map(self) -> MapResult:
        return self._pool.submit(_proc_build, self._job).result()

    def clean_group(self, refs: list[SegmentRef]) -> GroupResult:
        return self._pool.submit(_proc_clean_group, self._job, refs).result()

    def close(self) -> None:
        self._pool.submit(_proc_close, self._job).result()


class ProcessCleanerRunner:
    """Runs CleanerWorkers in one dedicated child process (spawned on first use, at
    `nice` lower CPU priority; a dead child is replaced on the next pass). The worker
    keeps its offset map between calls."""

    def __init__(self, nice: int = CLEANER_PROCESS_NICE) -> None:
        self._pool: cf.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.nice = nice

    def _get_pool(self) -> cf.ProcessPoolExecutor:
        import multiprocessing

        with self._lock:
            pool = self._pool
            if pool is not None and getattr(pool, "_broken", False):
                pool.shutdown(wait=False, cancel_futures=True)
                pool = None
            if pool is None:
                pool = self._pool = cf.ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_proc_init, initargs=(self.nice, os.getpid()),
                )
            return pool

    def start(self, plan: CleaningPlan) -> _ProcessJob:
        return _ProcessJob(self._get_pool(), plan)

    def close(self) -> None:
        """Stop the child now (a pass in progress only ever wrote `.cleaned` files)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            try:
                p.terminate()
                p.join(5)
            except Exception:  # noqa: BLE001 - already gone
                pass


# ---------------------------------------------------------------------- metrics


class CleanerMetrics:
    """Counters and gauges of the background jobs (read by the broker's /metrics)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.passes_total = 0
        self.passes_aborted_total = 0
        self.bytes_read_total = 0
        self.bytes_written_total = 0
        self.records_removed_total = 0
        self.tombstones_removed_total = 0
        self.cleaning_seconds_total = 0.0
        self.throttled_seconds_total = 0.0
        self.last_pass_seconds = 0.0
        self.max_pass_seconds = 0.0
        self.retention_runs_total = 0
        self.segments_deleted_by_retention_total = 0
        self.dirty_ratio: dict[tuple[str, int], float] = {}

    def record_pass(self, stats: CleanerStats) -> None:
        with self._lock:
            self.passes_total += 1
            self.passes_aborted_total += int(stats.aborted)
            self.bytes_read_total += stats.bytes_read
            self.bytes_written_total += stats.bytes_written
            self.records_removed_total += stats.records_read - stats.records_retained
            self.tombstones_removed_total += stats.tombstones_removed
            self.cleaning_seconds_total += stats.elapsed_s
            self.throttled_seconds_total += stats.throttled_s
            self.last_pass_seconds = stats.elapsed_s
            self.max_pass_seconds = max(self.max_pass_seconds, stats.elapsed_s)

    def record_retention(self, deleted: int) -> None:
        with self._lock:
            self.retention_runs_total += 1
            self.segments_deleted_by_retention_total += deleted

    def set_dirty_ratio(self, tp: tuple[str, int], ratio: float | None) -> None:
        with self._lock:
            if ratio is None:
                self.dirty_ratio.pop(tp, None)
            else:
                self.dirty_ratio[tp] = ratio

    def retain(self, tps: set) -> None:
        """Forget the gauges of logs not in `tps` (gone, or no longer compacted)."""
        with self._lock:
            for tp in [tp for tp in self.dirty_ratio if tp not in tps]:
                del self.dirty_ratio[tp]

    def snapshot(self) -> dict:
        with self._lock:
            out = {k: v for k, v in self.__dict__.items() if not k.startswith("_") and k != "dirty_ratio"}
            out["dirty_ratio"] = dict(self.dirty_ratio)
            return out


# ---------------------------------------------------------------------- the scheduler


class LogScheduler:
    """Runs retention and compaction in background threads (see module docstring).
    Invariant: at most one job (retention or a cleaning pass) per log at a time."""

    def __init__(
        self,
        log_manager,
        *,
        cleaner_enable: bool = True,
        cleaner_threads: int = 1,
        cleaner_backoff_ms: int = 15_000,
        cleaner_process: bool = False,
        retention_check_interval_ms: int = 300_000,
        dedupe_buffer_size_bytes: int = DEFAULT_DEDUPE_BUFFER_SIZE_BYTES,
        io_max_bytes_per_second: float = -1,
        clock: Clock = SYSTEM_CLOCK,
    ):
        self.log_manager = log_manager
        self.cleaner_enable = cleaner_enable
        self.cleaner_threads = max(1, cleaner_threads)
        self.cleaner_backoff_ms = cleaner_backoff_ms
        self.cleaner_process = cleaner_process
        self.retention_check_interval_ms = retention_check_interval_ms
        self.dedupe_buffer_size_bytes = dedupe_buffer_size_bytes
        self.io_max_bytes_per_second = io_max_bytes_per_second   # per cleaner thread
        self._clock = clock
        self._time_ms = clock.now_ms
        self.metrics = CleanerMetrics()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._runners: list = []
        self._locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Log -> its job lock
        self._locks_guard = threading.Lock()
        # the cleaner used by run_once (planning in the calling thread; the work in a
        # process of its own if cleaner_process)
        self._local_runner = ProcessCleanerRunner() if cleaner_process else None
        self._local_cleaner = LogCleaner(dedupe_buffer_size_bytes=dedupe_buffer_size_bytes, clock=clock,
                                         runner=self._local_runner, io_max_bytes_per_second=io_max_bytes_per_second)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._threads:
            return
        self._stop.clear()
        t = threading.Thread(target=self._retention_loop, name="log-retention", daemon=True)
        self._threads.append(t)
        if self.cleaner_enable:
            for i in range(self.cleaner_threads):
                runner = ProcessCleanerRunner() if self.cleaner_process else None
                self._runners.append(runner)
                cleaner = LogCleaner(
                    dedupe_buffer_size_bytes=self.dedupe_buffer_size_bytes, clock=self._clock, runner=runner,
                    io_max_bytes_per_second=self.io_max_bytes_per_second,
                )
                self._threads.append(
                    threading.Thread(target=self._cleaner_loop, args=(cleaner,), name=f"log-cleaner-{i}", daemon=True)
                )
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the threads (a pass in progress stops after its current group)."""
        self._stop.set()
        for runner in self._runners:
            if runner is not None:
                runner.close()  # a pass waiting on its process ends with an error now
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = []
        self._runners = []
        if self._local_runner is not None:
            self._local_runner.close()  # respawned if run_once is called again

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    # ------------------------------------------------------------------ per-log locking

    def _lock_for(self, lg) -> threading.Lock:
        with self._locks_guard:
            lock = self._locks.get(lg)
            if lock is None:
                lock = self._locks[lg] = threading.Lock()
            return lock

    def _logs(self, topic: str | None = None) -> list:
        logs = self.log_manager.all_logs() if topic is None else self.log_manager.topic_logs(topic)
        return [lg for lg in logs if not lg.closed]

    # ------------------------------------------------------------------ jobs

    def _retention_one(self, lg, now_ms: int | None) -> int:
        try:
            deleted = lg.apply_retention(now_ms)
        except Exception as exc:  # noqa: BLE001 - a closed or broken log must not stop the others
            log.warning("retention on %s failed: %s", lg.dir, exc)
            return 0
        if deleted:
            log.info("retention deleted %d segments of %s (log start offset now %d)", deleted, lg.dir.name,
                     lg.log_start_offset)
        return deleted

    def run_retention(self, now_ms: int | None = None, *, topic: str | None = None, wait: bool = True) -> dict:
        """One retention pass over every log; {"segments_deleted": n, "logs": {name: n}}.
        Pauses `RETENTION_PAUSE_S` after every `RETENTION_SLICE_LOGS` logs."""
        total = 0
        per_log: dict[str, int] = {}
        for i, lg in enumerate(self._logs(topic)):
            if i and i % RETENTION_SLICE_LOGS == 0:
                _pause(RETENTION_PAUSE_S)
            lock = self._lock_for(lg)
            if not lock.acquire(blocking=wait):
                continue
            try:
                n = self._retention_one(lg, now_ms)
            finally:
                lock.release()
            total += n
            if n:
                per_log[lg.dir.name] = n
        self.metrics.record_retention(total)
        return {"segments_deleted": total, "logs": per_log}

    def _update_ratio(self, cleaner: LogCleaner, lg, now_ms: int | None) -> float | None:
        tp = (lg.topic, lg.partition)
        if not lg.config.compact or lg.closed:
            self.metrics.set_dirty_ratio(tp, None)
            return None
        try:
            ratio = cleaner.dirty_ratio(lg, now_ms)
        except Exception:  # noqa: BLE001 - closed meanwhile
            return None
        self.metrics.set_dirty_ratio(tp, ratio)
        return ratio

    def _clean_one(self, cleaner: LogCleaner, lg, now_ms: int | None) -> CleanerStats | None:
        try:
            stats = cleaner.clean(lg, now_ms, should_abort=self._stop.is_set)
        except Exception as exc:  # noqa: BLE001 - e.g. the cleaner process died; next pass retries
            if self._stop.is_set():
                log.info("cleaning %s stopped: %s", lg.dir, exc)
            else:
                log.warning("cleaning %s failed: %s", lg.dir, exc)
            stats = None
        if stats is not None:
            self.metrics.record_pass(stats)
            log.info(
                "cleaned %s [%d, %d): %d segments, %d -> %d bytes, %d tombstones removed, %.3f s%s",
                lg.dir.name, stats.first_dirty_offset, stats.end_offset, stats.segments_cleaned,
                stats.bytes_read, stats.bytes_written, stats.tombstones_removed, stats.elapsed_s,
                " (aborted)" if stats.aborted else "",
            )
        self._update_ratio(cleaner, lg, now_ms)
        return stats

    def run_cleaning(self, now_ms: int | None = None, *, topic: str | None = None, force: bool = False) -> list[dict]:
        """One compaction pass over every compacted log that needs it (every compacted log
        with something cleanable if `force`), in the calling thread; one dict per pass."""
        out = []
        cleaner = self._local_cleaner
        for lg in self.log_manager.compacted_logs(topic):
            if not lg.config.compact:   # switched to delete since the index was read
                self.metrics.set_dirty_ratio((lg.topic, lg.partition), None)
                continue
            with self._lock_for(lg):
                if lg.closed or not (force or cleaner.needs_cleaning(lg, now_ms)):
                    self._update_ratio(cleaner, lg, now_ms)
                    continue
                stats = self._clean_one(cleaner, lg, now_ms)
            if stats is not None:
                out.append(dict(stats.to_dict(), topic=lg.topic, partition=lg.partition))
        return out

    def run_once(self, now_ms: int | None = None, *, retention: bool = True, cleaning: bool = True,
                 topic: str | None = None, force: bool = False) -> dict:
        """Synchronous retention and/or cleaning pass; what was done."""
        result: dict = {}
        if cleaning:
            result["cleaned"] = self.run_cleaning(now_ms, topic=topic, force=force)
        if retention:
            result["retention"] = self.run_retention(now_ms, topic=topic)
        return result

    def snapshot(self) -> dict:
        return self.metrics.snapshot()

    # ------------------------------------------------------------------ threads

    def _retention_loop(self) -> None:
        while not self._stop.wait(self.retention_check_interval_ms / 1000):
            try:
                self.run_retention(wait=False)
            except Exception:  # noqa: BLE001
                log.exception("retention pass failed")

    def _grab_filthiest(self, cleaner: LogCleaner):
        """The compacted log with the highest dirty ratio that needs cleaning (None: none);
        refreshes the dirty-ratio gauges, which exist for compacted logs only."""
        best, best_ratio = None, -1.0
        logs = self.log_manager.compacted_logs()
        self.metrics.retain({(lg.topic, lg.partition) for lg in logs})
        for lg in logs:
            ratio = self._update_ratio(cleaner, lg, None)
            if ratio is None:
                continue
            try:
                if ratio > best_ratio and cleaner.needs_cleaning(lg):
                    best, best_ratio = lg, ratio
            except Exception:  # noqa: BLE001 - closed meanwhile
                continue
        return best

    def _cleaner_loop(self, cleaner: LogCleaner) -> None:
        while not self._stop.is_set():
            did = False
            try:
                lg = self._grab_filthiest(cleaner)
                if lg is not None:
                    lock = self._lock_for(lg)
                    if lock.acquire(blocking=False):
                        try:
                            stats = self._clean_one(cleaner, lg, None)
                            did = stats is not None and not stats.aborted
                        finally:
                            lock.release()
            except Exception:  # noqa: BLE001
                log.exception("log cleaner thread iteration failed")
            if not did:
                self._stop.wait(self.cleaner_backoff_ms / 1000)


__all__ = ["LogScheduler", "CleanerMetrics", "ProcessCleanerRunner"]
