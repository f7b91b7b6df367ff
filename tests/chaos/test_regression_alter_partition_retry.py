"""Regression (found by the simulation: seeds 18, 22, 26, 27, 31, ... of tests/sim never
converged once message loss hit an AlterPartition): the broker's `_isr_loop` marks a
partition epoch as "asked" *before* sending AlterPartition and never clears the mark when
the call fails (controller unreachable past the client's request timeout, a controller
failover, a lost answer). It then never asks again until something else bumps the partition
epoch: the ISR stays shrunk forever although the follower is caught up. With
min.insync.replicas=2 and an ISR stuck at one member, every acks=all produce is refused
(NOT_ENOUGH_REPLICAS) for good: an unavailability that outlives the fault.

Fix (owner: replication, http_api/broker/server.py `_isr_loop`): forget the pending mark
when the call fails (or after a timeout), so the next check asks again.
"""
from __future__ import annotations

import asyncio

import http_api.broker.server as broker_server
from http_api.broker.config import BrokerConfig
from partitions.replication.partition import Partition


class _Lifecycle:
    broker_epoch = 7


class _ReplicaManager:
    _topic_configs: dict = {}

    def __init__(self, part):
        self.part = part

    def replica_lag_time_max_ms(self, topic, default_ms):
        return default_ms

    isr_check_busy_s = 0.0

    async def isr_changes_sliced(self, replica_lag_time_max_ms):
        return [(self.part, [1, 2, 3])]   # follower 3 is caught up and should rejoin

    def shrink_still_due(self, part, new_isr, replica_lag_time_max_ms):
        return True


class _FlakyController:
    """The first AlterPartition fails (controller unreachable), later ones succeed."""

    def __init__(self):
        self.calls = 0

    async def alter_partition(self, *args):
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("controller unreachable")
        return {}


async def test_regression_isr_loop_asks_again_after_a_failed_alter_partition(tmp_path):
    cfg = BrokerConfig(broker_id=1, log_dirs=[str(tmp_path / "logs")], state_dir=str(tmp_path),
                       replica_lag_time_max_ms=100)
    broker = broker_server.Broker(cfg)
    part = Partition("t", 0, 1, replicas=[1, 2, 3], isr=[1, 2], leader_id=1, leader_epoch=0, partition_epoch=3)
    broker.lifecycle = _Lifecycle()
    broker.rm = _ReplicaManager(part)
    broker.client = _FlakyController()
    task = asyncio.create_task(broker._isr_loop())
    try:
        deadline = asyncio.get_running_loop().time() + 2.0
        while broker.client.calls < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        broker.executor.shutdown(wait=False)
    assert broker.client.calls >= 2, (
        "after a failed AlterPartition the broker never asked again for the same partition epoch: "
        "the ISR stays shrunk (acks=all refused with NOT_ENOUGH_REPLICAS) until another change")
