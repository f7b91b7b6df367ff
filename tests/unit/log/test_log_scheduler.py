"""Background retention/compaction (log_scheduler.py) and the cleaner rules it relies on:
cleanup.policy per log, dirty ratio / max.compaction.lag.ms triggers, bounded dedupe map,
producer state across cleaning, cleaner state across truncation, the cleaner process."""
from __future__ import annotations

import time

import pytest

from partitions.clock import ManualClock
from partitions.log.cleaner import LogCleaner, read_cleaner_checkpoint, read_tombstone_horizons
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.log_manager import LogManager
from partitions.log.log_scheduler import LogScheduler
from partitions.log.record_batch import Record, build_batch, decode_batches

pytestmark = pytest.mark.usefixtures("no_fsync")

COMPACT = LogConfig(cleanup_policy="compact", segment_bytes=400, delete_retention_ms=1000,
                    min_cleanable_dirty_ratio=0.5, retention_ms=1000)


def _put(lg, items, ts, **kw):
    return lg.append_as_leader(build_batch([Record(k, v, timestamp=ts) for k, v in items], **kw), 0)


def _all(lg):
    return [r for r in decode_batches(lg.read(lg.log_start_offset, 10**8).records) if r.offset >= lg.log_start_offset]


def _view(lg):
    state = {}
    for r in _all(lg):
        if r.value is None:
            state.pop(r.key, None)
        else:
            state[r.key] = r.value
    return state


def _fill(lg, ts, rounds=30, keys=5):
    for i in range(rounds):
        _put(lg, [(b"k%d" % (i % keys), b"v%d" % i)], ts=ts)
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)


def _manager(tmp_path, clock):
    lm = LogManager([str(tmp_path / "logs")], LogConfig(segment_bytes=400), clock=clock)
    lm.open_all()
    return lm


def test_each_cleanup_policy_gets_its_jobs(tmp_path):
    clock = ManualClock(10_000)
    lm = _manager(tmp_path, clock)
    logs = {}
    for policy in ("delete", "compact", "compact,delete"):
        name = policy.replace(",", "_")
        lg = lm.get_or_create(name, 0, COMPACT.replace(cleanup_policy=policy))
        _fill(lg, ts=clock.now_ms())
        logs[policy] = lg
    sched = LogScheduler(lm, clock=clock)
    clock.advance(5000)  # past retention.ms for every closed segment
    done = sched.run_once()
    cleaned = {c["topic"] for c in done["cleaned"]}
    assert cleaned == {"compact", "compact_delete"}
    assert done["retention"]["segments_deleted"] > 0
    assert set(done["retention"]["logs"]) == {"delete-0", "compact_delete-0"}
    # compact only: nothing deleted by time, latest value per key kept
    assert logs["compact"].log_start_offset == 0 and len(_view(logs["compact"])) == 5
    # delete only: never compacted; every closed segment went, the active one stays
    assert logs["delete"].segment_count == 1 and read_cleaner_checkpoint(logs["delete"].dir) is None
    snap = sched.snapshot()
    assert snap["passes_total"] == 2 and snap["bytes_read_total"] > snap["bytes_written_total"] > 0
    assert snap["segments_deleted_by_retention_total"] == done["retention"]["segments_deleted"]
    assert snap["dirty_ratio"][("compact", 0)] == 0.0
    lm.close()


def test_dirty_ratio_and_max_compaction_lag_trigger_cleaning(tmp_path):
    clock = ManualClock(10_000)
    cfg = COMPACT.replace(min_cleanable_dirty_ratio=0.9, max_compaction_lag_ms=60_000)
    lg = Log.open(tmp_path / "c-0", cfg, clock=clock)
    _fill(lg, ts=clock.now_ms())
    cleaner = LogCleaner(clock=clock)
    cleaner.clean(lg)
    _fill(lg, ts=clock.now_ms(), rounds=6)  # a little dirt on a big clean part: ratio < 0.9
    assert 0 < cleaner.dirty_ratio(lg) < 0.9
    assert not cleaner.needs_cleaning(lg)
    clock.advance(61_000)  # the dirty segment is now older than max.compaction.lag.ms
    assert cleaner.needs_cleaning(lg)
    lg.update_config(cfg.replace(max_compaction_lag_ms=None, min_cleanable_dirty_ratio=0.1))
    assert cleaner.needs_cleaning(lg)  # and the ratio alone triggers with a low threshold


def test_small_dedupe_buffer_cleans_in_several_passes(tmp_path):
    clock = ManualClock(10_000)
    lg = Log.open(tmp_path / "c-0", COMPACT.replace(segment_bytes=4000), clock=clock)
    for i in range(200):
        _put(lg, [(b"key-%03d" % (i % 50), b"v%d" % i)], ts=clock.now_ms())
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    expected = _view(lg)
    cleaner = LogCleaner(clock=clock, dedupe_buffer_size_bytes=20 * 107)  # ~20 keys of 7 bytes
    passes = []
    while (stats := cleaner.clean(lg)) is not None:
        passes.append(stats)
        assert stats.map_keys <= 21 and not stats.aborted
    assert len(passes) >= 3
    assert read_cleaner_checkpoint(lg.dir) == 200
    assert _view(lg) == expected and len(_all(lg)) == 50


def test_idempotent_producer_state_survives_cleaning(tmp_path):
    clock = ManualClock(10_000)
    lg = Log.open(tmp_path / "c-0", COMPACT, clock=clock)
    pid, epoch = 7, 0
    last = None
    for seq in range(5):
        last = build_batch([Record(b"k", b"p%d" % seq, timestamp=clock.now_ms())], producer_id=pid,
                           producer_epoch=epoch, base_sequence=seq)
        lg.append_as_leader(last, 0)
    # other keys overwrite everything the producer wrote
    for i in range(20):
        _put(lg, [(b"k", b"other%d" % i)], ts=clock.now_ms())
    lg.roll()
    lg.update_high_watermark(lg.log_end_offset)
    stats = LogCleaner(clock=clock).clean(lg)
    assert stats.segments_cleaned and [r.value for r in _all(lg)] == [b"other19"]
    lg.close_without_flush()
    lg = Log.open(tmp_path / "c-0", COMPACT, clock=clock)  # producer state rebuilt from the log
    dup = lg.append_as_leader(last, 0)
    assert dup.duplicate and dup.first_offset == 4  # the retry is recognised
    nxt = lg.append_as_leader(build_batch([Record(b"k", b"p5")], producer_id=pid, producer_epoch=epoch,
                                          base_sequence=5), 0)
    assert not nxt.duplicate and nxt.first_offset == 25


def test_truncation_below_the_checkpoint_makes_new_records_dirty(tmp_path):
    clock = ManualClock(10_000)
    lg = Log.open(tmp_path / "c-0", COMPACT.replace(delete_retention_ms=0), clock=clock)
    _put(lg, [(b"a", b"1")], ts=clock.now_ms())
    _put(lg, [(b"a", None)], ts=clock.now_ms())
    _fill(lg, ts=clock.now_ms())
    cleaner = LogCleaner(clock=clock)
    cleaner.clean(lg)
    assert read_cleaner_checkpoint(lg.dir) == 32 and read_tombstone_horizons(lg.dir) == [(32, 10_000)]
    lg.truncate_to(1)  # a follower truncating to its leader's epoch end
    assert read_cleaner_checkpoint(lg.dir) <= 1
    assert all(end <= 1 for end, _ in read_tombstone_horizons(lg.dir))
    _put(lg, [(b"a", None)], ts=clock.now_ms())  # a new tombstone at offset 1
    _fill(lg, ts=clock.now_ms(), rounds=3)
    cleaner.clean(lg)
    assert (b"a", None) in [(r.key, r.value) for r in _all(lg)]  # first pass over it: kept


def test_a_pass_planned_before_a_truncation_does_not_swap(tmp_path):
    clock = ManualClock(10_000)
    lg = Log.open(tmp_path / "c-0", COMPACT, clock=clock)
    _fill(lg, ts=clock.now_ms())
    _fill(lg, ts=clock.now_ms())
    cleaner = LogCleaner(clock=clock)
    plan, segments = cleaner.plan(lg)
    from partitions.log.cleaner import CleanerWorker
    from partitions.log.segment import LogSegment

    worker = CleanerWorker(plan)
    worker.build_offset_map()
    lg.truncate_to(segments[1].next_offset + 1)  # segment 0 untouched, but the log changed
    res = worker.clean_group([plan.segments[0]])
    new = LogSegment(lg.dir, res.base_offset, COMPACT, clock.now_ms(), suffix=".cleaned")
    new.next_offset = res.next_offset
    assert not lg.replace_segments([segments[0]], new, generation=plan.generation)
    assert not any(p.name.endswith(".cleaned") for p in lg.dir.iterdir())
    # a pass whose worker reads a segment truncated underneath it aborts cleanly
    plan2, _ = cleaner.plan(lg)
    lg.truncate_to(segments[0].next_offset + 1)
    from partitions.log.errors import CorruptRecordError

    with pytest.raises(CorruptRecordError):
        CleanerWorker(plan2).build_offset_map()


def test_background_threads_compact_in_a_cleaner_process(tmp_path):
    lm = LogManager([str(tmp_path / "logs")], LogConfig(segment_bytes=400))
    lm.open_all()
    lg = lm.get_or_create("c", 0, COMPACT.replace(min_cleanable_dirty_ratio=0.1))
    now = int(time.time() * 1000)
    _fill(lg, ts=now, rounds=60)
    expected = _view(lg)
    sched = LogScheduler(lm, cleaner_process=True, cleaner_backoff_ms=50, retention_check_interval_ms=50)
    sched.start()
    try:
        deadline = time.monotonic() + 20
        while sched.snapshot()["passes_total"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sched.stop()
    assert not sched.running
    snap = sched.snapshot()
    assert snap["passes_total"] >= 1 and snap["passes_aborted_total"] == 0
    assert snap["retention_runs_total"] >= 1
    assert _view(lg) == expected and len(_all(lg)) == 5
    lm.close()


def test_each_tombstone_is_kept_delete_retention_after_its_own_first_pass(tmp_path):
    clock = ManualClock(10_000)
    lg = Log.open(tmp_path / "c-0", COMPACT.replace(delete_retention_ms=1000), clock=clock)
    cleaner = LogCleaner(clock=clock)
    _put(lg, [(b"a", b"1"), (b"a", None)], ts=clock.now_ms())
    _fill(lg, ts=clock.now_ms(), rounds=3)
    cleaner.clean(lg)  # first pass over the "a" tombstone at t=10000
    clock.set_ms(10_600)
    _put(lg, [(b"b", b"1"), (b"b", None)], ts=clock.now_ms())
    _fill(lg, ts=clock.now_ms(), rounds=3)
    cleaner.clean(lg)  # first pass over the "b" tombstone at t=10600
    assert [e for e, _ in read_tombstone_horizons(lg.dir)] == [5, 10]

    def tombstones():
        return sorted(r.key for r in _all(lg) if r.value is None)

    assert tombstones() == [b"a", b"b"]
    clock.set_ms(11_000)  # a's horizon reached, not b's
    assert cleaner.needs_cleaning(lg)
    stats = cleaner.clean(lg)
    assert stats.tombstones_removed == 1 and tombstones() == [b"b"]
    assert read_tombstone_horizons(lg.dir) == [(10, 10_600)]
    clock.set_ms(11_599)
    assert not cleaner.needs_cleaning(lg)
    clock.set_ms(11_600)
    cleaner.clean(lg)
    assert tombstones() == [] and read_tombstone_horizons(lg.dir) == []
