"""Broker heartbeats go out from a thread of their own (metadata_quorum/heartbeat_thread.py,
issue 25): a broker whose event loop is held for longer than its session timeout keeps its
lease, and one whose loop is wedged (held longer than `heartbeat_loop_stall_max_ms`) loses it,
then gets it back once the loop turns again. A real controller process decides."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from metadata_quorum.client import BrokerLifecycle, ControllerClient
from metadata_quorum.heartbeat_thread import BrokerHeartbeatThread
from tests.rigs.controllers import ControllerCluster, http_json

pytestmark = pytest.mark.integration

SESSION_TIMEOUT_MS = 2000
HEARTBEAT_INTERVAL_MS = 200
STARTUP_S = 60


def fenced_at_controller(cluster: ControllerCluster, broker_id: int) -> bool:
    body = http_json(cluster.urls[0] + "/controller/v1/brokers", timeout=5.0)
    return next(b for b in body["brokers"] if b["id"] == broker_id)["fenced"]


async def until(pred, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(pred):
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.1)


@pytest.fixture
def controller(tmp_path):
    with ControllerCluster(1, str(tmp_path), extra_args=[
            "--broker-session-timeout-ms", str(SESSION_TIMEOUT_MS),
            "--broker-heartbeat-interval-ms", str(HEARTBEAT_INTERVAL_MS)]) as cluster:
        cluster.start_all()
        cluster.wait_active(STARTUP_S)
        yield cluster


async def started_broker(client: ControllerClient, stall_max_ms: int, *, thread: bool = True) -> BrokerLifecycle:
    # a metadata follower that is always caught up: the controller unfences at the first heartbeat
    caught_up = SimpleNamespace(image=SimpleNamespace(offset=10**9))
    lc = BrokerLifecycle(client, 1, "http://127.0.0.1:1", metadata_follower=caught_up)
    await lc.start(heartbeat_thread=BrokerHeartbeatThread(lc, loop_stall_max_ms=stall_max_ms) if thread else None)
    await lc.heartbeat_once()
    assert not lc.is_fenced
    return lc


async def test_a_loop_held_past_the_session_timeout_keeps_the_lease(controller):
    async with ControllerClient(controller.urls) as client:
        lc = await started_broker(client, stall_max_ms=10_000)
        try:
            sent = lc._heartbeat_thread.heartbeats_sent
            time.sleep(SESSION_TIMEOUT_MS * 1.6 / 1000)   # one synchronous step holds the loop
            # the thread went on: heartbeats answered while the loop was held
            assert lc.heartbeat_silence_ms() < 1000
            assert lc._heartbeat_thread.heartbeats_sent >= sent + 5
            assert not await asyncio.to_thread(fenced_at_controller, controller, 1)
        finally:
            await lc.stop()


async def test_a_loop_held_by_heartbeats_on_the_loop_loses_the_lease(controller):
    """The same hold with heartbeats sent from the loop (the old way): fenced. What the
    thread is for."""
    async with ControllerClient(controller.urls) as client:
        lc = await started_broker(client, stall_max_ms=10_000, thread=False)
        try:
            time.sleep(SESSION_TIMEOUT_MS * 1.6 / 1000)
            assert lc.heartbeat_silence_ms() >= SESSION_TIMEOUT_MS
            assert await asyncio.to_thread(fenced_at_controller, controller, 1)
        finally:
            await lc.stop()


async def test_a_wedged_loop_loses_the_lease_and_gets_it_back(controller):
    stall_max_ms = 500
    async with ControllerClient(controller.urls) as client:
        lc = await started_broker(client, stall_max_ms=stall_max_ms)
        try:
            time.sleep((stall_max_ms + SESSION_TIMEOUT_MS) / 1000 + 1.0)   # wedged: no turn at all
            assert lc._heartbeat_thread.heartbeats_skipped >= 3
            assert lc.heartbeat_silence_ms() >= SESSION_TIMEOUT_MS
            assert await asyncio.to_thread(fenced_at_controller, controller, 1)
            # the loop turns again: heartbeats resume and the controller unfences the broker
            await until(lambda: not fenced_at_controller(controller, 1), "broker unfenced after the wedge")
            assert await lc.wait_unfenced(10)
            assert lc.heartbeat_silence_ms() < 1000
        finally:
            await lc.stop()
        assert lc._heartbeat_thread is None


async def test_stop_ends_the_thread(controller):
    async with ControllerClient(controller.urls) as client:
        lc = await started_broker(client, stall_max_ms=5000)
        thread = lc._heartbeat_thread._thread
        assert thread.is_alive()
        await lc.stop()
        assert not thread.is_alive()
