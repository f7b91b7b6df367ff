"""The group coordinator reads the time from the clock it is given (BrokerDeps.clock), so
session expiry follows that clock, not the machine's."""
import asyncio
import time

from broker_harness import running_broker
from fake_controller import FakeControllerClient

from partitions.clock import ManualClock

SESSION_TIMEOUT_MS = 30_000


async def test_a_member_expires_once_the_injected_clock_passes_its_session(tmp_path):
    clock = ManualClock(now_ms=int(time.time() * 1000))
    async with running_broker(tmp_path, FakeControllerClient(), clock=clock) as h:
        c = h.client
        r = await c.post("/v1/topics", json={"name": "tc", "partitions": 1, "replication_factor": 1})
        assert r.status == 201, await r.text()
        r = await c.post("/v1/groups/gc/join", json={"subscribed_topics": ["tc"],
                                                     "session_timeout_ms": SESSION_TIMEOUT_MS})
        assert r.status == 200, await r.text()
        member = (await r.json())["member_id"]

        async def members() -> list:
            doc = await (await c.get("/v1/groups/gc")).json()
            return [m["member_id"] for m in doc["members"]]

        assert await members() == [member]
        clock.advance(SESSION_TIMEOUT_MS + 1)   # 30 s on the coordinator's clock, none on the machine's
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 3.0   # the expiry check runs every 100 ms; the real session is 30 s
        while await members():
            assert loop.time() < deadline, "the member outlived its session on the coordinator's clock"
            await asyncio.sleep(0.05)
