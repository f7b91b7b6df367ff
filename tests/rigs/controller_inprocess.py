"""One controller in-process for shell tests: `ControllerServer` over the in-memory raft log,
served on a free port, its maintenance loop running, a clock the test moves; brokers 1-3
registered and heartbeating (unfenced). Used by tests that drive the controller's decisions
through its real HTTP routes without raft or broker processes."""
from __future__ import annotations

import asyncio
import random
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from aiohttp import web

from metadata_quorum.client import ControllerClient
from metadata_quorum.controller import ControllerSettings
from metadata_quorum.controller_server import ControllerConfig, ControllerServer, Voter
from metadata_quorum.state_machine import MetadataStateMachine
from partitions.clock import ManualClock
from raft import InMemoryReplicatedLog
from tests.rigs.controllers import free_port


async def wait_until(pred: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll `pred` every 10 ms until it holds; AssertionError after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@dataclass
class InProcessController:
    server: ControllerServer
    client: ControllerClient
    clock: ManualClock
    epochs: dict   # broker id -> its registration epoch


@asynccontextmanager
async def inprocess_controller(sm: MetadataStateMachine, cluster_id: str, settings: ControllerSettings,
                               maintenance_interval_ms: int = 20) -> AsyncIterator[InProcessController]:
    clock = ManualClock()
    port = free_port()
    voters = {1: Voter(1, "127.0.0.1", free_port(), port)}
    config = ControllerConfig(node_id=1, data_dir="/nonexistent", voters=voters, cluster_id=cluster_id,
                              maintenance_interval_ms=maintenance_interval_ms, settings=settings)
    raft_log = InMemoryReplicatedLog(sm, node_id=1, leader=False)
    server = ControllerServer(config, sm, raft_log, clock=clock, rng=random.Random(1))
    runner = web.AppRunner(server.build_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    maint = asyncio.create_task(server.maintenance_loop())
    try:
        raft_log.become_leader()
        await wait_until(lambda: server.is_active)
        async with ControllerClient([f"http://127.0.0.1:{port}"]) as c:
            epochs = {}
            for b in (1, 2, 3):
                epochs[b] = await c.register_broker(b, f"inc-{b}", f"http://127.0.0.1:{9000 + b}")
                await c.heartbeat(b, epochs[b], 10**9)
            yield InProcessController(server, c, clock, epochs)
    finally:
        maint.cancel()
        await runner.cleanup()
