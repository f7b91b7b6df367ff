"""Reassignment progress (issue 17): the bytes an adding replica still has to copy, and has
copied, are exact byte counts of the leader's segments from the replica's log end, over
segment boundaries, below the log start and at the log end (http_api/broker/reassignments.py)."""
from __future__ import annotations

from http_api.broker.reassignments import log_bytes_from
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.record_batch import Record, build_batch


def test_bytes_from_an_offset_are_the_leaders_bytes_from_that_batch_to_the_log_end(tmp_path):
    cfg = LogConfig(segment_bytes=4096, preallocate=False, index_interval_bytes=1024)
    lg = Log.open(tmp_path / "t-0", cfg)
    try:
        sizes, offsets = [], []
        for i in range(60):   # batches of different sizes (2 records each) over several segments
            batch = build_batch([Record(None, b"x" * (100 + 37 * (i % 7))), Record(None, b"y")])
            offsets.append(lg.log_end_offset)
            lg.append_as_leader(batch, 0)
            sizes.append(len(batch))
        assert lg.segment_count > 3
        total = sum(sizes)
        assert lg.size_bytes == total
        for k in (0, 1, 17, 29, 30, 59):   # a replica whose log end is batch k's base offset
            assert log_bytes_from(lg, offsets[k]) == sum(sizes[k:]), k
        assert log_bytes_from(lg, lg.log_end_offset) == 0 and log_bytes_from(lg, lg.log_end_offset + 5) == 0
        lg.update_high_watermark(lg.log_end_offset)
        lg.delete_records(offsets[30])      # the log start moves into the middle
        lg.apply_retention()
        assert log_bytes_from(lg, 0) == lg.size_bytes   # a new replica copies from the log start
        assert log_bytes_from(lg, offsets[45]) == sum(sizes[45:])
    finally:
        lg.close()
