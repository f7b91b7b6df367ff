"""Log: appends (leader/follower), reads, offsets, truncation, retention, flush, reopen."""
from __future__ import annotations

import threading

import pytest
from logtest_helpers import make_batch

from partitions.clock import ManualClock
from partitions.log.config import LogConfig
from partitions.log.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    LogClosedError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from partitions.log.log import Log
from partitions.log.record_batch import BatchHeader, decode_batches, iter_batches


def _open(tmp_path, clock=None, name="orders-3", **cfg):
    return Log.open(tmp_path / name, LogConfig(**cfg), clock=clock or ManualClock())


def _fill(lg, batches=10, per=2, epoch=0, ts=1000):
    for i in range(batches):
        lg.append_as_leader(make_batch(per, ts=ts + 10 * i), epoch)


def test_topic_and_partition_from_dir_name(tmp_path):
    lg = _open(tmp_path, name="my-topic-12")
    assert (lg.topic, lg.partition) == ("my-topic", 12)
    assert lg.log_end_offset == 0 and lg.log_start_offset == 0 and lg.segment_count == 1


def test_append_as_leader_stamps_offsets_and_epoch(tmp_path):
    lg = _open(tmp_path)
    info = lg.append_as_leader(make_batch(3, ts=50) + make_batch(2, ts=70), 5)
    assert (info.first_offset, info.last_offset, info.num_records, info.max_timestamp) == (0, 4, 5, 71)
    assert info.log_append_time_ms == -1
    info2 = lg.append_as_leader(make_batch(1), 5)
    assert (info2.first_offset, info2.last_offset) == (5, 5)
    data = lg.read(0, 10**6).records
    headers = [h for h, _ in iter_batches(data)]
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers] == [(0, 5), (3, 5), (5, 5)]
    assert [r.offset for r in decode_batches(data)] == list(range(6))
    assert lg.latest_epoch == 5


def test_leader_append_validates_everything_before_writing(tmp_path):
    lg = _open(tmp_path, max_message_bytes=200)
    good = make_batch(1)
    bad = bytearray(make_batch(1))
    bad[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC"):
        lg.append_as_leader(good + bytes(bad), 0)
    with pytest.raises(CorruptRecordError):
        lg.append_as_leader(good + good[:20], 0)
    with pytest.raises(RecordTooLargeError, match="max.message.bytes"):
        lg.append_as_leader(good + make_batch(1, value=b"x" * 300), 0)
    with pytest.raises(CorruptRecordError, match="empty"):
        lg.append_as_leader(b"", 0)
    assert lg.log_end_offset == 0 and lg.size_bytes == 0


def test_leader_append_refuses_an_older_epoch(tmp_path):
    lg = _open(tmp_path)
    lg.append_as_leader(make_batch(1), 3)
    with pytest.raises(FencedLeaderEpochError, match="older"):
        lg.append_as_leader(make_batch(1), 2)


def test_log_append_time_topic(tmp_path):
    clock = ManualClock(777_000)
    lg = _open(tmp_path, clock, message_timestamp_type="LogAppendTime")
    info = lg.append_as_leader(make_batch(2, ts=5), 0)
    assert info.log_append_time_ms == 777_000 and info.max_timestamp == 777_000
    recs = decode_batches(lg.read(0, 10**6).records)
    assert [r.timestamp for r in recs] == [777_000, 777_000]


def test_append_as_follower(tmp_path):
    leader = _open(tmp_path, name="l-0")
    leader.append_as_leader(make_batch(2), 1)
    leader.append_as_leader(make_batch(3), 4)
    follower = _open(tmp_path, name="f-0")
    data = leader.read(0, 10**6).records
    with pytest.raises(OffsetMismatchError):
        follower.append_as_follower(data[BatchHeader.parse(data).size :])
    info = follower.append_as_follower(data)
    assert (info.first_offset, info.last_offset, info.num_records) == (0, 4, 5)
    assert follower.read(0, 10**6).records == data
    assert follower.leader_epoch_cache.entries == [(1, 0), (4, 2)]
    assert follower.end_offset_for_epoch(1) == (1, 2)
    assert follower.end_offset_for_epoch(4) == (4, 5)


def test_read_semantics(tmp_path):
    lg = _open(tmp_path, segment_bytes=300)
    _fill(lg, batches=10, per=2)
    assert lg.segment_count > 2
    full = lg.read(0, 10**6)
    assert (full.first_offset, full.next_offset) == (0, 20)
    assert [r.offset for r in decode_batches(full.records)] == list(range(20))  # across segments
    f = lg.read(7, 10**6)
    assert f.first_offset == 6  # the batch containing 7
    f = lg.read(7, 1)
    assert (f.first_offset, f.next_offset) == (6, 8)  # min one message
    f = lg.read(7, 1, min_one_message=False)
    assert f.records == b"" and f.next_offset == 7
    f = lg.read(0, 10**6, max_offset=9)
    assert f.next_offset == 10  # batch 8-9 starts below 9
    f = lg.read(0, 10**6, max_offset=8)
    assert f.next_offset == 8
    assert lg.read(20, 100).records == b""
    assert lg.read(10, 100, max_offset=10).records == b""
    with pytest.raises(OffsetOutOfRangeError) as exc:
        lg.read(21, 100)
    assert (exc.value.log_start_offset, exc.value.log_end_offset) == (0, 20)


def test_read_respects_max_bytes_with_whole_batches(tmp_path):
    lg = _open(tmp_path)
    _fill(lg, batches=10, per=2)
    size = BatchHeader.parse(lg.read(0, 10**6).records).size
    f = lg.read(0, size * 3 + 5)
    assert len(f.records) == size * 3 and f.next_offset == 6


def test_high_watermark_is_clamped_and_moves_forward(tmp_path):
    lg = _open(tmp_path)
    _fill(lg, batches=5, per=2)
    assert lg.update_high_watermark(4) == 4
    assert lg.update_high_watermark(2) == 4
    assert lg.update_high_watermark(100) == 10


def test_truncate_to(tmp_path):
    lg = _open(tmp_path, segment_bytes=300)
    _fill(lg, batches=10, per=2, epoch=1)
    lg.append_as_leader(make_batch(2), 2)
    lg.update_high_watermark(22)
    segments = lg.segment_count
    assert lg.truncate_to(9)  # batch 8-9 dropped whole
    assert lg.log_end_offset == 8 and lg.high_watermark == 8
    assert lg.segment_count < segments
    assert lg.leader_epoch_cache.entries == [(1, 0)]
    assert not lg.truncate_to(100)
    assert lg.append_as_leader(make_batch(1), 3).first_offset == 8
    assert [r.offset for r in decode_batches(lg.read(0, 10**6).records)] == list(range(9))


def test_truncate_fully_and_start_at(tmp_path):
    lg = _open(tmp_path)
    _fill(lg, batches=3)
    lg.truncate_fully_and_start_at(500)
    assert (lg.log_start_offset, lg.log_end_offset, lg.high_watermark) == (500, 500, 500)
    assert lg.append_as_leader(make_batch(1), 0).first_offset == 500
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(0, 10)


def test_delete_records(tmp_path):
    lg = _open(tmp_path, segment_bytes=300)
    _fill(lg, batches=10, per=2)
    lg.update_high_watermark(12)
    with pytest.raises(OffsetOutOfRangeError, match="high watermark"):
        lg.delete_records(13)
    segments = lg.segment_count
    assert lg.delete_records(11) == 11
    assert lg.segment_count < segments
    assert lg.segments[0].base_offset <= 11
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(10, 100)
    assert lg.read(11, 10**6).first_offset == 10  # batch containing 11
    assert lg.delete_records(5) == 11  # never moves back


def test_delete_records_up_to_log_end_rolls_the_active_segment(tmp_path):
    lg = _open(tmp_path)
    _fill(lg, batches=3, per=2)
    lg.update_high_watermark(6)
    assert lg.delete_records(6) == 6
    assert lg.size_bytes == 0 and lg.log_end_offset == 6
    assert lg.append_as_leader(make_batch(1), 0).first_offset == 6


def test_retention_by_time_rolls_and_deletes_an_expired_active_segment(tmp_path):
    clock = ManualClock(10_000)
    lg = _open(tmp_path, clock, segment_bytes=300, retention_ms=1000)
    _fill(lg, batches=10, per=2, ts=1000)  # ts 1000..1091
    lg.update_high_watermark(lg.log_end_offset)
    n = lg.segment_count
    assert lg.apply_retention(now_ms=1500) == 0
    assert lg.apply_retention(now_ms=10**9) == n          # the active one too (rolled first, Kafka)
    assert lg.segment_count == 1 and lg.segments[0].is_empty
    assert lg.log_start_offset == lg.log_end_offset == 20
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(0, 1 << 20)
    lg.append_as_leader(make_batch(1, ts=10**9), 0)          # the log goes on at its end offset
    assert lg.read(20, 1 << 20).records


def test_retention_keeps_an_expired_active_segment_above_the_high_watermark(tmp_path):
    lg = _open(tmp_path, segment_bytes=300, retention_ms=1000)
    _fill(lg, batches=10, per=2, ts=1000)
    lg.update_high_watermark(lg.log_end_offset - 1)       # the last record is not committed yet
    n = lg.segment_count
    assert lg.apply_retention(now_ms=10**9) == n - 1
    assert lg.segment_count == 1 and not lg.segments[0].is_empty


def test_retention_of_a_recent_single_segment_deletes_nothing(tmp_path):
    lg = _open(tmp_path, retention_ms=1000)
    _fill(lg, batches=3, per=2, ts=5000)
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.apply_retention(now_ms=5500) == 0
    assert lg.log_start_offset == 0 and lg.log_end_offset == 6


def test_retention_only_below_high_watermark(tmp_path):
    lg = _open(tmp_path, segment_bytes=300, retention_ms=0)
    _fill(lg, batches=10, per=2)
    assert lg.apply_retention(now_ms=10**9) == 0
    lg.update_high_watermark(lg.segments[2].base_offset)
    assert lg.apply_retention(now_ms=10**9) == 2


def test_retention_by_size(tmp_path):
    lg = _open(tmp_path, segment_bytes=300, retention_bytes=700)
    _fill(lg, batches=20, per=2)
    lg.update_high_watermark(lg.log_end_offset)
    lg.apply_retention()
    assert lg.size_bytes <= 700 + 300
    assert lg.size_bytes - lg.segments[0].size < 700


def test_compact_only_topics_have_no_time_retention(tmp_path):
    lg = _open(tmp_path, segment_bytes=300, retention_ms=0, cleanup_policy="compact")
    for _ in range(10):
        lg.append_as_leader(make_batch(2, key=b"k"), 0)
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.apply_retention(now_ms=10**9) == 0


def test_offset_for_timestamp(tmp_path):
    lg = _open(tmp_path, segment_bytes=300)
    _fill(lg, batches=10, per=2, ts=1000)  # batch i: ts 1000+10i, +1
    assert lg.offset_for_timestamp(0) == 0
    assert lg.offset_for_timestamp(1031) == 7
    assert lg.offset_for_timestamp(1032) == 8
    assert lg.offset_for_timestamp(1091) == 19
    assert lg.offset_for_timestamp(1092) is None
    assert lg.offset_for_timestamp(-1) == 20
    assert lg.offset_for_timestamp(-2) == 0


def test_flush_policy_and_recovery_point(tmp_path, clock):
    lg = Log.open(tmp_path / "t-0", LogConfig(flush_messages=5, flush_ms=1000), clock=clock)
    lg.append_as_leader(make_batch(3), 0)
    assert not lg.needs_flush() and lg.unflushed_messages == 3
    lg.append_as_leader(make_batch(2), 0)
    assert lg.needs_flush()
    lg.flush()
    assert lg.recovery_point == 5 and lg.unflushed_messages == 0 and not lg.needs_flush()
    lg.append_as_leader(make_batch(1), 0)
    assert not lg.needs_flush()
    clock.advance(1000)
    assert lg.needs_flush()
    lg.flush(up_to_offset=5)
    assert lg.recovery_point == 5
    lg.flush()
    assert lg.recovery_point == 6


def test_flush_from_another_thread_while_appending(tmp_path):
    lg = _open(tmp_path, segment_bytes=2000)
    stop = threading.Event()
    errors = []

    def flusher():
        while not stop.is_set():
            try:
                lg.flush()
            except Exception as exc:  # pragma: no cover - the assertion reports it
                errors.append(exc)
                return

    t = threading.Thread(target=flusher)
    t.start()
    try:
        for i in range(300):
            lg.append_as_leader(make_batch(2), 0)
            if i % 50 == 49:
                lg.update_high_watermark(lg.log_end_offset)
                lg.truncate_to(lg.log_end_offset - 3)
    finally:
        stop.set()
        t.join()
    assert not errors
    lg.flush()
    assert lg.recovery_point == lg.log_end_offset


def test_reopen_clean_keeps_everything(tmp_path, clock):
    lg = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=300), clock=clock)
    _fill(lg, batches=10, per=2, epoch=2)
    lg.update_high_watermark(15)
    data = lg.read(0, 10**6).records
    lg.close()
    with pytest.raises(LogClosedError):
        lg.read(0, 10)
    again = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=300), recovery_point=20, high_watermark=15,
                     clean_shutdown=True, clock=clock)
    assert again.read(0, 10**6).records == data
    assert (again.log_end_offset, again.high_watermark, again.recovery_point) == (20, 15, 20)
    assert again.leader_epoch_cache.entries == [(2, 0)]
    assert again.append_as_leader(make_batch(1), 2).first_offset == 20


def test_reopen_rebuilds_a_lost_epoch_checkpoint(tmp_path):
    lg = _open(tmp_path, name="t-0")
    lg.append_as_leader(make_batch(1), 1)
    lg.append_as_leader(make_batch(1), 3)
    lg.close()
    (tmp_path / "t-0" / "leader-epoch-checkpoint").write_text("garbage")
    again = Log.open(tmp_path / "t-0", LogConfig(), clean_shutdown=True)
    assert again.leader_epoch_cache.entries == [(1, 0), (3, 1)]


def test_update_config_changes_roll_size(tmp_path):
    lg = _open(tmp_path)
    _fill(lg, batches=5)
    assert lg.segment_count == 1
    lg.update_config(LogConfig(segment_bytes=100))
    _fill(lg, batches=3)
    assert lg.segment_count == 4 and lg.config.segment_bytes == 100


def test_delete_removes_directory(tmp_path):
    lg = _open(tmp_path)
    _fill(lg, batches=2)
    lg.delete()
    assert not (tmp_path / "orders-3").exists()
    with pytest.raises(LogClosedError):
        lg.append_as_leader(make_batch(1), 0)
