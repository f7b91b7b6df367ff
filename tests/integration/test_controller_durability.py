"""Acknowledged metadata writes survive repeated kill -9 of the active controller: every
topic whose creation was answered 201 exists afterwards, on every controller, and nothing
appears that was never requested."""
from __future__ import annotations

import asyncio
import time

import pytest

from partitions.errors import KraftlogError
from metadata_quorum.client import ControllerClient
from tests.rigs.controllers import ControllerCluster, http_json

pytestmark = pytest.mark.integration

# poll deadlines (each poll ends once its condition holds): three Python controllers starting
# and electing on 2 shared cores took more than 20 s at load 20-40 (CI failed)
STARTUP_S = 120
WAIT_S = 60


async def test_acknowledged_creates_survive_failovers(tmp_path):
    with ControllerCluster(3, str(tmp_path)) as cluster:
        cluster.start_all()
        cluster.wait_active(STARTUP_S)
        async with ControllerClient(cluster.urls, request_timeout_ms=30_000) as client:
            epoch = await client.register_broker(1, "inc-1", "http://127.0.0.1:1")
            await client.heartbeat(1, epoch, 10**9)
            acknowledged, attempted = set(), set()
            stop = asyncio.Event()

            async def writer(w: int):
                i = 0
                while not stop.is_set():
                    name = f"w{w}-{i}"
                    i += 1
                    attempted.add(name)
                    try:
                        await client.create_topic(name, 1, 1)
                        acknowledged.add(name)
                    except KraftlogError:
                        pass

            async def more_acknowledged(n: int, timeout: float = WAIT_S) -> None:
                """Writes are being acknowledged: `n` more than now (the kills land mid-stream)."""
                target = len(acknowledged) + n
                deadline = time.monotonic() + timeout
                while len(acknowledged) < target:
                    assert time.monotonic() < deadline, f"only {len(acknowledged)} of {target} creates acknowledged"
                    await asyncio.sleep(0.02)

            writers = [asyncio.create_task(writer(w)) for w in range(4)]
            try:
                for _ in range(2):
                    await more_acknowledged(10)
                    active = await asyncio.to_thread(cluster.wait_active, WAIT_S)
                    cluster.kill(active)
                    await asyncio.to_thread(cluster.wait_active, WAIT_S, (active,))
                    cluster.start(active)
                await more_acknowledged(10)
            finally:
                stop.set()
                await asyncio.gather(*writers)
            assert len(acknowledged) > 20
            final = await client.metadata_json()
            offset = final["metadata_offset"]
            names = {t["name"] for t in final["topics"]}
            assert acknowledged <= names, sorted(acknowledged - names)[:5]
            assert names <= attempted
            # every controller converges on the same topics
            deadline = time.monotonic() + WAIT_S
            for v in cluster.voters.values():
                while True:
                    md = http_json(v.url + "/controller/v1/metadata")
                    if md and md["metadata_offset"] >= offset:
                        break
                    assert time.monotonic() < deadline, f"controller {v.node_id} did not catch up"
                    await asyncio.sleep(0.1)
                assert {t["name"] for t in md["topics"]} == names
