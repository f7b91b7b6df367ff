"""http_api.client against in-process brokers: batching, ordering, retries, long polls."""
import asyncio

from http_api.client import AdminClient, Consumer, Producer


async def test_admin_producer_consumer_roundtrip(broker):
    url = broker.config.url
    async with AdminClient(url) as admin:
        await admin.create_topic("c", partitions=3)
        assert "c" in await admin.list_topics()
    async with Producer(url, linger_ms=20, batch_size_bytes=4096, acks="all") as producer:
        futs = [await producer.send("c", f"v{i}", key=f"k{i % 5}") for i in range(300)]
        await producer.flush()
        metas = [f.result() for f in futs]
    # batching: far fewer produce requests than records
    text = await (await broker.client.get("/metrics")).text()
    requests = sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("kraftlog_produce_requests_total"))
    assert requests < 60
    # per-partition order: offsets increase in send order within each partition
    last = {}
    for m in metas:
        assert m.offset > last.get(m.partition, -1)
        last[m.partition] = m.offset
    async with Consumer(url, auto_offset_reset="earliest", max_wait_ms=200) as consumer:
        await consumer.subscribe(["c"])
        got = []
        while len(got) < 300:
            got.extend(await consumer.poll(500))
    assert len(got) == 300
    per_key = {}
    for r in got:
        per_key.setdefault(r.key, []).append(int(r.value[1:]))
    for key, values in per_key.items():
        assert values == sorted(values), key  # same key, same partition, in order
        assert len({r.partition for r in got if r.key == key}) == 1


async def test_consumer_long_poll_wakes_on_new_record(broker):
    url = broker.config.url
    async with AdminClient(url) as admin:
        await admin.create_topic("lp")
    async with Consumer(url, auto_offset_reset="latest") as consumer, Producer(url, linger_ms=0) as producer:
        consumer.assign([("lp", 0)])
        assert await consumer.position(("lp", 0)) == 0
        loop = asyncio.get_running_loop()
        poll = asyncio.create_task(consumer.poll(5000))
        deadline = loop.time() + 20
        while broker.rm.long_polls_waiting == 0:   # the consumer's fetch waits at the broker
            assert loop.time() < deadline and not poll.done(), "the consumer's long poll never reached the broker"
            await asyncio.sleep(0.005)
        await (await producer.send("lp", b"\xff\x00binary"))
        records = await asyncio.wait_for(poll, 4)   # woken: a poll left waiting would take its 5 s
        assert [r.value for r in records] == [b"\xff\x00binary"]
        assert await consumer.position(("lp", 0)) == 1
        consumer.seek(("lp", 0), 0)
        assert [r.offset for r in await consumer.poll(500)] == [0]


async def test_consumer_group_commit(broker):
    url = broker.config.url
    async with Producer(url, linger_ms=0) as producer:
        for i in range(5):
            await producer.send("grp", f"m{i}", partition=0)
    async with Consumer(url, group_id="g", auto_offset_reset="earliest") as c:
        c.assign([("grp", 0)])
        got = []
        while len(got) < 5:
            got.extend(await c.poll(500))
        await c.commit()
        assert await c.committed(("grp", 0)) == 5
    async with Consumer(url, group_id="g") as c2:
        c2.assign([("grp", 0)])
        assert await c2.position(("grp", 0)) == 5


async def test_producer_retries_after_leader_moves(two_brokers):
    b1, b2 = two_brokers
    url = b1.config.url
    async with AdminClient(url) as admin:
        topic = await admin.create_topic("mv", partitions=1, replication_factor=2)
    leader = topic["partitions"][0]["leader"]
    async with Producer(url, linger_ms=0, retry_backoff_ms=10, acks="all") as producer:
        m = await (await producer.send("mv", "before", partition=0))
        assert m.offset == 0  # acks=all: the follower has it too
        await b1.controller.move_leader("mv", 0, 2 if leader == 1 else 1)  # the producer's cache is stale now
        m = await (await producer.send("mv", "after", partition=0))
        assert m.offset == 1  # appended on the new leader after a metadata refresh
    new_h = b2 if leader == 1 else b1
    r = await new_h.client.get("/v1/topics/mv/partitions/0/records", params={"offset": "0"})
    assert [x["value"] for x in (await r.json())["records"]] == ["before", "after"]


async def test_producer_auto_creates_only_when_the_broker_allows(broker, tmp_path):
    # broker default auto.create.topics.enable=true: the producer's first send creates it
    async with Producer(broker.config.url, linger_ms=0) as producer:
        fut = await producer.send("born-on-send", "v")
        assert (await fut).offset == 0
    async with AdminClient(broker.config.url) as admin:
        assert "born-on-send" in await admin.list_topics()

    # auto.create.topics.enable=false: the producer must not create it behind the broker's back
    from broker_harness import start_broker, stop_broker
    from fake_controller import FakeControllerClient
    from partitions.errors import ErrorCode, KraftlogError
    h = await start_broker(tmp_path / "off", FakeControllerClient(), auto_create_topics_enable=False)
    try:
        async with Producer(h.config.url, linger_ms=0, delivery_timeout_ms=3000) as producer:
            try:
                await (await producer.send("not-there", "v"))
                raise AssertionError("send to a missing topic succeeded with auto-create off")
            except KraftlogError as e:
                assert e.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                assert "auto.create.topics.enable is off" in str(e)
        r = await h.client.get("/v1/topics")
        assert (await r.json()) == {"topics": []}
    finally:
        await stop_broker(h)
