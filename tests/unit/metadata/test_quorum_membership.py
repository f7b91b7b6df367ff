"""Controller quorum membership: the pure decisions (quorum_membership.py) and the replicated
registrations in the metadata state machine."""
import pytest

from metadata_quorum import quorum_membership as qm
from metadata_quorum.records import LeaderChangeRecord, record_to_dict
from metadata_quorum.state_machine import MetadataStateMachine
from partitions.errors import ErrorCode, KraftlogError

A1, A2, A3, A4 = "h:9001", "h:9002", "h:9003", "h:9004"
CONFIG = {1: A1, 2: A2, 3: A3}


def reg(nid, addr, inc=None, state="voter"):
    return qm.registration(nid, addr, f"http://h:{8000 + nid}", inc or f"incarnation-{nid}", state)


def sm_at_epoch(epoch=3):
    sm = MetadataStateMachine("c")
    sm.apply([{"request_id": None, "controller_epoch": epoch,
               "records": [record_to_dict(LeaderChangeRecord(1, epoch))]}])
    return sm


def quorum(sm, op, epoch=3):
    return sm.apply([{"request_id": None, "controller_epoch": epoch, "quorum": op}])[0]


def test_registration_is_validated_with_what_to_fix():
    with pytest.raises(KraftlogError, match="raft_address must be HOST:PORT"):
        qm.registration(4, "nohost", "http://h:1", "abcdefgh")
    with pytest.raises(KraftlogError, match="incarnation"):
        qm.registration(4, A4, "http://h:1", "short")
    with pytest.raises(KraftlogError, match="unknown field"):
        qm.registration_from_body({"id": 4, "raft_address": A4, "url": "http://h:1", "incarnation": "abcdefgh",
                                   "extra": 1})
    assert qm.registration_from_body({"id": 4, "raft_address": A4, "url": "http://h:1/", "incarnation": "abcdefgh"}) \
        == {"id": 4, "raft_address": A4, "url": "http://h:1", "incarnation": "abcdefgh", "state": "adding"}


def test_one_change_at_a_time_and_duplicates_are_refused():
    controllers = {n: reg(n, a) for n, a in CONFIG.items()}
    change = {"op": "add", "id": 4, "epoch": 3}
    with pytest.raises(KraftlogError) as e:
        qm.decide_add(controllers, change, [A1, A2, A3], CONFIG, reg(5, "h:9005"))
    assert e.value.code is ErrorCode.POLICY_VIOLATION and e.value.extra["reason"] == "voter_change_in_progress"
    with pytest.raises(KraftlogError) as e:
        qm.decide_remove(controllers, change, [A1, A2, A3], CONFIG, 2, 1)
    assert e.value.extra["reason"] == "voter_change_in_progress"
    with pytest.raises(KraftlogError) as e:
        qm.decide_add(controllers, None, [A1, A2, A3], CONFIG, reg(2, A4))
    assert e.value.code is ErrorCode.DUPLICATE_VOTER
    with pytest.raises(KraftlogError) as e:
        qm.decide_add(controllers, None, [A1, A2, A3], CONFIG, reg(4, A3))
    assert e.value.code is ErrorCode.DUPLICATE_VOTER and "belongs to voter 3" in e.value.message
    qm.decide_add(controllers, None, [A1, A2, A3], CONFIG, reg(4, A4))   # allowed


def test_a_removed_incarnation_cannot_be_added_again():
    controllers = {1: reg(1, A1), 4: reg(4, A4, "old-incarnation", "removed")}
    with pytest.raises(KraftlogError) as e:
        qm.decide_add(controllers, None, [A1], CONFIG, reg(4, A4, "old-incarnation"))
    assert e.value.code is ErrorCode.INVALID_VOTER_KEY and "empty data directory" in e.value.message
    qm.decide_add(controllers, None, [A1], CONFIG, reg(4, A4, "new-incarnation"))


def test_remove_unknown_and_last_voter_are_refused():
    controllers = {n: reg(n, a) for n, a in CONFIG.items()}
    with pytest.raises(KraftlogError) as e:
        qm.decide_remove(controllers, None, [A1, A2, A3], CONFIG, 9, 1)
    assert e.value.code is ErrorCode.VOTER_NOT_FOUND and "[1, 2, 3]" in e.value.message
    with pytest.raises(KraftlogError) as e:
        qm.decide_remove(controllers, None, [A1], CONFIG, 1, 1)
    assert e.value.code is ErrorCode.POLICY_VIOLATION and e.value.extra["reason"] == "last_voter"
    # a voter of the initial configuration that has not registered is still found by address
    assert qm.decide_remove({}, None, [A1, A2], CONFIG, 2, 1) == A2


def test_the_state_machine_records_a_whole_add_and_refuses_a_second_change():
    sm = sm_at_epoch(3)
    offset = sm.image.offset
    assert quorum(sm, {"op": "register", "registration": reg(1, A1)}, epoch=0) == {"ok": True}
    assert quorum(sm, {"op": "begin_add", "registration": reg(4, A4, state="adding")})["ok"]
    assert sm.quorum_change == {"op": "add", "id": 4, "epoch": 3}
    second = quorum(sm, {"op": "begin_remove", "id": 1, "raft_address": A1})
    assert not second["ok"] and second["in_flight"]["id"] == 4
    assert sm.controllers[1]["state"] == "voter"
    assert quorum(sm, {"op": "end_add", "id": 4}) == {"ok": True}
    assert sm.quorum_change is None and sm.controllers[4]["state"] == "voter"
    assert sm.image.offset == offset   # quorum entries move no metadata offset
    # a deposed controller's late op is refused on every node alike
    assert quorum(sm, {"op": "begin_remove", "id": 1, "raft_address": A1}, epoch=2) == {"ok": False, "stale_epoch": True}
    # registrations survive a snapshot (a restart, a follower installing it)
    sm2 = MetadataStateMachine("c")
    sm2.restore(sm.snapshot())
    assert sm2.controllers == sm.controllers and sm2.quorum_change is None


def test_register_keeps_the_first_incarnation_and_says_when_it_differs():
    sm = sm_at_epoch()
    quorum(sm, {"op": "register", "registration": reg(2, A2, "first-incarnation")}, epoch=0)
    assert quorum(sm, {"op": "register", "registration": reg(2, A2, "first-incarnation")}, epoch=0)["noop"]
    wiped = quorum(sm, {"op": "register", "registration": reg(2, A2, "fresh-incarnation")}, epoch=0)
    assert wiped["conflict"] and wiped["registered"] == "first-incarnation"
    assert sm.controllers[2]["incarnation"] == "first-incarnation"
    problem = qm.own_registration_problem(sm.controllers, 2, "fresh-incarnation")
    assert "was lost or replaced" in problem and "kraftlog quorum remove-controller 2" in problem
    assert qm.own_registration_problem(sm.controllers, 2, "first-incarnation") is None


def test_remove_then_abort_and_remove_then_end():
    sm = sm_at_epoch()
    quorum(sm, {"op": "register", "registration": reg(3, A3)}, epoch=0)
    quorum(sm, {"op": "begin_remove", "id": 3, "raft_address": A3})
    assert sm.controllers[3]["state"] == "removing"
    quorum(sm, {"op": "abort", "id": 3})
    assert sm.controllers[3]["state"] == "voter" and sm.quorum_change is None
    quorum(sm, {"op": "begin_remove", "id": 3, "raft_address": A3})
    quorum(sm, {"op": "end_remove", "id": 3})
    assert sm.controllers[3]["state"] == "removed"
    assert "was removed" in qm.own_registration_problem(sm.controllers, 3, "incarnation-3")
    # an add that never reached raft is undone completely
    quorum(sm, {"op": "begin_add", "registration": reg(5, "h:9005", state="adding")})
    quorum(sm, {"op": "abort", "id": 5})
    assert 5 not in sm.controllers and sm.quorum_change is None


def test_a_new_active_controller_finishes_or_aborts_its_predecessors_change():
    controllers = {4: reg(4, A4, state="adding"), 2: reg(2, A2, state="removing")}
    add = {"op": "add", "id": 4, "epoch": 2}
    assert qm.reconcile(add, controllers, [A1, A2, A3, A4], 3) == {"op": "end_add", "id": 4}
    assert qm.reconcile(add, controllers, [A1, A2, A3], 3) == {"op": "abort", "id": 4}
    assert qm.reconcile(add, controllers, [A1, A2, A3], 2) is None   # its own: the handler is on it
    rem = {"op": "remove", "id": 2, "epoch": 2}
    assert qm.reconcile(rem, controllers, [A1, A3], 3) == {"op": "end_remove", "id": 2}
    assert qm.reconcile(rem, controllers, [A1, A2, A3], 3) == {"op": "abort", "id": 2}


def test_describe_names_voters_and_their_lag():
    controllers = {1: reg(1, A1), 4: reg(4, A4)}
    doc = qm.describe(controllers, None, [A1, A2, A4], CONFIG, 1, {A1: 50, A2: 47, A4: 50}, 50)
    assert doc["leader_id"] == 1
    assert [(v["id"], v["address"], v["lag"], v["state"]) for v in doc["voters"]] == [
        (1, A1, 0, "voter"), (2, A2, 3, "unregistered"), (4, A4, 0, "voter")]
    # a standby cannot know the lag
    assert {v["lag"] for v in qm.describe(controllers, None, [A1, A2], CONFIG, 1, {}, 50)["voters"]} == {None}
