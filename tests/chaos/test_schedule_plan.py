"""The fault schedule is balanced: after k whole rounds every kind has exactly k faults."""
import collections

from tests.chaos.harness.nemesis import ALL_NEMESES, Schedule
from tests.chaos.run import main as _main  # noqa: F401  (the CLI module imports cleanly)


def test_every_prefix_of_whole_rounds_is_balanced():
    kinds = list(ALL_NEMESES)
    plan = Schedule(seed=7, kinds=kinds).plan(len(kinds) * 40 + 3)
    assert len(plan) == len(kinds) * 40 + 3
    for k in (1, 2, 17, 40):
        counts = collections.Counter(plan[:k * len(kinds)])
        assert set(counts) == set(kinds) and set(counts.values()) == {k}
    assert plan[:len(kinds)] != plan[len(kinds):2 * len(kinds)]  # each round in its own order


def test_same_seed_same_plan_other_seed_other_plan():
    kinds = list(ALL_NEMESES)
    assert Schedule(seed=3, kinds=kinds).plan(50) == Schedule(seed=3, kinds=kinds).plan(50)
    assert Schedule(seed=3, kinds=kinds).plan(50) != Schedule(seed=4, kinds=kinds).plan(50)
