"""Real controller processes with aggressive raft log compaction: pysyncobj full dumps +
journal truncation must lose nothing across restarts, a controller that missed the
compacted entries catches up from the leader's snapshot, and brokers far behind get a
snapshot from the metadata feed."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from metadata_quorum.client import ControllerClient, MetadataFollower
from tests.rigs.controllers import ControllerCluster, http_json

pytestmark = pytest.mark.integration

# poll deadlines (each poll ends once its condition holds): three Python controllers starting
# and electing on 2 shared cores took more than 20 s at load 20-40 (CI failed)
STARTUP_S = 120
WAIT_S = 60

COMPACTION_ENTRIES = 40


async def _writes(client: ControllerClient, prefix: str, n: int) -> None:
    for i in range(n):
        await client.alter_configs("t", {"retention.ms": f"{prefix}{i + 1}"})


async def test_compaction_restart_and_snapshot_install(tmp_path):
    with ControllerCluster(3, str(tmp_path), extra_args=[
            "--raft-log-compaction-min-entries", str(COMPACTION_ENTRIES),
            "--no-raft-log-compaction-split"]) as cluster:   # compact as soon as due: this test is about installs
        cluster.start_all()
        cluster.wait_active(STARTUP_S)
        async with ControllerClient(cluster.urls, request_timeout_ms=60_000) as client:
            epoch = await client.register_broker(1, "inc-1", "http://127.0.0.1:1")
            await client.heartbeat(1, epoch, 10**9)
            await client.create_topic("t", 2, 1)
            await _writes(client, "1", 3 * COMPACTION_ENTRIES)
            active = cluster.wait_active(WAIT_S)
            lagging = next(n for n in cluster.voters if n != active)
            cluster.kill(lagging)
            await _writes(client, "2", 3 * COMPACTION_ENTRIES)
            expected = await client.metadata_json()
            dumps = [os.path.join(str(tmp_path), f"controller-{n}", "raft", "raft.dump") for n in cluster.voters]
            assert any(os.path.exists(d) for d in dumps), "no pysyncobj full dump was written"

            # the lagging controller comes back: it needs entries the others compacted away
            cluster.start(lagging)
            url = cluster.voters[lagging].url + "/controller/v1/metadata"
            deadline = time.monotonic() + WAIT_S
            got = None
            while time.monotonic() < deadline:
                got = http_json(url)
                if got and got["metadata_offset"] >= expected["metadata_offset"]:
                    break
                await asyncio.sleep(0.1)
            assert got is not None and got["topics"] == expected["topics"]

            # a broker starting from offset 0 gets a snapshot (the feed tail starts after it)
            cluster.stop_all()
            cluster.start_all()
            cluster.wait_active(STARTUP_S)
            follower = MetadataFollower(client, max_wait_ms=0)
            target = (await client.metadata_json())["metadata_offset"]
            assert target >= expected["metadata_offset"]
            changes = []
            follower.on_change = lambda image, records: changes.append(records)
            while follower.image.offset < target:
                await follower.poll_once(max_wait_ms=0)
            assert changes[0] is None  # snapshot first
            assert follower.image.topic("t").configs == {"retention.ms": f"2{3 * COMPACTION_ENTRIES}"}
            assert follower.image.to_metadata_json()["topics"] == expected["topics"]
