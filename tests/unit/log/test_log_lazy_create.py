"""A new log creates its `.log` file only; the two index files are created by the first
flush (issue 25: creating 10,000 partitions made a broker create 30,000 segment and index
files, seconds of its log-creation threads competing with the event loop). A crash at any
point opens as before (an empty log, or the appended batches recovered, torn ones cut)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from logtest_helpers import make_batch

from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.log_manager import LogManager
from partitions.log.record_batch import decode_batches
from partitions.log.segment import segment_file_name

LOG0 = segment_file_name(0, ".log")
INDEX0 = segment_file_name(0, ".index")
TIMEINDEX0 = segment_file_name(0, ".timeindex")


def _values(lg: Log) -> list:
    return [r.value for r in decode_batches(lg.read(0, 1 << 20).records)]


def test_creating_logs_creates_one_file_per_log(tmp_path, clock):
    mgr = LogManager([tmp_path / "d"], LogConfig(), clock=clock)
    logs = mgr.create_logs([("t", p, None) for p in range(20)])
    for lg in logs:
        assert os.listdir(lg.dir) == [LOG0]
        assert lg.log_end_offset == 0 and lg.log_start_offset == 0
    mgr.close()
    assert all(INDEX0 not in os.listdir(lg.dir) for lg in logs)   # a clean shutdown of unwritten logs adds none


def test_the_first_flush_creates_the_index_files(tmp_path, clock):
    lg = Log.open(tmp_path / "t-0", LogConfig(), clock=clock)
    lg.append_as_leader(make_batch(3), 0)
    assert os.listdir(lg.dir) == [LOG0]   # the append adds no file
    lg.flush()
    assert {LOG0, INDEX0, TIMEINDEX0} <= set(os.listdir(lg.dir))
    lg.close()
    lg2 = Log.open(tmp_path / "t-0", LogConfig(), clock=clock, recovery_point=3, clean_shutdown=True)
    assert lg2.log_end_offset == 3 and _values(lg2) == [b"v0", b"v1", b"v2"]
    lg2.append_as_leader(make_batch(1, value=b"w"), 0)
    assert lg2.log_end_offset == 4


def test_crash_before_the_first_flush_opens_an_empty_log_without_a_rebuild(tmp_path, clock, caplog):
    lg = Log.open(tmp_path / "t-0", LogConfig(), clock=clock)
    lg.close_without_flush()
    with caplog.at_level(logging.WARNING):
        lg2 = Log.open(tmp_path / "t-0", LogConfig(), clock=clock)   # unclean
    assert lg2.log_end_offset == 0
    assert not [r for r in caplog.records if "rebuilding" in r.getMessage()]
    lg2.append_as_leader(make_batch(2), 0)
    assert _values(lg2) == [b"v0", b"v1"]


def test_empty_log_file_without_indexes_opens_empty_quietly(tmp_path, clock, caplog):
    d = tmp_path / "t-0"
    d.mkdir()
    (d / LOG0).write_bytes(b"")   # created by a first use, then a crash before any index flush
    with caplog.at_level(logging.WARNING):
        lg = Log.open(d, LogConfig(), clock=clock, clean_shutdown=True)
    assert lg.log_end_offset == 0
    assert not [r for r in caplog.records if "rebuilding" in r.getMessage()]
    lg.append_as_leader(make_batch(2), 0)
    lg.flush()
    lg.close()
    lg2 = Log.open(d, LogConfig(), clock=clock, recovery_point=2, clean_shutdown=True)
    assert _values(lg2) == [b"v0", b"v1"]


def test_crash_after_the_first_append_without_index_files_recovers_the_batches(tmp_path, clock):
    lg = Log.open(tmp_path / "t-0", LogConfig(), clock=clock)
    for i in range(4):
        lg.append_as_leader(make_batch(1, value=b"r%d-" % i), 0)
    lg.close_without_flush()
    for name in (INDEX0, TIMEINDEX0):   # crash: the index files were never flushed
        (tmp_path / "t-0" / name).unlink()
    lg2 = Log.open(tmp_path / "t-0", LogConfig(), clock=clock)   # unclean: recovered from the .log
    assert lg2.log_end_offset == 4
    assert _values(lg2) == [b"r0-0", b"r1-0", b"r2-0", b"r3-0"]
    assert lg2.read(2, 1 << 20).records   # the rebuilt index finds offsets
    lg2.close()
    lg3 = Log.open(tmp_path / "t-0", LogConfig(), clock=clock, recovery_point=4, clean_shutdown=True)
    assert _values(lg3) == [b"r0-0", b"r1-0", b"r2-0", b"r3-0"]


def test_torn_first_append_is_truncated_as_before(tmp_path, clock):
    lg = Log.open(tmp_path / "t-0", LogConfig(), clock=clock)
    lg.append_as_leader(make_batch(2), 0)
    lg.append_as_leader(make_batch(2, value=b"x"), 0)
    lg.close_without_flush()
    path = tmp_path / "t-0" / LOG0
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 5)   # the second batch torn
    lg2 = Log.open(tmp_path / "t-0", LogConfig(), clock=clock)
    assert lg2.log_end_offset == 2 and _values(lg2) == [b"v0", b"v1"]
    lg2.append_as_leader(make_batch(1, value=b"y"), 0)
    assert lg2.log_end_offset == 3


def test_roll_of_a_new_logs_segment_leaves_its_index_files(tmp_path, clock):
    lg = Log.open(tmp_path / "t-0", LogConfig(), clock=clock)
    lg.append_as_leader(make_batch(2), 0)
    lg.roll()
    assert {LOG0, INDEX0, TIMEINDEX0} <= set(os.listdir(lg.dir))
    lg.append_as_leader(make_batch(1), 0)
    lg.flush()
    lg.close()
    lg2 = Log.open(tmp_path / "t-0", LogConfig(), clock=clock, recovery_point=3, clean_shutdown=True)
    assert lg2.log_end_offset == 3 and len(lg2.segments) == 2


def test_opening_a_new_dir_lists_nothing_and_looks_for_no_file(tmp_path, clock, monkeypatch):
    """A dir Log.open has just created is empty: no listing, no checkpoint or snapshot probe."""
    looked: list = []
    real_iterdir, real_exists, real_read_text = Path.iterdir, Path.exists, Path.read_text

    def iterdir(self):
        looked.append(("iterdir", self))
        return real_iterdir(self)

    def exists(self, *a, **kw):
        looked.append(("exists", self))
        return real_exists(self, *a, **kw)

    def read_text(self, *a, **kw):
        looked.append(("read_text", self))
        return real_read_text(self, *a, **kw)
    monkeypatch.setattr(Path, "iterdir", iterdir)
    monkeypatch.setattr(Path, "exists", exists)
    monkeypatch.setattr(Path, "read_text", read_text)
    lg = Log.open(tmp_path / "t-0", LogConfig(), clock=clock)
    assert looked == []
    assert os.listdir(lg.dir) == [LOG0]


@pytest.mark.parametrize("start", [None, 7])
def test_a_new_dirs_log_has_the_state_of_a_full_load_of_an_empty_dir(tmp_path, clock, start):
    fresh = Log.open(tmp_path / "a-0", LogConfig(), clock=clock, log_start_offset=start, recovery_point=3)
    (tmp_path / "b-0").mkdir()   # exists: the full load
    full = Log.open(tmp_path / "b-0", LogConfig(), clock=clock, log_start_offset=start, recovery_point=3,
                    clean_shutdown=True)
    for lg in (fresh, full):
        lg.append_as_leader(make_batch(2), 4)
    state = [(lg.log_start_offset, lg.log_end_offset, lg.recovery_point, lg.high_watermark,
              lg.leader_epoch_cache.entries, lg.producer_state.producers, lg.transactions.ongoing,
              [s.base_offset for s in lg.segments], sorted(os.listdir(lg.dir))) for lg in (fresh, full)]
    assert state[0] == state[1]
