"""The HTTP edge limits as settings: one set of names and defaults for the broker
(RequestLimits, node config keys) and the controller (ControllerConfig.http_limits, its
--http-limits-json flag, which `kraftlog serve` fills from the node config)."""
import dataclasses
import json

import pytest

from deploy.config import NodeConfig
from deploy.supervisor import controller_command
from http_api.broker.config import BrokerConfig, RequestLimits
from http_api.wire.hardening import HttpLimits
from metadata_quorum.controller_server import build_arg_parser, config_from_args
from raft.log import RAFT_FRAME_MAX_BYTES_DEFAULT


def test_broker_and_controller_share_names_and_defaults():
    names = [f.name for f in dataclasses.fields(HttpLimits)]
    broker = RequestLimits()
    assert {n: getattr(broker, n) for n in names} == dataclasses.asdict(HttpLimits())
    assert HttpLimits.from_settings(BrokerConfig(request_header_timeout_ms=1234)).request_header_timeout_ms == 1234
    with pytest.raises(ValueError, match="connections_max_per_ip"):
        BrokerConfig(connections_max_per_ip=-1)


def test_a_node_config_reaches_the_controller_process():
    node = NodeConfig.from_dict({"request_header_timeout_ms": 1500, "connections_max_per_ip": 50})
    assert node.broker.request_header_timeout_ms == 1500
    cmd = controller_command(node)
    limits = json.loads(cmd[cmd.index("--http-limits-json") + 1])
    assert limits["request_header_timeout_ms"] == 1500 and limits["connections_max_per_ip"] == 50
    assert "--http-limits-json" not in controller_command(NodeConfig())   # defaults: no flag
    args = build_arg_parser().parse_args(["--node-id", "1", "--data-dir", "/tmp/x", "--raft-port", "1",
                                          "--http-port", "2", "--http-limits-json", json.dumps(limits)])
    cfg = config_from_args(args)
    assert cfg.http_limits == HttpLimits(**limits)
    assert cfg.raft_config().frame_max_bytes == cfg.raft_frame_max_bytes == RAFT_FRAME_MAX_BYTES_DEFAULT
