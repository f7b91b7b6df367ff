"""Segment preallocation: blocks reserved ahead of the active segment's end once it holds
SEGMENT_PREALLOCATE_AFTER_BYTES (none for the first appends), file length unchanged, reserve
released on roll / truncation / close, crash recovery unaffected."""
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


BATCH = make_batch(10, value=b"v" * 1000)   # ~10 KB: 7 of them pass SEGMENT_PREALLOCATE_AFTER_BYTES


def test_first_appends_of_a_segment_reserve_nothing_until_it_holds_the_threshold(fs, monkeypatch):
    calls = []
    real = segment_mod._fallocate

    def spy(fd, mode, offset, length):
        calls.append((offset, length))
        return real(fd, mode, offset, length)
    monkeypatch.setattr(segment_mod, "_fallocate", spy)
    logs = [Log.open(fs / f"t-{p}", LogConfig(), clock=ManualClock()) for p in range(50)]
    for lg in logs:   # the first append to each of many new partitions: no fallocate on the append path
        lg.append_as_leader(make_batch(10, value=b"v" * 100), 0)
    assert calls == []
    lg = logs[0]
    while lg._segments[-1].size + len(BATCH) < segment_mod.SEGMENT_PREALLOCATE_AFTER_BYTES:
        lg.append_as_leader(BATCH, 0)
    assert calls == []
    lg.append_as_leader(BATCH, 0)   # now it holds the threshold: blocks are reserved ahead
    assert len(calls) == 1
    seg = lg._segments[-1]
    assert _allocated(seg.log_path) >= seg.size + segment_mod.SEGMENT_PREALLOCATE_BYTES_MIN // 2


def test_active_segment_reserves_blocks_but_keeps_its_length(fs):
    lg = _open(fs)
    for _ in range(20):
        lg.append_as_leader(BATCH, 0)
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
        lg.append_as_leader(BATCH, 0)
    first = lg._segments[-1]
    lg.roll()
    assert _allocated(first.log_path) < first.size + 8192            # rolled: released
    for _ in range(8):
        lg.append_as_leader(BATCH, 0)
    active = lg._segments[-1]
    assert _allocated(active.log_path) > active.size + 8192
    lg.truncate_to(active.base_offset + 10)
    assert _allocated(active.log_path) < active.size + 8192          # truncated: released
    for _ in range(7):
        lg.append_as_leader(BATCH, 0)
    assert _allocated(active.log_path) > active.size + 8192          # and reserved again
    lg.close()
    assert _allocated(active.log_path) < os.path.getsize(active.log_path) + 8192


def test_crash_with_a_reserve_recovers_every_batch(fs):
    lg = _open(fs)
    pad = b"." * 2000
    for i in range(30):
        lg.append_as_leader(make_batch(2, value=f"r{i}".encode() + pad), 0)
    seg_path = lg._segments[-1].log_path
    assert _allocated(seg_path) > os.path.getsize(seg_path)
    lg.close_without_flush()   # a crash: nothing released, nothing trimmed
    lg2 = _open(fs)
    assert lg2.log_end_offset == 60
    assert [r.value for r in decode_batches(lg2.read(0, 1 << 20).records)][::2] == [
        f"r{i}".encode() + pad + b"0" for i in range(30)]
    lg2.append_as_leader(make_batch(1, value=b"after"), 0)
    assert lg2.log_end_offset == 61


def test_preallocate_false_reserves_nothing(fs):
    lg = _open(fs, preallocate=False)
    for _ in range(20):
        lg.append_as_leader(BATCH, 0)
    seg = lg._segments[-1]
    assert _allocated(seg.log_path) < seg.size + 8192


def test_failing_fallocate_turns_preallocation_off_and_appends_go_on(fs, monkeypatch):
    calls = []

    def refuse(fd, mode, offset, length):
        calls.append(length)
        return -1
    monkeypatch.setattr(segment_mod, "_fallocate", refuse)
    lg = _open(fs)
    for _ in range(10):
        lg.append_as_leader(BATCH, 0)
    assert len(calls) == 1          # tried once, then off for this segment
    assert lg.log_end_offset == 100
