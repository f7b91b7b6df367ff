"""MetadataImage replay, snapshots, the API.md metadata shape and batch preconditions."""
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import (
    ConfigRecord, FenceBrokerRecord, LeaderChangeRecord, PartitionChangeRecord, PartitionRecord,
    ProducerIdsRecord, RegisterBrokerRecord, RemoveTopicRecord, TopicRecord, UnfenceBrokerRecord,
    record_from_dict, record_to_dict, RECORD_TYPES,
)
import json
import pytest


def _records():
    return [
        LeaderChangeRecord(1, 3),
        RegisterBrokerRecord(1, "i1", -1, "http://b1", "r1"),
        RegisterBrokerRecord(2, "i2", -1, "http://b2", None),
        UnfenceBrokerRecord(1, 1),
        TopicRecord("orders", "tid1"),
        ConfigRecord("topic", "orders", "retention.ms", "1000"),
        PartitionRecord("orders", "tid1", 0, (1, 2), (1, 2), 1, 0, 0),
        PartitionRecord("orders", "tid1", 1, (2, 1), (2, 1), 2, 0, 0),
        PartitionChangeRecord("orders", "tid1", 1, (2, 1), (1,), 1, 1, 1),
        ProducerIdsRecord(1, 1, 1000),
    ]


def test_every_record_type_round_trips_through_plain_json():
    samples = _records() + [RemoveTopicRecord("orders", "tid1"), FenceBrokerRecord(1, 1)]
    for r in samples:
        assert record_from_dict(json.loads(json.dumps(record_to_dict(r)))) == r
    assert {type(r).TYPE for r in samples} <= set(RECORD_TYPES)


def test_unknown_record_type_is_a_value_error():
    with pytest.raises(ValueError):
        record_from_dict({"type": "Bogus"})


def test_replay_builds_the_image_and_counts_offsets():
    image = MetadataImage("c1")
    image.replay_all(_records())
    assert image.offset == 10
    assert (image.controller_id, image.controller_epoch) == (1, 3)
    assert image.brokers[1].epoch == 1 and image.brokers[2].epoch == 2  # epoch = record offset
    assert not image.brokers[1].fenced and image.brokers[2].fenced
    p1 = image.partition("orders", 1)
    assert (p1.leader, p1.isr, p1.leader_epoch, p1.partition_epoch) == (1, (1,), 1, 1)
    assert image.topic("orders").configs == {"retention.ms": "1000"}
    assert image.next_producer_id == 1000


def test_metadata_json_has_exactly_the_api_shape():
    image = MetadataImage("c1")
    image.replay_all(_records())
    body = image.to_metadata_json()
    assert set(body) == {"cluster_id", "controller_id", "brokers", "topics"}
    assert body["brokers"][0] == {"id": 1, "url": "http://b1", "rack": "r1", "fenced": False}
    topic = body["topics"][0]
    assert set(topic) == {"name", "partitions"}
    assert topic["partitions"][0] == {"partition": 0, "leader": 1, "leader_epoch": 0, "replicas": [1, 2], "isr": [1, 2],
                                      "adding_replicas": [], "removing_replicas": []}
    json.dumps(body)


def test_snapshot_round_trip_preserves_everything():
    image = MetadataImage("c1")
    image.replay_all(_records())
    copy = MetadataImage.from_snapshot(json.loads(json.dumps(image.to_snapshot())))
    assert copy.to_metadata_json() == image.to_metadata_json()
    assert copy.offset == image.offset and copy.next_producer_id == image.next_producer_id
    assert copy.topic("orders").configs == image.topic("orders").configs
    assert copy.brokers == image.brokers


def test_remove_topic_and_config_delete():
    image = MetadataImage()
    image.replay_all(_records())
    image.replay(ConfigRecord("topic", "orders", "retention.ms", None))
    assert image.topic("orders").configs == {}
    image.replay(RemoveTopicRecord("orders", "tid1"))
    assert image.topic("orders") is None


def test_check_batch_rejects_stale_partition_epoch_and_duplicates():
    image = MetadataImage()
    image.replay_all(_records())
    stale = PartitionChangeRecord("orders", "tid1", 1, (2, 1), (1, 2), 1, 1, 1)  # epoch 1 already used
    assert image.check_batch([stale]) is not None
    fresh = PartitionChangeRecord("orders", "tid1", 1, (2, 1), (1, 2), 1, 1, 2)
    assert image.check_batch([fresh]) is None
    assert image.check_batch([TopicRecord("orders", "x")]) is not None
    assert image.check_batch([FenceBrokerRecord(1, 99)]) is not None
    assert image.check_batch([ProducerIdsRecord(1, 1, 1000)]) is not None  # overlapping block
    # a batch that creates a topic may add its partitions
    assert image.check_batch([TopicRecord("new", "t2"), PartitionRecord("new", "t2", 0, (1,), (1,), 1)]) is None
    assert image.check_batch([PartitionRecord("nope", "t9", 0, (1,), (1,), 1)]) is not None
