"""POST /controller/v1/alter-partitions (batched AlterPartition, issue 25) in-process over
the in-memory raft log, through ControllerClient.alter_partitions: one write changes every
accepted item, refused items come back as per-partition errors."""
from __future__ import annotations

import pytest

from metadata_quorum.client import ControllerClient
from partitions.errors import ErrorCode, KraftlogError
from tests.functional.test_controller_api import register, start_node, stop_node


@pytest.fixture
async def node():
    n = await start_node()
    yield n
    await stop_node(n)


async def test_batched_alter_partition_route(node):
    async with ControllerClient([node.url]) as c:
        epochs = {b: await register(c, b) for b in (1, 2, 3)}
        await c.create_topic("big", 12, 3)
        md = await c.metadata_json()
        parts = md["topics"][0]["partitions"]
        led = [p for p in parts if p["leader"] == 1]
        items = [{"topic": "big", "partition": p["partition"], "leader_epoch": p["leader_epoch"],
                  "partition_epoch": p.get("partition_epoch", 0), "new_isr": [1],
                  "new_isr_broker_epochs": {1: epochs[1]}} for p in led]
        items[0]["partition_epoch"] += 5   # stale: refused alone
        writes = node.server.writes
        answers = await c.alter_partitions(1, epochs[1], items)
        assert node.server.writes == writes + 1   # one controller write for the whole batch
        assert answers[0]["error_code"] == "INVALID_UPDATE_VERSION" and answers[0]["partition"] == items[0]["partition"]
        assert all(a["isr"] == [1] and a["topic"] == "big" for a in answers[1:])
        after = {p["partition"]: p for p in (await c.metadata_json())["topics"][0]["partitions"]}
        assert len(after[items[0]["partition"]]["isr"]) == 3
        assert all(after[it["partition"]]["isr"] == [1] for it in items[1:])
        with pytest.raises(KraftlogError) as exc:
            await c.alter_partitions(1, epochs[1] + 1, items[1:])
        assert exc.value.code is ErrorCode.STALE_BROKER_EPOCH
