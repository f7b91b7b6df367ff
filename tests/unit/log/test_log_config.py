"""LogConfig: Kafka names, defaults, parsing and validation messages."""
from __future__ import annotations

import pytest

from partitions.log.config import TOPIC_CONFIG_KEYS, LogConfig, validate_topic_configs


def test_defaults_follow_kafka():
    c = LogConfig()
    assert c.segment_bytes == 1 << 30
    assert c.segment_ms == 7 * 86400000 and c.retention_ms == 7 * 86400000
    assert c.retention_bytes == -1 and c.max_message_bytes == 1048588
    assert c.flush_messages is None and c.flush_ms is None
    assert c.cleanup_policy == "delete" and c.message_timestamp_type == "CreateTime"
    assert c.index_interval_bytes == 4096 and c.segment_index_bytes == 10 << 20


def test_every_required_key_is_known():
    for name in ["segment.bytes", "segment.ms", "retention.ms", "retention.bytes", "max.message.bytes",
                 "flush.messages", "flush.ms", "cleanup.policy", "message.timestamp.type",
                 "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "max.compaction.lag.ms",
                 "delete.retention.ms", "segment.index.bytes", "index.interval.bytes", "min.insync.replicas",
                 "unclean.leader.election.enable", "compression.type"]:
        assert name in TOPIC_CONFIG_KEYS


def test_from_topic_configs_parses_strings():
    c = LogConfig.from_topic_configs({
        "segment.bytes": "1024", "retention.ms": "-1", "cleanup.policy": "delete, compact",
        "message.timestamp.type": "LogAppendTime", "min.cleanable.dirty.ratio": "0.1",
        "flush.messages": "1", "unclean.leader.election.enable": "TRUE", "compression.type": "ZSTD",
        "min.insync.replicas": "2",
    })
    assert c.segment_bytes == 1024 and c.retention_ms == -1
    assert c.cleanup_policy == "compact,delete" and c.compact and c.delete
    assert c.log_append_time and c.min_cleanable_dirty_ratio == 0.1 and c.flush_messages == 1
    assert c.unclean_leader_election_enable is True and c.compression_type == "zstd" and c.min_insync_replicas == 2


def test_base_is_overridden_not_replaced():
    base = LogConfig(segment_bytes=2048, retention_bytes=10)
    c = LogConfig.from_topic_configs({"retention.bytes": "20"}, base)
    assert (c.segment_bytes, c.retention_bytes) == (2048, 20)


@pytest.mark.parametrize("configs, message", [
    ({"segment.bytse": "1"}, "segment.bytse: unknown topic config"),
    ({"segment.bytes": "abc"}, "segment.bytes: not an integer"),
    ({"segment.bytes": "1"}, "segment.bytes: too small"),
    ({"retention.ms": "-2"}, "retention.ms: too small"),
    ({"cleanup.policy": "forever"}, "cleanup.policy: .*one of delete, compact"),
    ({"message.timestamp.type": "Now"}, "message.timestamp.type: .*CreateTime"),
    ({"min.cleanable.dirty.ratio": "1.5"}, "min.cleanable.dirty.ratio: too large"),
    ({"unclean.leader.election.enable": "yes"}, "unclean.leader.election.enable: .*true or false"),
    ({"compression.type": "snappy"}, "compression.type: .*zstd"),
    ({"min.insync.replicas": "0"}, "min.insync.replicas: too small"),
    ({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}, "min.compaction.lag.ms: "),
])
def test_bad_configs_name_the_key_and_what_is_allowed(configs, message):
    with pytest.raises(ValueError, match=message):
        validate_topic_configs(configs)


def test_round_trip_to_topic_configs():
    c = LogConfig(retention_ms=-1, flush_ms=100, preallocate=True)
    assert LogConfig.from_topic_configs(c.to_topic_configs()) == c


def test_direct_construction_is_checked():
    with pytest.raises(ValueError, match="segment.bytes"):
        LogConfig(segment_bytes=0)
