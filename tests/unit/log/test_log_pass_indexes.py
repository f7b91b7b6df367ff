"""Issue 25: the broker's periodic passes over its logs visit only the logs they can act on
(LogManager's compacted / flush-candidate / per-dir / per-topic indexes, log_manager.py;
the cleaner scan and sliced retention, log_scheduler.py), with the same results."""
from __future__ import annotations

from contextlib import contextmanager

import pytest
from logtest_helpers import make_batch

import partitions.log.log_manager as log_manager_mod
import partitions.log.log_scheduler as log_scheduler_mod
from partitions.clock import ManualClock
from partitions.log.cleaner import LogCleaner
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.log_manager import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LogManager,
    read_offset_checkpoint,
)
from partitions.log.log_scheduler import LogScheduler
from partitions.log.record_batch import Record, build_batch

pytestmark = pytest.mark.usefixtures("no_fsync")

COMPACT = LogConfig(cleanup_policy="compact", segment_bytes=300, min_cleanable_dirty_ratio=0.1)


def _mgr(tmp_path, clock=None, **cfg):
    m = LogManager([str(tmp_path / "d1"), str(tmp_path / "d2")], LogConfig(segment_bytes=300, **cfg),
                   clock=clock or ManualClock())
    m.open_all()
    return m


def _dirty(lg, n=20):
    """Closed segments full of one key's versions: cleanable once compacted."""
    for i in range(n):
        lg.append_as_leader(build_batch([Record(b"same-key", b"v%d" % i)]), 0)
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)


@contextmanager
def _no_full_walk(m):
    """Within: a call of m.all_logs() (a walk over every log) fails the test."""
    def boom():
        raise AssertionError("the pass walked every log")
    m.all_logs = boom
    try:
        yield
    finally:
        del m.all_logs


# ---------------------------------------------------------------------- the cleaner scan


def test_cleaner_scan_visits_only_compacted_logs(tmp_path, monkeypatch):
    m = _mgr(tmp_path)
    plain = [m.get_or_create("plain", p) for p in range(4)]
    compacted = m.get_or_create("c", 0, COMPACT)
    for lg in plain + [compacted]:
        _dirty(lg)
    sched = LogScheduler(m)
    seen = []
    cleaner = LogCleaner()
    real_ratio = cleaner.dirty_ratio
    monkeypatch.setattr(cleaner, "dirty_ratio", lambda lg, now=None: seen.append(lg) or real_ratio(lg, now))
    with _no_full_walk(m):
        assert sched._grab_filthiest(cleaner) is compacted
        assert seen and all(lg is compacted for lg in seen)
        assert set(sched.snapshot()["dirty_ratio"]) == {("c", 0)}
        assert [d["topic"] for d in sched.run_cleaning()] == ["c"]
    m.close()


@pytest.mark.parametrize("how", ["manager", "log"])
def test_a_topic_switched_to_compact_is_cleaned_and_back_to_delete_is_not(tmp_path, how):
    m = _mgr(tmp_path)
    lg = m.get_or_create("t", 0)
    _dirty(lg)
    sched = LogScheduler(m)
    cleaner = LogCleaner()
    assert sched._grab_filthiest(cleaner) is None and m.compacted_logs() == []

    def switch(cfg):
        m.update_config("t", cfg) if how == "manager" else lg.update_config(cfg)

    switch(COMPACT)
    assert m.compacted_logs() == [lg] and m.compacted_logs("t") == [lg] and m.compacted_logs("x") == []
    assert sched._grab_filthiest(cleaner) is lg
    assert ("t", 0) in sched.snapshot()["dirty_ratio"]
    size = lg.size_bytes
    [done] = sched.run_cleaning()
    assert done["topic"] == "t" and lg.size_bytes < size / 3
    switch(LogConfig(segment_bytes=300))
    assert m.compacted_logs() == []
    assert sched._grab_filthiest(cleaner) is None
    assert sched.snapshot()["dirty_ratio"] == {}   # no gauge for a log that is not compacted
    m.close()


def test_a_deleted_or_recreated_compacted_log_leaves_the_index(tmp_path):
    m = _mgr(tmp_path)
    lg = m.get_or_create("c", 0, COMPACT)
    _dirty(lg)
    sched = LogScheduler(m)
    assert sched._grab_filthiest(LogCleaner()) is lg
    assert m.delete_log("c", 0)
    assert m.compacted_logs() == [] and lg.on_config_change is None
    lg.update_config(COMPACT)   # a stale handle's config change does not bring it back
    assert m.compacted_logs() == []
    assert sched._grab_filthiest(LogCleaner()) is None and sched.snapshot()["dirty_ratio"] == {}
    again = m.get_or_create("c", 0)   # the topic's config (compact) is kept for new partitions
    assert m.compacted_logs() == [again]
    m.close()


def test_reopened_compacted_logs_are_indexed(tmp_path):
    m = _mgr(tmp_path)
    m.get_or_create("c", 0, COMPACT)
    m.get_or_create("plain", 0)
    m.close()
    m2 = LogManager([str(tmp_path / "d1"), str(tmp_path / "d2")], LogConfig(segment_bytes=300))
    m2.open_all()
    assert m2.compacted_logs() == []   # opened with the default config, as before its topic config arrives
    m2.update_config("c", COMPACT)
    assert [lg.topic for lg in m2.compacted_logs()] == ["c"]
    assert [lg.topic for lg in m2.topic_logs("plain")] == ["plain"]
    m2.close()


# ---------------------------------------------------------------------- flush.ms / flush.messages


def test_flush_pass_visits_only_logs_with_a_flush_policy_and_unflushed_data(tmp_path, monkeypatch):
    clock = ManualClock()
    m = _mgr(tmp_path, clock)
    plain = [m.get_or_create("plain", p) for p in range(5)]
    timed = m.get_or_create("timed", 0, LogConfig(flush_ms=1000))
    counted = m.get_or_create("counted", 0, LogConfig(flush_messages=3))
    idle = m.get_or_create("idle", 0, LogConfig(flush_ms=1000))   # a policy, nothing appended
    for lg in plain + [timed, counted]:
        lg.append_as_leader(make_batch(2), 0)
    visited = []
    real = Log.needs_flush
    monkeypatch.setattr(Log, "needs_flush", lambda self, now=None: visited.append(self.topic) or real(self, now))
    with _no_full_walk(m):
        assert m.flush_needed() == 0
    assert sorted(visited) == ["counted", "timed"]
    assert timed.recovery_point == 0 and counted.recovery_point == 0 and idle.recovery_point == 0
    clock.advance(1000)   # flush.ms reached
    counted.append_as_leader(make_batch(1), 0)   # flush.messages reached
    visited.clear()
    assert m.flush_needed() == 2
    assert timed.recovery_point == timed.log_end_offset == 2
    assert counted.recovery_point == counted.log_end_offset == 3
    assert all(lg.recovery_point == 0 and lg.unflushed_messages == 2 for lg in plain)   # the OS decides
    visited.clear()
    assert m.flush_needed() == 0 and visited == []   # flushed logs left the candidates
    timed.append_as_leader(make_batch(1), 0)
    clock.advance(1000)
    assert m.flush_needed() == 1 and visited == ["timed"] and timed.recovery_point == 3
    m.close()


def test_a_flush_policy_set_by_a_config_change_covers_data_already_appended(tmp_path):
    clock = ManualClock()
    m = _mgr(tmp_path, clock)
    lg = m.get_or_create("t", 0)
    lg.append_as_leader(make_batch(4), 0)
    assert m.flush_needed() == 0
    m.update_config("t", LogConfig(flush_ms=500))
    clock.advance(500)
    assert m.flush_needed() == 1 and lg.recovery_point == 4
    m.close()


def test_a_failed_flush_keeps_the_log_a_candidate(tmp_path, monkeypatch):
    m = _mgr(tmp_path, flush_messages=1)
    lg = m.get_or_create("t", 0)
    lg.append_as_leader(make_batch(1), 0)
    real = lg.flush

    def failing(up_to_offset=None):
        monkeypatch.setattr(lg, "flush", real)
        raise OSError("disk full")

    monkeypatch.setattr(lg, "flush", failing)
    with pytest.raises(OSError):
        m.flush_needed()
    assert m.flush_needed() == 1 and lg.recovery_point == 1
    m.close()


def test_a_deleted_log_leaves_the_flush_candidates(tmp_path):
    m = _mgr(tmp_path, flush_messages=100)
    lg = m.get_or_create("t", 0)
    lg.append_as_leader(make_batch(1), 0)
    assert lg in m._flush_candidates
    m.delete_log("t", 0)
    assert lg not in m._flush_candidates and m.flush_needed() == 0
    m.close()


# ---------------------------------------------------------------------- retention


def test_retention_pauses_between_slices_and_still_covers_every_log(tmp_path, monkeypatch):
    m = _mgr(tmp_path, retention_bytes=0)
    logs = [m.get_or_create("t", p) for p in range(5)]
    for lg in logs:
        _dirty(lg)
    pauses = []
    monkeypatch.setattr(log_scheduler_mod, "RETENTION_SLICE_LOGS", 2)
    monkeypatch.setattr(log_scheduler_mod, "_pause", pauses.append)
    done = LogScheduler(m).run_retention()
    assert pauses == [log_scheduler_mod.RETENTION_PAUSE_S] * 2   # after logs 2 and 4 of 5
    assert set(done["logs"]) == {f"t-{p}" for p in range(5)}
    assert all(lg.segment_count == 1 and lg.log_start_offset == lg.log_end_offset for lg in logs)
    m.close()


def test_retention_of_one_topic_uses_the_topic_index(tmp_path, monkeypatch):
    m = _mgr(tmp_path, retention_bytes=0)
    a, b = m.get_or_create("a", 0), m.get_or_create("b", 0)
    for lg in (a, b):
        _dirty(lg)
    with _no_full_walk(m):
        done = LogScheduler(m).run_retention(topic="a")
    assert set(done["logs"]) == {"a-0"} and b.log_start_offset == 0
    m.close()


# ---------------------------------------------------------------------- checkpoints


def _files(tmp_path):
    return {(d, name): read_offset_checkpoint(tmp_path / d / name) for d in ("d1", "d2")
            for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT)}


def test_checkpoint_rewrites_only_files_whose_offsets_changed(tmp_path, monkeypatch):
    m = _mgr(tmp_path)
    logs = [m.get_or_create("t", p) for p in range(4)]   # t-0, t-2 in d1; t-1, t-3 in d2
    written = []
    real = log_manager_mod.write_checkpoint_file
    monkeypatch.setattr(log_manager_mod, "write_checkpoint_file",
                        lambda path, lines: written.append((path.parent.name, path.name)) or real(path, lines))
    m.checkpoint()
    assert len(written) == 6
    written.clear()
    m.checkpoint()
    assert written == []   # nothing changed
    logs[1].append_as_leader(make_batch(3), 0)
    logs[1].update_high_watermark(2)
    m.checkpoint()
    assert written == [("d2", REPLICATION_OFFSET_CHECKPOINT)]
    assert _files(tmp_path)[("d2", REPLICATION_OFFSET_CHECKPOINT)] == {("t", 1): 2, ("t", 3): 0}
    written.clear()
    m.get_or_create("new", 0)   # to d1: its three files change
    m.checkpoint()
    assert sorted(written) == sorted(("d1", n) for n in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT,
                                                         REPLICATION_OFFSET_CHECKPOINT))
    written.clear()
    m.delete_log("t", 3)
    m.checkpoint()
    assert len(written) == 3 and all(d == "d2" for d, _ in written)
    files = _files(tmp_path)
    assert files[("d1", RECOVERY_POINT_CHECKPOINT)] == {("new", 0): 0, ("t", 0): 0, ("t", 2): 0}
    assert files[("d2", RECOVERY_POINT_CHECKPOINT)] == {("t", 1): 0}
    logs[1].flush()
    m.checkpoint()
    assert _files(tmp_path)[("d2", RECOVERY_POINT_CHECKPOINT)] == {("t", 1): 3}
    m.close()


def test_checkpoint_lines_are_sorted_kafka_format(tmp_path):
    m = LogManager([str(tmp_path / "d")], LogConfig())
    m.open_all()
    for topic, p in [("b", 10), ("a", 2), ("b", 9), ("a", 11)]:
        m.get_or_create(topic, p)
    m.get("a", 11).append_as_leader(make_batch(2), 0)
    m.get("a", 11).update_high_watermark(2)
    m.checkpoint()
    text = (tmp_path / "d" / REPLICATION_OFFSET_CHECKPOINT).read_text()
    assert text.splitlines() == ["0", "4", "a 2 0", "a 11 2", "b 9 0", "b 10 0"]
    m.close()


def test_a_failed_checkpoint_write_is_retried_by_the_next_pass(tmp_path, monkeypatch):
    m = _mgr(tmp_path)
    m.get_or_create("t", 0)
    real = log_manager_mod.write_checkpoint_file
    calls = []

    def failing(path, lines):
        calls.append(path.name)
        raise OSError("disk full")

    monkeypatch.setattr(log_manager_mod, "write_checkpoint_file", failing)
    with pytest.raises(OSError):
        m.checkpoint()
    monkeypatch.setattr(log_manager_mod, "write_checkpoint_file", real)
    m.checkpoint()
    assert _files(tmp_path)[("d1", RECOVERY_POINT_CHECKPOINT)] == {("t", 0): 0}
    m.close()


def test_a_checkpoint_in_progress_does_not_deadlock_close(tmp_path, monkeypatch):
    import threading
    import time

    m = _mgr(tmp_path)
    m.get_or_create("t", 0)
    m.get_or_create("t", 1)
    real = log_manager_mod.write_checkpoint_file
    writing = threading.Event()

    def slow(path, lines):
        if not writing.is_set():
            writing.set()
            time.sleep(0.2)   # close() starts meanwhile
        real(path, lines)

    monkeypatch.setattr(log_manager_mod, "write_checkpoint_file", slow)
    periodic = threading.Thread(target=m.checkpoint, daemon=True)
    periodic.start()
    assert writing.wait(5)
    closing = threading.Thread(target=m.close, daemon=True)
    closing.start()
    periodic.join(5)
    closing.join(5)
    assert not periodic.is_alive() and not closing.is_alive()
    assert (tmp_path / "d1" / log_manager_mod.CLEAN_SHUTDOWN_MARKER).exists()


def test_checkpoint_reads_offsets_in_slices_with_pauses(tmp_path, monkeypatch):
    m = LogManager([str(tmp_path / "d")], LogConfig())
    m.open_all()
    logs = [m.get_or_create("t", p) for p in range(5)]
    logs[4].append_as_leader(make_batch(2), 0)
    logs[4].update_high_watermark(1)
    pauses = []
    monkeypatch.setattr(log_manager_mod, "CHECKPOINT_SLICE_LOGS", 2)
    monkeypatch.setattr(log_manager_mod, "pause_between_slices", pauses.append)
    m.checkpoint()
    assert pauses == [log_manager_mod.CHECKPOINT_PAUSE_S] * 2   # slices [0, 2) [2, 4) [4, 5)
    assert read_offset_checkpoint(tmp_path / "d" / REPLICATION_OFFSET_CHECKPOINT) == {
        ("t", p): 1 if p == 4 else 0 for p in range(5)}
    assert read_offset_checkpoint(tmp_path / "d" / LOG_START_OFFSET_CHECKPOINT) == {("t", p): 0 for p in range(5)}
    monkeypatch.undo()
    m.close()
