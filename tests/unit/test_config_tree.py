"""One config tree: NodeConfig (node-level settings and listeners) nests the broker's
BrokerConfig (frozen, validated groups) and the controller's ControllerSettings; every
setting is declared once; renamed settings keep working under their old names, with a
warning naming the new one."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import warnings

import pytest

from deploy.cli import build_parser, serve_overrides
from deploy.config import NodeConfig
from deploy.supervisor import broker_command, controller_command
from metadata_quorum.security.config import SecurityConfig
from partitions.log.remote.config import RemoteStorageConfig
from http_api.broker.config import (GROUPS, RENAMED_SETTINGS, BrokerConfig, DeprecatedSettingWarning, GroupCoordinatorConfig,
                             ListenerConfig, LogCleanerConfig, LogDefaults, MemoryConfig, ReplicationConfig,
                             RequestLimits)
from metadata_quorum.controller import ControllerSettings, MinInsyncReplicasDefault
from metadata_quorum.controller_server import build_arg_parser as controller_arg_parser
from metadata_quorum.controller_server import config_from_args as controller_config_from_args

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "examples" / "3-node"

# ---- each group validates itself ------------------------------------------------------

INVALID = [
    (ListenerConfig, "http_host", ""),
    (ListenerConfig, "http_port", 70_000),
    (ListenerConfig, "raft_port", -1),
    (RequestLimits, "socket_request_max_bytes", 0),
    (RequestLimits, "message_max_bytes", -1),
    (RequestLimits, "long_poll_max_requests", 0),
    (RequestLimits, "fetch_max_wait_ms", -1),
    (ReplicationConfig, "min_insync_replicas", 0),
    (ReplicationConfig, "replica_lag_time_max_ms", 0),
    (ReplicationConfig, "replica_fetch_backoff_ms", -5),
    (LogDefaults, "num_partitions", 0),
    (LogDefaults, "offset_checkpoint_interval_ms", 0),
    (LogCleanerConfig, "log_cleaner_threads", 0),
    (LogCleanerConfig, "log_cleaner_io_max_bytes_per_second", 0),
    (GroupCoordinatorConfig, "offsets_topic_num_partitions", 0),
    (GroupCoordinatorConfig, "group_max_session_timeout_ms", 500),   # below the min (1000)
    (MemoryConfig, "malloc_trim_threshold_bytes", -1),
    (SecurityConfig, "tls_client_auth", "always"),
    (RemoteStorageConfig, "remote_log_manager_task_interval_ms", 0),
    (ControllerSettings, "broker_session_timeout_ms", 0),
    (ControllerSettings, "leader_imbalance_check_interval_ms", -1),
]


@pytest.mark.parametrize("cls, setting, bad", INVALID, ids=[f"{c.__name__}.{s}" for c, s, _ in INVALID])
def test_a_group_refuses_a_bad_value_naming_the_setting_and_the_fix(cls, setting, bad):
    good = cls()
    good.validate()
    with pytest.raises(ValueError, match=rf"^{setting} must be .*; fix {setting} in the config"):
        cls(**{setting: bad})
    # the frozen group cannot be changed past validation either
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(good, setting, bad)


def test_every_group_has_a_validation_case():
    assert {cls for cls, _, _ in INVALID} == set(GROUPS.values()) | {ControllerSettings}


def test_broker_config_validates_its_groups_and_identity_when_built_flat():
    with pytest.raises(ValueError, match="^fetch_max_bytes must be > 0"):
        BrokerConfig(fetch_max_bytes=0)
    with pytest.raises(ValueError, match="^log_dirs must be at least one directory"):
        BrokerConfig(log_dirs=[])
    with pytest.raises(TypeError, match="unknown broker setting 'fetch_max_byte'"):
        BrokerConfig(fetch_max_byte=1)


def test_broker_config_reads_flat_and_nested():
    c = BrokerConfig(broker_id=2, fetch_max_bytes=4096, limits=RequestLimits(fetch_max_wait_ms=7), http_port=9001)
    assert c.limits == RequestLimits(fetch_max_bytes=4096, fetch_max_wait_ms=7)
    assert (c.fetch_max_bytes, c.fetch_max_wait_ms, c.http_port) == (4096, 7, 9001)
    assert c.url == "http://127.0.0.1:9001"
    # the two forms the broker process accepts: flat (kraftlog serve) and nested (dataclasses.asdict)
    assert BrokerConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert BrokerConfig.from_dict(json.loads(json.dumps(dataclasses.asdict(c)))) == c
    with pytest.raises(ValueError, match="unknown broker setting 'nope'"):
        BrokerConfig.from_dict({"nope": 1})


# ---- nesting ---------------------------------------------------------------------------

NODE_TOML = """
node_id = 3
data_dir = "/var/k"
http_host = "0.0.0.0"
advertised_host = "10.0.0.3"
http_port = 9000
controller_port = 9094
raft_port = 9194
controller_quorum_voters = "1@10.0.0.1:9193:9093,3@10.0.0.3:9194:9094"
cluster_id = "prod"
rack = "r1"
default_replication_factor = 3
min_insync_replicas = 2
fetch_max_bytes = 1024
offsets_topic_num_partitions = 4
log_cleaner_threads = 2
broker_session_timeout_ms = 6000
leader_imbalance_check_interval_ms = 1000
"""


def test_a_node_config_file_yields_the_broker_and_controller_configs(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text(NODE_TOML)
    node = NodeConfig.load(str(path))
    b = node.broker
    assert (b.broker_id, b.cluster_id, b.rack) == (3, "prod", "r1")
    assert (b.state_dir, b.log_dirs) == ("/var/k/broker-3", ["/var/k/broker-3/logs"])
    assert b.listeners is node.listeners and b.url == node.broker_url == "http://10.0.0.3:9000"
    assert b.controller_urls == ["http://10.0.0.1:9093", "http://10.0.0.3:9094"]
    assert b.replication == ReplicationConfig(default_replication_factor=3, min_insync_replicas=2)
    assert b.limits == RequestLimits(fetch_max_bytes=1024)
    assert b.groups == GroupCoordinatorConfig(offsets_topic_num_partitions=4)
    assert b.cleaner == LogCleanerConfig(log_cleaner_threads=2)
    assert node.controller == ControllerSettings(broker_session_timeout_ms=6000, leader_imbalance_check_interval_ms=1000,
                                                 min_insync_replicas=2)

    # what the two processes are started with gives them exactly these configs
    cmd = broker_command(node)
    assert BrokerConfig.from_dict(json.loads(cmd[cmd.index("--config-json") + 1])) == b
    cmd = controller_command(node)
    controller = controller_config_from_args(controller_arg_parser().parse_args(cmd[3:]))
    assert controller.settings == node.controller
    assert (controller.node_id, controller.http_port, controller.voters[3].raft_port) == (3, 9094, 9194)


def test_serve_flags_override_the_file_and_reach_the_broker(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text("node_id = 2\nhttp_port = 9000\nnum_partitions = 6\n")
    args = build_parser().parse_args(["serve", "--config", str(path), "--node-id", "5", "--data-dir",
                                      str(tmp_path / "d"), "--advertised-host", "h5", "--controller-port", "9500"])
    node = NodeConfig.load(args.config, serve_overrides(args))
    assert (node.node_id, node.http_port, node.controller_port) == (5, 9000, 9500)
    assert (node.broker.broker_id, node.broker.num_partitions) == (5, 6)
    assert node.broker.state_dir == str(tmp_path / "d" / "broker-5")
    assert node.broker.url == "http://h5:9000" and node.controller_url == "http://h5:9500"


def test_the_controller_min_insync_replicas_is_the_brokers():
    node = NodeConfig(broker=BrokerConfig(min_insync_replicas=3), controller=ControllerSettings(min_insync_replicas=1))
    assert node.controller.min_insync_replicas == node.broker.min_insync_replicas == 3
    with pytest.raises(ValueError, match="'broker_id' is derived from the node config; set 'node_id'"):
        NodeConfig.from_dict({"broker_id": 2})


# ---- one name per setting, old names still work -----------------------------------------

def _own_settings(cls) -> list[str]:
    """Settings `cls` itself declares (inherited ones belong to the base; groups are not settings)."""
    group_fields = {"listeners", "broker", "controller", *GROUPS}
    return [n for n in vars(cls).get("__annotations__", {}) if n not in group_fields]


TREE = [NodeConfig, BrokerConfig, *GROUPS.values(), ControllerSettings, MinInsyncReplicasDefault]


def test_no_setting_is_declared_in_two_config_classes():
    declared: dict[str, list[str]] = {}
    for cls in TREE:
        for name in _own_settings(cls):
            declared.setdefault(name, []).append(cls.__name__)
    twice = {name: owners for name, owners in declared.items() if len(owners) > 1}
    assert not twice, f"settings declared in more than one config class: {twice}"
    keys = NodeConfig.setting_names()
    assert len(keys) == len(set(keys)), "a config file key maps to two settings"


def test_renamed_settings_are_gone_under_their_old_names():
    for old, new in RENAMED_SETTINGS.items():
        assert old not in NodeConfig.setting_names() and old not in BrokerConfig.setting_names()
        assert new in NodeConfig.setting_names()
        assert not hasattr(BrokerConfig(), old), f"{old} still readable: one name per limit"


# the renames users see (docs/OPERATIONS.md); an old key dropped from RENAMED_SETTINGS fails here
RENAMES = [
    ("max_concurrent_long_polls", "long_poll_max_requests"),
    ("max_message_bytes", "message_max_bytes"),
    ("max_records_per_request", "request_max_records"),
    ("max_request_bytes", "socket_request_max_bytes"),
]


def test_the_rename_table_is_the_documented_one():
    assert sorted(RENAMED_SETTINGS.items()) == RENAMES


@pytest.mark.parametrize("old, new", RENAMES)
@pytest.mark.parametrize("fmt", ["toml", "ini", "json"])
def test_an_old_key_in_a_file_still_works_and_names_the_new_key(tmp_path, old, new, fmt):
    path = tmp_path / f"node.{fmt}"
    path.write_text({"toml": f"{old} = 777\n", "ini": f"[kraftlog]\n{old.replace('_', '-')} = 777\n",
                     "json": json.dumps({old.replace("_", "."): 777})}[fmt])
    with pytest.warns(DeprecatedSettingWarning, match=rf"'{old}' is deprecated, use '{new}' instead"):
        node = NodeConfig.load(str(path))
    assert getattr(node.broker, new) == 777
    with pytest.warns(DeprecatedSettingWarning, match=rf"use '{new}'"):
        assert getattr(BrokerConfig(**{old: 778}), new) == 778
    both = tmp_path / "both.json"
    both.write_text(json.dumps({old: 1, new: 2}))
    with pytest.raises(ValueError, match=rf"both set '{new}'; keep only '{new}'"):
        with pytest.warns(DeprecatedSettingWarning):
            NodeConfig.load(str(both))


def test_new_keys_and_the_examples_load_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        node = NodeConfig.from_dict({new: 999 for new in RENAMED_SETTINGS.values()})
        examples = [NodeConfig.load(str(p)) for p in sorted(EXAMPLES.glob("node*.toml"))]
    assert all(getattr(node.broker, new) == 999 for new in RENAMED_SETTINGS.values())
    assert [(n.node_id, n.broker.rack, n.broker.min_insync_replicas, n.controller.min_insync_replicas)
            for n in examples] == [(1, "rack-1", 2, 2), (2, "rack-2", 2, 2), (3, "rack-3", 2, 2)]


# every key the node config file took before the tree, with its default then
OLD_NODE_DEFAULTS = {
    "node_id": 1, "data_dir": "./data", "http_host": "127.0.0.1", "http_port": 8082, "controller_port": 9093,
    "raft_port": 9193, "raft_bind_host": None, "advertised_host": None, "cluster_id": "kraftlog-local",
    "controller_quorum_voters": None, "password": None, "log_dirs": [], "rack": None,
    "max_request_bytes": 8 << 20, "max_records_per_request": 100_000, "max_message_bytes": (1 << 20) + 12,
    "fetch_max_bytes": 8 << 20, "fetch_max_wait_ms": 30_000, "max_concurrent_long_polls": 1024,
    "request_timeout_ms": 30_000, "auto_create_topics_enable": True, "num_partitions": 1,
    "default_replication_factor": 1, "min_insync_replicas": 1, "replica_lag_time_max_ms": 30_000,
    "log_retention_check_interval_ms": 300_000, "log_cleaner_enable": True, "log_cleaner_threads": 1,
    "log_cleaner_dedupe_buffer_size_bytes": 128 << 20, "log_cleaner_io_max_bytes_per_second": -1,
    "offsets_topic_num_partitions": 10, "offsets_topic_replication_factor": 3,
    "group_min_session_timeout_ms": 1_000, "group_max_session_timeout_ms": 300_000,
    "offsets_retention_minutes": 10_080, "log_level": "INFO",
}


def test_every_old_key_is_accepted_with_its_old_default():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecatedSettingWarning)
        old = NodeConfig.from_dict({k: v for k, v in OLD_NODE_DEFAULTS.items() if v is not None})
    assert old == NodeConfig()
