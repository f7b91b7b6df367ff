"""LogSegment: append/read, index maintenance, recovery, truncation, roll conditions."""
from __future__ import annotations

import os

from logtest_helpers import make_batch

from partitions.log.append import BatchEntry
from partitions.log.config import LogConfig
from partitions.log.record_batch import BatchHeader, decode_batches, iter_batches, stamp_batch
from partitions.log.segment import LogSegment


def _append(seg, raw: bytes, base: int) -> BatchHeader:
    data = bytearray(raw)
    stamp_batch(data, base, 0)
    h = BatchHeader.parse(data)
    seg.append(data, [BatchEntry(0, h.base_offset, h.next_offset, h.size, h.max_timestamp)])
    return h


def _filled(tmp_path, n=20, per=3, cfg=None, base=100):
    cfg = cfg or LogConfig(index_interval_bytes=400)
    seg = LogSegment.create(tmp_path, base, cfg, 0)
    off = base
    for i in range(n):
        h = _append(seg, make_batch(per, ts=1000 + 10 * i, value=b"x" * 20), off)
        off = h.next_offset
    return seg


def test_file_names_and_offsets(tmp_path):
    seg = _filled(tmp_path)
    assert seg.log_path.name == "00000000000000000100.log"
    assert (tmp_path / "00000000000000000100.index").exists()
    assert (tmp_path / "00000000000000000100.timeindex").exists()
    assert seg.next_offset == 160 and seg.size == os.path.getsize(seg.log_path)
    assert len(seg.offset_index) > 2  # sparse: not one per batch, but more than one
    assert len(seg.offset_index) < 20
    assert seg.largest_timestamp == 1000 + 190 + 2


def test_read_starts_at_batch_containing_offset(tmp_path):
    seg = _filled(tmp_path)
    data, first, nxt = seg.read(131, 10**6)
    assert first == 130 and nxt == 160
    assert decode_batches(data)[0].offset == 130
    data, first, nxt = seg.read(131, 1)  # min one message
    assert (first, nxt) == (130, 133) and len(list(iter_batches(data))) == 1
    assert seg.read(131, 1, min_one_message=False) == (b"", 130, 131)
    data, first, nxt = seg.read(100, 10**6, max_offset=106)
    assert nxt == 106
    assert seg.read(160, 100) is None


def test_reload_trusts_sane_indexes(tmp_path):
    seg = _filled(tmp_path)
    seg.flush()
    seg.close()
    again, truncated = LogSegment.load(tmp_path, 100, LogConfig(index_interval_bytes=400), 0, recover=False)
    assert truncated == 0 and again.next_offset == 160
    assert again.largest_timestamp == 1192
    assert again.read(150, 10**6)[1] == 148


def test_corrupted_index_is_rebuilt(tmp_path):
    seg = _filled(tmp_path)
    entries = list(zip(seg.offset_index.relative_offsets, seg.offset_index.positions))
    seg.close()
    idx = tmp_path / "00000000000000000100.index"
    raw = bytearray(idx.read_bytes())
    raw[-1] ^= 0x55  # last entry now points at garbage
    idx.write_bytes(bytes(raw))
    again, truncated = LogSegment.load(tmp_path, 100, LogConfig(index_interval_bytes=400), 0, recover=False)
    assert truncated == 0
    assert list(zip(again.offset_index.relative_offsets, again.offset_index.positions)) == entries
    assert again.read(150, 10**6)[1] == 148


def test_garbage_index_and_missing_time_index_are_rebuilt(tmp_path):
    seg = _filled(tmp_path)
    seg.close()
    (tmp_path / "00000000000000000100.index").write_bytes(os.urandom(13))
    (tmp_path / "00000000000000000100.timeindex").unlink()
    again, _ = LogSegment.load(tmp_path, 100, LogConfig(index_interval_bytes=400), 0, recover=False)
    assert again.next_offset == 160 and len(again.offset_index) > 2 and len(again.time_index) > 2
    assert again.find_offset_by_timestamp(1095, 100) == 130


def test_recover_truncates_torn_tail(tmp_path):
    seg = _filled(tmp_path, n=5)
    size = seg.size
    seg.close()
    with open(tmp_path / "00000000000000000100.log", "ab") as f:
        f.write(make_batch(2)[:30])
    again, truncated = LogSegment.load(tmp_path, 100, LogConfig(), 0, recover=True)
    assert truncated == 30 and again.size == size and again.next_offset == 115


def test_truncate_to_drops_whole_batch_containing_offset(tmp_path):
    seg = _filled(tmp_path)
    removed = seg.truncate_to(131)
    assert removed > 0 and seg.next_offset == 130
    assert seg.read(127, 10**6)[2] == 130
    assert seg.largest_timestamp == 1000 + 90 + 2
    _append(seg, make_batch(1, ts=5000), 130)
    assert seg.next_offset == 131 and seg.largest_timestamp == 5000


def test_find_offset_by_timestamp(tmp_path):
    seg = _filled(tmp_path)
    assert seg.find_offset_by_timestamp(0, 100) == 100
    assert seg.find_offset_by_timestamp(1011, 100) == 104  # batch 1: ts 1010, 1011, 1012
    assert seg.find_offset_by_timestamp(1192, 100) == 159
    assert seg.find_offset_by_timestamp(1193, 100) is None
    assert seg.find_offset_by_timestamp(0, 105) == 105


def test_roll_conditions(tmp_path):
    # 24 index bytes: 3 offset index entries, 2 time index entries
    cfg = LogConfig(segment_bytes=1000, segment_ms=100, segment_index_bytes=24, index_interval_bytes=0)
    seg = LogSegment.create(tmp_path, 0, cfg, now_ms=0)
    assert not seg.should_roll(10**6, 10**9, 0, 10**9)  # never roll an empty segment
    _append(seg, make_batch(1, ts=1000), 0)
    assert not seg.should_roll(10, 1050, 1, 0)
    assert seg.should_roll(1000, 1050, 1, 0)  # size
    assert seg.should_roll(10, 1101, 1, 0)  # age (record time since first batch)
    assert seg.should_roll(10, 1050, 2**31 + 5, 0)  # relative offset overflow
    _append(seg, make_batch(1, ts=1000), 1)
    assert not seg.should_roll(10, 1050, 2, 0)
    _append(seg, make_batch(1, ts=1000), 2)
    assert seg.offset_index.is_full and seg.should_roll(10, 1050, 3, 0)  # index full
