"""Eligible leader replicas and unclean recovery (KIP-966) in the pure controller.

The chaos bug these rules fix (issue 9, seeds 505 and 606): a record is committed with ISR
[3, 2, 1]; 3 is killed, 2 is cut off, so the ISR shrinks to [1]; 1 is killed and its tail
torn away; restarted, it was re-elected as the only ISR member with the shorter log and 3
(which had the record) truncated to it. Now 2 (which left the ISR while it was below
min.insync.replicas, so it holds every committed record) is in the ELR and leads, and a
broker restarting after an unclean shutdown never leads from a shrunken ISR on its own.
"""
from __future__ import annotations

from metadata_quorum.records import NO_LEADER
from tests.unit.metadata.metadata_harness import Harness


def _setup(min_isr="2"):
    h = Harness()
    h.create("t", 1, 3, {"min.insync.replicas": min_isr})
    p = h.image.partition("t", 0)
    return h, p.replicas


def _shrink(h, leader, isr):
    p = h.image.partition("t", 0)
    h.run(h.controller.alter_partition(h.image, leader, h.image.brokers[leader].epoch, "t", 0,
                                       p.leader_epoch, p.partition_epoch, list(isr)))


def _restart(h, b, clean, incarnation):
    """A new incarnation of broker b registers (after a clean or unclean shutdown)."""
    h.run(h.controller.register_broker(h.image, b, incarnation, f"http://h:{b}", None, h.now,
                                       clean_shutdown=clean))


def _both_eligible_restarted_unclean():
    """ISR [a] + ELR [b], every broker fenced, then a and b restart unclean and heartbeat:
    the partition awaits unclean recovery with last_known_elr {a, b}."""
    h, (a, b, c) = _setup()
    _shrink(h, a, [a, b])
    _shrink(h, a, [a])
    for x in (c, b, a):
        h.run(h.controller.fence_broker(h.image, x))
    _restart(h, b, clean=False, incarnation="inc-b-2")
    _restart(h, a, clean=False, incarnation="inc-a-2")
    h.heartbeat(a)
    h.heartbeat(b)
    return h, (a, b, c)


def _report(h, b, last_epoch, leo, partition_epoch=None):
    p = h.image.partition("t", 0)
    epoch = h.image.brokers[b].epoch
    rep = [{"topic": "t", "partition": 0, "last_epoch": last_epoch, "log_end_offset": leo,
            "partition_epoch": p.partition_epoch if partition_epoch is None else partition_epoch}]
    return h.run(h.controller.heartbeat(h.image, b, epoch, h.image.offset, h.now, log_reports=rep))


def test_replicas_leaving_an_isr_below_min_insync_join_the_elr_and_leave_it_when_it_grows_back():
    h, (a, b, c) = _setup()
    _shrink(h, a, [a, b])           # ISR 2 = min: c is not guaranteed to have what commits next
    assert h.image.partition("t", 0).elr == ()
    _shrink(h, a, [a])              # below min: the HW stops, b keeps every committed record
    p = h.image.partition("t", 0)
    assert p.isr == (a,) and p.elr == (b,)
    _shrink(h, a, [a, c])           # back to min: the HW moves again, b no longer guaranteed
    assert h.image.partition("t", 0).elr == ()


def test_the_seed_606_sequence_elects_the_elr_member_not_the_torn_last_isr_member():
    h, (a, b, c) = _setup()
    h.run(h.controller.fence_broker(h.image, c))          # c killed (lease / unreachable)
    assert h.image.partition("t", 0).isr == (a, b)
    _shrink(h, a, [a])                                    # b cut off: the leader drops it
    assert h.image.partition("t", 0).elr == (b,)
    h.run(h.controller.fence_broker(h.image, b))          # b's lease expires too
    h.run(h.controller.fence_broker(h.image, a))          # a killed, its tail torn
    p = h.image.partition("t", 0)
    assert p.leader == NO_LEADER and set(p.isr) | set(p.elr) == {a, b}
    _restart(h, a, clean=False, incarnation="inc-a-2")    # a: unclean restart
    p = h.image.partition("t", 0)
    assert a not in p.isr and a not in p.elr and p.elr == (b,) and p.leader == NO_LEADER
    h.heartbeat(a)                                        # a unfenced: still not a leader
    _restart(h, c, clean=False, incarnation="inc-c-2")
    h.heartbeat(c)
    assert h.image.partition("t", 0).leader == NO_LEADER  # c left the ISR at 2 = min: not eligible
    h.heartbeat(b)                                        # b comes back: the ELR member leads
    p = h.image.partition("t", 0)
    assert p.leader == b and p.isr == (b,) and p.elr == ()


def test_a_cleanly_restarted_last_isr_member_leads_again_at_once():
    h, (a, b, c) = _setup()
    _shrink(h, a, [a])          # ELR [b, c]
    h.run(h.controller.fence_broker(h.image, b))
    h.run(h.controller.fence_broker(h.image, c))
    h.run(h.controller.heartbeat(h.image, a, h.image.brokers[a].epoch, h.image.offset, h.now, True))
    assert h.image.partition("t", 0).leader == NO_LEADER   # controlled shutdown of the last member
    _restart(h, a, clean=True, incarnation="inc-a-2")
    h.heartbeat(a)
    p = h.image.partition("t", 0)
    assert p.leader == a and p.isr == (a,)


def test_unclean_restart_of_every_eligible_replica_waits_for_all_reports_then_elects_the_longest_log():
    h, (a, b, c) = _setup()
    _shrink(h, a, [a, b])
    _shrink(h, a, [a])                                     # ELR [b]
    for x in (c, b, a):
        h.run(h.controller.fence_broker(h.image, x))
    _restart(h, b, clean=False, incarnation="inc-b-2")     # b loses eligibility
    _restart(h, a, clean=False, incarnation="inc-a-2")     # and so does a: nobody is sure
    p = h.image.partition("t", 0)
    assert p.isr == () and p.elr == () and p.leader == NO_LEADER
    assert set(p.last_known_elr) == {a, b} and p.awaiting_recovery
    h.heartbeat(a)
    h.heartbeat(b)
    assert h.image.partition("t", 0).leader == NO_LEADER   # no reports yet
    _report(h, a, last_epoch=0, leo=90)                    # a's tail was torn
    assert h.image.partition("t", 0).leader == NO_LEADER   # b has not reported
    _report(h, b, last_epoch=0, leo=95, partition_epoch=0)  # a stale report (old partition epoch)
    assert h.image.partition("t", 0).leader == NO_LEADER
    _restart(h, c, clean=False, incarnation="inc-c-2")      # c (not eligible) cannot speed it up
    h.heartbeat(c)
    _report(h, c, last_epoch=0, leo=200)
    assert h.image.partition("t", 0).leader == NO_LEADER
    _report(h, b, last_epoch=0, leo=95)
    p = h.image.partition("t", 0)
    assert p.leader == b and p.isr == (b,) and not p.awaiting_recovery
    assert set(p.last_known_elr) == {a, b}      # compared again if b restarts unclean too


def test_recovery_compares_the_last_leader_epoch_before_the_log_end_offset():
    h, (a, b, c) = _both_eligible_restarted_unclean()
    _report(h, a, last_epoch=3, leo=50)
    _report(h, b, last_epoch=2, leo=80)        # longer, but its tail is from an older leader
    assert h.image.partition("t", 0).leader == a


def test_a_restarted_eligible_replica_must_report_in_its_new_registration():
    h, (a, b, c) = _both_eligible_restarted_unclean()
    _report(h, a, last_epoch=0, leo=90)
    _restart(h, a, clean=False, incarnation="inc-a-3")   # a restarts again: its report is void
    h.heartbeat(a)
    _report(h, b, last_epoch=0, leo=80)
    assert h.image.partition("t", 0).leader == NO_LEADER
    _report(h, a, last_epoch=0, leo=85)
    assert h.image.partition("t", 0).leader == a


def test_min_insync_one_keeps_the_classic_behaviour_with_recovery_for_unclean_restarts():
    h, (a, b, c) = _setup(min_isr="1")
    _shrink(h, a, [a])
    assert h.image.partition("t", 0).elr == ()          # the HW may move with ISR [a]: no ELR
    h.run(h.controller.fence_broker(h.image, a))
    assert h.image.partition("t", 0).isr == (a,)
    _restart(h, a, clean=False, incarnation="inc-a-2")
    p = h.image.partition("t", 0)
    assert p.isr == () and p.last_known_elr == (a,) and p.leader == NO_LEADER
    h.heartbeat(a)                  # unfenced: the only candidate leads, no report to compare
    p = h.image.partition("t", 0)
    assert p.leader == a and p.isr == (a,) and p.last_known_elr == ()


def test_unclean_leader_election_still_overrides_recovery():
    h = Harness()
    h.create("u", 1, 3, {"min.insync.replicas": "2", "unclean.leader.election.enable": "true"})
    a, b, c = h.image.partition("u", 0).replicas
    p = h.image.partition("u", 0)
    h.run(h.controller.alter_partition(h.image, a, h.image.brokers[a].epoch, "u", 0, p.leader_epoch,
                                       p.partition_epoch, [a]))
    h.run(h.controller.fence_broker(h.image, b))
    h.run(h.controller.register_broker(h.image, a, "inc-a-2", "http://h", None, 0, clean_shutdown=False))
    p = h.image.partition("u", 0)
    assert p.leader == c and p.isr == (c,)


def test_elr_and_last_known_elr_survive_a_metadata_snapshot():
    from metadata_quorum.image import MetadataImage

    h, (a, b, c) = _setup()
    _shrink(h, a, [a, b])
    _shrink(h, a, [a])
    img = MetadataImage.from_snapshot(h.image.to_snapshot())
    assert img.partition("t", 0) == h.image.partition("t", 0) and img.partition("t", 0).elr == (b,)
    for x in (c, b, a):
        h.run(h.controller.fence_broker(h.image, x))
    _restart(h, b, clean=False, incarnation="inc-b-2")
    img = MetadataImage.from_snapshot(h.image.to_snapshot())
    assert img.partition("t", 0) == h.image.partition("t", 0)
    assert img.partition("t", 0).isr == (a,) and img.partition("t", 0).last_known_elr == (b,)


def test_alter_partition_refuses_a_member_whose_fetches_came_from_an_earlier_registration():
    """KIP-903: the leader's view of a follower may come from the process before a restart."""
    from partitions.errors import ErrorCode, KraftlogError
    import pytest

    h, (a, b, c) = _setup()
    _shrink(h, a, [a, b])
    old_epoch = h.image.brokers[c].epoch
    _restart(h, c, clean=False, incarnation="inc-c-2")
    h.heartbeat(c)
    p = h.image.partition("t", 0)
    with pytest.raises(KraftlogError) as e:
        h.controller.alter_partition(h.image, a, h.image.brokers[a].epoch, "t", 0, p.leader_epoch,
                                     p.partition_epoch, [a, b, c], {str(c): old_epoch})
    assert e.value.code is ErrorCode.INELIGIBLE_REPLICA and "registered again" in str(e.value)
    h.run(h.controller.alter_partition(h.image, a, h.image.brokers[a].epoch, "t", 0, p.leader_epoch,
                                       p.partition_epoch, [a, b, c], {str(c): h.image.brokers[c].epoch}))
    assert h.image.partition("t", 0).isr == (a, b, c)


def test_members_with_the_same_log_as_the_recovered_leader_stay_eligible():
    """Chaos seed 606 after the KIP-966 change: b and c (killed together) both had the
    record; recovery elected b with ISR [b]; b was then torn and restarted: with c not
    eligible, b led again without the record and c truncated to it."""
    h, (a, b, c) = _both_eligible_restarted_unclean()
    _report(h, a, last_epoch=1, leo=732)
    _report(h, b, last_epoch=1, leo=732)
    p = h.image.partition("t", 0)
    assert p.leader == a and p.isr == (a,) and p.elr == (b,)
    h.run(h.controller.fence_broker(h.image, a))
    _restart(h, a, clean=False, incarnation="inc-a-3")     # the new leader, torn
    h.heartbeat(a)
    p = h.image.partition("t", 0)
    assert p.leader == b and p.isr == (b,) and a not in p.elr


def test_a_recovered_leader_restarting_unclean_again_is_compared_with_the_others_again():
    """Chaos seed 606, second run: recovery elected b over a (a's log shorter); b was torn
    right after. It must not lead alone again: a's log is compared with b's new one."""
    h, (a, b, c) = _both_eligible_restarted_unclean()
    _report(h, a, last_epoch=1, leo=731)
    _report(h, b, last_epoch=1, leo=732)
    assert h.image.partition("t", 0).leader == b and h.image.partition("t", 0).elr == ()
    _restart(h, b, clean=False, incarnation="inc-b-3")     # torn: lost offsets 730 and 731
    h.heartbeat(b)
    p = h.image.partition("t", 0)
    assert p.leader == NO_LEADER and set(p.last_known_elr) == {a, b}
    _report(h, b, last_epoch=1, leo=730)
    _report(h, a, last_epoch=1, leo=731)
    p = h.image.partition("t", 0)
    assert p.leader == a and p.isr == (a,)


def test_enabling_unclean_leader_election_unblocks_a_partition_waiting_for_lost_replicas():
    """The operator's way out when an eligible replica is gone for good (its disk died)."""
    h, (a, b, c) = _both_eligible_restarted_unclean()
    _report(h, a, last_epoch=0, leo=90)                  # b never reports (its disk is gone)
    assert h.image.partition("t", 0).leader == NO_LEADER
    assert h.controller.maintenance(h.image, h.now) == []
    h.run(h.controller.alter_configs(h.image, "t", {"unclean.leader.election.enable": "true"}))
    h.run(h.controller.maintenance(h.image, h.now))
    p = h.image.partition("t", 0)
    assert p.leader in (a, b, c) and p.isr == (p.leader,)
