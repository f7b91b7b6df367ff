"""A produce request naming hundreds of partitions does not hold the broker's event loop for
one long turn (issue 25): its appends are started `REQUEST_SLICE_PARTITIONS` at a time with a
turn of the loop between slices (http_api/loop_slices.py), so heartbeats, replica fetches and
`/healthz` are served meanwhile. At 3,334 partitions one turn used to take 1.2-1.5 s."""
import asyncio

import pytest

from http_api.broker.produce import ProduceRoutes
from http_api.loop_slices import REQUEST_SLICE_PARTITIONS, gather_in_slices
from tests.functional.broker_harness import running_broker
from tests.functional.fake_controller import FakeControllerClient


class LoopTurns:
    """Counts turns of the running event loop (a callback that re-schedules itself once per turn)."""

    def __init__(self) -> None:
        self.n = 0
        self._stopped = False
        asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        if not self._stopped:
            self.n += 1
            asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        self._stopped = True


async def test_gather_in_slices_starts_a_slice_per_turn_keeps_order_and_cancels_all():
    turns = LoopTurns()
    started: list[int] = []

    async def work(i: int) -> int:
        started.append(turns.n)
        await asyncio.sleep(0.001)
        return i * 2

    assert await gather_in_slices(work, range(25), slice_size=10) == [i * 2 for i in range(25)]
    per_turn: dict = {}
    for t in started:
        per_turn[t] = per_turn.get(t, 0) + 1
    assert max(per_turn.values()) <= 10 and len(per_turn) >= 3, per_turn
    # a cancelled gather cancels what it started
    blocked = asyncio.Event()
    made: list[asyncio.Task] = []

    async def hang(_i: int) -> None:
        made.append(asyncio.current_task())
        await blocked.wait()

    g = asyncio.ensure_future(gather_in_slices(hang, range(30), slice_size=10))
    while len(made) < 30:
        await asyncio.sleep(0)
    g.cancel()
    with pytest.raises(asyncio.CancelledError):
        await g
    await asyncio.sleep(0)
    assert all(t.cancelled() for t in made)
    turns.stop()


async def test_a_produce_to_many_partitions_is_started_a_slice_per_turn(tmp_path, monkeypatch):
    n = 2 * REQUEST_SLICE_PARTITIONS + 44
    controller = FakeControllerClient()
    async with running_broker(tmp_path, controller, 1) as b:
        r = await b.client.post("/v1/topics", json={"name": "wide", "partitions": n, "replication_factor": 1})
        assert r.status == 201, await r.text()
        turns = LoopTurns()
        started: list[int] = []
        original = ProduceRoutes._append_anywhere

        async def counted(self, topic, partition, batches, acks):
            started.append(turns.n)
            return await original(self, topic, partition, batches, acks)
        monkeypatch.setattr(ProduceRoutes, "_append_anywhere", counted)
        r = await b.client.post("/v1/topics/wide/records?acks=1",
                                json={"records": [{"value": f"v{p}", "partition": p} for p in range(n)]})
        body = await r.json()
        assert r.status == 200, body
        assert sorted(e["partition"] for e in body["offsets"]) == list(range(n))
        assert all(e["offset"] == 0 for e in body["offsets"])
        turns.stop()
        per_turn: dict = {}
        for t in started:
            per_turn[t] = per_turn.get(t, 0) + 1
        assert len(started) == n
        # without slicing all n start in the same turn
        assert max(per_turn.values()) <= REQUEST_SLICE_PARTITIONS and len(per_turn) >= 3, per_turn


async def test_a_leader_that_refused_a_forward_is_not_connected_to_again_for_a_moment():
    """After a kill -9 a produce naming thousands of partitions forwarded each to the dead
    leader, one refused connection per partition, again after each metadata refresh: a
    refusal now marks the leader for FORWARD_REFUSED_BACKOFF_MS and its other partitions
    fail as refused without a connection (the caller retries after a metadata refresh)."""
    import aiohttp

    from http_api.broker.produce import FORWARD_REFUSED_BACKOFF_MS
    from http_api.wire.errors import ErrorCode, KraftlogError

    dead, trace, attempts = dead_leader_and_counter()
    async with aiohttp.ClientSession(trace_configs=[trace]) as session:
        routes = forwarding_routes(session)
        for p in range(50):
            with pytest.raises(KraftlogError) as e:
                await routes._forward(dead, "t", p, b"x", 1)
            assert e.value.code is ErrorCode.BROKER_NOT_AVAILABLE and e.value.extra.get("refused")
        assert len(attempts) == 1           # one connection tried for 50 partitions
        await asyncio.sleep(FORWARD_REFUSED_BACKOFF_MS / 1000 + 0.05)
        with pytest.raises(KraftlogError) as e:
            await routes._forward(dead, "t", 0, b"x", 1)
        assert e.value.extra.get("refused")   # after the back-off a probe found it still refusing
        assert len(attempts) == 1           # ... with one TCP connect (_probe_refused), not a forward


async def test_after_the_back_off_one_probe_speaks_for_every_held_forward(monkeypatch):
    """At the end of each back-off, the forwards held for a dead leader's thousands of
    partitions each tried a connection, FORWARD_CONNECTIONS_PER_LEADER at a time (a tenth
    of a survivor's loop, issue 25): now one TCP connect probes it and the others wait for
    its answer. A leader that listens again gets the forwards at once."""
    import aiohttp
    from aiohttp import web

    from http_api.broker import produce
    from http_api.broker.produce import FORWARD_CONNECTIONS_PER_LEADER, FORWARD_REFUSED_BACKOFF_MS
    from http_api.wire.errors import ErrorCode, KraftlogError

    probes: list = []
    real = produce.connection_refused

    async def counting(url, timeout_s):
        probes.append(url)
        return await real(url, timeout_s)
    monkeypatch.setattr(produce, "connection_refused", counting)
    dead, trace, attempts = dead_leader_and_counter()
    async with aiohttp.ClientSession(trace_configs=[trace]) as session:
        routes = forwarding_routes(session)
        with pytest.raises(KraftlogError):
            await routes._forward(dead, "t", 0, b"x", 1)
        await asyncio.sleep(FORWARD_REFUSED_BACKOFF_MS / 1000 + 0.05)
        n = 3 * FORWARD_CONNECTIONS_PER_LEADER
        results = await asyncio.gather(*(routes._forward(dead, "t", p, b"x", 1) for p in range(n)),
                                       return_exceptions=True)
        assert all(isinstance(r, KraftlogError) and r.code is ErrorCode.BROKER_NOT_AVAILABLE
                   and r.extra.get("refused") for r in results)
        assert (len(attempts), len(probes)) == (1, 1)   # the first refusal, then one probe for 300
        # the leader's port listens again (a restarted broker): the next probe lets them through
        app = web.Application()

        async def produce_partition(request):
            await request.read()
            return web.json_response({"offsets": [{"partition": 0, "offset": 41}]})
        app.router.add_post("/v1/topics/{topic}/partitions/{partition}/records", produce_partition)
        runner = web.AppRunner(app)
        await runner.setup()
        port = int(dead.rsplit(":", 1)[1])
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            await asyncio.sleep(FORWARD_REFUSED_BACKOFF_MS / 1000 + 0.05)
            offsets = await asyncio.gather(*(routes._forward(dead, "t", p, b"x", 1) for p in range(20)))
            assert offsets == [41] * 20 and len(probes) == 2   # one more probe, then no more
            assert await routes._forward(dead, "t", 0, b"x", 1) == 41 and len(probes) == 2
        finally:
            await runner.cleanup()


async def test_concurrent_forwards_to_a_dead_leader_try_few_connections():
    """After a kill -9 thousands of partitions' forwards start at once: they wait for one of
    FORWARD_CONNECTIONS_PER_LEADER slots, and those that waited while a connection was
    refused fail without trying their own (queued in aiohttp's connector, each tried one,
    holding the event loop for seconds)."""
    import aiohttp

    from http_api.broker.produce import FORWARD_CONNECTIONS_PER_LEADER
    from http_api.wire.errors import ErrorCode, KraftlogError

    dead, trace, attempts = dead_leader_and_counter()
    async with aiohttp.ClientSession(trace_configs=[trace]) as session:
        routes = forwarding_routes(session)
        n = 5 * FORWARD_CONNECTIONS_PER_LEADER
        results = await asyncio.gather(*(routes._forward(dead, "t", p, b"x", 1) for p in range(n)),
                                       return_exceptions=True)
    assert all(isinstance(r, KraftlogError) and r.code is ErrorCode.BROKER_NOT_AVAILABLE
               and r.extra.get("refused") for r in results)
    assert len(attempts) <= FORWARD_CONNECTIONS_PER_LEADER, len(attempts)


def dead_leader_and_counter():
    """(URL nobody listens at, aiohttp TraceConfig, list that grows by one per connection tried)."""
    import socket

    import aiohttp

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()                               # nothing listens: connections are refused
    attempts: list = []
    trace = aiohttp.TraceConfig()

    async def on_start(_session, _ctx, _params):
        attempts.append(1)
    trace.on_connection_create_start.append(on_start)
    return dead, trace, attempts


def forwarding_routes(session) -> ProduceRoutes:
    from types import SimpleNamespace
    ctx = SimpleNamespace(config=SimpleNamespace(request_timeout_ms=2000),
                          deps=SimpleNamespace(http_session=session), rm=None, metrics=None)
    return ProduceRoutes(ctx)


async def test_a_produce_held_for_a_gone_leader_falls_back_to_retrying_rarely():
    """A partition whose leader refused the forward (its process is gone) or that has no
    leader waits for a metadata change of that partition, falling back to a retry only
    every NO_LEADER_REFRESH_WAIT_S: at 1 s, the 10,000 partitions held after a kill -9 at
    30,000 partitions retried every second, a quarter of a survivor's event loop while it
    was applying the fencing (issue 25). Other retryable errors keep the 1 s fallback."""
    from types import SimpleNamespace

    import aiohttp

    from http_api.broker.produce import METADATA_REFRESH_WAIT_S, NO_LEADER_REFRESH_WAIT_S

    class Stop(Exception):
        pass

    waits: list = []

    class View:
        async def partition_change(self, topic, partition, timeout):
            waits.append(timeout)
            raise Stop()

    dead, trace, attempts = dead_leader_and_counter()
    leader = {"id": 2, "url": dead}
    rm = SimpleNamespace(partitions={}, leads=lambda key: False,
                         leader_info=lambda t, p: (leader["id"], leader["url"]),
                         no_leader_message=lambda t, p: f"{t}-{p} has no leader")
    async with aiohttp.ClientSession(trace_configs=[trace]) as session:
        routes = forwarding_routes(session)
        routes.ctx.config.request_timeout_ms = 30_000
        routes.ctx.config.broker_id = 1
        routes.ctx.deps.metadata = View()
        routes.rm = rm
        for case in ("refused", "no leader", "becoming leader"):
            if case == "no leader":
                leader.update(id=-1, url=None)
            elif case == "becoming leader":
                leader.update(id=1, url="http://127.0.0.1:1")   # metadata says we lead, not applied yet
            with pytest.raises(Stop):
                await routes._append_anywhere("t", 0, [b"x"], 1)
    assert waits == [NO_LEADER_REFRESH_WAIT_S, NO_LEADER_REFRESH_WAIT_S, METADATA_REFRESH_WAIT_S], waits
    assert NO_LEADER_REFRESH_WAIT_S >= 5 * METADATA_REFRESH_WAIT_S
    assert len(attempts) == 1   # the refused leader was tried once


async def test_concurrent_gathers_share_one_slice_per_turn():
    """167 requests of 200 partitions each arrived together after a kill -9 at 100,000
    partitions: a slice per request per turn was 21,000 starts in one turn (1.3 s)."""
    turns = LoopTurns()
    started: list[int] = []

    async def work(i: int) -> int:
        started.append(turns.n)
        await asyncio.sleep(0)
        return i

    results = await asyncio.gather(*(gather_in_slices(work, range(r * 30, r * 30 + 30), slice_size=10)
                                     for r in range(8)))
    assert results == [list(range(r * 30, r * 30 + 30)) for r in range(8)]
    per_turn: dict = {}
    for t in started:
        per_turn[t] = per_turn.get(t, 0) + 1
    assert len(started) == 240
    assert max(per_turn.values()) <= 10, per_turn
    assert len(per_turn) >= 24, per_turn
    turns.stop()
