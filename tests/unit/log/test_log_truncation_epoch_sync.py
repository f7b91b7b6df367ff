"""A follower's truncation writes the leader-epoch checkpoint without fsync; the log's next
flush makes it durable (issue 25, as Kafka's KAFKA-15046: two fsyncs per truncated partition
on the event loop stalled brokers for seconds at 10,000 partitions). Crash safety: after an
unclean reopen the epoch cache matches the log and no acknowledged record is lost."""
from __future__ import annotations

from logtest_helpers import make_batch

import partitions.log.leader_epoch_cache as cache_mod
from partitions.log.config import LogConfig
from partitions.log.leader_epoch_cache import LEADER_EPOCH_CHECKPOINT, LeaderEpochCache
from partitions.log.log import Log
from partitions.log.record_batch import iter_batches


def _count_fsyncs(monkeypatch):
    synced = []
    real = cache_mod.write_checkpoint_file

    def spy(path, lines, *, sync=True, tmp_suffix=".tmp"):
        if sync:
            synced.append(list(lines))
        real(path, lines, sync=sync, tmp_suffix=tmp_suffix)

    monkeypatch.setattr(cache_mod, "write_checkpoint_file", spy)
    return synced


def _diverged_log(path, clock):
    """Epoch 1 at 0..2 (flushed, acknowledged), then epoch 2 at 3..4 never replicated."""
    lg = Log.open(path, LogConfig(), clock=clock)
    lg.append_as_leader(make_batch(3), 1)
    lg.flush()
    lg.update_high_watermark(3)
    lg.append_as_leader(make_batch(2), 2)
    return lg


def test_truncation_does_not_fsync_the_epoch_checkpoint_the_next_flush_does(tmp_path, monkeypatch, clock):
    lg = _diverged_log(tmp_path / "t-0", clock)
    lg.flush()
    synced = _count_fsyncs(monkeypatch)
    assert lg.truncate_to(3)
    assert synced == []                                       # nothing fsynced on the caller's thread
    assert lg.leader_epoch_cache.unsynced
    on_disk = LeaderEpochCache.load(tmp_path / "t-0" / LEADER_EPOCH_CHECKPOINT)
    assert on_disk.entries == [(1, 0)]                        # but the file already matches the log
    lg.flush()                                                # nothing new to flush: still writes it
    assert synced == [["0", "1", "1 0"]]
    assert not lg.leader_epoch_cache.unsynced
    lg.close()


def test_a_truncation_that_removes_no_epoch_writes_no_checkpoint(tmp_path, monkeypatch, clock):
    lg = Log.open(tmp_path / "t-0", LogConfig(), clock=clock)
    lg.append_as_leader(make_batch(2), 1)
    lg.append_as_leader(make_batch(2), 1)
    lg.flush()
    writes = []
    monkeypatch.setattr(cache_mod, "write_checkpoint_file", lambda *a, **k: writes.append(a))
    assert lg.truncate_to(2)                                  # epoch 1 still starts at 0
    assert not lg.truncate_to(5)                              # beyond the log end: a no-op
    assert writes == [] and not lg.leader_epoch_cache.unsynced
    lg.close()


def test_unclean_reopen_after_truncation_and_new_epoch_matches_the_log(tmp_path, clock):
    path = tmp_path / "t-0"
    lg = _diverged_log(path, clock)
    lg.truncate_to(3)
    lg.append_as_follower(make_batch(2, partition_leader_epoch=3, base_offset=3))
    lg.append_as_follower(make_batch(1, partition_leader_epoch=3, base_offset=5))
    lg.close_without_flush()                                  # crash: no flush, no clean marker
    reopened = Log.open(path, LogConfig(), recovery_point=3, high_watermark=3, clock=clock)
    assert reopened.leader_epoch_cache.entries == [(1, 0), (3, 3)]
    assert reopened.log_end_offset == 6
    assert reopened.end_offset_for_epoch(1) == (1, 3)         # what a follower of ours would be told
    headers = [h for h, _ in iter_batches(reopened.read(0, 1 << 20).records)]
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers] == [(0, 1), (3, 3), (5, 3)]
    reopened.close()


def test_unclean_reopen_after_truncation_alone_drops_the_removed_epoch(tmp_path, clock):
    path = tmp_path / "t-0"
    lg = _diverged_log(path, clock)
    lg.flush()                                                # epoch 2 durable in the checkpoint
    lg.truncate_to(3)
    lg.close_without_flush()
    reopened = Log.open(path, LogConfig(), recovery_point=5, high_watermark=3, clock=clock)
    assert reopened.log_end_offset == 3
    assert reopened.leader_epoch_cache.entries == [(1, 0)]   # no epoch beyond the log end
    assert reopened.latest_epoch == 1
    reopened.close()


def test_unclean_reopen_with_a_stale_recovery_point_keeps_the_truncated_epoch_away(tmp_path, clock):
    """The recovery-point checkpoint is written periodically, so after a crash it may still
    name an offset above the truncation: only the segments from there are re-read, and the
    epoch checkpoint written by the truncation is what keeps the older segments right."""
    path = tmp_path / "t-0"
    config = LogConfig(segment_bytes=14)                      # one batch per segment
    lg = Log.open(path, config, clock=clock)
    for _ in range(3):
        lg.append_as_leader(make_batch(1), 1)
    for _ in range(2):
        lg.append_as_leader(make_batch(1), 2)                 # 3..4, never replicated
    lg.flush()
    lg.update_high_watermark(3)
    lg.truncate_to(3)                                         # the new leader's epoch 1 goes on to 6
    for offset in (3, 4, 5):
        lg.append_as_follower(make_batch(1, partition_leader_epoch=1, base_offset=offset))
    lg.close_without_flush()
    reopened = Log.open(path, config, recovery_point=5, high_watermark=3, clock=clock)
    assert reopened.log_end_offset == 6
    assert reopened.leader_epoch_cache.entries == [(1, 0)]
    assert reopened.end_offset_for_epoch(1) == (1, 6)
    reopened.close()


def test_a_new_epoch_appended_above_the_recovery_point_writes_no_file_until_the_flush(tmp_path, monkeypatch, clock):
    path = tmp_path / "t-0"
    lg = Log.open(path, LogConfig(segment_bytes=14), clock=clock)
    writes = []
    real = cache_mod.write_checkpoint_file
    monkeypatch.setattr(cache_mod, "write_checkpoint_file",
                        lambda p, lines, **k: writes.append((list(lines), k.get("sync", True))) or real(p, lines, **k))
    lg.append_as_leader(make_batch(1), 1)
    lg.append_as_follower(make_batch(1, partition_leader_epoch=2, base_offset=1))
    lg.append_as_leader(make_batch(1), 3)
    assert writes == [] and lg.leader_epoch_cache.unsynced    # no file work on the append path
    lg.flush()
    assert writes == [(["0", "3", "1 0", "2 1", "3 2"], True)]
    lg.append_as_leader(make_batch(1), 4)
    lg.close_without_flush()                                  # crash before epoch 4 reached the file
    reopened = Log.open(path, LogConfig(segment_bytes=14), recovery_point=3, clock=clock)
    assert reopened.leader_epoch_cache.entries == [(1, 0), (2, 1), (3, 2), (4, 3)]
    reopened.close()


def test_a_new_epoch_after_truncating_below_a_past_recovery_point_is_written_at_once(tmp_path, clock):
    """A checkpoint file may still hold the recovery point from before the truncation, so
    the batches of the new epoch would not be re-read after a crash: the file must have it."""
    path = tmp_path / "t-0"
    config = LogConfig(segment_bytes=14)
    lg = Log.open(path, config, clock=clock)
    for epoch in (1, 1, 1, 2, 2):
        lg.append_as_leader(make_batch(1), epoch)
    lg.flush()                                                # recovery point 5
    lg.truncate_to(3)
    for offset in (3, 4, 5):
        lg.append_as_follower(make_batch(1, partition_leader_epoch=3, base_offset=offset))
    on_disk = LeaderEpochCache.load(path / LEADER_EPOCH_CHECKPOINT)
    assert on_disk.entries == [(1, 0), (3, 3)]
    lg.close_without_flush()
    reopened = Log.open(path, config, recovery_point=5, high_watermark=3, clock=clock)
    assert reopened.leader_epoch_cache.entries == [(1, 0), (3, 3)]
    reopened.close()


def test_unclean_reopen_from_a_later_segment_keeps_the_start_of_an_older_epoch(tmp_path, clock):
    """Recovery re-reads the batches from the recovery point's segment: an epoch that began
    in an earlier segment keeps its start offset (it was moved up to the re-read segment)."""
    path = tmp_path / "t-0"
    config = LogConfig(segment_bytes=14)
    lg = Log.open(path, config, clock=clock)
    for epoch in (1, 1, 1, 2, 2):
        lg.append_as_leader(make_batch(1), epoch)
    lg.flush()
    lg.close_without_flush()
    reopened = Log.open(path, config, recovery_point=2, clock=clock)
    assert reopened.leader_epoch_cache.entries == [(1, 0), (2, 3)]
    assert reopened.leader_epoch_cache.epoch_for_offset(1) == 1
    reopened.close()
