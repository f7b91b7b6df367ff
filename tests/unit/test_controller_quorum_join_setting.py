"""`controller_quorum_join` (issue 17): a node file on a real host says its controller joins a
running quorum, and `kraftlog serve` starts the controller process with `--join` (no
election before the active controller has added it); off by default."""
from __future__ import annotations

import pytest

from deploy.config import NodeConfig
from deploy.supervisor import controller_command
from metadata_quorum.controller_server import build_arg_parser, config_from_args


def test_a_node_file_makes_the_controller_join_a_running_quorum(tmp_path):
    path = tmp_path / "node4.toml"
    path.write_text('node_id = 4\nadvertised_host = "h4"\ncontroller_quorum_voters = "1@h1:9193:9093,4@h4:9193:9093"\n'
                    "controller_quorum_join = true\n")
    node = NodeConfig.load(str(path))
    assert node.controller_quorum_join is True
    cmd = controller_command(node)
    assert "--join" in cmd
    assert config_from_args(build_arg_parser().parse_args(cmd[3:])).raft_join is True


def test_off_by_default_and_a_bad_value_is_refused_naming_the_setting(tmp_path):
    node = NodeConfig.load(None, {"data_dir": str(tmp_path)})
    assert "--join" not in controller_command(node)
    assert config_from_args(build_arg_parser().parse_args(controller_command(node)[3:])).raft_join is False
    path = tmp_path / "bad.toml"
    path.write_text('controller_quorum_join = "maybe"\n')
    with pytest.raises(ValueError, match="controller_quorum_join"):
        NodeConfig.load(str(path))
