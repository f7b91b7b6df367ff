"""`kraftlog reassign plan` argument parsing (deploy/reassign_planner_cli.py): one mode of
--add-brokers IDS | --remove-brokers IDS | --rebalance, --topics, --capacity ID=BYTES."""
import argparse

import pytest

from deploy.reassign_planner_cli import add_plan_parser


def _parser():
    p = argparse.ArgumentParser(prog="kraftlog reassign")
    add_plan_parser(p.add_subparsers(dest="reassign_cmd"))
    return p


def test_modes_ids_topics_and_capacities_parse():
    a = _parser().parse_args(["plan", "--add-brokers", "4,5", "--topics", "a,b", "--capacity", "4=1000",
                              "--bootstrap", "http://b:1"])
    assert (a.add_brokers, a.remove_brokers, a.rebalance, a.topics, a.capacity) == ([4, 5], None, False, "a,b",
                                                                                    [(4, 1000)])
    assert callable(a.func)
    assert _parser().parse_args(["plan", "--rebalance"]).rebalance is True


@pytest.mark.parametrize("argv", [["plan"], ["plan", "--rebalance", "--add-brokers", "4"],
                                  ["plan", "--remove-brokers", "x"], ["plan", "--rebalance", "--capacity", "4"]])
def test_a_missing_or_second_mode_and_bad_ids_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(argv)
    assert e.value.code == 2

