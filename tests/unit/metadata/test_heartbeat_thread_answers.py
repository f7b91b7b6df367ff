"""The heartbeat thread's answers reach the broker's loop safely (metadata_quorum/
heartbeat_thread.py): an answer about an older registration changes nothing, a stale epoch
makes the loop register again (once), and the log reports built on the loop after an answer
go out with the thread's next heartbeat. A scripted controller client, no sockets."""
from __future__ import annotations

import asyncio
import time

from metadata_quorum.client import BrokerLifecycle
from metadata_quorum.heartbeat_thread import BrokerHeartbeatThread
from partitions.errors import ErrorCode, KraftlogError


class ScriptedClient:
    """ControllerClient's broker calls, answered like the controller does."""

    def __init__(self) -> None:
        self.active_url = "http://controller"
        self.try_timeout_ms = 2000
        self.epoch = 10
        self.registrations = 0
        self.heartbeats: list[dict] = []
        self.stale_up_to = 0   # heartbeats of registrations up to this epoch are refused (lost)

    def twin(self) -> "ScriptedClient":
        return self

    async def close(self) -> None:
        pass

    async def register_broker_full(self, broker_id, incarnation_id, url, rack=None, clean_shutdown=True,
                                   kafka_address=None) -> dict:
        self.registrations += 1
        self.epoch += 1
        return {"broker_epoch": self.epoch, "fenced": False, "heartbeat_interval_ms": 20,
                "session_timeout_ms": 500}

    async def heartbeat(self, broker_id, broker_epoch, metadata_offset, want_shutdown=False, timeout_ms=None,
                        log_reports=None) -> dict:
        self.heartbeats.append({"broker_epoch": broker_epoch, "log_reports": log_reports})
        if broker_epoch <= self.stale_up_to:
            raise KraftlogError(ErrorCode.STALE_BROKER_EPOCH, f"registration {broker_epoch} was replaced")
        return {"broker_epoch": broker_epoch, "fenced": False}


async def until(pred, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


async def test_an_answer_about_an_older_registration_changes_nothing():
    lc = BrokerLifecycle(ScriptedClient(), 1, "http://b1")
    await lc.register()
    lc.is_fenced = False
    ok_before = lc.last_heartbeat_ok
    lc.apply_heartbeat_answer({"broker_epoch": lc.broker_epoch - 1, "fenced": True}, time.monotonic() + 5)
    assert not lc.is_fenced and lc.last_heartbeat_ok == ok_before
    lc.apply_heartbeat_answer({"broker_epoch": lc.broker_epoch, "fenced": True}, ok_before + 1)
    assert lc.is_fenced and lc.last_heartbeat_ok == ok_before + 1


async def test_a_stale_epoch_registers_again_once_and_heartbeats_go_on():
    client = ScriptedClient()
    lc = BrokerLifecycle(client, 1, "http://b1")
    await lc.start(heartbeat_thread=BrokerHeartbeatThread(lc, loop_stall_max_ms=5000))
    first_epoch = lc.broker_epoch
    try:
        # the registration is lost: the next heartbeats are refused until we register again
        client.stale_up_to = first_epoch
        await until(lambda: lc.broker_epoch != first_epoch)
        assert client.registrations == 2
        await until(lambda: any(h["broker_epoch"] == lc.broker_epoch for h in client.heartbeats[-3:]))
        # the thread's heartbeats now carry the new registration
        n = len(client.heartbeats)
        await until(lambda: len(client.heartbeats) >= n + 3)
        assert all(h["broker_epoch"] == lc.broker_epoch for h in client.heartbeats[n:])
    finally:
        await lc.stop()


async def test_log_reports_built_on_the_loop_go_out_with_the_next_heartbeat():
    client = ScriptedClient()
    lc = BrokerLifecycle(client, 1, "http://b1")
    built_on = []
    report = [{"topic": "t", "partition": 0, "partition_epoch": 3, "last_epoch": 2, "log_end_offset": 9}]

    def reports():
        built_on.append(asyncio.get_running_loop())
        return report
    lc.log_reports_fn = reports
    await lc.start(heartbeat_thread=BrokerHeartbeatThread(lc, loop_stall_max_ms=5000))
    try:
        await until(lambda: any(h["log_reports"] == report for h in client.heartbeats))
        assert set(built_on) == {asyncio.get_running_loop()}   # built on the broker's loop, never the thread's
    finally:
        await lc.stop()


async def test_an_interval_longer_than_the_stall_limit_still_heartbeats():
    """The loop check times the broker loop's answer to the thread's callback, not the time
    since the last heartbeat: a heartbeat interval above `heartbeat_loop_stall_max_ms` (the
    controller announces the interval) must not hold every heartbeat of a healthy broker."""
    client = ScriptedClient()
    lc = BrokerLifecycle(client, 1, "http://b1", heartbeat_interval_ms=60)
    thread = BrokerHeartbeatThread(lc, loop_stall_max_ms=20)
    await lc.start(heartbeat_thread=thread)
    try:
        await until(lambda: len(client.heartbeats) >= 3)
        assert thread.heartbeats_skipped == 0
    finally:
        await lc.stop()
