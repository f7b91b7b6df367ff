"""OffsetIndex / TimeIndex: lookups, persistence, sanity checks, truncation."""
from __future__ import annotations

import pytest

from partitions.invariants import InvariantViolation
from partitions.log.index import OffsetIndex, TimeIndex


def test_offset_index_lookup_is_greatest_entry_at_or_below(tmp_path):
    idx = OffsetIndex(tmp_path / "0.index", 100)
    for rel, pos in [(0, 0), (10, 4096), (25, 8200)]:
        idx.append(rel, pos)
    assert idx.lookup(-5) == (-1, 0)
    assert idx.lookup(0) == (0, 0)
    assert idx.lookup(9) == (0, 0)
    assert idx.lookup(10) == (10, 4096)
    assert idx.lookup(24) == (10, 4096)
    assert idx.lookup(10**6) == (25, 8200)


def test_offset_index_rejects_non_increasing_entries(tmp_path):
    idx = OffsetIndex(tmp_path / "0.index", 100)
    idx.append(5, 100)
    with pytest.raises(InvariantViolation, match="must increase"):
        idx.append(5, 200)
    with pytest.raises(InvariantViolation, match="must increase"):
        idx.append(6, 100)
    assert idx.relative_offsets == [5] and idx.positions == [100]


def test_time_index_skips_an_older_timestamp_but_rejects_an_offset_going_back(tmp_path):
    idx = TimeIndex(tmp_path / "0.timeindex", 100)
    assert idx.maybe_append(1000, 5)
    assert not idx.maybe_append(1000, 9)  # max timestamp did not grow: nothing to index
    with pytest.raises(InvariantViolation, match="time index offsets must increase"):
        idx.maybe_append(2000, 5)
    assert idx.timestamps == [1000] and idx.relative_offsets == [5]


def test_offset_index_persists_and_reloads(tmp_path):
    idx = OffsetIndex(tmp_path / "0.index", 100)
    idx.append(0, 0)
    idx.append(3, 50)
    idx.flush()
    idx.close()
    again = OffsetIndex(tmp_path / "0.index", 100)
    assert again.load()
    assert again.lookup(4) == (3, 50) and len(again) == 2


@pytest.mark.parametrize("content, reason", [
    (b"\x00" * 7, "multiple"),
    (b"\x00\x00\x00\x05\x00\x00\x00\x10" + b"\x00\x00\x00\x04\x00\x00\x00\x20", "increasing"),
])
def test_offset_index_sanity_check_refuses_bad_files(tmp_path, content, reason):
    (tmp_path / "0.index").write_bytes(content)
    idx = OffsetIndex(tmp_path / "0.index", 100)
    assert not idx.load()
    assert reason in idx.corrupt_reason
    assert len(idx) == 0


def test_offset_index_truncation_and_fullness(tmp_path):
    idx = OffsetIndex(tmp_path / "0.index", 3)
    for rel, pos in [(0, 0), (10, 100), (20, 200)]:
        idx.append(rel, pos)
    assert idx.is_full
    idx.truncate_to_offset(10)
    assert idx.last_entry() == (0, 0) and not idx.is_full
    assert (tmp_path / "0.index").stat().st_size == 8
    idx.append(5, 60)
    idx.truncate_to_position(60)
    assert len(idx) == 1


def test_time_index_appends_only_growing_timestamps(tmp_path):
    idx = TimeIndex(tmp_path / "0.timeindex", 100)
    assert idx.maybe_append(100, 0)
    assert not idx.maybe_append(100, 5)
    assert not idx.maybe_append(90, 6)
    assert idx.maybe_append(200, 7)
    assert idx.lookup_before(100) == (-1, -1)
    assert idx.lookup_before(101) == (100, 0)
    assert idx.lookup_before(200) == (100, 0)
    assert idx.lookup_before(201) == (200, 7)
    idx.flush()
    idx.close()
    again = TimeIndex(tmp_path / "0.timeindex", 100)
    assert again.load() and again.last_entry() == (200, 7)
    again.truncate_to_offset(7)
    assert again.last_entry() == (100, 0)
