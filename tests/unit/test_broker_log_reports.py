"""The broker's heartbeat log reports (KIP-966 unclean recovery, `Broker._log_reports`) come
from the image's leaderless index (issue 25): the partitions awaiting recovery that name this
broker are reported with their log's epoch and end offset, and the heartbeat no longer walks
every partition of the image (1 s of the event loop at 30,000 partitions under load)."""
from types import SimpleNamespace

from http_api.broker.server import Broker
from metadata_quorum.records import PartitionChangeRecord
from tests.rigs.metadata_image import ImageBuilder


class CountingPartitions(dict):
    """A topic's partition map that counts iterations over its values."""
    walks = 0

    def values(self):
        CountingPartitions.walks += 1
        return super().values()


def test_log_reports_name_the_partitions_awaiting_recovery_without_walking_the_image():
    b = ImageBuilder(seed=3)
    b.create("big", 2000, 3)
    sm, write = b.sm, b.write
    t = sm.image.topics["big"]
    p7 = t.partitions[7]
    # partition 7: leaderless, ISR and ELR empty, broker 1 among the last known ELR
    write([PartitionChangeRecord("big", t.topic_id, 7, tuple(p7.replicas), (), -1, p7.leader_epoch + 1,
                                 p7.partition_epoch + 1, (), (1, 2))])
    img = sm.image
    assert img.partition("big", 7).awaiting_recovery
    for topic in img.topics.values():
        topic.partitions = CountingPartitions(topic.partitions)
    epoch = img.partition("big", 7).partition_epoch
    broker = SimpleNamespace(
        follower=SimpleNamespace(image=img), config=SimpleNamespace(broker_id=1),
        log_manager=SimpleNamespace(get=lambda topic, p: SimpleNamespace(latest_epoch=4, log_end_offset=17)),
        rm=SimpleNamespace(partitions={("big", p): SimpleNamespace(partition_epoch=epoch if p == 7 else 0)
                                       for p in range(2000)}))
    CountingPartitions.walks = 0
    assert Broker._log_reports(broker) == [{"topic": "big", "partition": 7, "partition_epoch": epoch,
                                            "last_epoch": 4, "log_end_offset": 17}]
    assert CountingPartitions.walks == 0     # no walk of a topic's partitions
    broker.config.broker_id = 3              # not in the last known ELR: nothing to report
    assert Broker._log_reports(broker) == []
