"""Each replication bug the simulation found, replayed deterministically on the product code.

The simulation (tests/sim) finds these with random faults and pins them with a switch of its
own (`SimConfig.incarnation_gate`, `isr_broker_epochs`, `report_unclean_shutdowns`, the
maximal ISR behind `check_hw_within_isr`). Here the fix itself is pinned: three brokers'
replica cores (`ReplicaState`, the code `ReplicaManager` runs) over in-memory logs, with
the pure controller and metadata state machine where the bug crosses into the controller.
Replication is done by hand, step by step, the way the fetcher does it.
"""
from __future__ import annotations

import pytest

from partitions.errors import ErrorCode, KraftlogError
from partitions.log import record_batch as rb
from partitions.log.protocols import TopicPartition
from partitions.replication.replica_state import LeaderAndIsr, ReplicaState, leader_and_isr
from tests.unit.metadata.metadata_harness import Harness
from tests.unit.replication.fake_log import MemoryLog

TP = TopicPartition("t", 0)
LAG_MS = 500


def batch(n: int = 1) -> bytes:
    return rb.build_batch([rb.Record(None, b"v", timestamp=1) for _ in range(n)])


class Broker:
    """One broker process: its replica core and its log."""

    def __init__(self, broker_id: int, log: MemoryLog | None = None, min_isr: int = 2) -> None:
        self.id = broker_id
        self.core = ReplicaState(broker_id, min_isr_for=lambda topic: min_isr)
        self.log = log or MemoryLog()
        self.part = self.core.add_replica(TP, self.log)

    def apply(self, state: LeaderAndIsr, now_ms: int = 0, registered: bool = True):
        return self.core.apply_leader_and_isr(TP, state, now_ms=now_ms, registered=registered)


def fetch(leader: Broker, follower: Broker, now_ms: int = 0, broker_epoch: int = -1, max_bytes: int = 1 << 20):
    """One replica fetch round trip: the leader records the follower's LEO and answers with
    data and its HW; the follower appends and adopts it. Returns the leader's Effects."""
    res, effects = leader.core.replica_read(TP, replica_id=follower.id, offset=follower.log.log_end_offset,
                                            leader_epoch=leader.part.leader_epoch, max_bytes=max_bytes,
                                            now_ms=now_ms, broker_epoch=broker_epoch)
    follower.core.follower_append(TP, follower.part.leader_epoch, res.records, res.high_watermark,
                                  res.log_start_offset)
    return effects


def catch_up(leader: Broker, *followers: Broker, now_ms: int = 0, broker_epoch: int = -1) -> None:
    """Each follower copies the leader's log, then fetches again (which tells the leader its LEO)."""
    for f in followers:
        fetch(leader, f, now_ms, broker_epoch)
        fetch(leader, f, now_ms, broker_epoch)


def three_brokers(min_isr: int = 2) -> tuple[Broker, Broker, Broker, LeaderAndIsr]:
    brokers = Broker(1, min_isr=min_isr), Broker(2, min_isr=min_isr), Broker(3, min_isr=min_isr)
    state = LeaderAndIsr(1, 0, (1, 2, 3), (1, 2, 3), 0)
    for b in brokers:
        b.apply(state)
    return (*brokers, state)


def test_seed4_the_hw_waits_for_a_member_of_a_pending_isr_expansion():
    """Simulation seed 4 (tests/sim/test_regression_isr_expansion_hw.py): the controller has
    committed ISR {L, Y, X} but L has not heard; L must not commit (and acknowledge) with Y
    alone while X lags, since X may be elected (Kafka's maximal ISR, KIP-497)."""
    leader, x, y, _ = three_brokers()
    leader.apply(LeaderAndIsr(1, 0, (1, 2, 3), (1, 3), 1))           # X (broker 2) left the ISR
    leader.core.append_as_leader(TP, batch(5))
    catch_up(leader, y, x, now_ms=10)                                 # X caught up again
    assert leader.part.high_watermark == 5
    changes = leader.core.isr_changes(20, lambda topic: LAG_MS)
    assert [isr for _, isr in changes] == [[1, 3, 2]]                 # proposed; no answer yet
    _, effects = leader.core.append_as_leader(TP, batch(5))
    waiter = object()
    leader.core.add_ack_waiter(TP, waiter, leader.log.log_end_offset - 1)
    fetch(leader, y, now_ms=30)
    effects = fetch(leader, y, now_ms=30)                             # Y has all 10, X only 5
    assert leader.part.high_watermark == 5 and waiter not in effects.completed
    fetch(leader, x, now_ms=40)
    effects = fetch(leader, x, now_ms=40)
    assert leader.part.high_watermark == 10 and effects.completed == [waiter]
    assert leader.log.high_watermark == 10                            # the log's copy follows


def test_seed71_a_restarted_broker_does_not_take_up_its_previous_incarnations_leadership():
    """Simulation seed 71 (SimConfig.incarnation_gate; chaos
    test_regression_restarted_leader_truncates_followers): a leader restarts with a torn
    tail; until the metadata holds its new registration, the leadership in it belongs to the
    previous process. Taking it up would serve a shorter log under the old epoch, so the
    followers would truncate committed records to it."""
    leader, f2, f3, state = three_brokers()
    leader.core.append_as_leader(TP, batch(4))
    catch_up(leader, f2, f3)
    assert leader.part.high_watermark == 4
    torn = MemoryLog()                                   # the restarted process: 2 records survived
    torn.append_as_leader(batch(2), 0)
    restarted = Broker(1, torn)
    effects = restarted.apply(state, registered=False)
    assert not restarted.part.is_leader and effects.wake_fetches == []
    with pytest.raises(KraftlogError) as err:            # followers fetching from it are refused,
        restarted.core.replica_read(TP, replica_id=2, offset=4, leader_epoch=0, max_bytes=100, now_ms=0)
    assert err.value.code is ErrorCode.NOT_LEADER_OR_FOLLOWER
    with pytest.raises(KraftlogError):                   # and so is a truncation point
        restarted.core.epoch_end_offset(TP, 0, leader_epoch=0)
    assert f2.log.log_end_offset == 4                    # nothing told them to truncate
    restarted.apply(LeaderAndIsr(2, 1, (1, 2, 3), (2, 3), 1), registered=True)
    assert restarted.part.leader_id == 2                 # the new metadata: it follows


def _cluster_metadata() -> tuple[Harness, int, int, int]:
    h = Harness()
    h.create("t", 1, 3, {"min.insync.replicas": "2"})
    reg = h.image.partition("t", 0)
    return (h, *reg.replicas)


def test_seed222_a_restarted_follower_does_not_rejoin_the_isr_on_its_previous_process_progress():
    """Simulation seed 222 (SimConfig.isr_broker_epochs, KIP-903): a follower out of the ISR
    restarts with a torn tail. The leader still holds what its previous process fetched and
    proposes it; the proposal names that registration's broker epoch and the controller
    refuses it. Once the new process fetches, the leader forgets the old progress."""
    h, lid, fid, oid = _cluster_metadata()
    reg = h.image.partition("t", 0)
    leader, follower, other = Broker(lid), Broker(fid), Broker(oid)
    for b in (leader, follower, other):
        b.apply(leader_and_isr(reg))
    old_epoch = h.image.brokers[fid].epoch
    reg_shrunk = h.run(h.controller.alter_partition(h.image, lid, h.image.brokers[lid].epoch, "t", 0,
                                                    reg.leader_epoch, reg.partition_epoch, [lid, oid]))
    assert reg_shrunk
    reg = h.image.partition("t", 0)
    leader.apply(leader_and_isr(reg))
    leader.core.append_as_leader(TP, batch(6))
    catch_up(leader, other, now_ms=10, broker_epoch=h.image.brokers[oid].epoch)
    catch_up(leader, follower, now_ms=20, broker_epoch=old_epoch)   # the old process had all 6
    assert leader.part.high_watermark == 6
    # the follower crashes, loses its tail, registers again (unclean) before it fetches
    h.run(h.controller.register_broker(h.image, fid, "inc-new", f"http://h:{fid}", None, h.now,
                                       clean_shutdown=False))
    h.heartbeat(fid)
    [(part, new_isr)] = leader.core.isr_changes(30, lambda topic: LAG_MS)
    assert fid in new_isr and part.broker_epochs(new_isr)[fid] == old_epoch
    with pytest.raises(KraftlogError) as err:
        h.controller.alter_partition(h.image, lid, h.image.brokers[lid].epoch, "t", 0, reg.leader_epoch,
                                     reg.partition_epoch, new_isr, {str(k): v for k, v in
                                                                    part.broker_epochs(new_isr).items()})
    assert err.value.code is ErrorCode.INELIGIBLE_REPLICA
    leader.part.isr_change_rejected(reg.partition_epoch)   # the broker's answer to the refusal
    # the new process fetches from its shorter (here: empty) log: not caught up, not proposed
    leader.core.replica_read(TP, replica_id=fid, offset=0, leader_epoch=reg.leader_epoch,
                                      max_bytes=0, now_ms=40, broker_epoch=h.image.brokers[fid].epoch)
    assert leader.part.remote_replicas[fid].log_end_offset == 0
    assert leader.core.isr_changes(50, lambda topic: LAG_MS) == []


def test_seed29_the_hw_holds_while_the_isr_is_below_min_insync_replicas():
    """Simulation seed 29 (SimConfig.report_unclean_shutdowns; chaos seeds 505/606, KIP-966):
    the last ISR member must not commit on its own, so the replicas that left the ISR (now
    ELR) still hold every committed record when it crashes with a torn tail; acks=all
    waiters answer NOT_ENOUGH_REPLICAS_AFTER_APPEND at once instead of timing out."""
    leader, f2, f3, _ = three_brokers(min_isr=2)
    leader.core.append_as_leader(TP, batch(3))
    catch_up(leader, f2, f3)
    assert leader.part.high_watermark == 3
    _, effects = leader.core.append_as_leader(TP, batch(2))
    waiter = object()
    leader.core.add_ack_waiter(TP, waiter, 4)
    effects = leader.apply(LeaderAndIsr(1, 0, (1, 2, 3), (1,), 2))  # ISR shrank to the leader alone
    assert [(w, e.code) for w, e in effects.failed] == [(waiter, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)]
    leader.core.append_as_leader(TP, batch(2))
    assert leader.part.high_watermark == 3 and leader.log.high_watermark == 3
    with pytest.raises(KraftlogError) as err:                       # acks=all is refused up front
        leader.core.append_as_leader(TP, batch(), required_min_isr=2)
    assert err.value.code is ErrorCode.NOT_ENOUGH_REPLICAS
    # the ELR members hold every committed record (HW 3), whatever the leader's tail loses
    assert f2.log.log_end_offset >= leader.part.high_watermark and f3.log.log_end_offset >= 3


def test_seed29_a_broker_restarting_unclean_leaves_every_isr_so_it_never_leads_alone():
    """The controller side of seed 29: the torn last ISR member registers with
    clean_shutdown=False and leaves the ISR; an ELR member (with every committed record) leads."""
    h, a, b, c = _cluster_metadata()
    for isr in ([a, b], [a]):
        reg = h.image.partition("t", 0)
        h.run(h.controller.alter_partition(h.image, a, h.image.brokers[a].epoch, "t", 0, reg.leader_epoch,
                                           reg.partition_epoch, isr))
    assert h.image.partition("t", 0).elr == (b,)    # left while the ISR was below min.insync
    h.run(h.controller.fence_broker(h.image, a))
    h.run(h.controller.register_broker(h.image, a, "inc-a-2", f"http://h:{a}", None, h.now,
                                       clean_shutdown=False))
    h.heartbeat(a)
    reg = h.image.partition("t", 0)
    assert a not in reg.isr and a not in reg.elr and reg.leader in (b, c)
