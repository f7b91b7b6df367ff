"""The Python Consumer in a group (in-process broker): three consumers share six partitions
without overlap, a closed member's partitions move with its commits, committed offsets never
go backwards, a restarted consumer resumes where the group committed."""
import asyncio

from http_api.client import AdminClient, Consumer, Producer


async def produce(url, topic, n, partitions):
    async with Producer(url, linger_ms=1) as p:
        for i in range(n):
            await p.send(topic, f"v{i}", partition=i % partitions)


async def poll_until(consumers, pred, timeout=10.0, seen=None):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "condition not reached"
        batches = await asyncio.gather(*(c.poll(100) for c in consumers))
        if seen is not None:
            for c, recs in zip(consumers, batches):
                for r in recs:
                    seen.append((id(c), r.topic, r.partition, r.offset))


async def committed(url, group):
    async with Consumer(url, group_id=group) as c:
        _, doc = await c.t.bootstrap_json("GET", f"/v1/groups/{group}/offsets")
        return {(e["topic"], e["partition"]): e["offset"] for e in doc["offsets"]}


async def test_three_consumers_share_six_partitions_then_one_leaves(broker):
    url = broker.config.url
    async with AdminClient(url) as admin:
        await admin.create_topic("six", 6)
    await produce(url, "six", 60, 6)
    cs = [Consumer(url, group_id="g6", auto_offset_reset="earliest", session_timeout_ms=2000,
                   auto_commit_interval_ms=50, max_wait_ms=100) for _ in range(3)]
    try:
        for c in cs:
            await c.subscribe(["six"])
        seen = []

        def balanced():
            sets = [set(c.assignment()) for c in cs]
            return sorted(map(len, sets)) == [2, 2, 2] and len(set().union(*sets)) == 6

        await poll_until(cs, lambda: balanced() and len({x[1:] for x in seen}) == 60, seen=seen)
        # no overlap: each (partition, offset) delivered to exactly one consumer
        owners = {}
        for cid, t, p, o in seen:
            owners.setdefault((t, p), set()).add(cid)
        assert all(len(v) == 1 for v in owners.values())
        history = []

        async def committed_reaches(expected: dict, timeout: float = 10.0) -> None:
            """Poll (auto-commit runs inside poll once its 50 ms interval has passed) until the
            group's committed offsets are `expected`; every sample goes into `history`."""
            loop = asyncio.get_running_loop()
            end = loop.time() + timeout
            while True:
                await asyncio.gather(*(c.poll(10) for c in cs))
                history.append(await committed(url, "g6"))
                if history[-1] == expected:
                    return
                assert loop.time() < end, f"committed {history[-1]}, expected {expected}"

        await committed_reaches({("six", p): 10 for p in range(6)})
        # one member leaves (commits, releases): the other two take its partitions over
        gone = cs.pop()
        await gone.close()
        await produce(url, "six", 30, 6)
        await poll_until(cs, lambda: len(set(cs[0].assignment()) | set(cs[1].assignment())) == 6
                         and not set(cs[0].assignment()) & set(cs[1].assignment()), seen=seen)
        await poll_until(cs, lambda: len({x[1:] for x in seen}) == 90, seen=seen)
        await committed_reaches({("six", p): 15 for p in range(6)})
        for a, b in zip(history, history[1:]):
            assert all(b[k] >= a.get(k, 0) for k in b), "a committed offset went backwards"
    finally:
        for c in cs:
            await c.close()
    # restarted with the same group: resumes where the group committed
    await produce(url, "six", 6, 6)
    async with Consumer(url, group_id="g6", auto_offset_reset="earliest", max_wait_ms=100) as c:
        await c.subscribe(["six"])
        got = []
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while len(got) < 6 and loop.time() < end:
            got.extend(await c.poll(200))
        assert sorted((r.partition, r.offset) for r in got) == [(p, 15) for p in range(6)]


async def test_manual_commit_seek_and_committed_in_a_group(broker):
    url = broker.config.url
    async with AdminClient(url) as admin:
        await admin.create_topic("man", 1)
    await produce(url, "man", 5, 1)
    async with Consumer(url, group_id="gman", auto_offset_reset="earliest", enable_auto_commit=False,
                        max_wait_ms=100) as c:
        await c.subscribe(["man"])
        got = []
        loop = asyncio.get_running_loop()
        end = loop.time() + 5
        while len(got) < 5 and loop.time() < end:
            got.extend(await c.poll(100))
        assert [r.offset for r in got] == [0, 1, 2, 3, 4]
        assert await c.committed(("man", 0)) is None      # no auto commit
        await c.commit({("man", 0): 3})
        assert await c.committed(("man", 0)) == 3
        await c.commit()
        assert await c.committed(("man", 0)) == 5
        c.seek(("man", 0), 1)
        assert [r.offset for r in await c.poll(500)][:1] == [1]
    # without auto commit, close does not commit the sought-back position
    assert (await committed(url, "gman")) == {("man", 0): 5}


async def test_membership_talks_to_the_coordinator_and_falls_back_to_bootstrap(two_brokers):
    from partitions.groups.records import OFFSETS_TOPIC, partition_for_group
    b1, b2 = two_brokers
    async with AdminClient(b1.config.url) as admin:
        await admin.create_topic("dc", 2, replication_factor=2)
    r = await b1.client.post("/v1/groups/gdc/offsets", json={"offsets": [{"topic": "dc", "partition": 0, "offset": 0}]})
    assert r.status == 200
    t = b1.controller.image.topics[OFFSETS_TOPIC]
    coord = t.partitions[partition_for_group("gdc", len(t.partitions))].leader
    coord_url, other_url = (b1.config.url, b2.config.url) if coord == 1 else (b2.config.url, b1.config.url)
    async with Consumer(other_url, group_id="gdc", auto_offset_reset="earliest", max_wait_ms=50) as c:
        await c.subscribe(["dc"])
        m = c.membership
        assert m.coordinator_url == coord_url.rstrip("/")
        await c.poll(50)
        m.coordinator_url = "http://127.0.0.1:9"   # unreachable: requests go through the bootstrap broker
        m._coordinator_found_at = asyncio.get_running_loop().time() + 1e9
        epoch = m.member_epoch
        await m.heartbeat_once()
        assert m.coordinator_url is None and m.member_epoch == epoch
        await c.commit({("dc", 0): 1})
        assert await c.committed(("dc", 0)) == 1
