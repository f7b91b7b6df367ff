"""The controller's fencing-from-silence settings (issue 24, docs/AVAILABILITY.md part B)
are node config keys like the session timeout: a node file sets them, `kraftlog serve`
starts the controller process with them, and a bad value is refused at start-up naming it."""
from __future__ import annotations

import pytest

from deploy.config import NodeConfig
from deploy.supervisor import controller_command
from metadata_quorum.controller import ControllerSettings
from metadata_quorum.controller_server import build_arg_parser, config_from_args


def test_a_node_file_sets_the_silence_settings_and_the_controller_process_gets_them(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text("node_id = 2\nbroker_silence_fence_ms = 2500\nbroker_silence_report_max_age_ms = 4000\n"
                    "broker_session_timeout_ms = 6000\n")
    node = NodeConfig.load(str(path))
    assert (node.controller.broker_silence_fence_ms, node.controller.broker_silence_report_max_age_ms) == (2500, 4000)
    cmd = controller_command(node)
    controller = config_from_args(build_arg_parser().parse_args(cmd[3:]))
    assert controller.settings == node.controller


def test_defaults_reach_the_controller_process_and_zero_turns_fencing_from_silence_off(tmp_path):
    node = NodeConfig.load(None, {"data_dir": str(tmp_path)})
    controller = config_from_args(build_arg_parser().parse_args(controller_command(node)[3:]))
    assert controller.settings.broker_silence_fence_ms == ControllerSettings().broker_silence_fence_ms == 1500
    path = tmp_path / "off.toml"
    path.write_text("broker_silence_fence_ms = 0\n")
    assert NodeConfig.load(str(path)).controller.broker_silence_fence_ms == 0


def test_a_negative_value_is_refused_naming_the_setting(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("broker_silence_report_max_age_ms = -1\n")
    with pytest.raises(ValueError, match="broker_silence_report_max_age_ms"):
        NodeConfig.load(str(path))
