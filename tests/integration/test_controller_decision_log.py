"""The controller logs every fencing decision at INFO with its reason (issue 24): fence on an
expired session, unfence on catching up, the ISR/leader changes fencing makes, AlterPartition.

In-process controller over the in-memory raft log, with a clock the test moves."""
from __future__ import annotations

import asyncio
import logging
import random

from aiohttp import web

from metadata_quorum.client import ControllerClient
from metadata_quorum.controller import ControllerSettings
from metadata_quorum.controller_server import ControllerConfig, ControllerServer, Voter
from metadata_quorum.state_machine import MetadataStateMachine
from partitions.clock import ManualClock
from raft import InMemoryReplicatedLog
from tests.rigs.controllers import free_port

SESSION_MS = 9000


async def _wait(pred, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_fencing_unfencing_and_isr_changes_are_logged_with_reasons(caplog):
    caplog.set_level(logging.INFO, logger="kraftlog.controller")
    clock = ManualClock()
    port = free_port()
    voters = {1: Voter(1, "127.0.0.1", free_port(), port)}
    config = ControllerConfig(node_id=1, data_dir="/nonexistent", voters=voters, cluster_id="c-log",
                              maintenance_interval_ms=20,
                              settings=ControllerSettings(broker_session_timeout_ms=SESSION_MS))
    sm = MetadataStateMachine("c-log")
    raft_log = InMemoryReplicatedLog(sm, node_id=1, leader=False)
    server = ControllerServer(config, sm, raft_log, clock=clock, rng=random.Random(1))
    runner = web.AppRunner(server.build_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    maint = asyncio.create_task(server.maintenance_loop())
    try:
        raft_log.become_leader()
        await _wait(lambda: server.is_active)
        async with ControllerClient([f"http://127.0.0.1:{port}"]) as c:
            epochs = {}
            for b in (1, 2, 3):
                epochs[b] = await c.register_broker(b, f"inc-{b}", f"http://127.0.0.1:{9000 + b}")
                await c.heartbeat(b, epochs[b], 10**9)
            await c.create_topic("orders", 1, 3)
            unfenced = [r.getMessage() for r in caplog.records if r.getMessage().startswith("unfenced broker")]
            assert len(unfenced) == 3 and all("caught up with metadata" in m for m in unfenced), unfenced

            p = (await c.metadata_json())["topics"][0]["partitions"][0]
            leader, victim = p["leader"], next(r for r in p["replicas"] if r != p["leader"])
            # a leader-driven ISR shrink (AlterPartition)
            changed = await c.alter_partition(leader, epochs[leader], "orders", 0, p["leader_epoch"],
                                              _partition_epoch(sm), [r for r in p["isr"] if r != victim])
            assert victim not in changed["isr"]
            await _wait(lambda: any("AlterPartition from leader" in r.getMessage() and "orders-0" in r.getMessage()
                                    for r in caplog.records))

            # the leader stops heartbeating: its session expires and the controller fences it
            clock.advance(SESSION_MS + 1000)
            for b in (1, 2, 3):
                if b != leader:
                    await c.heartbeat(b, epochs[b], 10**9)
            await _wait(lambda: any(r.getMessage().startswith(f"fenced broker {leader} ") for r in caplog.records))
            fence = next(r.getMessage() for r in caplog.records if r.getMessage().startswith(f"fenced broker {leader} "))
            assert "session expired" in fence and "broker_session_timeout_ms=9000" in fence, fence
            await _wait(lambda: any(f"leader {leader} -> " in r.getMessage() and "session expired" in r.getMessage()
                                    for r in caplog.records))
            assert all(r.levelno == logging.INFO for r in caplog.records
                       if r.getMessage().startswith(("fenced broker", "unfenced broker", "orders-0:")))
    finally:
        maint.cancel()
        await runner.cleanup()


def _partition_epoch(sm: MetadataStateMachine) -> int:
    with sm.lock:
        return sm.image.partition("orders", 0).partition_epoch
