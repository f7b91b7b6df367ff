"""Regression (found by `python -m tests.chaos.run --minutes 12 --seed 101`: 4
committed-offset-regression anomalies, each right after a blackhole-broker fault): a
deposed group coordinator keeps answering GET /v1/groups/{g}/offsets from its in-memory
state, so committed offsets read back go *backwards* for a while after a newer commit was
acknowledged by the new coordinator.

Observed (seed 101, group chaos-group, partition 1):
  501.6 s  read 11108            (broker 3 had just been blackholed 498.3-501.1 s)
  502.1 s  commit 11115 -> 200   (new coordinator)
  502.1 s  read 11108  <- stale, answered by the old coordinator
  502.7 s  read 11115
  503.2 s  read 11108  <- stale again (reads go to random brokers)
A consumer (re)starting in that window resumes from an older offset (duplicates; no
commit is lost: later reads see the newer offset).

Why: the old coordinator is the __consumer_offsets partition leader in its own (stale)
metadata: its links were blackholed, so its metadata long poll hangs until the client
timeout, and `GroupCoordinator.route` serves `fetch_offsets` locally whenever the local
view says "leader here". Kafka bounds the same window with the leader epoch check on the
partition; a fix here (owner: consumer groups, http_api/broker/groups.py): answer offsets
fetches only while the local replica is provably leader (e.g. its followers fetched within
replica.lag.time.max.ms / a fresh metadata heartbeat), else NOT_COORDINATOR /
COORDINATOR_NOT_AVAILABLE so the client retries on the new coordinator.
Fixed in d227b69 (groups: read barrier before answering group state).
"""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.chaos.harness.cluster import ChaosCluster
from tests.chaos.harness.history import History
from tests.chaos.harness.workload import Workload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GROUP = "stale-reader"


async def _json(session, method, url, **kw):
    async with session.request(method, url, timeout=aiohttp.ClientTimeout(total=5), **kw) as r:
        return r.status, await r.json(content_type=None)


async def _commit(session, url, offset) -> int:
    status, _ = await _json(session, "POST", f"{url}/v1/groups/{GROUP}/offsets",
                            json={"offsets": [{"topic": "t", "partition": 0, "offset": offset}]})
    return status


async def test_regression_deposed_coordinator_never_answers_older_committed_offsets(tmp_path):
    cluster = ChaosCluster(str(tmp_path / "cluster"))
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, cluster.start)
    try:
        async with Workload(cluster, History(), topic="t", partitions=1, idempotent_every=0) as wl:
            await wl.create_topic()
            s = wl.session
            deadline = time.monotonic() + 30
            while await _commit(s, cluster.direct_url(1), 5) != 200:
                assert time.monotonic() < deadline, "the first commit never succeeded"
                await asyncio.sleep(0.3)
            _, doc = await _json(s, "GET", f"{cluster.direct_url(1)}/v1/groups/{GROUP}/coordinator")
            old = doc["coordinator_id"]
            # the coordinator loses every link (hangs, as a partition does); it is fenced and
            # another broker becomes the coordinator
            for proxy, src in cluster.links_from(old) + cluster.links_to(old):
                proxy.blackhole(src)
            other = next(i for i in cluster.ids if i != old)
            while True:
                assert time.monotonic() < deadline + 30, "no new coordinator was elected"
                try:
                    _, doc = await _json(s, "GET", f"{cluster.direct_url(other)}/v1/groups/{GROUP}/coordinator")
                    if doc.get("coordinator_id") not in (old, None, -1) and \
                            await _commit(s, cluster.direct_url(other), 9) == 200:
                        break
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await asyncio.sleep(0.3)
            # the deposed coordinator, asked directly, must not answer the older offset
            status, doc = await _json(s, "GET", f"{cluster.direct_url(old)}/v1/groups/{GROUP}/offsets")
            cluster.heal_network()
    finally:
        await loop.run_in_executor(None, cluster.stop)
    if status == 200:
        got = {(o["topic"], o["partition"]): o["offset"] for o in doc["offsets"]}.get(("t", 0))
        assert got == 9, f"deposed coordinator {old} answered committed offset {got} after 9 was committed"
    else:
        assert doc.get("error_code") in ("NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE",
                                         "COORDINATOR_LOAD_IN_PROGRESS"), doc
