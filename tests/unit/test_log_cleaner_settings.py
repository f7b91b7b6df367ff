"""Node settings for the log cleaner reach the broker (deploy/config.py -> BrokerConfig)."""
from deploy.config import NodeConfig


def test_log_cleaner_settings_pass_through_to_the_broker():
    node = NodeConfig.from_dict({"data_dir": "/tmp/x", "log_cleaner_threads": "2", "log_cleaner_enable": "false",
                                 "log_cleaner_dedupe_buffer_size_bytes": 1 << 20})
    cfg = node.broker_config()
    assert (cfg.log_cleaner_threads, cfg.log_cleaner_enable, cfg.log_cleaner_dedupe_buffer_size_bytes) == (
        2, False, 1 << 20)
