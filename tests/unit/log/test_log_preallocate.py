"""Segment preallocation: blocks reserved ahead of the active segment's end, file length
unchanged, reserve released on roll / truncation / close, crash recovery unaffected."""
from __future__ import annotations

import os

import pytest
from logtest_helpers import make_batch

from partitions.clock import ManualClock
import partitions.log.segment as segment_mod
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.record_batch import decode_batches

pytestmark = pytest.mark.skipif(segment_mod._fallocate is None, reason="no fallocate(2) on this platform")


def _allocated(path) -> int:
    return os.stat(path).st_blocks * 512


def _reserve_supported(tmp_path) -> bool:
    fd = os.open(tmp_path / "probe", os.O_RDWR | os.O_CREAT)
    try:
        return segment_mod._fallocate(fd, segment_mod._FALLOC_FL_KEEP_SIZE, 0, 1 << 20) == 0
    finally:
        os.close(fd)


@pytest.fixture
def fs(tmp_path):
    if not _reserve_supported(tmp_path):
        pytest.fail(f"the filesystem under {tmp_path} refuses fallocate(KEEP_SIZE): preallocation untestable")
    return tmp_path


def _open(path, **cfg):
    return Log.open(path / "t-0", LogConfig(**cfg), clock=ManualClock())


def test_active_segment_reserves_blocks_but_keeps_its_length(fs):
    lg = _open(fs)
    for _ in range(20):
        lg.append_as_leader(make_batch(10, value=b"v" * 100), 0)
    seg = lg._segments[-1]
    assert os.path.getsize(seg.log_path) == seg.size          # length = data, as before
    assert _allocated(seg.log_path) >= seg.size + segment_mod.SEGMENT_PREALLOCATE_BYTES_MIN // 2
    assert _allocated(seg.log_path) <= seg.size + segment_mod.SEGMENT_PREALLOCATE_BYTES_MAX + 8192


def test_reserve_grows_with_the_segment_up_to_the_max(fs):
    lg = _open(fs)
    big = make_batch(100, value=b"x" * 1000)   # ~100 KB a batch
    for _ in range(300):                       # ~30 MB
        lg.append_as_leader(big, 0)
    seg = lg._segments[-1]
    ahead = _allocated(seg.log_path) - seg.size
    assert segment_mod.SEGMENT_PREALLOCATE_BYTES_MAX // 4 < ahead <= segment_mod.SEGMENT_PREALLOCATE_BYTES_MAX + 8192


def test_roll_truncate_and_close_release_the_reserve(fs):
    lg = _open(fs)
    for _ in range(20):
        lg.append_as_leader(make_batch(10, value=b"v" * 100), 0)
    first = lg._segments[-1]
    lg.roll()
    assert _allocated(first.log_path) < first.size + 8192            # rolled: released
    lg.append_as_leader(make_batch(10, value=b"v" * 100), 0)
    lg.append_as_leader(make_batch(10, value=b"v" * 100), 0)
    active = lg._segments[-1]
    assert _allocated(active.log_path) > active.size + 8192
    lg.truncate_to(active.base_offset + 10)
    assert _allocated(active.log_path) < active.size + 8192          # truncated: released
    lg.append_as_leader(make_batch(10, value=b"v" * 100), 0)
    assert _allocated(active.log_path) > active.size + 8192          # and reserved again
    lg.close()
    assert _allocated(active.log_path) < os.path.getsize(active.log_path) + 8192


def test_crash_with_a_reserve_recovers_every_batch(fs):
    lg = _open(fs)
    for i in range(30):
        lg.append_as_leader(make_batch(2, value=f"r{i}".encode()), 0)
    seg_path = lg._segments[-1].log_path
    assert _allocated(seg_path) > os.path.getsize(seg_path)
    lg.close_without_flush()   # a crash: nothing released, nothing trimmed
    lg2 = _open(fs)
    assert lg2.log_end_offset == 60
    assert [r.value for r in decode_batches(lg2.read(0, 1 << 20).records)][::2] == [f"r{i}0".encode() for i in range(30)]
    lg2.append_as_leader(make_batch(1, value=b"after"), 0)
    assert lg2.log_end_offset == 61


def test_preallocate_false_reserves_nothing(fs):
    lg = _open(fs, preallocate=False)
    for _ in range(20):
        lg.append_as_leader(make_batch(10, value=b"v" * 100), 0)
    seg = lg._segments[-1]
    assert _allocated(seg.log_path) < seg.size + 8192


def test_failing_fallocate_turns_preallocation_off_and_appends_go_on(fs, monkeypatch):
    calls = []

    def refuse(fd, mode, offset, length):
        calls.append(length)
        return -1
    monkeypatch.setattr(segment_mod, "_fallocate", refuse)
    lg = _open(fs)
    for _ in range(5):
        lg.append_as_leader(make_batch(10, value=b"v" * 100), 0)
    assert len(calls) == 1          # tried once, then off for this segment
    assert lg.log_end_offset == 50
