"""Node configuration: defaults, TOML/INI/JSON files, CLI overrides, clear errors (pure: no process, no socket)."""
import pytest

from deploy.config import NodeConfig


def test_defaults_match_make_run():
    c = NodeConfig()
    assert (c.node_id, c.data_dir, c.http_host, c.http_port, c.controller_port, c.raft_port) == \
        (1, "./data", "127.0.0.1", 8082, 9093, 9193)
    assert c.broker_url == "http://127.0.0.1:8082"
    assert c.controller_urls() == ["http://127.0.0.1:9093"]
    bc = c.broker_config()
    assert bc.url == "http://127.0.0.1:8082" and bc.log_dirs == ["./data/broker-1/logs"]


@pytest.mark.parametrize("name, text", [
    ("n.toml", 'http_port = 9000\nnum-partitions = 3\nauto_create_topics_enable = false\nlog_dirs = ["/a", "/b"]\n'),
    ("n.ini", "[kraftlog]\nhttp_port = 9000\nnum.partitions = 3\nauto_create_topics_enable = false\nlog_dirs = /a,/b\n"),
    ("n.json", '{"http_port": 9000, "num_partitions": "3", "auto_create_topics_enable": "false", "log_dirs": ["/a", "/b"]}'),
])
def test_file_then_flags(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    c = NodeConfig.load(str(path), {"node_id": 4, "http_port": None})
    assert c.http_port == 9000 and c.broker.num_partitions == 3 and c.broker.auto_create_topics_enable is False
    assert c.broker.log_dirs == ["/a", "/b"] and c.node_id == 4 and c.broker.broker_id == 4
    c = NodeConfig.load(str(path), {"http_port": 9100})
    assert c.http_port == 9100
    bc = c.broker_config()
    assert bc.num_partitions == 3 and bc.auto_create_topics_enable is False and bc.log_dirs == ["/a", "/b"]


def test_errors_name_the_problem(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("htp_port = 1\n")
    with pytest.raises(ValueError, match="unknown setting 'htp_port'"):
        NodeConfig.load(str(p))
    p.write_text("http_port = 'abc'\n")
    with pytest.raises(ValueError, match="http_port"):
        NodeConfig.load(str(p))
    with pytest.raises(ValueError, match="does not exist"):
        NodeConfig.load(str(tmp_path / "missing.toml"))


def test_multi_voter_controller_urls():
    c = NodeConfig(controller_quorum_voters="1@h1:9193:9093,2@h2:9194:9094")
    assert c.controller_urls() == ["http://h1:9093", "http://h2:9094"]
