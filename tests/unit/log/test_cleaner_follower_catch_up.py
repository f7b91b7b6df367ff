"""A follower behind its leader catches up from the leader's *cleaned* segments (issue 24,
found by the chaos harness). The cleaner closed a group whose last batches were all
compacted away with one empty batch spanning them all ([451..480]); a follower whose log
ended inside that span (log end 480: it had 451..479 as separate batches) fetched from
480, got the batch starting at 451, and could never append it ("follower append starts at
offset 451 but the log end offset is 480"), so it looped for minutes, out of the ISR (and
__consumer_offsets followers the same). A cleaned segment must keep the leader's batch
boundaries: the trailing empty batch covers only the last dropped batch; the offsets
before it are a gap, which a compacted follower skips (Kafka's cleaned segments have gaps)."""
from __future__ import annotations

import pytest

from partitions.clock import ManualClock
from partitions.log.cleaner import LogCleaner
from partitions.log.config import LogConfig
from partitions.log.log import Log
from partitions.log.record_batch import Record, build_batch, iter_batches

pytestmark = pytest.mark.usefixtures("no_fsync")

CFG = LogConfig(cleanup_policy="compact", segment_bytes=600, delete_retention_ms=1000, min_cleanable_dirty_ratio=0.1)


def _catch_up(follower: Log, leader: Log) -> None:
    """The replica fetch loop in miniature: read from the follower's log end, append."""
    for _ in range(1000):
        if follower.log_end_offset == leader.log_end_offset:
            return
        data = leader.read(follower.log_end_offset, 10**6).records
        follower.append_as_follower(bytes(data))
    raise AssertionError("the follower made no progress")


def test_a_follower_at_any_batch_boundary_catches_up_from_cleaned_segments(tmp_path):
    clock = ManualClock(10_000)
    leader = Log.open(tmp_path / "leader" / "c-0", CFG, clean_shutdown=True, clock=clock)
    for i in range(60):   # one record per batch; the same 3 keys again and again
        leader.append_as_leader(build_batch([Record(b"k%d" % (i % 3), b"v%d" % i, timestamp=clock.now_ms())]), 0)
    leader.roll()
    leader.update_high_watermark(leader.log_end_offset)
    original = [bytes(raw) for _, raw in iter_batches(leader.read(0, 10**8).records)]
    assert len(original) == 60
    stats = LogCleaner(clock=clock).clean(leader)
    assert stats and stats.segments_cleaned > 1
    spans = [(h.base_offset, h.last_offset) for h, _ in iter_batches(leader.read(0, 10**8).records)]
    originals = {(h.base_offset, h.last_offset) for h, _ in iter_batches(b"".join(original))}
    assert set(spans) <= originals, f"cleaned batches not on the leader's batch boundaries: {spans}"
    for k in range(0, 60, 3):   # a follower that had the first k batches before the cleaning
        follower = Log.open(tmp_path / f"f{k}" / "c-0", CFG, clean_shutdown=True, clock=clock)
        if k:
            follower.append_as_follower(b"".join(original[:k]))
        _catch_up(follower, leader)
        assert follower.log_end_offset == 60
        follower.close()
