"""The controller HTTP API in-process over the in-memory raft log: request validation,
error bodies, NOT_CONTROLLER redirects, idempotent retries, the metadata feed, and the
broker-side client classes (ControllerClient, MetadataFollower, BrokerLifecycle)."""
from __future__ import annotations

import asyncio
import random

import aiohttp
import pytest
from aiohttp import web

from partitions.errors import ErrorCode, KraftlogError
from metadata_quorum.client import BrokerLifecycle, ControllerClient, MetadataFollower
from metadata_quorum.controller import ControllerSettings
from metadata_quorum.controller_server import ControllerConfig, ControllerServer, Voter
from metadata_quorum.state_machine import MetadataStateMachine
from tests.rigs.controllers import free_port
from raft import InMemoryReplicatedLog, OutcomeUnknownError


class Node:
    def __init__(self, server, runner, url, raft_log):
        self.server, self.runner, self.url, self.log = server, runner, url, raft_log


async def start_node(leader=True, node_id=1, voters=None, feed_retained=100_000, **cfg):
    port = voters[node_id].http_port if voters else free_port()
    voters = voters or {node_id: Voter(node_id, "127.0.0.1", free_port(), port)}
    config = ControllerConfig(node_id=node_id, data_dir="/nonexistent", voters=voters, cluster_id="c-test",
                              maintenance_interval_ms=20, **cfg)
    sm = MetadataStateMachine("c-test", feed_retained_records=feed_retained)
    raft_log = InMemoryReplicatedLog(sm, node_id=node_id, leader=False)
    server = ControllerServer(config, sm, raft_log, rng=random.Random(1))
    runner = web.AppRunner(server.build_app())
    await runner.setup()
    node = Node(server, runner, f"http://127.0.0.1:{port}", raft_log)
    server._maint = None
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        server._maint = asyncio.create_task(server.maintenance_loop())
        if leader:
            raft_log.become_leader()
            await until(lambda: server.is_active, "the controller active")
    except BaseException:
        await stop_node(node)
        raise
    return node


async def stop_node(node):
    if node.server._maint is not None:
        node.server._maint.cancel()
    await node.runner.cleanup()


async def until(pred, what: str, timeout: float = 20.0) -> None:
    """Poll `pred` until true; fail after `timeout` seconds naming `what`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        await asyncio.sleep(0.005)


@pytest.fixture
async def node():
    n = await start_node()
    yield n
    await stop_node(n)


async def raw(method, url, **kw):
    async with aiohttp.ClientSession() as s:
        async with s.request(method, url, **kw) as resp:
            return resp.status, await resp.json(content_type=None)


async def register(client, b, offset_follow=True):
    epoch = await client.register_broker(b, f"inc-{b}", f"http://127.0.0.1:{9000 + b}")
    await client.heartbeat(b, epoch, 10**9)
    return epoch


async def test_create_topic_shapes_and_errors(node):
    async with ControllerClient([node.url]) as c:
        for b in (1, 2, 3):
            await register(c, b)
        base = node.url + "/controller/v1"
        status, body = await raw("POST", base + "/topics", json={"name": "orders", "partitions": 3,
                                                                  "replication_factor": 2, "configs": {}})
        assert status == 201
        assert body["name"] == "orders" and len(body["partitions"]) == 3
        assert set(body["partitions"][0]) == {"partition", "leader", "leader_epoch", "replicas", "isr", "adding_replicas",
                                             "removing_replicas"}
        cases = [
            ({"name": "orders", "partitions": 1, "replication_factor": 1}, 409, "TOPIC_ALREADY_EXISTS"),
            ({"name": "bad/name", "partitions": 1, "replication_factor": 1}, 400, "INVALID_TOPIC_EXCEPTION"),
            ({"name": "x", "partitions": 0, "replication_factor": 1}, 400, "INVALID_PARTITIONS"),
            ({"name": "x", "partitions": 1, "replication_factor": 4}, 400, "INVALID_REPLICATION_FACTOR"),
            ({"name": "x", "partitions": 1, "replication_factor": 1, "configs": {"nope": "1"}}, 400, "INVALID_CONFIG"),
        ]
        for req, want_status, want_code in cases:
            status, body = await raw("POST", base + "/topics", json=req)
            assert (status, body["error_code"]) == (want_status, want_code), body
            assert body["message"]
        status, body = await raw("POST", base + "/topics", data=b"{not json")
        assert status == 400 and body["error_code"] == "INVALID_REQUEST"
        status, body = await raw("POST", base + "/brokers/heartbeat", json={"broker_id": 77, "broker_epoch": 1})
        assert status == 409 and body["error_code"] == "STALE_BROKER_EPOCH"
        status, body = await raw("POST", base + "/alter-partition", json=[1, 2])
        assert status == 400
        status, body = await raw("GET", base + "/metadata/records?after=abc")
        assert status == 400
        md = await c.metadata_json()
        assert md["controller_id"] == 1 and md["metadata_offset"] > 0 and md["cluster_id"] == "c-test"
        # delete, partitions, configs through the client
        await c.create_partitions("orders", 5)
        assert len((await c.metadata_json())["topics"][0]["partitions"]) == 5
        assert (await c.alter_configs("orders", {"retention.ms": "1000"}))["configs"] == {"retention.ms": "1000"}
        with pytest.raises(KraftlogError) as exc:
            await c.alter_configs("orders", {"retention.ms": "never"})
        assert exc.value.code is ErrorCode.INVALID_CONFIG
        await c.delete_topic("orders")
        assert (await c.metadata_json())["topics"] == []
        first, size = await c.allocate_producer_ids(1, (await c.register_broker(1, "inc-1", "http://127.0.0.1:9001")))
        assert (first, size) == (0, 1000)


async def test_retry_after_unknown_outcome_is_applied_once(node):
    async with ControllerClient([node.url]) as c:
        await register(c, 1)
        node.log.fail_next(OutcomeUnknownError("answer lost"), apply=True)
        topic = await c.create_topic("once", 2, 1)  # first try 504, retry with the same request id
        assert topic["name"] == "once"
        assert [t["name"] for t in (await c.metadata_json())["topics"]] == ["once"]


async def test_standby_redirects_writes_with_not_controller():
    voters = {1: Voter(1, "127.0.0.1", free_port(), free_port()), 2: Voter(2, "127.0.0.1", free_port(), free_port())}
    active = await start_node(node_id=1, voters=voters)
    try:
        standby = await start_node(leader=False, node_id=2, voters=voters)
    except BaseException:
        await stop_node(active)
        raise
    try:
        status, body = await raw("POST", standby.url + "/controller/v1/topics",
                                 json={"name": "t", "partitions": 1, "replication_factor": 1})
        assert status == 421 and body["error_code"] == "NOT_CONTROLLER" and "leader_url" in body
        async with ControllerClient([standby.url, active.url], request_timeout_ms=3000) as c:
            await register(c, 1)  # the client moves on to the active controller
            assert c.active_url == active.url
        status, body = await raw("GET", standby.url + "/controller/v1/metadata?require_active=true")
        assert status == 421 and body["error_code"] == "NOT_CONTROLLER"
        status, body = await raw("GET", standby.url + "/controller/v1/metadata")
        assert status == 200 and "metadata_offset" in body  # standby reads carry their offset
        status, body = await raw("GET", standby.url + "/controller/v1/status")
        assert body["is_active"] is False and body["node_id"] == 2
    finally:
        await stop_node(active)
        await stop_node(standby)


async def test_follower_long_poll_and_snapshot_fallback():
    n = await start_node(feed_retained=5)
    try:
        async with ControllerClient([n.url]) as c:
            for b in (1, 2):
                await register(c, b)
            for i in range(8):
                await c.create_topic(f"t{i}", 1, 1)
            changes = []
            f = MetadataFollower(c, lambda image, recs: changes.append(recs), max_wait_ms=2000)
            await f.poll_once()
            assert changes[0] is None  # offset 0 is older than the retained tail: snapshot
            assert f.image.to_metadata_json() == n.server.sm.image.to_metadata_json()
            task = asyncio.create_task(f.run())
            try:
                await c.create_topic("late", 1, 1)
                target = n.server.sm.image.offset
                assert await f.wait_for_offset(target, 3)
                assert f.image.topic("late") is not None and changes[-1]
            finally:
                f.stop()
                task.cancel()
    finally:
        await stop_node(n)


async def test_broker_lifecycle_fencing_unfencing_and_controlled_shutdown():
    n = await start_node(settings=ControllerSettings(broker_session_timeout_ms=400, broker_heartbeat_interval_ms=100))
    try:
        async with ControllerClient([n.url]) as c:
            follower = MetadataFollower(c, max_wait_ms=500)
            ftask = asyncio.create_task(follower.run())
            brokers = []
            try:
                for b in (1, 2, 3):
                    lc = BrokerLifecycle(c, b, f"http://127.0.0.1:{9100 + b}", metadata_follower=follower)
                    await lc.start()
                    brokers.append(lc)
                for lc in brokers:
                    assert await lc.wait_unfenced(5)
                await c.create_topic("t", 3, 3)
                b1 = brokers[0]
                b1.pause_heartbeats()
                await until(lambda: n.server.sm.image.brokers[1].fenced, "broker 1 fenced")
                img = n.server.sm.image
                assert all(1 not in p.isr and p.leader in (2, 3) for p in img.topic("t").partitions.values())
                b1.pause_heartbeats(False)
                await until(lambda: not n.server.sm.image.brokers[1].fenced, "broker 1 unfenced")
                assert await b1.wait_unfenced(5)
                # controlled shutdown of broker 2
                assert await brokers[1].controlled_shutdown(5)
                img = n.server.sm.image
                assert img.brokers[2].fenced and all(p.leader != 2 for p in img.topic("t").partitions.values())
            finally:
                follower.stop()
                ftask.cancel()
                for lc in brokers:
                    await lc.stop()
    finally:
        await stop_node(n)


async def test_a_feed_reader_in_runs_gets_a_large_change_in_one_answer():
    """issue 25: a reader that takes runs (runs=1, as brokers ask) gets up to
    feed_run_records_per_response_max records per answer; one reading record by record
    still gets feed_records_per_response_max."""
    n = await start_node(feed_records_per_response_max=100, feed_run_records_per_response_max=2000)
    try:
        async with ControllerClient([n.url]) as c:
            for b in (1, 2, 3):
                await register(c, b)
            await c.create_topic("big", 900, 3)
            base = n.url + "/controller/v1/metadata/records?after=0"
            _, plain = await raw("GET", base)
            _, runs = await raw("GET", base + "&runs=1")
            _, capped = await raw("GET", base + "&runs=1&max_records=300")

            def covered(body):
                return sum(len(i["run"]["partition"]) if "run" in i else 1 for i in body["records"])
            assert covered(plain) == 100
            assert covered(runs) == n.server.sm.feed_end > 900   # the whole feed: every record
            assert covered(capped) == 300
    finally:
        await stop_node(n)
