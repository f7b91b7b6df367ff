"""The follower's replica requests are bounded while their answer is awaited (issue 24): a
leader cut off mid-request (no RST, packets dropped) left a replica fetch waiting for the
whole request timeout (30 s), so a healed follower rejoined the ISR 5-7 s late and the
chaos harness's next fault found partitions at min.insync.replicas. Now the answer must
start within the long-poll wait plus `read_timeout_ms`, and may pause at most that long."""
from __future__ import annotations

import asyncio
import os

import pytest

from partitions.errors import ErrorCode, KraftlogError
from http_api.broker.replica_client import (REPLICA_READ_TIMEOUT_MS, REPLICA_READ_TIMEOUT_PER_PARTITION_US,
                                           ReplicaTransport)
from tests.unit.http_api.test_replica_connection import RawLeader, _answer, _fetch, _http, _read_request


async def test_a_leader_silent_mid_fetch_is_given_up_after_the_wait_plus_the_read_timeout():
    """The request timeout is 30 s; the silent leader costs max_wait + read_timeout only, and
    the fetch re-sent after the heal is answered on a fresh connection."""
    async def script(reader, writer, n):
        await _read_request(reader)
        if n == 1:
            await asyncio.sleep(30)           # the cut: the request arrived, no answer ever
            return
        _, body = _answer([b"after the heal"])
        writer.write(_http(body))
        await writer.drain()
        await asyncio.sleep(1)
    async with RawLeader(script) as leader:
        t = ReplicaTransport(request_timeout_ms=30_000, read_timeout_ms=300)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(KraftlogError) as e:
            await _fetch(t, leader.url, max_wait_ms=200)
        took = loop.time() - t0
        assert e.value.code is ErrorCode.BROKER_NOT_AVAILABLE and "no answer within 500 ms" in e.value.message
        assert 0.45 <= took < 5, took
        parts = await _fetch(t, leader.url, max_wait_ms=200)
        assert bytes(parts[0].records) == b"after the heal" and leader.connections == 2
        await t.close()


async def test_a_long_poll_answered_at_its_wait_and_a_slow_steady_answer_are_not_cut():
    """A leader that holds the fetch for its whole long-poll wait, then sends the answer in
    pieces spaced below the read timeout (total well above it), is waited for."""
    _, body = _answer([os.urandom(40_000)])
    wire = _http(body)

    async def script(reader, writer, n):
        while True:
            await _read_request(reader)
            await asyncio.sleep(0.4)          # the long poll (max_wait_ms=400)
            for i in range(0, len(wire), len(wire) // 6 + 1):
                writer.write(wire[i:i + len(wire) // 6 + 1])
                await writer.drain()
                await asyncio.sleep(0.2)      # 7 pieces: ~1.4 s in all, 0.2 s apart
    async with RawLeader(script) as leader:
        # the read bound (1 s) is below the answer's whole time, far above its pauses (a
        # stalled test process delays the leader's pieces and the bound's timer alike)
        t = ReplicaTransport(request_timeout_ms=30_000, read_timeout_ms=1000)
        parts = await _fetch(t, leader.url, max_wait_ms=400)
        assert b"".join(bytes(p.records) for p in parts) == body[-40_000:]
        parts = await _fetch(t, leader.url, max_wait_ms=400)
        assert len(parts) == 1 and leader.connections == 1    # kept alive, never timed out
        await t.close()


async def test_an_answer_that_stops_midway_is_given_up_after_the_read_timeout():
    _, body = _answer([os.urandom(30_000)])
    wire = _http(body)

    async def script(reader, writer, n):
        await _read_request(reader)
        writer.write(wire[:len(wire) // 2])
        await writer.drain()
        await asyncio.sleep(30)               # cut off mid-answer
    async with RawLeader(script) as leader:
        t = ReplicaTransport(request_timeout_ms=30_000, read_timeout_ms=300)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(KraftlogError) as e:
            await _fetch(t, leader.url, max_wait_ms=0)
        assert "the answer stopped for 300 ms" in e.value.message and loop.time() - t0 < 5
        assert not [c for q in t.pool._idle.values() for c in q if not c.closed]
        await t.close()


async def test_epoch_end_offsets_is_bounded_by_the_read_timeout_and_the_default_is_the_named_limit():
    async def script(reader, writer, n):
        await _read_request(reader)
        await asyncio.sleep(30)
    async with RawLeader(script) as leader:
        t = ReplicaTransport(request_timeout_ms=30_000, read_timeout_ms=300)
        with pytest.raises(KraftlogError) as e:
            await asyncio.wait_for(t.epoch_end_offsets(leader.url, 2, [
                {"topic": "t", "partition": 0, "leader_epoch": 1, "epoch": 0}]), 5)
        assert e.value.code is ErrorCode.BROKER_NOT_AVAILABLE
        await t.close()
    assert ReplicaTransport().read_timeout_ms == REPLICA_READ_TIMEOUT_MS
    with pytest.raises(ValueError):
        ReplicaTransport(read_timeout_ms=0)


async def test_a_fetch_of_many_partitions_gets_time_per_partition_to_start_its_answer():
    """Issue 25: a full fetch of 50,000 partitions takes a busy leader seconds before its
    answer starts; with the same 2 s bound as a small fetch it timed out again and again
    (each retry a new full fetch). The bound grows by REPLICA_READ_TIMEOUT_PER_PARTITION_US
    per partition named: the same slow leader answers a large fetch and times out a small one."""
    delay_s = 1.2

    async def script(reader, writer, n):
        while True:
            await _read_request(reader)
            await asyncio.sleep(delay_s)      # the leader's work before its answer starts
            _, body = _answer([b"late but whole"])
            writer.write(_http(body))
            await writer.drain()
    many = [{"topic": "t", "partition": p, "offset": 0, "leader_epoch": 1} for p in range(10_000)]
    async with RawLeader(script) as leader:
        t = ReplicaTransport(request_timeout_ms=30_000, read_timeout_ms=300)
        assert t.first_byte_timeout_ms(200, 10_000) == 200 + 300 + 10_000 * REPLICA_READ_TIMEOUT_PER_PARTITION_US / 1000
        parts = await t.fetch(leader.url, 2, 1, many, max_bytes=1 << 20, partition_max_bytes=1 << 20,
                              max_wait_ms=200)
        assert bytes(parts[0].records) == b"late but whole"
        with pytest.raises(KraftlogError) as e:
            await _fetch(t, leader.url, max_wait_ms=200)   # one partition: 500 ms
        assert e.value.code is ErrorCode.BROKER_NOT_AVAILABLE
        await t.close()
