"""Real controller processes with a short broker session: a fake broker driven through
ControllerClient stops heartbeating, is fenced, loses its leaderships to ISR replicas, and is
unfenced when it heartbeats again with a caught-up metadata offset. Stale broker epochs
cannot change an ISR; bad requests get clear errors."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from partitions.errors import ErrorCode, KraftlogError
from metadata_quorum.client import ControllerClient
from tests.rigs.controllers import ControllerCluster

pytestmark = pytest.mark.integration

SESSION_MS = 1000


async def _poll(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached in time")


async def test_session_expiry_fences_and_heartbeat_unfences(tmp_path):
    with ControllerCluster(3, str(tmp_path), extra_args=["--broker-session-timeout-ms", str(SESSION_MS),
                                                          "--broker-heartbeat-interval-ms", "200"]) as cluster:
        cluster.start_all()
        cluster.wait_active(20)
        async with ControllerClient(cluster.urls, request_timeout_ms=10_000) as client:
            epochs = {}
            for b in (1, 2, 3):
                epochs[b] = await client.register_broker(b, f"inc-{b}", f"http://127.0.0.1:{9000 + b}")
                hb = await client.heartbeat(b, epochs[b], 10**9)
                assert not hb["fenced"]
            topic = await client.create_topic("t", 6, 3)
            led_by_1 = [p["partition"] for p in topic["partitions"] if p["leader"] == 1]
            assert led_by_1

            alive = {2, 3}

            async def heartbeats():
                while True:
                    for b in list(alive):
                        await client.heartbeat(b, epochs[b], 10**9)
                    await asyncio.sleep(0.2)

            hb_task = asyncio.create_task(heartbeats())
            try:
                t0 = time.monotonic()

                async def fenced():
                    md = await client.metadata_json()
                    return md if next(b for b in md["brokers"] if b["id"] == 1)["fenced"] else None

                md = await _poll(fenced, 10)
                fenced_after = time.monotonic() - t0
                assert fenced_after >= SESSION_MS / 1000 * 0.8
                parts = md["topics"][0]["partitions"]
                for p in parts:
                    assert 1 not in p["isr"] and p["leader"] in (2, 3) and p["leader"] in p["isr"]
                    if p["partition"] in led_by_1:
                        assert p["leader_epoch"] == 1
                # a stale broker epoch cannot change an ISR
                p0 = parts[0]
                with pytest.raises(KraftlogError) as exc:
                    await client.alter_partition(p0["leader"], epochs[p0["leader"]] - 1, "t", 0, p0["leader_epoch"],
                                                 0, [p0["leader"]])
                assert exc.value.code is ErrorCode.STALE_BROKER_EPOCH
                # a behind metadata offset keeps it fenced; a caught-up one unfences it
                hb = await client.heartbeat(1, epochs[1], epochs[1])
                assert hb["fenced"]
                hb = await client.heartbeat(1, epochs[1], hb["metadata_offset"])
                assert not hb["fenced"]
                alive.add(1)
                md = await client.metadata_json()
                assert not next(b for b in md["brokers"] if b["id"] == 1)["fenced"]
                print(f"\nbroker fenced {fenced_after:.2f} s after its last heartbeat (session {SESSION_MS} ms)")
            finally:
                hb_task.cancel()


async def test_bad_requests_get_clear_errors(tmp_path):
    with ControllerCluster(1, str(tmp_path)) as cluster:
        cluster.start_all()
        active = cluster.wait_active(20)
        base = cluster.voters[active].url + "/controller/v1"
        async with aiohttp.ClientSession() as s:
            cases = [
                ("POST", "/brokers/register", b"[]", 400, "INVALID_REQUEST"),
                ("POST", "/brokers/register", b'{"broker_id": "x", "incarnation_id": "i", "url": "http://a"}', 400,
                 "INVALID_REQUEST"),
                ("POST", "/brokers/heartbeat", b'{"broker_id": 5, "broker_epoch": 3}', 409, "STALE_BROKER_EPOCH"),
                ("POST", "/alter-partition", b'{"broker_id": 5}', 400, "INVALID_REQUEST"),
                ("POST", "/topics", b"garbage", 400, "INVALID_REQUEST"),
                ("POST", "/topics/nope/partitions", b'{"count": 3}', 404, "UNKNOWN_TOPIC_OR_PARTITION"),
                ("DELETE", "/topics/nope", b"", 404, "UNKNOWN_TOPIC_OR_PARTITION"),
                ("POST", "/producer-ids", b'{"broker_id": 1, "broker_epoch": 1}', 409, "STALE_BROKER_EPOCH"),
                ("POST", "/elect-leaders", b'{"partitions": 3}', 400, "INVALID_REQUEST"),
            ]
            for method, path, data, status, code in cases:
                async with s.request(method, base + path, data=data) as resp:
                    body = await resp.json(content_type=None)
                    assert (resp.status, body["error_code"]) == (status, code), (path, body)
                    assert body["message"]
            async with s.get(cluster.voters[active].url + "/healthz") as resp:
                assert resp.status == 200
        assert cluster.procs[active].poll() is None  # still alive
