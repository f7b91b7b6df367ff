"""Leader epoch cache: assign, OffsetsForLeaderEpoch semantics, truncation, persistence."""
from __future__ import annotations

from partitions.log.leader_epoch_cache import LeaderEpochCache


def _cache(tmp_path, entries):
    return LeaderEpochCache(tmp_path / "leader-epoch-checkpoint", entries)


def test_assign_keeps_first_start_offset_of_an_epoch(tmp_path):
    c = _cache(tmp_path, [])
    assert c.assign(1, 0)
    assert not c.assign(1, 5)
    assert c.assign(3, 10)
    assert c.entries == [(1, 0), (3, 10)] and c.latest_epoch == 3
    assert not c.assign(-1, 20)  # batches without an epoch are ignored


def test_assign_removes_conflicting_entries(tmp_path):
    c = _cache(tmp_path, [(1, 0), (2, 10), (3, 20)])
    c.assign(4, 15)  # start offset below epoch 3's: that entry is gone
    assert c.entries == [(1, 0), (2, 10), (4, 15)]


def test_end_offset_for_epoch_kafka_semantics(tmp_path):
    c = _cache(tmp_path, [(2, 0), (4, 10), (7, 30)])
    leo = 42
    assert c.end_offset_for_epoch(7, leo) == (7, 42)  # latest epoch: log end
    assert c.end_offset_for_epoch(4, leo) == (4, 30)  # next higher epoch's start
    assert c.end_offset_for_epoch(5, leo) == (4, 30)  # unknown epoch: largest <= requested
    assert c.end_offset_for_epoch(1, leo) == (1, 0)  # below the first epoch
    assert c.end_offset_for_epoch(8, leo) == (-1, -1)  # above the latest
    assert c.end_offset_for_epoch(-1, leo) == (-1, -1)
    assert _cache(tmp_path, []).end_offset_for_epoch(3, leo) == (-1, -1)


def test_truncate_from_end_and_start(tmp_path):
    c = _cache(tmp_path, [(2, 0), (4, 10), (7, 30)])
    c.truncate_from_end(30)
    assert c.entries == [(2, 0), (4, 10)]
    c.truncate_from_start(12)
    assert c.entries == [(4, 12)]
    c.truncate_from_start(5)
    assert c.entries == [(4, 12)]


def test_persisted_in_kafka_checkpoint_format(tmp_path):
    c = _cache(tmp_path, [])
    c.assign(1, 0)
    c.assign(5, 100)
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "0\n2\n1 0\n5 100\n"
    again = LeaderEpochCache.load(tmp_path / "leader-epoch-checkpoint")
    assert again.entries == [(1, 0), (5, 100)] and again.loaded_ok


def test_malformed_file_loads_empty_and_flags_rebuild(tmp_path):
    (tmp_path / "leader-epoch-checkpoint").write_text("0\n3\n1 0\nbanana\n")
    c = LeaderEpochCache.load(tmp_path / "leader-epoch-checkpoint")
    assert c.entries == [] and not c.loaded_ok
