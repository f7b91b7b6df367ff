"""SegmentFiles (issue 25): a broker hosts more partition replicas than it may open files,
so segment descriptors live in one bounded LRU and indexes hold none."""
from __future__ import annotations

import os

import pytest
from logtest_helpers import make_batch

import partitions.log.segment as segment
from partitions.clock import ManualClock
from partitions.log.config import LogConfig
from partitions.log.log_manager import LogManager


@pytest.fixture
def open_max():
    saved = segment.SEGMENT_FILES.open_max
    segment.set_open_segment_files_max(8)
    try:
        yield 8
    finally:
        segment.set_open_segment_files_max(saved)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_many_logs_hold_at_most_open_max_descriptors_and_read_back(tmp_path, open_max):
    m = LogManager([str(tmp_path / "d")], LogConfig(), clock=ManualClock())
    m.open_all()
    before = _fds()
    logs = m.create_logs([("t", p, None) for p in range(60)])
    for rnd in range(3):   # every log written in turn: each append evicts another log's file
        for p, lg in enumerate(logs):
            lg.append_as_leader(make_batch(2, value=f"<{p}-{rnd}>".encode()), 0)
    assert segment.SEGMENT_FILES.open_count <= open_max
    assert _fds() - before <= open_max   # 60 logs x 3 files each before: 180 descriptors
    for p, lg in enumerate(logs):
        data = lg.read(0, 1 << 20).records
        assert data.count(f"<{p}-2>".encode()) == 2 and lg.log_end_offset == 6
    m.close()
    assert segment.SEGMENT_FILES.open_count == 0


def test_flush_syncs_a_segment_whose_descriptor_was_evicted(tmp_path, open_max, monkeypatch):
    m = LogManager([str(tmp_path / "d")], LogConfig(), clock=ManualClock())
    m.open_all()
    first, *others = m.create_logs([("t", p, None) for p in range(open_max + 4)])
    first.append_as_leader(make_batch(3), 0)
    for lg in others:   # push the first log's descriptor out
        lg.append_as_leader(make_batch(1), 0)
    seg = first.active_segment
    assert seg._fd is None and seg._unsynced
    synced = []
    real = segment._fdatasync
    monkeypatch.setattr(segment, "_fdatasync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                           real(fd)))
    first.flush()
    assert synced == [str(seg.log_path)] and not seg._unsynced
    assert first.recovery_point == 3
    m.close()


def test_index_entries_wait_in_memory_and_reach_the_file_on_flush(tmp_path):
    idx = segment.OffsetIndex(tmp_path / "0.index", 100)
    idx.reset()   # the empty file, as a new segment makes it
    before = _fds()
    idx.append(0, 0)
    idx.append(10, 4096)
    assert _fds() == before and idx.path.read_bytes() == b""   # no descriptor held, nothing written yet
    idx.flush()
    assert len(idx.path.read_bytes()) == 16
    reloaded = segment.OffsetIndex(tmp_path / "0.index", 100)
    assert reloaded.load() and reloaded.relative_offsets == [0, 10] and reloaded.positions == [0, 4096]


def test_segment_file_creates_of_several_threads_overlap(tmp_path, monkeypatch):
    """Creating logs from several threads (the replica manager creates batches in parallel):
    the file creates run at the same time, not one by one under the descriptor pool's lock
    (issue 25: 10,000 creates per broker queued there)."""
    import threading

    inside = threading.Barrier(2, timeout=10)
    real_open = os.open

    def slow_create(path, flags, mode=0o777, *a, **kw):
        if flags & os.O_CREAT and str(path).endswith(".log"):
            inside.wait()   # both threads must be creating at once, or this times out
        return real_open(path, flags, mode, *a, **kw)
    monkeypatch.setattr(segment.os, "open", slow_create)
    m = LogManager([str(tmp_path / "d")], LogConfig(), clock=ManualClock())
    errors: list = []

    def create(p: int) -> None:
        try:
            m.create_logs([("t", p, None)])
        except Exception as exc:   # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=create, args=(p,)) for p in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert segment.SEGMENT_FILES.open_count >= 2
    logs = [m.get("t", p) for p in range(2)]
    for lg in logs:
        lg.append_as_leader(make_batch(1), 0)
        assert lg.log_end_offset == 1
