"""Group settings reach the broker from a node config file with Kafka's dotted names."""
from deploy.config import NodeConfig


def test_kafka_named_group_settings_reach_the_broker_config():
    cfg = NodeConfig.from_dict({"offsets.topic.num.partitions": 3, "offsets.topic.replication.factor": "1",
                                "group.min.session.timeout.ms": 500, "group.max.session.timeout.ms": 9000})
    b = cfg.broker_config()
    assert (b.offsets_topic_num_partitions, b.offsets_topic_replication_factor) == (3, 1)
    assert (b.group_min_session_timeout_ms, b.group_max_session_timeout_ms) == (500, 9000)
    d = NodeConfig().broker_config()
    assert (d.offsets_topic_num_partitions, d.group_session_timeout_ms) == (10, 45_000)
