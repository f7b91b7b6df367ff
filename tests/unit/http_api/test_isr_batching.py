"""The broker's ISR loop sends the ISR changes of many led partitions in one batched
AlterPartition request (issue 25), and handles each answer as a single AlterPartition's."""
from __future__ import annotations

import asyncio

import http_api.broker.server as broker_server
from http_api.broker.config import BrokerConfig
from partitions.replication.partition import Partition


class _Lifecycle:
    broker_epoch = 7


class _ReplicaManager:
    _topic_configs: dict = {}

    def __init__(self, parts):
        self.parts = parts

    def replica_lag_time_max_ms(self, topic, default_ms):
        return default_ms

    isr_check_busy_s = 0.0

    async def isr_changes_sliced(self, replica_lag_time_max_ms):
        return [(p, [1, 2]) for p in self.parts]   # follower 3 lags on every partition

    def describe_follower(self, part, replica_id):
        return f"{part.topic}-{part.partition} broker {replica_id}"

    def shrink_still_due(self, part, new_isr, replica_lag_time_max_ms):
        return True


class _Controller:
    def __init__(self):
        self.batches: list = []
        self.singles = 0

    async def alter_partition(self, *args):
        self.singles += 1
        return {}

    async def alter_partitions(self, broker_id, broker_epoch, items):
        self.batches.append(items)
        return [{"topic": it["topic"], "partition": it["partition"], "error_code": "INELIGIBLE_REPLICA",
                 "message": "refused"} if it["partition"] == 4 else
                {"topic": it["topic"], "partition": it["partition"], "isr": it["new_isr"]} for it in items]


async def test_isr_changes_of_many_partitions_go_in_one_request(tmp_path, monkeypatch):
    monkeypatch.setattr(broker_server, "ALTER_PARTITIONS_BATCH", 4)
    cfg = BrokerConfig(broker_id=1, log_dirs=[str(tmp_path / "logs")], state_dir=str(tmp_path),
                       replica_lag_time_max_ms=100)
    broker = broker_server.Broker(cfg)
    parts = [Partition("t", n, 1, replicas=[1, 2, 3], isr=[1, 2, 3], leader_id=1, leader_epoch=0, partition_epoch=3)
             for n in range(10)]
    rejected = []
    parts[4].isr_change_rejected = lambda epoch: rejected.append(epoch)
    broker.lifecycle = _Lifecycle()
    broker.rm = _ReplicaManager(parts)
    broker.client = _Controller()
    task = asyncio.create_task(broker._isr_loop())
    try:
        deadline = asyncio.get_running_loop().time() + 10.0
        while len(broker.client.batches) < 3 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        broker.executor.shutdown(wait=False)
    first = broker.client.batches[:3]
    assert [len(b) for b in first] == [4, 4, 2] and broker.client.singles == 0
    assert [it["partition"] for b in first for it in b] == list(range(10))
    assert first[0][0] == {"topic": "t", "partition": 0, "leader_epoch": 0, "partition_epoch": 3,
                           "new_isr": [1, 2], "new_isr_broker_epochs": parts[0].broker_epochs([1, 2])}
    assert rejected and rejected[0] == 3   # the refused item is handled as a refused AlterPartition


class _BehindController(_Controller):
    """Refuses every item: the broker's partition epoch is behind the controller's."""

    async def alter_partitions(self, broker_id, broker_epoch, items):
        self.batches.append(items)
        return [{"topic": it["topic"], "partition": it["partition"], "error_code": "INVALID_UPDATE_VERSION",
                 "message": f"partition epoch {it['partition_epoch']} is not the current one"} for it in items]


async def test_a_stale_partition_epoch_waits_for_the_metadata_before_asking_again(tmp_path):
    """INVALID_UPDATE_VERSION: asked again once the metadata brings a new partition epoch
    (or after ALTER_PARTITION_RETRY_MS), not at every check (issue 25: thousands of
    partitions refused every 300 ms while the broker applied a large create)."""
    cfg = BrokerConfig(broker_id=1, log_dirs=[str(tmp_path / "logs")], state_dir=str(tmp_path),
                       replica_lag_time_max_ms=100)   # a check every 50 ms
    broker = broker_server.Broker(cfg)
    parts = [Partition("t", n, 1, replicas=[1, 2, 3], isr=[1, 2, 3], leader_id=1, leader_epoch=0, partition_epoch=3)
             for n in range(2)]
    broker.lifecycle = _Lifecycle()
    broker.rm = _ReplicaManager(parts)
    broker.client = _BehindController()
    task = asyncio.create_task(broker._isr_loop())
    try:
        await asyncio.sleep(1.0)   # about 20 checks
        assert len(broker.client.batches) == 1
        for p in parts:
            p.partition_epoch = 4  # the metadata arrives
        deadline = asyncio.get_running_loop().time() + 5.0
        while len(broker.client.batches) < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        assert [it["partition_epoch"] for it in broker.client.batches[1]] == [4, 4]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        broker.executor.shutdown(wait=False)
