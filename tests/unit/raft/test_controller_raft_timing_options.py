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


def test_an_election_timeout_above_the_connection_timeout_starts_a_raft_node(tmp_path):
    """KRaft-like election timeouts (`--raft-min-timeout-s 1 --raft-max-timeout-s 2`, what
    docs/SCALE.md suggests comparing) crashed the controller at startup with a bare
    AssertionError from pysyncobj (its connection timeout, 1.5 s, must be at least the
    longest election timeout): the node now starts with a connection timeout raised to it."""
    import asyncio

    from raft.syncobj_log import SyncObjReplicatedLog
    from tests.unit.raft.test_raft_prevote import _Entries, _free_port

    async def go() -> None:
        port = _free_port()
        cfg = config_from_args(build_arg_parser().parse_args(
            ["--node-id", "1", "--data-dir", str(tmp_path), "--voters", f"1@127.0.0.1:{port}:{_free_port()}",
             "--raft-min-timeout-s", "1", "--raft-max-timeout-s", "2", "--no-raft-fsync"]))
        rc = cfg.raft_config()
        assert (rc.raft_min_timeout_s, rc.raft_max_timeout_s) == (1.0, 2.0)
        node = SyncObjReplicatedLog(rc, _Entries(), loop=asyncio.get_running_loop())
        node.start()
        try:
            assert node._syncobj._SyncObj__conf.connectionTimeout >= 2.0
        finally:
            node.stop()
    asyncio.run(go())


def test_an_election_timeout_range_pysyncobj_refuses_is_refused_with_what_to_set():
    import pytest

    for lo, hi in (("1", "1"), ("2", "1"), ("0.1", "0.6")):
        with pytest.raises(ValueError) as e:
            config_from_args(build_arg_parser().parse_args(
                ARGS + ["--raft-min-timeout-s", lo, "--raft-max-timeout-s", hi]))
        assert "raft_m" in str(e.value) and ("above" in str(e.value))
