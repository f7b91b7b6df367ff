"""The leader's OffsetsForLeaderEpoch answer before its first append in a new epoch: the
epoch counts as started at the leader's LEO (Kafka's makeLeader), so a follower with the
previous leader's uncommitted tail truncates that tail only, never its whole log."""
from partitions.replication.fetcher_state import truncation_step
from partitions.replication.replica_state import leader_epoch_end_offset


def cached(epochs):
    """end_offset_for_epoch of a log whose cache holds `epochs` [(epoch, start)] and LEO 10."""
    def end_for(requested):
        if requested < 0 or not epochs:
            return -1, -1
        if requested == epochs[-1][0]:
            return requested, 10
        higher = [i for i, (e, _) in enumerate(epochs) if e > requested]
        if not higher:
            return -1, -1
        i = higher[0]
        return (epochs[i - 1][0] if i > 0 else requested), epochs[i][1]
    return end_for


def test_an_epoch_between_the_cache_and_the_leadership_ends_where_the_leadership_started():
    end_for = cached([(1, 0), (3, 6)])     # leader's log: epoch 3 up to its LEO 10; now leader at epoch 5
    assert leader_epoch_end_offset(4, 5, 10, 3, 10, end_for) == (3, 10)
    assert leader_epoch_end_offset(5, 5, 10, 3, 10, end_for) == (5, 10)
    assert leader_epoch_end_offset(3, 5, 10, 3, 10, end_for) == (3, 10)
    assert leader_epoch_end_offset(2, 5, 10, 3, 10, end_for) == (1, 6)
    assert leader_epoch_end_offset(6, 5, 10, 3, 10, end_for) == (-1, -1)


def test_an_empty_leader_log_answers_its_start_not_unknown():
    assert leader_epoch_end_offset(4, 5, 0, -1, 0, cached([])) == (4, 0)


def test_follower_with_the_old_leaders_tail_keeps_what_it_shares_with_the_new_leader():
    follower = cached([(1, 0), (3, 6), (4, 10)])  # it appended epoch 4 at 10.. as the old leader
    follower_leo = 15

    def follower_end_for(e):
        ep, end = follower(e)
        return ep, (follower_leo if ep == 4 else end)

    epoch, end = leader_epoch_end_offset(4, 5, 10, 3, 10, cached([(1, 0), (3, 6)]))
    assert (epoch, end) == (3, 10)
    assert truncation_step(follower_leo, follower_end_for, epoch, end) == (10, True)   # only the epoch-4 tail goes
    # before: the leader answered (-1, -1) and the follower truncated to 0
    assert truncation_step(follower_leo, follower_end_for, -1, -1) == (0, True)


def test_the_replica_core_answers_for_its_new_epoch_before_appending_in_it():
    from partitions.log import record_batch as rb
    from partitions.log.protocols import TopicPartition
    from partitions.replication.replica_state import LeaderAndIsr, ReplicaState
    from tests.unit.replication.fake_log import MemoryLog

    tp = TopicPartition("t", 0)
    core = ReplicaState(1)
    core.add_replica(tp, MemoryLog())
    core.apply_leader_and_isr(tp, LeaderAndIsr(1, 0, (1, 2), (1, 2), 0), now_ms=0)
    core.append_as_leader(tp, rb.build_batch([rb.Record(None, b"v", timestamp=1) for _ in range(3)]))
    core.apply_leader_and_isr(tp, LeaderAndIsr(1, 2, (1, 2), (1, 2), 1), now_ms=0)   # epoch 1 was broker 2's
    assert core.epoch_end_offset(tp, 1, leader_epoch=2) == (0, 3)
    assert core.epoch_end_offset(tp, 2, leader_epoch=2) == (2, 3)
