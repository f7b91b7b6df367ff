"""Crash consistency: torn tails at every byte, flipped bytes, corrupt indexes, garbage files.

A crash is simulated by closing file handles without flushing and then damaging files;
the log is reopened uncleanly and must hold exactly the intact prefix, with appends
continuing at the right offset.
"""
from __future__ import annotations

import os
import shutil

import pytest
from logtest_helpers import make_batch

from partitions.clock import ManualClock
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.record_batch import decode_batches, iter_batches

CFG = LogConfig(segment_bytes=400, index_interval_bytes=100)

# These tests reopen logs hundreds of times; they test recovery logic, not the disk.
pytestmark = pytest.mark.usefixtures("no_fsync")


def _build_template(path, batches=12, per=2):
    lg = Log.open(path, CFG, clock=ManualClock())
    for i in range(batches):
        lg.append_as_leader(make_batch(per, ts=1000 + i, value=b"val%d-" % i), 1 + i // 4)
    data = lg.read(0, 10**7).records
    positions = []
    for h, mv in iter_batches(data):
        positions.append((h.base_offset, h.next_offset, h.size))
    last_seg = lg.segments[-1]
    seg_info = (last_seg.log_path.name, last_seg.base_offset, last_seg.size)
    lg.close_without_flush()
    return data, positions, seg_info


def _batches_before(data: bytes, offset: int) -> bytes:
    out = b""
    for h, mv in iter_batches(data):
        if h.base_offset >= offset:
            break
        out += bytes(mv)
    return out


def _check_prefix(lg: Log, data: bytes, intact_end: int):
    assert lg.log_end_offset == intact_end
    expected = _batches_before(data, intact_end)
    got = lg.read(0, 10**7).records if intact_end > 0 else b""
    assert got == expected
    info = lg.append_as_leader(make_batch(1), 99)
    assert info.first_offset == intact_end
    assert [r.offset for r in decode_batches(lg.read(0, 10**7).records)] == list(range(intact_end + 1))


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash")
    data, positions, seg_info = _build_template(root / "t-0")
    return root / "t-0", data, positions, seg_info


def _copy(template_dir, tmp_path, name="t-0"):
    dst = tmp_path / name
    shutil.copytree(template_dir, dst)
    return dst


def test_torn_last_batch_at_every_byte_boundary(template, tmp_path):
    src, data, positions, (seg_name, seg_base, seg_size) = template
    last_base, last_next, last_size = positions[-1]
    last_pos = seg_size - last_size
    for cut in range(last_pos, seg_size):
        d = tmp_path / f"cut{cut}" / "t-0"
        shutil.copytree(src, d)
        os.truncate(d / seg_name, cut)
        lg = Log.open(d, CFG, recovery_point=0, clean_shutdown=False, clock=ManualClock())
        _check_prefix(lg, data, last_base)
        assert lg.leader_epoch_cache.latest_epoch == 99
        lg.close_without_flush()
        shutil.rmtree(d.parent)


def test_torn_tail_is_recovered_from_the_recovery_point_segment(template, tmp_path):
    src, data, positions, (seg_name, seg_base, seg_size) = template
    d = _copy(src, tmp_path)
    last_base = positions[-1][0]
    os.truncate(d / seg_name, seg_size - 3)
    lg = Log.open(d, CFG, recovery_point=seg_base, clean_shutdown=False, clock=ManualClock())
    _check_prefix(lg, data, last_base)


@pytest.mark.parametrize("field_range", ["length", "covered_by_crc", "base_offset"])
def test_flipped_bytes_in_last_batch_truncate_exactly_that_batch(template, tmp_path, field_range):
    src, data, positions, (seg_name, seg_base, seg_size) = template
    last_base, _, last_size = positions[-1]
    last_pos = seg_size - last_size
    # bytes 12-15 (leader epoch) are not covered by the CRC in Kafka's layout either
    offsets = {"length": range(8, 12), "covered_by_crc": range(16, last_size), "base_offset": range(0, 8)}[field_range]
    for i in offsets:
        d = tmp_path / f"flip{i}" / "t-0"
        shutil.copytree(src, d)
        with open(d / seg_name, "r+b") as f:
            f.seek(last_pos + i)
            b = f.read(1)
            f.seek(last_pos + i)
            f.write(bytes([b[0] ^ 0x10]))
        lg = Log.open(d, CFG, clean_shutdown=False, clock=ManualClock())
        _check_prefix(lg, data, last_base)
        lg.close_without_flush()
        shutil.rmtree(d.parent)


def test_corruption_in_a_middle_segment_drops_it_and_everything_after(template, tmp_path):
    src, data, positions, _ = template
    d = _copy(src, tmp_path)
    segs = sorted(p for p in d.iterdir() if p.suffix == ".log")
    assert len(segs) >= 3
    victim = segs[1]
    victim_base = int(victim.stem)
    with open(victim, "r+b") as f:
        f.seek(40)
        b = f.read(1)
        f.seek(40)
        f.write(bytes([b[0] ^ 0xFF]))
    lg = Log.open(d, CFG, clean_shutdown=False, clock=ManualClock())
    assert lg.segment_count == 2
    _check_prefix(lg, data, victim_base)
    assert not (d / segs[2].name).exists()


def test_clean_shutdown_skips_recovery_but_still_checks_indexes(template, tmp_path):
    src, data, positions, (seg_name, _, _) = template
    d = _copy(src, tmp_path)
    index = d / seg_name.replace(".log", ".index")
    index.write_bytes(b"\xff" * 16)  # nonsense entries
    lg = Log.open(d, CFG, clean_shutdown=True, recovery_point=positions[-1][1], clock=ManualClock())
    assert lg.log_end_offset == positions[-1][1]
    assert lg.read(0, 10**7).records == data
    for h_base, _, _ in positions:
        assert lg.read(h_base, 1).first_offset == h_base


def test_clean_open_of_a_torn_segment_falls_back_to_recovery(template, tmp_path):
    src, data, positions, (seg_name, _, seg_size) = template
    d = _copy(src, tmp_path)
    os.truncate(d / seg_name, seg_size - 1)
    lg = Log.open(d, CFG, clean_shutdown=True, clock=ManualClock())
    _check_prefix(lg, data, positions[-1][0])


def test_garbage_files_never_crash_open(tmp_path):
    d = tmp_path / "t-0"
    lg = Log.open(d, CFG, clock=ManualClock())
    for i in range(6):
        lg.append_as_leader(make_batch(2), 0)
    data = lg.read(0, 10**6).records
    lg.close()
    (d / "notes.txt").write_text("hello")
    (d / "123.log").write_bytes(b"xx")
    (d / "0000000000000000000x.log").write_bytes(b"xx")
    (d / "00000000000000099999.index").write_bytes(os.urandom(40))  # orphan index
    (d / "00000000000000000000.log.cleaned").write_bytes(os.urandom(100))
    (d / "00000000000000000000.log.swap").write_bytes(os.urandom(100))
    (d / "00000000000000000007.log.deleted").write_bytes(os.urandom(100))
    (d / "leader-epoch-checkpoint.tmp").write_text("0\n")
    (d / "00000000000000000500.log").write_bytes(os.urandom(3000))  # garbage segment after the real one
    (d / "00000000000000000600.log").mkdir()  # a directory with a segment's name
    lg = Log.open(d, CFG, clean_shutdown=False, clock=ManualClock())
    assert lg.read(0, 10**6).records == data
    assert lg.append_as_leader(make_batch(1), 0).first_offset == 12
    names = {p.name for p in d.iterdir()}
    assert "00000000000000099999.index" not in names
    assert not any(n.endswith((".cleaned", ".swap", ".deleted", ".tmp")) for n in names)


def test_random_garbage_segment_recovers_to_empty(tmp_path):
    d = tmp_path / "t-0"
    d.mkdir()
    (d / "00000000000000000000.log").write_bytes(os.urandom(5000))
    (d / "00000000000000000000.index").write_bytes(os.urandom(64))
    for clean in (False, True):
        lg = Log.open(d, CFG, clean_shutdown=clean, clock=ManualClock())
        assert lg.log_end_offset == 0 and lg.size_bytes == 0
        lg.close()
