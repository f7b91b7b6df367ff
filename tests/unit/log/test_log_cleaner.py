"""Log cleaner (compaction): latest value per key survives, tombstones expire, offsets are
kept, crash-safe swap, and a property test against a dict replay."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from partitions.clock import ManualClock
from partitions.log.cleaner import CLEANER_CHECKPOINT, LogCleaner, read_cleaner_checkpoint
from partitions.log.config import LogConfig
from partitions.log.log import OFFSET_GAPS_MARKER, Log
from partitions.log.record_batch import Record, build_batch, decode_batches, iter_batches

# Many opens and rolls: fsync only costs time here (these test logic, not the disk).
pytestmark = pytest.mark.usefixtures("no_fsync")

CFG = LogConfig(cleanup_policy="compact", segment_bytes=400, delete_retention_ms=1000, min_cleanable_dirty_ratio=0.1)


def _open(path, clock, cfg=CFG, clean=True):
    return Log.open(path, cfg, clean_shutdown=clean, clock=clock)


def _put(lg, items, ts):
    """items: list of (key, value|None); one batch."""
    recs = [Record(k, v, timestamp=ts) for k, v in items]
    return lg.append_as_leader(build_batch(recs), 0)


def _all(lg):
    return [r for r in decode_batches(lg.read(lg.log_start_offset, 10**8).records) if r.offset >= lg.log_start_offset]


def _replay(records):
    state = {}
    for r in records:
        if r.value is None:
            state.pop(r.key, None)
        else:
            state[r.key] = r.value
    return state


def _fill(lg, clock, rounds=30):
    for i in range(rounds):
        _put(lg, [(b"k%d" % (i % 5), b"v%d" % i), (b"k%d" % ((i + 1) % 5), b"w%d" % i)], ts=clock.now_ms())
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)


def test_compaction_keeps_latest_value_per_key(tmp_path):
    clock = ManualClock(10_000)
    lg = _open(tmp_path / "c-0", clock)
    _fill(lg, clock)
    before = _all(lg)
    size = lg.size_bytes
    cleaner = LogCleaner(clock=clock)
    assert cleaner.needs_cleaning(lg)
    stats = cleaner.clean(lg)
    assert stats and not stats.aborted and stats.segments_cleaned > 1
    after = _all(lg)
    assert _replay(after) == _replay(before)
    assert len({r.key for r in after}) == len(after) == 5  # one record per key left
    assert lg.size_bytes < size / 3
    assert lg.log_end_offset == 60
    originals = {r.offset: r.value for r in before}
    assert all(originals[r.offset] == r.value for r in after)  # offsets are preserved
    assert read_cleaner_checkpoint(lg.dir) == 60 and (lg.dir / OFFSET_GAPS_MARKER).exists()
    assert not cleaner.needs_cleaning(lg)
    assert cleaner.clean(lg) is None


def test_reads_across_offset_gaps_and_appends_continue(tmp_path):
    clock = ManualClock(10_000)
    lg = _open(tmp_path / "c-0", clock)
    _fill(lg, clock)
    LogCleaner(clock=clock).clean(lg)
    got = lg.read(3, 10**6)
    assert got.records and got.first_offset >= 0
    assert all(r.offset >= 0 for r in decode_batches(got.records))
    assert lg.append_as_leader(build_batch([Record(b"k1", b"new")]), 0).first_offset == 60
    # a gap-ful log reopens (unclean) without losing anything
    data = lg.read(0, 10**8).records
    lg.close_without_flush()
    again = _open(tmp_path / "c-0", clock, cfg=LogConfig(segment_bytes=400), clean=False)  # policy changed
    assert again.read(0, 10**8).records == data


def test_tombstones_expire_after_delete_retention(tmp_path):
    clock = ManualClock(10_000)
    lg = _open(tmp_path / "c-0", clock)
    _put(lg, [(b"a", b"1"), (b"b", b"2")], ts=10_000)
    _put(lg, [(b"a", None)], ts=10_000)
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    cleaner = LogCleaner(clock=clock)
    cleaner.clean(lg, now_ms=10_500)  # first pass over it: the tombstone stays
    recs = _all(lg)
    assert [(r.key, r.value) for r in recs] == [(b"b", b"2"), (b"a", None)]
    assert not cleaner.needs_cleaning(lg, now_ms=11_400)  # horizon: first pass + delete.retention.ms
    assert cleaner.needs_cleaning(lg, now_ms=11_500)
    stats = cleaner.clean(lg, now_ms=11_500)
    assert stats.tombstones_removed == 1
    assert [(r.key, r.value) for r in _all(lg)] == [(b"b", b"2")]
    assert lg.log_end_offset == 3


def test_active_segment_and_records_above_high_watermark_are_not_cleaned(tmp_path):
    clock = ManualClock(10_000)
    lg = _open(tmp_path / "c-0", clock)
    for i in range(20):
        _put(lg, [(b"same", b"%d" % i)], ts=clock.now_ms())
    lg.update_high_watermark(5)
    LogCleaner(clock=clock).clean(lg)
    recs = _all(lg)
    assert [r.offset for r in recs if r.offset >= 5] == list(range(5, 20))
    assert [r.offset for r in recs if r.offset < 5] == [4]


def test_min_compaction_lag_protects_recent_segments(tmp_path):
    clock = ManualClock(10_000)
    cfg = LogConfig(cleanup_policy="compact", segment_bytes=400, min_compaction_lag_ms=5000)
    lg = _open(tmp_path / "c-0", clock, cfg)
    _fill(lg, clock)
    cleaner = LogCleaner(clock=clock)
    assert cleaner.cleanable_range(lg) == (0, 0)
    assert cleaner.clean(lg) is None
    clock.advance(6000)
    assert cleaner.clean(lg).segments_cleaned > 0


def test_crash_in_the_middle_of_a_swap_keeps_a_consistent_log(tmp_path):
    clock = ManualClock(10_000)
    lg = _open(tmp_path / "c-0", clock)
    _fill(lg, clock)
    before = _all(lg)
    cleaner = LogCleaner(clock=clock)
    plan, segments = cleaner.plan(lg)
    from partitions.log.cleaner import CleanerWorker

    worker = CleanerWorker(plan)
    end = worker.build_offset_map().end
    group = [s for s in segments if s.base_offset < end]
    res = worker.clean_group([r for r in plan.segments if r.base_offset < end])
    from partitions.log.segment import LogSegment

    cleaned = LogSegment(lg.dir, res.base_offset, CFG, clock.now_ms(), suffix=".cleaned")
    lg.close_without_flush()
    # crash after the cleaned log replaced the first segment, before the rest were deleted
    os.replace(cleaned.log_path, group[0].log_path)
    group[0].offset_index.path.unlink()
    (lg.dir / OFFSET_GAPS_MARKER).write_text("")
    again = _open(tmp_path / "c-0", clock, clean=False)
    after = _all(again)
    assert _replay(after) == _replay(before)
    assert again.log_end_offset == 60 and again.segment_count == 2
    assert not any(p.name.endswith(".cleaned") for p in again.dir.iterdir())


def test_leftover_cleaned_files_are_removed_and_ignored(tmp_path):
    clock = ManualClock(10_000)
    lg = _open(tmp_path / "c-0", clock)
    _fill(lg, clock, rounds=10)
    data = lg.read(0, 10**8).records
    lg.close_without_flush()
    (lg.dir / "00000000000000000000.log.cleaned").write_bytes(b"junk")
    (lg.dir / "00000000000000000000.index.cleaned").write_bytes(b"junk")
    again = _open(tmp_path / "c-0", clock, clean=False)
    assert again.read(0, 10**8).records == data
    assert not any(p.name.endswith(".cleaned") for p in again.dir.iterdir())


def test_compacted_topics_refuse_records_without_a_key(tmp_path):
    from partitions.log.errors import InvalidRecordError

    lg = _open(tmp_path / "c-0", ManualClock())
    with pytest.raises(InvalidRecordError, match="no key"):
        lg.append_as_leader(build_batch([Record(b"k", b"1"), Record(None, b"2")]), 0)
    assert lg.log_end_offset == 0
    lg.append_as_leader(build_batch([Record(None, b"ctl")], is_control=True), 0)  # control: exempt


def test_control_and_keyless_records_are_kept(tmp_path):
    clock = ManualClock(10_000)
    lg = _open(tmp_path / "c-0", clock, cfg=LogConfig(segment_bytes=400))
    lg.append_as_leader(build_batch([Record(None, b"keyless")], now_ms=1), 0)  # before the topic was compacted
    lg.update_config(CFG)
    lg.append_as_leader(build_batch([Record(b"ctl", b"x")], is_control=True, now_ms=1), 0)
    _put(lg, [(b"ctl", b"y")], ts=1)
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    LogCleaner(clock=clock).clean(lg)
    assert [(r.key, r.value) for r in _all(lg)] == [(None, b"keyless"), (b"ctl", b"x"), (b"ctl", b"y")]


_op = st.tuples(st.integers(0, 6), st.one_of(st.none(), st.binary(min_size=1, max_size=30)))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(_op, min_size=1, max_size=5), min_size=1, max_size=30),
    st.lists(st.integers(1, 30), max_size=3),
    st.integers(0, 2000),
    st.booleans(),
)
def test_compaction_matches_dict_replay(batches, clean_after, tombstone_age, reopen_unclean):
    root = Path(tempfile.mkdtemp(prefix="cleanprop"))
    try:
        clock = ManualClock(10_000)
        lg = _open(root / "c-0", clock)
        cleaner = LogCleaner(clock=clock, max_map_keys=4)
        written = []
        for i, ops in enumerate(batches):
            recs = [Record(b"k%d" % k, v, timestamp=clock.now_ms()) for k, v in ops]
            info = lg.append_as_leader(build_batch(recs), 0)
            written.extend((info.first_offset + j, r.key, r.value) for j, r in enumerate(recs))
            clock.advance(100)
            lg.update_high_watermark(lg.log_end_offset)
            if i + 1 in clean_after:
                lg.roll()
                cleaner.clean(lg, now_ms=clock.now_ms() + tombstone_age)
        lg.roll()
        lg.update_high_watermark(lg.log_end_offset)
        cleaner.clean(lg, now_ms=clock.now_ms() + tombstone_age)
        if reopen_unclean:
            lg.close_without_flush()
            lg = _open(root / "c-0", clock, clean=False)
        after = _all(lg)
        offsets = [r.offset for r in after]
        assert offsets == sorted(set(offsets))
        by_offset = {o: (k, v) for o, k, v in written}
        assert all(by_offset[r.offset] == (r.key, r.value) for r in after)  # nothing invented
        expected = _replay(Record(k, v, offset=o) for o, k, v in written)
        assert _replay(after) == expected
        # the latest record of every key is always there (tombstones may be gone)
        latest = {}
        for o, k, v in written:
            latest[k] = (o, v)
        present = {r.offset for r in after}
        for k, (o, v) in latest.items():
            assert o in present or v is None
        assert lg.log_end_offset == len(written)
        for h, _ in iter_batches(lg.read(0, 10**8).records):
            assert h.record_count <= h.last_offset_delta + 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_cleaner_thread_runs_while_the_owner_appends_and_applies_retention(tmp_path):
    import threading

    clock = ManualClock(10_000)
    cfg = LogConfig(cleanup_policy="compact,delete", segment_bytes=400, retention_bytes=2500,
                    min_cleanable_dirty_ratio=0.0)
    lg = _open(tmp_path / "c-0", clock, cfg)
    cleaner = LogCleaner(clock=clock)
    stop = threading.Event()
    errors = []
    passes = []

    def run():
        while not stop.is_set():
            try:
                stats = cleaner.clean(lg)
                if stats is not None:
                    passes.append(stats)
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
                return

    written = []
    t = threading.Thread(target=run)
    t.start()
    try:
        for i in range(400):
            key, value = b"k%d" % (i % 7), b"v%d" % i
            info = _put(lg, [(key, value)], ts=clock.now_ms())
            written.append(Record(key, value, offset=info.first_offset))
            lg.update_high_watermark(lg.log_end_offset)
            if i % 50 == 49:
                lg.apply_retention()
    finally:
        stop.set()
        t.join()
    assert not errors
    assert any(p.segments_cleaned for p in passes)
    assert lg.log_start_offset > 0  # retention deleted segments meanwhile
    cleaner.clean(lg)
    expected = _replay(r for r in written if r.offset >= lg.log_start_offset)
    assert _replay(_all(lg)) == expected
    lg.close_without_flush()
    assert _replay(_all(_open(tmp_path / "c-0", clock, cfg, clean=False))) == expected


def test_cleaner_io_is_throttled_to_io_max_bytes_per_second(tmp_path):
    import time as _time

    results = {}
    for limit in (-1, 10_000):
        clock = ManualClock(10_000)
        lg = _open(tmp_path / f"t{limit}-0", clock)
        _fill(lg, clock, rounds=60)
        t0 = _time.monotonic()
        stats = LogCleaner(clock=clock, io_max_bytes_per_second=limit).clean(lg)
        results[limit] = (stats, _time.monotonic() - t0)
        assert stats and not stats.aborted and len(_all(lg)) == 5
    free, _ = results[-1]
    assert free.throttled_s == 0
    slow, elapsed = results[10_000]
    io_bytes = slow.bytes_read + slow.bytes_written
    assert io_bytes > 5_000                           # enough IO for the limit to matter
    assert slow.throttled_s > 0 and elapsed >= 0.8 * io_bytes / 10_000
