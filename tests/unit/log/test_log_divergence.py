"""Leader/follower divergence: a follower finds the divergence point with the leader's
epoch cache (OffsetsForLeaderEpoch), truncates there and copies the leader's log."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st
import pytest
from logtest_helpers import make_batch

from partitions.clock import ManualClock
from partitions.log.config import LogConfig
from partitions.log.log import Log

pytestmark = pytest.mark.usefixtures("no_fsync")


def _sync(follower: Log, leader: Log) -> None:
    """The replica fetcher's job in its simplest form: Kafka's (KIP-279) truncation loop
    on OffsetsForLeaderEpoch answers, then fetch until caught up."""
    for _ in range(100):
        epoch = follower.latest_epoch
        if epoch < 0:
            break
        leader_epoch, leader_end = leader.end_offset_for_epoch(epoch)
        if leader_end < 0:  # the leader knows no epoch <= ours: nothing is shared
            follower.truncate_to(0)
            break
        follower_epoch, follower_end = follower.end_offset_for_epoch(leader_epoch)
        if follower_epoch != leader_epoch:
            # we do not know the leader's epoch: cut back to our epochs below it and ask again
            follower.truncate_to(min(follower_end, follower.log_end_offset))
            continue
        follower.truncate_to(min(follower_end, leader_end, follower.log_end_offset))
        break
    else:  # pragma: no cover
        raise AssertionError("truncation loop did not converge")
    while follower.log_end_offset < leader.log_end_offset:
        data = leader.read(follower.log_end_offset, 10**6)
        follower.append_as_follower(data.records)


def test_follower_with_a_divergent_tail_truncates_and_catches_up(tmp_path):
    leader = Log.open(tmp_path / "l-0", LogConfig(segment_bytes=300), clock=ManualClock())
    follower = Log.open(tmp_path / "f-0", LogConfig(segment_bytes=300), clock=ManualClock())
    for _ in range(3):
        leader.append_as_leader(make_batch(2), 1)
    _sync(follower, leader)
    # follower was leader in epoch 2 and wrote a tail nobody else has
    follower.append_as_leader(make_batch(3, value=b"lost"), 2)
    # meanwhile the real leader (epoch 3) wrote different records at those offsets
    leader.append_as_leader(make_batch(1, value=b"kept"), 3)
    leader.append_as_leader(make_batch(4, value=b"kept"), 3)
    assert leader.end_offset_for_epoch(2) == (1, 6)
    _sync(follower, leader)
    assert follower.read(0, 10**6).records == leader.read(0, 10**6).records
    assert follower.leader_epoch_cache.entries == leader.leader_epoch_cache.entries == [(1, 0), (3, 6)]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 3), st.booleans()), min_size=1, max_size=25))
def test_any_history_of_leader_changes_converges(tmp_path_factory, steps):
    root = tmp_path_factory.mktemp("div")
    a = Log.open(root / "a-0", LogConfig(segment_bytes=300), clock=ManualClock())
    b = Log.open(root / "b-0", LogConfig(segment_bytes=300), clock=ManualClock())
    epoch = 0
    leader, follower = a, b
    for switch, n, replicate in steps:
        if switch:
            # the follower becomes leader in a new epoch; it first catches up only partly
            epoch += 1
            leader, follower = follower, leader
        leader.append_as_leader(make_batch(n), epoch)
        if replicate:
            _sync(follower, leader)
    _sync(follower, leader)
    assert follower.read(0, 10**6).records == leader.read(0, 10**6).records
    assert follower.log_end_offset == leader.log_end_offset
