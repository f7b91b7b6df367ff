"""Controller process configuration parsing (no process started)."""
import pytest

from metadata_quorum.controller_server import (ControllerConfig, build_arg_parser, config_from_args, format_voters,
                                                parse_voters)


def test_voters_round_trip_and_errors():
    voters = parse_voters("1@127.0.0.1:9193:9093, 2@10.0.0.2:9194:9094")
    assert voters[2].raft_address == "10.0.0.2:9194" and voters[2].url == "http://10.0.0.2:9094"
    assert parse_voters(format_voters(voters)) == voters
    with pytest.raises(ValueError, match="ID@HOST:RAFT_PORT:HTTP_PORT"):
        parse_voters("1@127.0.0.1:9193")
    with pytest.raises(ValueError):
        parse_voters("")


def test_config_from_args_checks_ports_against_voters():
    p = build_arg_parser()
    cfg = config_from_args(p.parse_args(["--node-id", "2", "--data-dir", "d", "--voters",
                                         "1@h:1:2,2@h:3:4", "--password", "x"]))
    assert isinstance(cfg, ControllerConfig) and cfg.http_port == 4 and cfg.raft_config().voters[2] == "h:3"
    assert cfg.raft_config().fsync_journal
    with pytest.raises(SystemExit, match="raft-port"):
        config_from_args(p.parse_args(["--node-id", "2", "--data-dir", "d", "--voters", "1@h:1:2,2@h:3:4",
                                       "--raft-port", "9"]))
    with pytest.raises(SystemExit, match="http-port"):
        config_from_args(p.parse_args(["--node-id", "2", "--data-dir", "d", "--voters", "1@h:1:2,2@h:3:4",
                                       "--http-port", "9"]))
    with pytest.raises(SystemExit, match="not in --voters"):
        config_from_args(p.parse_args(["--node-id", "5", "--data-dir", "d", "--voters", "1@h:1:2"]))
    single = config_from_args(p.parse_args(["--node-id", "1", "--data-dir", "d", "--raft-port", "7",
                                            "--http-port", "8", "--no-raft-fsync"]))
    assert list(single.voters) == [1] and not single.raft_config().fsync_journal
