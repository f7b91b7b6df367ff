"""`--raft-prevote` (issue 24): the controller process hands pre-vote to its raft node
(RaftConfig.prevote, raft/prevote.py); off without the flag."""
from __future__ import annotations

from metadata_quorum.controller_server import build_arg_parser, config_from_args

ARGS = ["--node-id", "1", "--data-dir", "/tmp/x", "--voters", "1@127.0.0.1:9193:9093"]


def test_the_flag_turns_raft_prevote_on():
    cfg = config_from_args(build_arg_parser().parse_args(ARGS + ["--raft-prevote"]))
    assert cfg.raft_prevote is True
    assert cfg.raft_config().prevote is True


def test_off_without_the_flag():
    cfg = config_from_args(build_arg_parser().parse_args(ARGS))
    assert cfg.raft_config().prevote is False
