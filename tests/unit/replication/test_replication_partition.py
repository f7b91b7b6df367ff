"""Partition state: roles, epochs, high watermark = min LEO over ISR, ISR shrink candidates."""
import pytest

from partitions.errors import ErrorCode, KraftlogError
from partitions.replication.partition import Partition


def leader(isr=(1, 2, 3), leo=10, hw=0):
    p = Partition("t", 0, local_broker_id=1)
    assert p.make_leader(replicas=[1, 2, 3], isr=list(isr), leader_epoch=1, partition_epoch=1,
                         log_end_offset=leo, high_watermark=hw, now_ms=1000)
    return p


def test_single_replica_isr_hw_follows_local_leo():
    p = Partition("t", 0, local_broker_id=1)
    p.make_leader(replicas=[1], isr=[1], leader_epoch=0, partition_epoch=0,
                  log_end_offset=5, high_watermark=0, now_ms=0)
    assert p.is_leader and p.high_watermark == 5
    assert p.update_local_log_end_offset(9) is True
    assert p.high_watermark == 9


def test_hw_is_min_leo_over_isr_and_monotonic():
    p = leader()
    assert p.high_watermark == 0
    assert p.update_follower_fetch(2, 7, now_ms=1001) is False  # replica 3 still at -1
    assert p.update_follower_fetch(3, 4, now_ms=1001) is True
    assert p.high_watermark == 4
    assert p.update_follower_fetch(3, 2, now_ms=1002) is False  # never backwards
    assert p.high_watermark == 4
    assert p.update_follower_fetch(3, 10, now_ms=1003) is True
    assert p.high_watermark == 7


def test_out_of_isr_replica_does_not_hold_back_hw():
    p = leader(isr=(1, 2))
    p.update_follower_fetch(2, 10, now_ms=1001)
    assert p.high_watermark == 10
    p.update_follower_fetch(3, 10, now_ms=1001)
    assert p.caught_up_out_of_isr() == {3}


def test_lagging_follower_is_out_of_sync_after_lag_time():
    p = leader()
    p.update_follower_fetch(2, 10, now_ms=1500)  # caught up at 1500
    p.update_follower_fetch(3, 3, now_ms=1500)   # behind since 1000
    assert p.out_of_sync_replicas(now_ms=1000 + 30_001, replica_lag_time_max_ms=30_000) == {3}
    assert p.out_of_sync_replicas(now_ms=1000 + 20_000, replica_lag_time_max_ms=30_000) == set()


def test_stale_epoch_is_ignored():
    p = leader()
    assert not p.make_follower(replicas=[1, 2, 3], isr=[1, 2, 3], leader_id=2, leader_epoch=0,
                               partition_epoch=0, log_end_offset=10, high_watermark=0)
    assert p.is_leader


def test_follower_role_and_fetch_rejected():
    p = leader()
    assert p.make_follower(replicas=[1, 2, 3], isr=[2, 3], leader_id=2, leader_epoch=2,
                           partition_epoch=2, log_end_offset=10, high_watermark=4)
    assert not p.is_leader and p.high_watermark == 4
    with pytest.raises(KraftlogError) as e:
        p.update_follower_fetch(3, 5, now_ms=0)
    assert e.value.code is ErrorCode.NOT_LEADER_OR_FOLLOWER
    p.set_follower_high_watermark(8)
    assert p.high_watermark == 8


def test_not_enough_replicas():
    p = leader(isr=(1,))
    p.check_enough_replicas(1)
    with pytest.raises(KraftlogError) as e:
        p.check_enough_replicas(2)
    assert e.value.code is ErrorCode.NOT_ENOUGH_REPLICAS


def test_follower_keeping_pace_with_appends_stays_caught_up():
    p = leader(isr=(1, 2), leo=10)
    p.update_follower_fetch(2, 10, now_ms=1000)     # caught up
    for t in range(1, 40):
        p.update_local_log_end_offset(10 + t * 5)    # leader keeps appending
        # follower always fetches what the leader had at its previous fetch
        p.update_follower_fetch(2, 10 + (t - 1) * 5, now_ms=1000 + t * 1000)
    assert p.out_of_sync_replicas(now_ms=1000 + 40 * 1000, replica_lag_time_max_ms=30_000) == set()
    # a follower stuck at one offset falls out
    q = leader(isr=(1, 2), leo=10)
    q.update_follower_fetch(2, 10, now_ms=1000)
    for t in range(1, 40):
        q.update_local_log_end_offset(10 + t * 5)
        q.update_follower_fetch(2, 10, now_ms=1000 + t * 1000)
    assert q.out_of_sync_replicas(now_ms=1000 + 40 * 1000, replica_lag_time_max_ms=30_000) == {2}


def test_pending_isr_expansion_holds_the_hw_back_until_metadata_answers():
    """Kafka's maximal ISR (KIP-497): once the leader proposed adding 3, the controller may
    commit it (and later elect 3), so the HW must not pass 3's LEO before the metadata says."""
    p = leader(isr=(1, 2), leo=10)
    p.update_follower_fetch(2, 10, now_ms=1001)
    p.update_follower_fetch(3, 10, now_ms=1001)
    assert p.high_watermark == 10
    assert p.propose_isr_change(now_ms=1002, replica_lag_time_max_ms=30_000) == [1, 2, 3]
    assert p.maximal_isr() == [1, 2, 3]
    p.update_local_log_end_offset(15)
    p.update_follower_fetch(2, 15, now_ms=1003)
    assert p.high_watermark == 10          # 3 has not fetched 10..14
    p.update_follower_fetch(3, 12, now_ms=1004)
    assert p.high_watermark == 12
    # the metadata answers (new partition epoch, ISR without 3: refused): back to the ISR
    assert p.make_leader(replicas=[1, 2, 3], isr=[1, 2], leader_epoch=1, partition_epoch=2,
                         log_end_offset=15, high_watermark=12, now_ms=1005)
    assert p.pending_isr_additions == set() and p.high_watermark == 15


def test_rejected_proposal_releases_the_hw():
    p = leader(isr=(1, 2), leo=10)
    p.update_follower_fetch(2, 10, now_ms=1001)
    p.update_follower_fetch(3, 10, now_ms=1001)
    p.propose_isr_change(now_ms=1002, replica_lag_time_max_ms=30_000)
    p.update_local_log_end_offset(12)
    p.update_follower_fetch(2, 12, now_ms=1003)
    assert p.high_watermark == 10
    p.isr_change_rejected(partition_epoch=0)   # an older proposal: ignored
    assert p.high_watermark == 10
    p.isr_change_rejected(partition_epoch=1)
    assert p.maximal_isr() == [1, 2]
    assert p.maybe_increment_high_watermark() and p.high_watermark == 12


def test_a_replica_rejoins_only_once_it_has_the_leader_epochs_start():
    """A new leader's HW can lag what the old leader committed; a follower at that HW but
    below the offset where the new epoch began may lack acknowledged records: not in sync."""
    p = Partition("t", 0, local_broker_id=1)
    p.make_leader(replicas=[1, 2, 3], isr=[1, 2], leader_epoch=5, partition_epoch=5,
                  log_end_offset=100, high_watermark=60, now_ms=0)
    assert p.high_watermark == 60
    p.update_follower_fetch(3, 70, now_ms=1)
    assert p.caught_up_out_of_isr() == set()
    p.update_follower_fetch(3, 100, now_ms=2)
    assert p.caught_up_out_of_isr() == {3}


def test_hw_holds_while_the_isr_is_below_min_insync_replicas():
    """KIP-966: a replica that left the ISR while it was below min.insync.replicas must
    still have every committed record (the controller may elect it from the ELR)."""
    p = leader(isr=(1, 2))
    p.min_insync_replicas = 2
    p.update_follower_fetch(2, 10, now_ms=1001)
    assert p.high_watermark == 10
    assert p.make_leader(replicas=[1, 2, 3], isr=[1], leader_epoch=1, partition_epoch=2,
                         log_end_offset=15, high_watermark=10, now_ms=1002)
    assert p.update_local_log_end_offset(20) is False and p.high_watermark == 10
    p.update_follower_fetch(3, 20, now_ms=1003)
    p.update_follower_fetch(2, 20, now_ms=1003)            # caught up again since it left
    assert p.propose_isr_change(1003, 30_000) == [1, 2, 3]   # pending: does not move the HW
    assert p.update_local_log_end_offset(21) is False and p.high_watermark == 10
    assert p.make_leader(replicas=[1, 2, 3], isr=[1, 3], leader_epoch=1, partition_epoch=3,
                         log_end_offset=21, high_watermark=10, now_ms=1004)
    assert p.high_watermark == 20                          # back at min: min LEO over [1, 3]


def test_a_fetch_from_a_new_registration_of_the_follower_forgets_its_old_progress():
    """KIP-903: the leader's view of a follower must not mix two processes, and
    AlterPartition carries the broker epoch behind each proposed member."""
    p = leader(isr=(1, 2))
    p.update_follower_fetch(3, 5, now_ms=1002, broker_epoch=7)    # old process, leader LEO 10
    assert p.broker_epochs([1, 2, 3]) == {2: -1, 3: 7}
    p.update_local_log_end_offset(20)
    # the new process fetches at 10 (what the leader had at the old process's fetch): that
    # must not count as "caught up as of the previous fetch", which was another process's
    p.update_follower_fetch(3, 10, now_ms=1003, broker_epoch=9)
    s = p.remote_replicas[3]
    assert s.broker_epoch == 9 and s.log_end_offset == 10 and s.last_caught_up_time_ms == -1
    p.update_follower_fetch(3, 20, now_ms=1004, broker_epoch=9)
    assert s.last_caught_up_time_ms == 1004 and p.broker_epochs([1, 3]) == {3: 9}
