"""The reassignment planner (metadata_quorum/reassignment_planner.py), pure: hard goals always
(RF kept, rack awareness, capacity, removed brokers empty), soft goals where they can be met
(replicas and leaders per broker within 1, bytes within 10%), few moves, determinism, and
Kafka's reassignment JSON with only the partitions that change."""
import ast
import collections
import math
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metadata_quorum.reassignment_planner import (BrokerSpec, assignment_from_metadata, brokers_from_metadata,
                                                  bytes_balanced, plan_assignment, plan_reassignment)
from partitions.errors import ErrorCode, KraftlogError

ROOT = pathlib.Path(__file__).resolve().parents[3]


def replica_counts(assignment, brokers):
    c = {b: 0 for b in brokers}
    for reps in assignment.values():
        for b in reps:
            c[b] = c.get(b, 0) + 1
    return c


def leader_counts(assignment, brokers):
    c = {b: 0 for b in brokers}
    for reps in assignment.values():
        c[reps[0]] = c.get(reps[0], 0) + 1
    return c


def spread(counts):
    return max(counts.values()) - min(counts.values())


def moved_replicas(before, after):
    return sum(len(set(after[tp]) - set(before[tp])) for tp in before)


def round_robin(n_partitions, rf, brokers, topic="t"):
    return {(topic, p): [brokers[(p + k) % len(brokers)] for k in range(rf)] for p in range(n_partitions)}


def test_adding_a_broker_moves_the_fewest_replicas_onto_it_and_balances_leaders():
    current = round_robin(12, 2, [1, 2, 3])          # 8 replicas each, 4 leaders each
    brokers = [BrokerSpec(i) for i in (1, 2, 3, 4)]
    target = plan_assignment(current, brokers, mode="add-brokers", broker_ids=[4])
    assert replica_counts(target, [1, 2, 3, 4]) == {1: 6, 2: 6, 3: 6, 4: 6}
    assert moved_replicas(current, target) == 6       # exactly what broker 4 must receive
    assert spread(leader_counts(target, [1, 2, 3, 4])) <= 1
    assert all(sorted(target[tp]) != sorted([]) and len(target[tp]) == 2 for tp in target)


def test_the_output_is_kafkas_reassignment_json_of_the_changed_partitions_only():
    current = round_robin(12, 2, [1, 2, 3])
    doc = plan_reassignment(current, [BrokerSpec(i) for i in (1, 2, 3, 4)], mode="add-brokers", broker_ids=[4])
    assert doc["version"] == 1 and doc["partitions"]
    for e in doc["partitions"]:
        assert set(e) == {"topic", "partition", "replicas"}
        assert e["replicas"] != current[(e["topic"], e["partition"])]
    # a balanced cluster: nothing to do
    assert plan_reassignment(current, [BrokerSpec(i) for i in (1, 2, 3)]) == {"version": 1, "partitions": []}


def test_removed_brokers_end_empty_and_an_rf_breaking_removal_is_refused():
    current = round_robin(9, 3, [1, 2, 3, 4])
    brokers = [BrokerSpec(i) for i in (1, 2, 3, 4)]
    target = plan_assignment(current, brokers, mode="remove-brokers", broker_ids=[2])
    assert replica_counts(target, [1, 3, 4]).get(2, 0) == 0 and all(2 not in r for r in target.values())
    assert all(len(r) == 3 and len(set(r)) == 3 for r in target.values())
    with pytest.raises(KraftlogError) as e:
        plan_assignment(current, brokers, mode="remove-brokers", broker_ids=[2, 3])
    assert e.value.code is ErrorCode.INVALID_REPLICATION_FACTOR and "replication factor 3" in e.value.message


def test_unknown_broker_ids_and_topics_are_refused_with_what_to_do():
    current = round_robin(3, 1, [1, 2])
    brokers = [BrokerSpec(1), BrokerSpec(2)]
    with pytest.raises(KraftlogError, match=r"unknown broker id\(s\) \[7\]"):
        plan_assignment(current, brokers, mode="add-brokers", broker_ids=[7])
    with pytest.raises(KraftlogError, match="unknown topic"):
        plan_assignment(current, brokers, topics=["nope"])
    with pytest.raises(KraftlogError, match="needs broker ids"):
        plan_assignment(current, brokers, mode="remove-brokers")


def test_rack_awareness_is_repaired_and_kept():
    # brokers 1,2 in rack a; 3,4 in rack b; every partition starts with both replicas in rack a
    brokers = [BrokerSpec(1, "a"), BrokerSpec(2, "a"), BrokerSpec(3, "b"), BrokerSpec(4, "b")]
    current = {("t", p): [1, 2] if p % 2 else [2, 1] for p in range(6)}
    target = plan_assignment(current, brokers)
    rack = {b.id: b.rack for b in brokers}
    assert all(len({rack[b] for b in r}) == 2 for r in target.values())
    assert spread(replica_counts(target, [1, 2, 3, 4])) <= 1


def test_no_broker_ends_over_its_capacity():
    brokers = [BrokerSpec(1, capacity_bytes=250), BrokerSpec(2, capacity_bytes=1000), BrokerSpec(3)]
    current = {("t", p): [1] for p in range(4)}          # 400 bytes on broker 1
    sizes = {tp: 100 for tp in current}
    target = plan_assignment(current, brokers, sizes=sizes)
    load = collections.Counter()
    for tp, r in target.items():
        for b in r:
            load[b] += sizes[tp]
    assert load[1] <= 250
    with pytest.raises(KraftlogError, match="capacity"):
        plan_assignment(current, [BrokerSpec(1, capacity_bytes=100), BrokerSpec(2, capacity_bytes=100)], sizes=sizes)


def test_bytes_balance_within_ten_percent_by_swapping_when_counts_are_already_even():
    # two brokers, counts even (4 each) but broker 1 holds all the big partitions
    current = {("t", p): [1 if p < 4 else 2] for p in range(8)}
    sizes = {("t", p): (1000 if p < 4 else 100) for p in range(8)}
    target = plan_assignment(current, [BrokerSpec(1), BrokerSpec(2)], sizes=sizes)
    load = {1: 0, 2: 0}
    for tp, r in target.items():
        load[r[0]] += sizes[tp]
    assert bytes_balanced(load), load
    assert replica_counts(target, [1, 2]) == {1: 4, 2: 4}


def test_topics_limit_which_partitions_move():
    current = {**round_robin(6, 1, [1], topic="a"), **round_robin(6, 1, [1], topic="b")}
    target = plan_assignment(current, [BrokerSpec(1), BrokerSpec(2)], topics=["b"])
    assert all(target[tp] == current[tp] for tp in current if tp[0] == "a")
    assert any(target[tp] != current[tp] for tp in current if tp[0] == "b")


def test_a_draining_broker_keeps_its_replicas_but_receives_none():
    doc = {"brokers": [{"id": 1, "rack": None, "state": "active"}, {"id": 2, "rack": "r", "state": "draining"},
                       {"id": 3, "rack": None, "state": "active"}, {"id": 4, "state": "decommissioned"}]}
    brokers = brokers_from_metadata(doc)
    assert [(b.id, b.rack, b.cordoned) for b in brokers] == [(1, None, False), (2, "r", True), (3, None, False)]
    current = {("t", p): [1, 2] for p in range(4)} | {("u", p): [1] for p in range(4)}
    target = plan_assignment(current, brokers)
    assert sum(2 in r for r in target.values()) == 4 and all(target[("u", p)] != [2] for p in range(4))
    assert spread(replica_counts({tp: [b for b in r if b != 2] for tp, r in target.items()}, [1, 3])) <= 1


def test_assignment_from_metadata_reads_the_v1_metadata_shape():
    doc = {"brokers": [], "topics": [{"name": "t", "partitions": [{"partition": 0, "replicas": [2, 1]}]}]}
    assert assignment_from_metadata(doc) == {("t", 0): [2, 1]}


def test_the_planner_is_a_pure_core():
    tree = ast.parse((ROOT / "metadata_quorum" / "reassignment_planner.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "math", "dataclasses", "typing", "partitions"}, imported


# ---- properties ------------------------------------------------------------------------

@st.composite
def clusters(draw):
    """A cluster: brokers (some with racks), a current assignment over some of them (maybe
    unbalanced), optional sizes, and a mode."""
    n = draw(st.integers(2, 6))
    ids = list(range(1, n + 1))
    use_racks = draw(st.booleans())
    racks = [draw(st.sampled_from("abc")) if use_racks else None for _ in ids]
    brokers = [BrokerSpec(i, r) for i, r in zip(ids, racks)]
    rf = draw(st.integers(1, min(3, n)))
    topics = draw(st.integers(1, 3))
    current = {}
    for t in range(topics):
        for p in range(draw(st.integers(1, 8))):
            current[(f"t{t}", p)] = draw(st.permutations(ids).map(lambda xs: list(xs[:rf])))
    mode = draw(st.sampled_from(["rebalance", "add-brokers", "remove-brokers"]))
    broker_ids = []
    if mode == "add-brokers":
        new = draw(st.integers(1, 2))
        broker_ids = list(range(n + 1, n + 1 + new))
        brokers += [BrokerSpec(i, draw(st.sampled_from("abc")) if use_racks else None) for i in broker_ids]
    elif mode == "remove-brokers":
        k = draw(st.integers(1, max(1, n - rf)))
        broker_ids = draw(st.permutations(ids)).__getitem__(slice(0, k)) if n - k >= rf else []
        if not broker_ids:
            mode = "rebalance"
    sizes = draw(st.none() | st.fixed_dictionaries({tp: st.integers(0, 1000) for tp in current}))
    return brokers, current, mode, list(broker_ids), sizes


def _rack_ok(reps, rack_of, n_racks):
    c = collections.Counter(rack_of[b] for b in reps)
    return max(c.values()) <= math.ceil(len(reps) / n_racks)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_hard_goals_hold_and_planning_again_changes_nothing(cluster):
    brokers, current, mode, broker_ids, sizes = cluster
    target = plan_assignment(current, brokers, mode=mode, broker_ids=broker_ids, sizes=sizes)
    removed = set(broker_ids) if mode == "remove-brokers" else set()
    eligible = [b for b in brokers if b.id not in removed]
    rack_of = {b.id: b.rack if b.rack is not None else f"own-{b.id}" for b in brokers}
    n_racks = len({rack_of[b.id] for b in eligible})
    assert set(target) == set(current)
    for tp, reps in target.items():
        assert len(reps) == len(current[tp]) and len(set(reps)) == len(reps)   # RF kept, distinct
        assert not set(reps) & removed
        assert _rack_ok(reps, rack_of, n_racks), (tp, reps)
    # deterministic, and a fixed point: the plan of the planned cluster is empty
    assert plan_assignment(current, brokers, mode=mode, broker_ids=broker_ids, sizes=sizes) == target
    assert plan_reassignment(target, eligible, sizes=sizes)["partitions"] == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_without_racks_replicas_and_leaders_end_within_one_and_no_broker_both_gives_and_takes(cluster):
    brokers, current, mode, broker_ids, sizes = cluster
    brokers = [BrokerSpec(b.id) for b in brokers]
    target = plan_assignment(current, brokers, mode=mode, broker_ids=broker_ids)
    removed = set(broker_ids) if mode == "remove-brokers" else set()
    eligible = [b.id for b in brokers if b.id not in removed]
    after = replica_counts(target, eligible)
    assert spread(after) <= 1, after
    assert spread(leader_counts(target, eligible)) <= 1
    before = replica_counts(current, [b.id for b in brokers])
    if mode == "remove-brokers":   # every replica of a removed broker moves, greedily placed
        assert moved_replicas(current, target) >= sum(before[b] for b in removed)
        return
    # fewest moves: each moved replica leaves a broker that ends with fewer
    assert moved_replicas(current, target) == sum(max(0, before[b] - after.get(b, 0)) for b in before)
