"""Assignors: every subscribed partition to exactly one subscribed member, balanced, deterministic."""
import itertools
import random

import pytest

from partitions.groups.assignors import ASSIGNORS, range_assign, roundrobin_assign, sticky_assign


def check_valid(members, topics, out):
    seen = {}
    for m, tps in out.items():
        for t, p in tps:
            assert t in members[m], f"{m} got {t} it does not subscribe to"
            assert (t, p) not in seen, f"{t}-{p} given twice"
            seen[(t, p)] = m
    wanted = {(t, p) for ts in members.values() for t in ts for p in range(topics.get(t, 0))}
    assert set(seen) == wanted


def test_range_gives_contiguous_ranges_per_topic():
    out = range_assign({"a": ("t",), "b": ("t",), "c": ("t",)}, {"t": 7})
    assert out == {"a": frozenset({("t", 0), ("t", 1), ("t", 2)}), "b": frozenset({("t", 3), ("t", 4)}),
                   "c": frozenset({("t", 5), ("t", 6)})}


def test_roundrobin_deals_in_turn_and_skips_unsubscribed():
    out = roundrobin_assign({"a": ("t", "u"), "b": ("t",)}, {"t": 2, "u": 2})
    assert out["a"] == {("t", 0), ("u", 0), ("u", 1)} and out["b"] == {("t", 1)}


def test_three_members_six_partitions_two_each_for_every_assignor():
    members = {"m1": ("t",), "m2": ("t",), "m3": ("t",)}
    for name, fn in ASSIGNORS.items():
        out = fn(members, {"t": 6}, {})
        check_valid(members, {"t": 6}, out)
        assert sorted(len(v) for v in out.values()) == [2, 2, 2], name


def test_sticky_keeps_owners_and_moves_only_what_it_must():
    members = {"m1": ("t",), "m2": ("t",), "m3": ("t",)}
    first = sticky_assign({"m1": ("t",), "m2": ("t",)}, {"t": 6}, {})
    out = sticky_assign(members, {"t": 6}, first)
    check_valid(members, {"t": 6}, out)
    moved = sum(len(first[m] - out[m]) for m in first)
    assert moved == 2  # m3 takes one from each, nothing else moves
    # m2 leaves: m1 and m3 keep theirs
    after = sticky_assign({"m1": ("t",), "m3": ("t",)}, {"t": 6}, {"m1": out["m1"], "m3": out["m3"]})
    assert out["m1"] <= after["m1"] and out["m3"] <= after["m3"]


@pytest.mark.parametrize("seed", range(30))
def test_random_subscriptions_are_valid_and_deterministic(seed):
    rnd = random.Random(seed)
    topics = {f"t{i}": rnd.randint(0, 5) for i in range(rnd.randint(1, 4))}
    members = {f"m{i}": tuple(sorted(rnd.sample(sorted(topics), rnd.randint(1, len(topics)))))
               for i in range(rnd.randint(1, 5))}
    current = {m: frozenset(rnd.sample([(t, p) for t in topics for p in range(topics[t])],
                                       k=min(2, sum(topics.values())))) for m in members}
    for fn in (range_assign, roundrobin_assign, sticky_assign):
        out = fn(members, topics, current)
        check_valid(members, topics, out)
        assert out == fn(dict(reversed(list(members.items()))), topics, current)


def test_sticky_is_balanced_with_uniform_subscriptions():
    for n_members, n_parts in itertools.product(range(1, 6), range(0, 12)):
        members = {f"m{i}": ("t",) for i in range(n_members)}
        out = sticky_assign(members, {"t": n_parts}, {})
        sizes = [len(v) for v in out.values()]
        assert max(sizes) - min(sizes) <= 1
