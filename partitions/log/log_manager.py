"""`LogManager`: every partition log on this broker, spread over one or more log dirs.

Per log dir it keeps Kafka's checkpoint files (text: version `0`, a count, then
`<topic> <partition> <offset>` lines), written temp + fsync + rename + fsync dir:

- `recovery-point-offset-checkpoint`  offsets known to be fsynced (recovery starts there)
- `log-start-offset-checkpoint`       log start offsets (after DeleteRecords / retention)
- `replication-offset-checkpoint`     high watermarks

and the clean shutdown marker `.kraftlog_cleanshutdown`, written by `close()` after
everything is flushed and checkpointed and deleted once the logs are opened again: when
it is present at open, recovery is skipped.

Many partitions at once (issue 25): `create_logs` makes a batch of new logs with one fsync
of each log dir for the whole batch (not one per log), and the log dir of a new log is
picked from counts kept up to date (not by counting every log on each creation: that made
creating n logs O(n^2), 10 ms per log at 2,000 logs).

Periodic passes at 100,000 logs (issue 25): each pass visits only the logs it can act on,
from indexes kept as logs are registered, unregistered and reconfigured: `compacted_logs()`
(cleanup.policy compact, for the log cleaner), `flush_needed` over the logs with unflushed
data under a flush.ms / flush.messages policy (none by default), `update_config` over the
topic's logs. `checkpoint` keeps each log dir's logs sorted between passes, reads their
offsets in slices of `CHECKPOINT_SLICE_LOGS` with a pause between, and rewrites a checkpoint
file only when an offset in it changed.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from operator import add, attrgetter
from pathlib import Path

from ..clock import SYSTEM_CLOCK, Clock
from .cleaner import LogCleaner
from .config import LogConfig
from .leader_epoch_cache import fsync_dir, write_checkpoint_file
from .record_format import ensure_log_dir_format
from .log import Log, parse_topic_partition

log = logging.getLogger(__name__)

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
CLEAN_SHUTDOWN_MARKER = ".kraftlog_cleanshutdown"
DELETE_SUFFIX = "-delete"

TopicPartition = tuple[str, int]


def read_offset_checkpoint(path: Path) -> dict[TopicPartition, int]:
    """Parse a Kafka offset checkpoint file; a missing or malformed file gives {}."""
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.warning("cannot read checkpoint %s: %s; ignoring it", path, exc)
        return {}
    try:
        if int(lines[0]) != 0:
            raise ValueError(f"unknown version {lines[0]!r}")
        count = int(lines[1])
        out: dict[TopicPartition, int] = {}
        for line in lines[2 : 2 + count]:
            topic, partition, offset = line.split()
            out[(topic, int(partition))] = int(offset)
        if len(out) != count:
            raise ValueError(f"expected {count} entries, found {len(out)}")
        return out
    except (ValueError, IndexError) as exc:
        log.warning("malformed checkpoint %s (%s); ignoring it", path, exc)
        return {}


def write_offset_checkpoint(path: Path, offsets: dict[TopicPartition, int]) -> None:
    lines = ["0", str(len(offsets))] + [f"{t} {p} {o}" for (t, p), o in sorted(offsets.items())]
    write_checkpoint_file(path, lines)


# the checkpoint files, and the Log offsets they record: the properties' backing fields,
# read in C by one attrgetter per log (reading 100,000 logs is memory-bound: one visit each)
_CHECKPOINT_FILES = (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT)
_CHECKPOINT_OFFSETS = attrgetter("_recovery_point", "_log_start_offset", "_high_watermark")
CHECKPOINT_SLICE_LOGS = 8192    # logs read per slice (one C call, a few ms of GIL at most)
CHECKPOINT_PAUSE_S = 0.001      # pause between slices: the GIL goes to the other threads


def pause_between_slices(seconds: float) -> None:
    """Sleep between slices of a pass over many logs, so that the other threads (the
    broker's event loop) get the GIL (also the seam tests replace)."""
    time.sleep(seconds)


class LogManager:
    """Owns the Log of every partition replica hosted here (see module docstring).

    Invariant (under `_lock`): every registered log is in `_logs`, in `_by_topic`, in
    `_by_dir` when its dir is a configured log dir, and in `_compacted` iff its config is
    compact; `_flush_candidates` holds at least every registered log with
    `policy_flush_pending` (the log adds itself on append, `flush_needed` prunes)."""

    def __init__(
        self,
        log_dirs: list[str],
        default_config: LogConfig,
        *,
        recovery_threads: int = 2,
        clock: Clock = SYSTEM_CLOCK,
    ):
        if not log_dirs:
            raise ValueError("log_dirs is empty: configure at least one log directory")
        self.log_dirs = [Path(d) for d in log_dirs]
        for d in self.log_dirs:
            d.mkdir(parents=True, exist_ok=True)
            ensure_log_dir_format(d)  # record format version; upgrades pre-issue-20 dirs in place
        self.default_config = default_config
        self.recovery_threads = max(1, recovery_threads)
        self._clock = clock
        self._time_ms = clock.now_ms
        self._logs: dict[TopicPartition, Log] = {}
        self._dir_counts: dict[Path, int] = {d: 0 for d in self.log_dirs}   # logs per log dir
        self._by_topic: dict[str, dict[int, Log]] = {}
        self._by_dir: dict[Path, dict[TopicPartition, Log]] = {d: {} for d in self.log_dirs}
        self._compacted: dict[TopicPartition, Log] = {}
        self._flush_candidates: set[Log] = set()   # shared with the logs (Log.flush_candidates)
        # log dir -> (its logs sorted by (topic, partition), their "<topic> <partition> " line
        # prefixes), until a log of the dir is registered or unregistered
        self._sorted: dict[Path, tuple[list, list]] = {}
        self._checkpoint_lock = threading.RLock()   # taken before `_lock` (checkpoint, close)
        self._written: dict[Path, tuple] = {}   # checkpoint file -> (the `_sorted` entry, offsets) last written
        self._topic_configs: dict[str, LogConfig] = {}
        self._lock = threading.RLock()
        self._closed = False
        # every log dir had the clean shutdown marker at open_all (False: the previous process
        # crashed or was killed, so an unflushed tail may be gone; a fresh dir counts as unclean)
        self.clean_shutdown = False

    # ------------------------------------------------------------------ opening

    def open_all(self) -> None:
        """Open every `<topic>-<partition>` dir in every log dir (recovering those not
        shut down cleanly), then delete the clean shutdown markers."""
        jobs = []
        self.clean_shutdown = True
        for log_dir in self.log_dirs:
            clean = (log_dir / CLEAN_SHUTDOWN_MARKER).exists()
            self.clean_shutdown = self.clean_shutdown and clean
            recovery_points = read_offset_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT)
            log_starts = read_offset_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT)
            high_watermarks = read_offset_checkpoint(log_dir / REPLICATION_OFFSET_CHECKPOINT)
            for sub in sorted(log_dir.iterdir()):
                if not sub.is_dir():
                    continue
                if sub.name.endswith(DELETE_SUFFIX):
                    log.info("removing partially deleted log %s", sub)
                    shutil.rmtree(sub, ignore_errors=True)
                    continue
                try:
                    tp = parse_topic_partition(sub.name)
                except ValueError:
                    log.warning("ignoring %s: not a <topic>-<partition> log directory", sub)
                    continue
                jobs.append(
                    (tp, sub, clean, recovery_points.get(tp, 0), log_starts.get(tp), high_watermarks.get(tp, 0))
                )

        def open_one(job):
            tp, path, clean, rp, ls, hw = job
            started = time.monotonic()
            lg = Log.open(
                path,
                self.config_for(tp[0]),
                recovery_point=rp,
                log_start_offset=ls,
                high_watermark=hw,
                clean_shutdown=clean,
                clock=self._clock,
            )
            log.debug("opened %s in %.1f ms", lg, (time.monotonic() - started) * 1000)
            return tp, lg

        if len(jobs) > 1 and self.recovery_threads > 1:
            with ThreadPoolExecutor(max_workers=self.recovery_threads, thread_name_prefix="log-recovery") as pool:
                opened = list(pool.map(open_one, jobs))
        else:
            opened = [open_one(job) for job in jobs]
        with self._lock:
            for tp, lg in opened:
                if tp in self._logs:
                    log.error(
                        "partition %s-%d exists in both %s and %s; using the first, remove the other",
                        tp[0], tp[1], self._logs[tp].dir, lg.dir,
                    )
                    lg.close()
                    continue
                self._register(tp, lg)
                self._count(lg, +1)
        for log_dir in self.log_dirs:
            marker = log_dir / CLEAN_SHUTDOWN_MARKER
            if marker.exists():
                marker.unlink()
                fsync_dir(log_dir)

    # ------------------------------------------------------------------ lookup

    def config_for(self, topic: str) -> LogConfig:
        return self._topic_configs.get(topic, self.default_config)

    def get(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    def _register(self, tp: TopicPartition, lg: Log) -> None:
        """Add a log to `_logs` and the indexes (see the class invariant). Under `_lock`."""
        self._logs[tp] = lg
        self._by_topic.setdefault(tp[0], {})[tp[1]] = lg
        parent = lg.dir.parent
        in_dir = self._by_dir.get(parent)
        if in_dir is not None:
            in_dir[tp] = lg
            self._sorted.pop(parent, None)
        lg.flush_candidates = self._flush_candidates
        lg.on_config_change = self._config_changed
        if lg.config.compact:
            self._compacted[tp] = lg
        if lg.policy_flush_pending:
            self._flush_candidates.add(lg)

    def _unregister(self, tp: TopicPartition) -> Log | None:
        """Remove a log from `_logs` and the indexes; the log, None if there was none. Under `_lock`."""
        lg = self._logs.pop(tp, None)
        if lg is None:
            return None
        of_topic = self._by_topic.get(tp[0])
        if of_topic is not None:
            of_topic.pop(tp[1], None)
            if not of_topic:
                del self._by_topic[tp[0]]
        parent = lg.dir.parent
        in_dir = self._by_dir.get(parent)
        if in_dir is not None and in_dir.pop(tp, None) is not None:
            self._sorted.pop(parent, None)
        self._compacted.pop(tp, None)
        lg.on_config_change = None
        lg.flush_candidates = None
        self._flush_candidates.discard(lg)
        return lg

    def _config_changed(self, lg: Log) -> None:
        """Log.update_config's hook: keep `_compacted` in step with the log's cleanup.policy."""
        tp = (lg.topic, lg.partition)
        with self._lock:
            if self._logs.get(tp) is not lg:
                return
            if lg.config.compact:
                self._compacted[tp] = lg
            else:
                self._compacted.pop(tp, None)

    def _count(self, lg: Log, delta: int) -> None:
        parent = lg.dir.parent
        if parent in self._dir_counts:
            self._dir_counts[parent] += delta

    def _pick_dir(self) -> Path:
        """The log dir with the fewest logs (the first on a tie); counts it. Under `_lock`."""
        target = min(self.log_dirs, key=lambda d: (self._dir_counts[d], self.log_dirs.index(d)))
        self._dir_counts[target] += 1
        return target

    def get_or_create(self, topic: str, partition: int, config: LogConfig | None = None) -> Log:
        """The partition's log, created in the log dir with the fewest partitions if new."""
        return self.create_logs([(topic, partition, config)])[0]

    def create_logs(self, specs: list) -> list[Log]:
        """The logs of `specs` [(topic, partition, config or None)], creating the missing ones
        (each in the log dir with the fewest logs), in order. The new logs' dir entries are
        made durable with one fsync per log dir for the whole batch. Safe to call from
        several threads at once (the logs are opened outside the manager's lock)."""
        out: list = [None] * len(specs)
        todo: list = []   # (index, tp, path, config)
        with self._lock:
            claimed: set = set()
            for i, (topic, partition, config) in enumerate(specs):
                tp = (topic, partition)
                lg = self._logs.get(tp)
                if lg is not None:
                    out[i] = lg
                    continue
                if config is not None:
                    self._topic_configs[topic] = config
                if tp in claimed:
                    continue   # the same partition twice in one batch: filled in below
                claimed.add(tp)
                path = self._pick_dir() / f"{topic}-{partition}"
                todo.append((i, tp, path, config or self.config_for(topic)))
        opened: list = []
        try:
            for i, tp, path, config in todo:
                lg = Log.open(   # a dir Log.open creates is new; one that exists is recovered
                    path,
                    config,
                    clean_shutdown=False,
                    clock=self._clock,
                )
                opened.append((i, tp, lg))
        finally:
            for parent in {path.parent for _, _, path, _ in todo}:
                fsync_dir(parent)
            with self._lock:
                for _, _, path, _ in todo[len(opened):]:   # not opened (an error): uncount
                    if path.parent in self._dir_counts:
                        self._dir_counts[path.parent] -= 1
                for i, tp, lg in opened:
                    existing = self._logs.get(tp)
                    if existing is not None:   # another thread created it meanwhile
                        self._count(lg, -1)
                        if existing.dir != lg.dir:
                            lg.close()
                        out[i] = existing
                        continue
                    self._register(tp, lg)
                    out[i] = lg
        for i, (topic, partition, _) in enumerate(specs):
            if out[i] is None:
                out[i] = self._logs[(topic, partition)]
        return out

    def all_logs(self) -> list[Log]:
        return list(self._logs.values())

    def topic_logs(self, topic: str) -> list[Log]:
        """The logs of `topic`'s partitions hosted here."""
        with self._lock:
            return list(self._by_topic.get(topic, {}).values())

    def compacted_logs(self, topic: str | None = None) -> list[Log]:
        """The open logs whose cleanup.policy includes compact (of `topic`, if given): what
        the log cleaner visits, without walking every log."""
        with self._lock:
            logs = list(self._compacted.values())
        return [lg for lg in logs if not lg.closed and (topic is None or lg.topic == topic)]

    def partitions(self) -> list[TopicPartition]:
        return sorted(self._logs)

    def update_config(self, topic: str, config: LogConfig) -> None:
        """Use `config` for `topic` from now on (existing and future partitions)."""
        with self._lock:
            self._topic_configs[topic] = config
            for lg in list(self._by_topic.get(topic, {}).values()):
                lg.update_config(config)   # its hook updates `_compacted`

    def delete_log(self, topic: str, partition: int) -> bool:
        """Close the log, rename its dir to `<dir>.<uuid>-delete`, then remove it."""
        with self._lock:
            lg = self._unregister((topic, partition))
            if lg is not None:
                self._count(lg, -1)
        if lg is None:
            return False
        lg.close_without_flush()
        doomed = lg.dir.with_name(f"{lg.dir.name}.{uuid.uuid4().hex}{DELETE_SUFFIX}")
        try:
            lg.dir.rename(doomed)
            fsync_dir(doomed.parent)
        except FileNotFoundError:
            return True
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    # ------------------------------------------------------------------ maintenance

    def checkpoint(self) -> None:
        """Write the recovery point, log start and high watermark checkpoints of every dir;
        a file whose logs and offsets are those it was last written with is left as it is."""
        with self._checkpoint_lock:
            for log_dir in self.log_dirs:
                with self._lock:
                    entry = self._sorted.get(log_dir)
                    if entry is None:
                        in_dir = self._by_dir[log_dir]
                        tps = sorted(in_dir)
                        entry = self._sorted[log_dir] = ([in_dir[tp] for tp in tps], [f"{t} {p} " for t, p in tps])
                logs, prefixes = entry
                rows: list = []
                for i in range(0, len(logs), CHECKPOINT_SLICE_LOGS):
                    if i:
                        pause_between_slices(CHECKPOINT_PAUSE_S)
                    rows.extend(map(_CHECKPOINT_OFFSETS, logs[i:i + CHECKPOINT_SLICE_LOGS]))
                columns = list(zip(*rows)) if rows else [(), (), ()]
                for name, offsets in zip(_CHECKPOINT_FILES, columns):
                    path = log_dir / name
                    last = self._written.get(path)
                    if last is not None and last[0] is entry and last[1] == offsets:
                        continue
                    self._written.pop(path, None)
                    write_checkpoint_file(path, ["0", str(len(logs))] + list(map(add, prefixes, map(str, offsets))))
                    self._written[path] = (entry, offsets)

    def run_retention(self, now_ms: int | None = None) -> int:
        """Apply retention to every log; returns the number of segments deleted."""
        return sum(lg.apply_retention(now_ms) for lg in self.all_logs() if not lg.closed)

    def run_cleaner(self, cleaner=None, now_ms: int | None = None) -> int:
        """One compaction pass over every compacted log that needs it (cleaner.py);
        returns the number of logs cleaned. Meant for a worker thread."""
        cleaner = cleaner or LogCleaner(clock=self._clock)
        cleaned = 0
        for lg in self.compacted_logs():
            if cleaner.needs_cleaning(lg, now_ms):
                stats = cleaner.clean(lg, now_ms)
                if stats is not None and not stats.aborted:
                    cleaned += 1
        return cleaned

    def flush_all(self) -> None:
        for lg in self.all_logs():
            if not lg.closed:
                lg.flush()

    def flush_needed(self, now_ms: int | None = None) -> int:
        """Flush the logs whose flush.messages / flush.ms policy asks for it; returns how many.
        Visits only the flush candidates (logs without a flush policy never need it). A log
        leaves the set first and is put back while it still has unflushed data under a
        policy: an append adds after counting, so it is never lost between the two."""
        n = 0
        candidates = self._flush_candidates
        for lg in candidates.copy():
            candidates.discard(lg)
            try:
                if not lg.closed and lg.needs_flush(now_ms):
                    lg.flush()
                    n += 1
            finally:
                if lg.policy_flush_pending and not lg.closed and lg.flush_candidates is candidates:
                    candidates.add(lg)
        return n

    def close(self) -> None:
        """Flush, checkpoint, close every log and write the clean shutdown markers."""
        with self._checkpoint_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            self.flush_all()
            self.checkpoint()
            for lg in self._logs.values():
                lg.close()
            for log_dir in self.log_dirs:
                marker = log_dir / CLEAN_SHUTDOWN_MARKER
                with open(marker, "w") as f:
                    f.flush()
                    os.fsync(f.fileno())
                fsync_dir(log_dir)


__all__ = [
    "LogManager",
    "read_offset_checkpoint",
    "write_offset_checkpoint",
    "CLEAN_SHUTDOWN_MARKER",
    "RECOVERY_POINT_CHECKPOINT",
    "LOG_START_OFFSET_CHECKPOINT",
    "REPLICATION_OFFSET_CHECKPOINT",
]
