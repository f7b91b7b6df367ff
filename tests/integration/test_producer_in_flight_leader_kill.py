"""3 brokers, RF=3, acks=all: the idempotent Python Producer with 5 requests in flight per
partition (max_in_flight_requests_per_connection, Kafka's default) streams numbered records
while the partition's leader is killed with kill -9. Every record is acknowledged, and the
log holds each exactly once in send order: batches in flight to the dead leader are resent
to the new one, a later batch that overtakes a resent one is refused as out of order and
resent after it, a batch written before the kill is answered as a duplicate."""
import asyncio
import time

import pytest

from http_api.client import Producer
from tests.rigs.cluster import ReplicatedCluster

pytestmark = pytest.mark.integration

RECORDS = 4000


async def _stream(c: ReplicatedCluster, topic: str) -> tuple[list, dict]:
    seen = {"in_flight": 0, "max_in_flight": 0}
    async with Producer(c.urls, acks="all", linger_ms=2, batch_size_bytes=1024, request_attempt_timeout_ms=1000,
                        max_in_flight_requests_per_connection=5) as producer:
        attempt = producer._attempt

        async def counting_attempt(*a, **kw):   # the real request, counted
            seen["in_flight"] += 1
            seen["max_in_flight"] = max(seen["max_in_flight"], seen["in_flight"])
            try:
                return await attempt(*a, **kw)
            finally:
                seen["in_flight"] -= 1

        producer._attempt = counting_attempt
        futs = []
        victim = None
        for i in range(RECORDS):
            futs.append(await producer.send(topic, str(i), partition=0))
            if i % 40 == 39:
                await asyncio.sleep(0.005)   # a steady stream, so the kill lands mid-flight
            if victim is None and i >= RECORDS // 4:
                victim = (await asyncio.to_thread(c.partition, topic, 0))["leader"]
                await asyncio.to_thread(c.kill, victim)
                seen["killed_at_record"] = i
        await producer.flush()
        seen["victim"] = victim
        return [f.result().offset for f in futs], seen


def test_five_in_flight_keep_order_and_exactly_once_across_a_leader_kill(tmp_path):
    c = ReplicatedCluster(str(tmp_path), brokers=3, broker_config={"min_insync_replicas": 2})
    c.start(timeout=180)   # generous: process start takes a minute on a saturated 2-core machine
    try:
        c.create_topic("f", partitions=1, replication_factor=3)
        t0 = time.monotonic()
        offsets, seen = asyncio.run(_stream(c, "f"))
        print(f"\n{RECORDS} records in {time.monotonic() - t0:.1f} s across the kill -9 of broker {seen['victim']}, "
              f"up to {seen['max_in_flight']} requests in flight")
        assert seen["max_in_flight"] > 1                           # really pipelined
        assert c.partition("f", 0)["leader"] != seen["victim"]
        log = c.read_all("f", 0, timeout=120)
        assert [v for _, v in log] == [str(i) for i in range(RECORDS)]   # in order, once each, none lost
        assert offsets == [o for o, _ in log]                      # each future has its record's offset
    finally:
        c.close()
