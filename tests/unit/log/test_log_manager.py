"""LogManager: placement over log dirs, checkpoints, clean shutdown marker, recovery."""
from __future__ import annotations

import os

from logtest_helpers import make_batch

from partitions.clock import ManualClock
from partitions.log.config import LogConfig
from partitions.log.log_manager import (
    CLEAN_SHUTDOWN_MARKER,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LogManager,
    read_offset_checkpoint,
    write_offset_checkpoint,
)


def _mgr(tmp_path, **cfg):
    m = LogManager([str(tmp_path / "d1"), str(tmp_path / "d2")], LogConfig(**cfg), clock=ManualClock())
    m.open_all()
    return m


def test_new_partitions_go_to_the_dir_with_fewest_partitions(tmp_path):
    m = _mgr(tmp_path)
    (tmp_path / "d1" / "pre-0").mkdir()  # not opened by this manager: only managed logs count
    logs = [m.get_or_create("t", p) for p in range(5)]
    parents = [lg.dir.parent.name for lg in logs]
    assert parents.count("d1") == 3 and parents.count("d2") == 2
    assert m.get("t", 0) is logs[0] and m.get_or_create("t", 0) is logs[0]
    assert m.get("t", 9) is None


def test_checkpoint_files_in_kafka_format(tmp_path):
    m = _mgr(tmp_path)
    lg = m.get_or_create("orders", 0)
    lg.append_as_leader(make_batch(5), 0)
    lg.update_high_watermark(4)
    lg.flush()
    m.checkpoint()
    d = lg.dir.parent
    assert (d / REPLICATION_OFFSET_CHECKPOINT).read_text() == "0\n1\norders 0 4\n"
    assert read_offset_checkpoint(d / RECOVERY_POINT_CHECKPOINT) == {("orders", 0): 5}
    assert read_offset_checkpoint(d / LOG_START_OFFSET_CHECKPOINT) == {("orders", 0): 0}
    assert not any(p.name.endswith(".tmp") for p in d.iterdir())


def test_checkpoint_reader_ignores_malformed_files(tmp_path):
    p = tmp_path / "cp"
    p.write_text("0\n2\nt 0 5\n")
    assert read_offset_checkpoint(p) == {}
    write_offset_checkpoint(p, {("a-b", 1): 7})
    assert read_offset_checkpoint(p) == {("a-b", 1): 7}
    assert read_offset_checkpoint(tmp_path / "missing") == {}


def test_clean_close_and_reopen(tmp_path):
    m = _mgr(tmp_path)
    for p in range(3):
        lg = m.get_or_create("t", p)
        lg.append_as_leader(make_batch(p + 1), 0)
        lg.update_high_watermark(p + 1)
    lg = m.get("t", 2)
    lg.update_high_watermark(3)
    lg.delete_records(1)
    m.close()
    for d in ("d1", "d2"):
        assert (tmp_path / d / CLEAN_SHUTDOWN_MARKER).exists()
    m2 = _mgr(tmp_path)
    assert sorted(m2.partitions()) == [("t", 0), ("t", 1), ("t", 2)]
    lg = m2.get("t", 2)
    assert (lg.log_start_offset, lg.high_watermark, lg.log_end_offset, lg.recovery_point) == (1, 3, 3, 3)
    for d in ("d1", "d2"):
        assert not (tmp_path / d / CLEAN_SHUTDOWN_MARKER).exists()


def test_unclean_reopen_recovers_from_the_recovery_point(tmp_path):
    m = _mgr(tmp_path)
    lg = m.get_or_create("t", 0)
    lg.append_as_leader(make_batch(2), 0)
    lg.flush()
    m.checkpoint()
    lg.append_as_leader(make_batch(2), 0)
    seg = lg.segments[-1].log_path
    lg.close_without_flush()  # crash: no marker, torn tail
    os.truncate(seg, os.path.getsize(seg) - 1)
    m2 = _mgr(tmp_path)
    assert m2.get("t", 0).log_end_offset == 2


def test_delete_log_renames_then_removes(tmp_path):
    m = _mgr(tmp_path)
    lg = m.get_or_create("t", 0)
    lg.append_as_leader(make_batch(1), 0)
    path = lg.dir
    assert m.delete_log("t", 0)
    assert not path.exists() and m.get("t", 0) is None
    assert not any(p.name.endswith("-delete") for p in path.parent.iterdir())
    assert not m.delete_log("t", 0)


def test_leftover_delete_dirs_and_stray_dirs_are_handled_on_open(tmp_path):
    (tmp_path / "d1" / "t-0.abc123-delete").mkdir(parents=True)
    (tmp_path / "d1" / "not_a_partition").mkdir()
    m = _mgr(tmp_path)
    assert m.partitions() == []
    assert not (tmp_path / "d1" / "t-0.abc123-delete").exists()


def test_update_config_and_retention_and_flush_all(tmp_path):
    m = _mgr(tmp_path, flush_messages=2)
    logs = [m.get_or_create("t", p) for p in range(2)]
    for lg in logs:
        for _ in range(6):
            lg.append_as_leader(make_batch(2), 0)
        lg.update_high_watermark(lg.log_end_offset)
    assert m.flush_needed() == 2
    assert all(lg.recovery_point == lg.log_end_offset for lg in logs)
    m.update_config("t", LogConfig(segment_bytes=100, retention_bytes=0))
    for lg in logs:
        lg.append_as_leader(make_batch(2), 0)
        lg.append_as_leader(make_batch(2), 0)
        lg.update_high_watermark(lg.log_end_offset)
        assert lg.config.segment_bytes == 100
    assert m.run_retention() == 6   # retention.bytes=0: every segment, the active ones rolled first
    assert all(lg.segment_count == 1 and lg.size_bytes == 0 for lg in logs)
    assert all(lg.log_start_offset == lg.log_end_offset == 16 for lg in logs)
    m.flush_all()
    m.close()


def test_open_all_in_parallel_threads(tmp_path):
    m = _mgr(tmp_path)
    for p in range(6):
        m.get_or_create("t", p).append_as_leader(make_batch(3), 0)
    for lg in m.all_logs():
        lg.close_without_flush()
    m2 = LogManager([str(tmp_path / "d1"), str(tmp_path / "d2")], LogConfig(), recovery_threads=3)
    m2.open_all()
    assert len(m2.all_logs()) == 6 and all(lg.log_end_offset == 3 for lg in m2.all_logs())


def test_run_cleaner_compacts_compacted_topics_only(tmp_path):
    from partitions.log.record_batch import Record, build_batch

    m = _mgr(tmp_path, segment_bytes=300)
    m.update_config("compacted", LogConfig(segment_bytes=300, cleanup_policy="compact"))
    logs = [m.get_or_create("compacted", 0), m.get_or_create("plain", 0)]
    for lg in logs:
        for i in range(20):
            lg.append_as_leader(build_batch([Record(b"same-key", b"v%d" % i)]), 0)
        lg.roll()
        lg.update_high_watermark(lg.log_end_offset)
    sizes = [lg.size_bytes for lg in logs]
    assert m.run_cleaner() == 1
    assert logs[0].size_bytes < sizes[0] / 3 and logs[1].size_bytes == sizes[1]


def test_get_or_create_recovers_an_existing_unopened_dir(tmp_path):
    m = _mgr(tmp_path)
    lg = m.get_or_create("t", 0)
    lg.append_as_leader(make_batch(2), 0)
    seg = lg.segments[-1].log_path
    lg.close_without_flush()
    raw = bytearray(seg.read_bytes())
    raw[-1] ^= 0xFF  # only a CRC check (recovery) notices this
    seg.write_bytes(bytes(raw))
    m2 = LogManager([str(tmp_path / "d1"), str(tmp_path / "d2")], LogConfig())  # open_all not called
    assert m2.get_or_create("t", 0).log_end_offset == 0
