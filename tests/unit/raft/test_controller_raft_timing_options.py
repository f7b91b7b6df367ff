"""The controller process's raft timing flags reach its raft node (RaftConfig): the election
timeout range and the election backoff cap (raft/election_backoff.py; issue 24)."""
from __future__ import annotations

from metadata_quorum.controller_server import build_arg_parser, config_from_args
from raft.election_backoff import ELECTION_BACKOFF_MAX_S_DEFAULT

ARGS = ["--node-id", "1", "--data-dir", "/tmp/x", "--voters", "1@127.0.0.1:9193:9093"]


def test_timing_flags_reach_the_raft_config():
    cfg = config_from_args(build_arg_parser().parse_args(
        ARGS + ["--raft-min-timeout-s", "0.5", "--raft-max-timeout-s", "1.0", "--raft-election-backoff-max-s", "1.5"]))
    rc = cfg.raft_config()
    assert (rc.raft_min_timeout_s, rc.raft_max_timeout_s, rc.election_backoff_max_s) == (0.5, 1.0, 1.5)


def test_defaults_are_the_raft_configs():
    rc = config_from_args(build_arg_parser().parse_args(ARGS)).raft_config()
    assert (rc.raft_min_timeout_s, rc.raft_max_timeout_s, rc.election_backoff_max_s) == \
        (0.3, 0.6, ELECTION_BACKOFF_MAX_S_DEFAULT)
