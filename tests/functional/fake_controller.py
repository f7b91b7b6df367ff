"""In-memory stand-in for metadata_quorum.client.ControllerClient, for in-process tests.

It runs the real pure controller logic (QuorumController) against a MetadataImage and
publishes a fresh copy of the image to the broker's MetadataView after every change, the
way the broker's MetadataFollower would after long-polling the quorum.
"""
from __future__ import annotations

import copy

from partitions.errors import ErrorCode, KraftlogError
from metadata_quorum.controller import QuorumController
from metadata_quorum.image import MetadataImage
from metadata_quorum.records import LeaderChangeRecord, RegisterBrokerRecord, UnfenceBrokerRecord


class FakeControllerClient:
    """Admin calls of ControllerClient, decided by QuorumController, applied in memory."""

    def __init__(self, cluster_id: str = "test-cluster") -> None:
        self.image = MetadataImage(cluster_id)
        self.controller = QuorumController()
        self.views = []  # MetadataViews to publish to
        self.calls: list[tuple] = []
        self._apply([LeaderChangeRecord(leader_id=1000, epoch=1)])

    def _apply(self, records) -> None:
        err = self.image.check_batch(records)
        if err:
            raise KraftlogError(ErrorCode.INVALID_UPDATE_VERSION, err)
        self.image.replay_all(records)

    async def publish(self) -> None:
        for view in self.views:
            await view.update(copy.deepcopy(self.image))

    async def add_broker(self, broker_id: int, url: str, rack=None) -> None:
        self._apply([RegisterBrokerRecord(broker_id, f"inc-{broker_id}", -1, url, rack, True, 0)])
        epoch = self.image.brokers[broker_id].epoch
        self._apply([UnfenceBrokerRecord(broker_id, epoch)])
        await self.publish()

    async def allocate_producer_ids(self, broker_id, broker_epoch):
        epoch = self.image.brokers[broker_id].epoch  # the in-process broker has no lifecycle
        records, first, size = self.controller.allocate_producer_ids(self.image, broker_id, epoch)
        self._apply(records)
        return first, size

    async def create_topic(self, name, partitions, replication_factor, configs=None):
        self.calls.append(("create_topic", name, partitions, replication_factor, configs))
        self._apply(self.controller.create_topic(self.image, name, partitions, replication_factor, configs))
        await self.publish()
        return self.image.topic_json(name, include_configs=True)

    async def delete_topic(self, name):
        self.calls.append(("delete_topic", name))
        self._apply(self.controller.delete_topic(self.image, name))
        await self.publish()

    async def create_partitions(self, name, count):
        self._apply(self.controller.create_partitions(self.image, name, count))
        await self.publish()

    async def alter_configs(self, name, configs):
        self._apply(self.controller.alter_configs(self.image, name, configs))
        await self.publish()

    async def move_leader(self, topic: str, partition: int, leader: int) -> None:
        """Test hook: make `leader` the partition leader (bumps the leader epoch)."""
        from metadata_quorum.records import PartitionChangeRecord
        t = self.image.topics[topic]
        p = t.partitions[partition]
        self._apply([PartitionChangeRecord(topic, t.topic_id, partition, p.replicas, p.isr, leader,
                                           p.leader_epoch + 1, p.partition_epoch + 1)])
        await self.publish()

    async def metadata_json(self):
        return self.image.to_metadata_json()
