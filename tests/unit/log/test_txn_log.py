"""Transactions on a partition log: markers, open transactions, LSO, aborted index, recovery."""
from __future__ import annotations

import pytest

from partitions.log.config import LogConfig
from partitions.log.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from partitions.log.log import Log
from partitions.log.record_batch import Record, build_batch, decode_batches
from partitions.log.transactions import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    TXN_INDEX_ENTRY_SIZE,
    AbortedTxn,
    build_marker_batch,
    build_transactional_batch,
    decode_txn_index,
    filter_read_committed,
    marker_type,
    parse_control_type,
    parse_isolation_level,
)


def txn(values, pid, epoch=0):
    return build_transactional_batch([Record(None, v) for v in values], pid, epoch)


def plain(values):
    return build_batch([Record(None, v) for v in values])


def committed_values(lg: Log, start: int = 0) -> list[bytes]:
    hw = lg.log_end_offset
    lg.update_high_watermark(hw)
    lso = lg.last_stable_offset()
    info = lg.read(start, 1 << 20, max_offset=hw)
    data, _ = filter_read_committed(info.records, start, lso, lg.aborted_transactions(start, lso))
    return [r.value for r in decode_batches(data)]


def test_control_record_layout_is_kafkas():
    marker = build_marker_batch(7, 3, commit=True, coordinator_epoch=5)
    recs = decode_batches(marker)
    assert recs[0].key == b"\x00\x00\x00\x01"           # version 0, type COMMIT
    assert recs[0].value == b"\x00\x00\x00\x00\x00\x05"  # version 0, coordinator epoch 5
    assert marker_type(marker) == CONTROL_COMMIT
    assert marker_type(build_marker_batch(7, 3, commit=False)) == CONTROL_ABORT
    assert marker[21:23] == b"\x00\x30"                  # attributes: transactional | control
    with pytest.raises(Exception):
        parse_control_type(b"\x00")


def test_isolation_level_parse():
    assert parse_isolation_level(None) == "read_uncommitted"
    assert parse_isolation_level("READ_COMMITTED") == "read_committed"
    with pytest.raises(ValueError, match="read_committed"):
        parse_isolation_level("serializable")


def test_lso_follows_open_transactions(tmp_path):
    lg = Log.open(tmp_path / "t-0", LogConfig())
    lg.append_as_leader(plain([b"a"]), 0)                  # 0
    lg.append_as_leader(txn([b"t1", b"t2"], pid=1), 0)     # 1-2
    lg.append_as_leader(plain([b"b"]), 0)                  # 3
    lg.append_as_leader(txn([b"u1"], pid=2), 0)            # 4
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.transactions.first_unstable_offset == 1
    assert lg.last_stable_offset() == 1
    assert committed_values(lg) == [b"a"]
    lg.append_as_leader(build_marker_batch(1, 0, commit=True), 0)   # 5
    assert lg.last_stable_offset() == 4
    assert committed_values(lg) == [b"a", b"t1", b"t2", b"b"]
    lg.append_as_leader(build_marker_batch(2, 0, commit=False), 0)  # 6
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.last_stable_offset() == lg.high_watermark == 7
    assert committed_values(lg) == [b"a", b"t1", b"t2", b"b"]       # u1 aborted, no markers
    assert lg.aborted_transactions(0, 7) == [AbortedTxn(2, 4, 6, 7)]
    # read_uncommitted sees everything but markers are still control batches
    assert [r.value for r in decode_batches(lg.read(0, 1 << 20).records, skip_control=True)] == [
        b"a", b"t1", b"t2", b"b", b"u1"]
    lg.close()


def test_read_committed_passes_over_aborted_and_markers_next_offset(tmp_path):
    lg = Log.open(tmp_path / "t-0", LogConfig())
    lg.append_as_leader(txn([b"x"], pid=9), 0)
    lg.append_as_leader(build_marker_batch(9, 0, commit=False), 0)
    lg.update_high_watermark(lg.log_end_offset)
    data, nxt = filter_read_committed(lg.read(0, 1 << 20).records, 0, lg.last_stable_offset(),
                                      lg.aborted_transactions(0, 2))
    assert data == b"" and nxt == 2  # the consumer moves past what it must not see
    lg.close()


def test_aborted_index_file_written_and_rebuilt_when_deleted_or_torn(tmp_path):
    d = tmp_path / "t-0"
    lg = Log.open(d, LogConfig())
    lg.append_as_leader(txn([b"x1", b"x2"], pid=3), 0)
    lg.append_as_leader(build_marker_batch(3, 0, commit=False), 0)
    lg.append_as_leader(plain([b"ok"]), 0)
    lg.update_high_watermark(lg.log_end_offset)
    idx = d / "00000000000000000000.txnindex"
    assert decode_txn_index(idx.read_bytes()) == [AbortedTxn(3, 0, 2, 3)]
    lg.close()
    for damage in ("delete", "tear"):
        if damage == "delete":
            idx.unlink()
        else:
            idx.write_bytes(idx.read_bytes()[:TXN_INDEX_ENTRY_SIZE - 5])
        lg = Log.open(d, LogConfig(), high_watermark=4)
        assert lg.transactions.rewritten_files == 1
        assert decode_txn_index(idx.read_bytes()) == [AbortedTxn(3, 0, 2, 3)]
        assert committed_values(lg) == [b"ok"]
        lg.close()


def test_open_transaction_survives_crash_recovery_and_follower_copy(tmp_path):
    leader = Log.open(tmp_path / "t-0", LogConfig())
    leader.append_as_leader(txn([b"a"], pid=5, epoch=2), 0)
    leader.close_without_flush()
    reopened = Log.open(tmp_path / "t-0", LogConfig())
    assert reopened.transactions.ongoing == {5: 0}
    follower = Log.open(tmp_path / "f" / "t-0", LogConfig())
    follower.append_as_follower(reopened.read(0, 1 << 20).records)
    assert follower.transactions.first_unstable_offset == 0
    reopened.append_as_leader(build_marker_batch(5, 2, commit=False), 0)
    follower.append_as_follower(reopened.read(1, 1 << 20).records)
    assert follower.transactions.first_unstable_offset is None
    assert follower.aborted_transactions(0, 2) == [AbortedTxn(5, 0, 1, 2)]
    assert (tmp_path / "f" / "t-0" / "00000000000000000000.txnindex").exists()
    reopened.close()
    follower.close()


def test_truncation_reopens_a_transaction_whose_marker_is_gone(tmp_path):
    lg = Log.open(tmp_path / "t-0", LogConfig())
    lg.append_as_leader(txn([b"a"], pid=5), 0)
    lg.append_as_leader(build_marker_batch(5, 0, commit=False), 0)
    lg.truncate_to(1)
    assert lg.transactions.ongoing == {5: 0}
    assert lg.aborted_transactions(0, 10) == []
    assert not (tmp_path / "t-0" / "00000000000000000000.txnindex").exists()
    lg.close()


def test_fenced_epoch_refused_at_the_partition(tmp_path):
    lg = Log.open(tmp_path / "t-0", LogConfig())
    lg.append_as_leader(txn([b"a"], pid=5, epoch=1), 0)
    lg.append_as_leader(build_marker_batch(5, 2, commit=False), 0)
    with pytest.raises(InvalidProducerEpochError, match="fenced"):
        lg.append_as_leader(txn([b"zombie"], pid=5, epoch=1), 0)
    lg.append_as_leader(txn([b"b"], pid=5, epoch=2), 0)
    lg.close()


def test_retention_deletes_the_txnindex_with_its_segment(tmp_path):
    d = tmp_path / "t-0"
    lg = Log.open(d, LogConfig(retention_ms=1000))
    lg.append_as_leader(build_transactional_batch([Record(None, b"a", timestamp=1)], 5, 0), 0)
    lg.append_as_leader(build_marker_batch(5, 0, commit=False, now_ms=1), 0)
    lg.update_high_watermark(lg.log_end_offset)
    assert (d / "00000000000000000000.txnindex").exists()
    assert lg.apply_retention(now_ms=10_000) == 1
    assert not (d / "00000000000000000000.txnindex").exists()
    assert lg.aborted_transactions(0, 100) == []
    lg.close()


def test_cleaner_stops_at_open_transactions_and_cleans_aborted_ones(tmp_path, clock):
    from partitions.log.cleaner import LogCleaner

    lg = Log.open(tmp_path / "t-0", LogConfig(cleanup_policy="compact", segment_bytes=200), clock=clock)
    for i in range(3):
        lg.append_as_leader(build_batch([Record(b"k", b"v%d" % i)]), 0)
    lg.append_as_leader(build_transactional_batch([Record(b"k", b"open")], 5, 0), 0)  # offset 3
    for i in range(3):
        lg.append_as_leader(build_batch([Record(b"j", b"w%d" % i)]), 0)
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    cleaner = LogCleaner(clock=clock)
    assert cleaner.cleanable_range(lg) == (0, 3)       # stops at the open transaction
    lg.append_as_leader(build_marker_batch(5, 0, commit=False), 0)
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    assert cleaner.cleanable_range(lg) == (0, 8)       # aborted: cleaned over
    assert cleaner.clean(lg).aborted_records_removed == 1
    # the aborted "open" value never shadows the committed v2 of key k, and is gone
    assert committed_values(lg) == [b"v2", b"w2"], committed_values(lg)
    assert b"open" not in [r.value for r in decode_batches(lg.read(0, 1 << 20).records)]
    lg.close()


def test_clean_open_reads_the_snapshot_and_index_files_without_scanning(tmp_path, monkeypatch):
    from partitions.log.segment import LogSegment

    d = tmp_path / "t-0"
    lg = Log.open(d, LogConfig())
    lg.append_as_leader(txn([b"a"], pid=3), 0)
    lg.append_as_leader(build_marker_batch(3, 0, commit=False), 0)
    lg.append_as_leader(txn([b"b"], pid=4, epoch=2), 0)           # still open at shutdown
    end = lg.log_end_offset
    lg.close()
    assert (d / "transaction-state-snapshot").exists()
    real_scan = LogSegment.scan_raw

    def no_txn_scan(self, *a, **kw):
        import traceback
        files = [f.filename for f in traceback.extract_stack()]
        assert not any(f.endswith("partitions/log/transactions.py") for f in files), "clean open scanned the log"
        return real_scan(self, *a, **kw)
    monkeypatch.setattr(LogSegment, "scan_raw", no_txn_scan)
    lg = Log.open(d, LogConfig(), recovery_point=end, high_watermark=end, clean_shutdown=True)
    assert lg.transactions.loaded_from_snapshot
    assert lg.transactions.ongoing == {4: 2} and lg.transactions.epochs == {3: 0, 4: 2}
    assert lg.aborted_transactions(0, end) == [AbortedTxn(3, 0, 1, 2)]
    assert not (d / "transaction-state-snapshot").exists()        # consumed: a later crash rescans
    lg.close_without_flush()
    monkeypatch.setattr(LogSegment, "scan_raw", real_scan)
    lg = Log.open(d, LogConfig(), recovery_point=end, high_watermark=end, clean_shutdown=True)
    assert not lg.transactions.loaded_from_snapshot                # no snapshot: rebuilt from the log
    assert lg.transactions.ongoing == {4: 2}
    lg.close()


def seq_txn(values, pid, seq, epoch=0):
    return build_transactional_batch([Record(None, v) for v in values], pid, epoch, base_sequence=seq)


def test_transactional_batches_with_sequences_are_deduplicated_like_idempotent_ones(tmp_path):
    """A transactional producer is idempotent (Kafka): a resent batch (lost answer) is answered
    with its original offsets and not appended again; sequences continue per partition across
    markers within an epoch, restart at 0 in a new epoch, and a gap is refused."""
    lg = Log.open(tmp_path / "t-0", LogConfig())
    first = lg.append_as_leader(seq_txn([b"a", b"b"], pid=3, seq=0), 0)      # 0-1
    again = lg.append_as_leader(seq_txn([b"a", b"b"], pid=3, seq=0), 0)
    assert (again.duplicate, again.first_offset, again.last_offset) == (True, 0, 1)
    assert not first.duplicate and lg.log_end_offset == 2
    assert lg.append_as_leader(seq_txn([b"c"], pid=3, seq=2), 0).first_offset == 2
    lg.append_as_leader(build_marker_batch(3, 0, commit=True), 0)            # 3
    # the next transaction of the same epoch continues the sequences after the marker
    with pytest.raises(OutOfOrderSequenceError):
        lg.append_as_leader(seq_txn([b"gap"], pid=3, seq=5), 0)
    assert lg.append_as_leader(seq_txn([b"d"], pid=3, seq=3), 0).first_offset == 4
    dup = lg.append_as_leader(seq_txn([b"d"], pid=3, seq=3), 0)
    assert dup.duplicate and dup.first_offset == 4 and lg.log_end_offset == 5
    lg.append_as_leader(build_marker_batch(3, 0, commit=False), 0)           # 5
    # a new epoch (init after the abort) starts at sequence 0
    with pytest.raises(OutOfOrderSequenceError, match="new epoch starts at 0"):
        lg.append_as_leader(seq_txn([b"e"], pid=3, seq=4, epoch=1), 0)
    assert lg.append_as_leader(seq_txn([b"e"], pid=3, seq=0, epoch=1), 0).first_offset == 6
    lg.append_as_leader(build_marker_batch(3, 1, commit=True), 0)            # 7
    assert committed_values(lg) == [b"a", b"b", b"c", b"e"]                  # each once, d aborted
    lg.close()
    # reopened (the producer state snapshot), a resend of the last batch is still recognised
    lg = Log.open(tmp_path / "t-0", LogConfig())
    dup = lg.append_as_leader(seq_txn([b"e"], pid=3, seq=0, epoch=1), 0)
    assert dup.duplicate and dup.first_offset == 6 and lg.log_end_offset == 8
    lg.close()
