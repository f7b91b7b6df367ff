"""The controller's decision log states the lease a session-expiry fencing was decided on
(issue 24). Seen in a chaos run: "fenced broker 2: session expired: no heartbeat from
broker 2 for -77 ms": the reason was computed after the raft commit, from a lease that a
heartbeat arriving during the commit had renewed, which hid how long the broker had
really been silent.

In-process controller over the in-memory raft log, with a clock the test moves."""
from __future__ import annotations

import logging
import random

from metadata_quorum.controller import ControllerSettings
from metadata_quorum.controller_server import ControllerConfig, ControllerServer, Voter
from metadata_quorum.state_machine import MetadataStateMachine
from partitions.clock import ManualClock
from raft import InMemoryReplicatedLog
from tests.rigs.controller_inprocess import wait_until

SESSION_MS = 3000


async def test_fence_reason_is_the_silence_the_decision_saw_not_a_lease_renewed_during_the_commit(caplog):
    caplog.set_level(logging.INFO, logger="kraftlog.controller")
    clock = ManualClock()
    voters = {1: Voter(1, "127.0.0.1", 1, 2)}
    config = ControllerConfig(node_id=1, data_dir="/nonexistent", voters=voters, cluster_id="c-fence",
                              settings=ControllerSettings(broker_session_timeout_ms=SESSION_MS,
                                                          broker_silence_fence_ms=0))
    sm = MetadataStateMachine("c-fence")
    raft_log = InMemoryReplicatedLog(sm, node_id=1, leader=False)
    server = ControllerServer(config, sm, raft_log, clock=clock, rng=random.Random(1))
    raft_log.become_leader()
    await wait_until(lambda: server.is_active, 10.0)
    ctl = server.controller
    for b in (1, 2):
        await server.write(lambda img, b=b: ctl.register_broker(img, b, f"inc-{b}", f"http://127.0.0.1:{9000 + b}",
                                                                 None, clock.monotonic_ms(), clock.now_ms()))
        epoch = sm.image.brokers[b].epoch
        await server.write(lambda img, b=b, e=epoch: ctl.heartbeat(img, b, e, 10**9, clock.monotonic_ms()))
    assert not sm.image.brokers[2].fenced

    clock.advance(SESSION_MS + 1000)          # broker 2 silent 4 s; broker 1 keeps heartbeating
    ctl.sessions[1] = clock.monotonic_ms()
    propose = raft_log.propose

    async def propose_while_broker_2_heartbeats(entries, **kw):
        ctl.sessions[2] = clock.monotonic_ms() + 77   # its heartbeat is handled during the commit
        return await propose(entries, **kw)

    raft_log.propose = propose_while_broker_2_heartbeats
    await server.maintenance_once()
    assert sm.image.brokers[2].fenced
    fence = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("fenced broker 2 "))
    assert f"no heartbeat from broker 2 for {SESSION_MS + 1000} ms" in fence, fence
