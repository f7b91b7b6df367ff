"""The controller refuses what would lose an internal topic's data, whoever asks: partition
changes, config changes beyond storage tuning, deletion (issue 16). User topics are unaffected."""
import pytest

from metadata_harness import Harness
from partitions.errors import ErrorCode, KraftlogError
from partitions.internal_topics import INTERNAL_TOPICS, OFFSETS_TOPIC, is_internal_topic


def refusal(fn, *args):
    with pytest.raises(KraftlogError) as exc:
        fn(*args)
    return exc.value


def test_internal_topic_predicate():
    assert is_internal_topic("__consumer_offsets") and is_internal_topic("__transaction_state")
    assert {"__consumer_offsets", "__transaction_state"} <= INTERNAL_TOPICS
    assert not is_internal_topic("orders") and not is_internal_topic(None) and not is_internal_topic("_x")


@pytest.mark.parametrize("topic", sorted(INTERNAL_TOPICS))
def test_controller_refuses_partition_changes_of_internal_topics(topic):
    h = Harness()
    h.create(topic, 10, 3, {"cleanup.policy": "compact"})
    e = refusal(h.controller.create_partitions, h.image, topic, 50)
    assert e.code is ErrorCode.POLICY_VIOLATION and "internal topic" in e.message
    assert len(h.image.topic(topic).partitions) == 10
    h.create("user-topic", 2, 1)
    h.run(h.controller.create_partitions(h.image, "user-topic", 4))
    assert len(h.image.topic("user-topic").partitions) == 4


def test_controller_refuses_data_losing_config_changes_of_internal_topics():
    h = Harness()
    h.create(OFFSETS_TOPIC, 10, 3, {"cleanup.policy": "compact"})
    for change in ({"cleanup.policy": "delete", "retention.ms": "1"}, {"cleanup.policy": None},
                   {"retention.bytes": "1"}, {"segment.bytes": "4096", "retention.ms": "1"}):
        e = refusal(h.controller.alter_configs, h.image, OFFSETS_TOPIC, change)
        assert e.code is ErrorCode.POLICY_VIOLATION, change
        assert "DELETE /v1/groups" in e.message
    assert h.image.topic(OFFSETS_TOPIC).configs == {"cleanup.policy": "compact"}
    # storage tuning stays possible (segments, cleaner eagerness, durability floor)
    h.run(h.controller.alter_configs(h.image, OFFSETS_TOPIC, {"segment.bytes": "4096",
                                                              "min.cleanable.dirty.ratio": "0.01"}))
    assert h.image.topic(OFFSETS_TOPIC).configs["segment.bytes"] == "4096"


def test_controller_refuses_deleting_internal_topics():
    h = Harness()
    h.create(OFFSETS_TOPIC, 3, 3)
    e = refusal(h.controller.delete_topic, h.image, OFFSETS_TOPIC)
    assert e.code is ErrorCode.INVALID_TOPIC_EXCEPTION
    assert OFFSETS_TOPIC in h.image.topics
