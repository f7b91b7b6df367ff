"""Internal topics through the Kafka listener (issue 16), with unmodified Kafka clients
against a real broker: produce and DeleteRecords into `__consumer_offsets` get
INVALID_TOPIC_EXCEPTION, CreatePartitions and a data-losing IncrementalAlterConfigs get
POLICY_VIOLATION, CreateTopics of an internal name is refused; the committed offsets of
every group are still there afterwards."""
from __future__ import annotations

import pytest

from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration

OFFSETS = "__consumer_offsets"
GROUPS = ("g1", "g2", "g3", "g4")


def offsets(c: ReplicatedCluster) -> dict:
    out = {}
    for g in GROUPS:
        status, doc = http("GET", f"{c.url(1)}/v1/groups/{g}/offsets")
        assert status == 200, doc
        out[g] = [(o["partition"], o["offset"]) for o in doc["offsets"]]
    return out


def test_kafka_clients_cannot_alter_or_write_internal_topics(tmp_path):
    from confluent_kafka import KafkaError, Producer, TopicPartition
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                       NewPartitions, NewTopic)

    with ReplicatedCluster(str(tmp_path), brokers=1) as c:
        c.create_topic("t", partitions=4, replication_factor=1)
        for i, g in enumerate(GROUPS):
            status, doc = http("POST", f"{c.url(1)}/v1/groups/{g}/offsets",
                               {"offsets": [{"topic": "t", "partition": i, "offset": 10 + i}]})
            assert status == 200, doc
        before = offsets(c)
        n_partitions = len(c.partition_list(OFFSETS))

        errors = []
        p = Producer({"bootstrap.servers": c.kafka_bootstrap, "acks": "all", "message.send.max.retries": 0})
        p.produce(OFFSETS, key=b"forged-key", value=b"forged", partition=0, on_delivery=lambda err, msg: errors.append(err))
        assert p.flush(30) == 0
        assert len(errors) == 1 and errors[0] is not None, errors
        assert errors[0].code() == KafkaError.TOPIC_EXCEPTION, errors[0]

        admin = AdminClient({"bootstrap.servers": c.kafka_bootstrap})
        fut = admin.create_partitions([NewPartitions(OFFSETS, 50)], request_timeout=20)[OFFSETS]
        with pytest.raises(Exception) as e:
            fut.result(30)
        assert e.value.args[0].code() == KafkaError.POLICY_VIOLATION, e.value
        res = ConfigResource(ConfigResource.Type.TOPIC, OFFSETS, incremental_configs=[
            ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(Exception) as e:
            admin.incremental_alter_configs([res])[res].result(30)
        assert e.value.args[0].code() == KafkaError.POLICY_VIOLATION, e.value
        deleted = admin.delete_records([TopicPartition(OFFSETS, 0, -1)])
        with pytest.raises(Exception) as e:
            next(iter(deleted.values())).result(30)
        assert "TOPIC_EXCEPTION" in str(e.value) or "internal topic" in str(e.value), e.value
        fut = admin.create_topics([NewTopic("__transaction_state", 3, 1)])["__transaction_state"]
        with pytest.raises(Exception) as e:
            fut.result(30)
        assert e.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, e.value

        assert len(c.partition_list(OFFSETS)) == n_partitions
        status, doc = http("GET", f"{c.url(1)}/v1/topics/{OFFSETS}")
        assert status == 200 and doc["configs"].get("cleanup.policy") == "compact", doc
        assert offsets(c) == before
