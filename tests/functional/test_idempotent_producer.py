"""Idempotent producer end to end (in-process broker): producer ids from the controller
through POST /v1/producer-ids, duplicates answered with their original offsets, and the
Python Producer idempotent by default so a retried batch is written once."""
import asyncio

from http_api.wire import codecs
from http_api.client import Consumer, Producer
from partitions.log import record_batch as rb


async def test_producer_ids_are_unique(broker):
    ids = set()
    for _ in range(5):
        r = await broker.client.post("/v1/producer-ids", json={})
        assert r.status == 200
        doc = await r.json()
        assert doc["producer_epoch"] == 0
        ids.add(doc["producer_id"])
    assert len(ids) == 5


async def test_a_resent_batch_is_answered_with_its_original_offsets(broker):
    await broker.client.post("/v1/topics", json={"name": "i", "partitions": 1, "replication_factor": 1})
    pid = (await (await broker.client.post("/v1/producer-ids", json={})).json())["producer_id"]
    first = rb.build_batch([rb.Record(None, b"a"), rb.Record(None, b"b")], producer_id=pid, producer_epoch=0,
                           base_sequence=0)
    url = "/v1/topics/i/partitions/0/records?acks=all"
    hdrs = {"Content-Type": codecs.RAW_BATCH}
    r1 = await broker.client.post(url, data=first, headers=hdrs)
    r2 = await broker.client.post(url, data=first, headers=hdrs)  # a retry after a lost answer
    assert r1.status == r2.status == 200
    first_answer, resent = (await r1.json())["offsets"], (await r2.json())["offsets"]
    assert all(e.pop("duplicate") is True for e in resent)  # flagged, so a writer can verify content
    assert first_answer == resent and not any("duplicate" in e for e in first_answer)
    nxt = rb.build_batch([rb.Record(None, b"c")], producer_id=pid, producer_epoch=0, base_sequence=2)
    r3 = await broker.client.post(url, data=nxt, headers=hdrs)
    assert (await r3.json())["offsets"][0]["offset"] == 2
    r = await broker.client.get("/v1/topics/i/partitions/0/records", params={"offset": "0"})
    assert [x["value"] for x in (await r.json())["records"]] == ["a", "b", "c"]


async def test_python_producer_is_idempotent_by_default(broker, monkeypatch):
    url = broker.config.url
    async with Producer(url, linger_ms=1) as producer:
        # the first answer is "lost": the client resends the same batch
        real = producer.t.request
        lost = {"n": 0}

        async def lossy(method, u, **kw):
            res = await real(method, u, **kw)
            if "/records" in u and lost["n"] == 0:
                lost["n"] += 1
                from partitions.errors import ErrorCode, KraftlogError
                raise KraftlogError(ErrorCode.REQUEST_TIMED_OUT, "answer lost")
            return res
        monkeypatch.setattr(producer.t, "request", lossy)
        futs = [await producer.send("idem", f"v{i}", partition=0) for i in range(3)]
        await producer.flush()
        offsets = [f.result().offset for f in futs]
        assert producer.producer_id >= 0
    assert lost["n"] == 1 and offsets == [0, 1, 2]
    async with Consumer(url, auto_offset_reset="earliest") as consumer:
        consumer.assign([("idem", 0)])
        got = []
        for _ in range(5):
            got.extend(await consumer.poll(200))
    assert [r.value for r in got] == [b"v0", b"v1", b"v2"]  # written once despite the resend


async def test_a_resent_batch_older_than_the_cached_five_is_a_duplicate_with_unknown_offsets(broker):
    await broker.client.post("/v1/topics", json={"name": "old", "partitions": 1, "replication_factor": 1})
    pid = (await (await broker.client.post("/v1/producer-ids", json={})).json())["producer_id"]
    url = "/v1/topics/old/partitions/0/records?acks=all"
    hdrs = {"Content-Type": codecs.RAW_BATCH}

    def batch(i):
        return rb.build_batch([rb.Record(None, b"%d" % i)], producer_id=pid, producer_epoch=0, base_sequence=i)

    for i in range(7):
        assert (await broker.client.post(url, data=batch(i), headers=hdrs)).status == 200
    r = await broker.client.post(url, data=batch(0) + batch(1), headers=hdrs)  # a retried task re-sends
    assert r.status == 200
    assert (await r.json())["offsets"] == [{"partition": 0, "offset": -1, "last_offset": -1, "duplicate": True}] * 2
    r = await broker.client.post(url, data=batch(6), headers=hdrs)  # in the cached window: real offsets
    assert (await r.json())["offsets"] == [{"partition": 0, "offset": 6, "last_offset": 6, "duplicate": True}]
    r = await broker.client.post(url, data=batch(7), headers=hdrs)  # new: no duplicate flag
    assert (await r.json())["offsets"] == [{"partition": 0, "offset": 7, "last_offset": 7}]
    r = await broker.client.get("/v1/topics/old/partitions/0/records", params={"offset": "0"})
    assert [x["value"] for x in (await r.json())["records"]] == [str(i) for i in range(8)]


async def test_a_later_batch_cannot_overtake_a_producer_ids_first_batch(broker, monkeypatch):
    """The leader accepts an unknown producer's first batch at any sequence (its state may
    have been deleted with old segments). Requests travel on several connections, so if the
    producer's second batch reached the leader before its first, the first would then look
    like an old duplicate: answered -1, never written. The first batch goes alone."""
    await broker.client.post("/v1/topics", json={"name": "ovt", "partitions": 1, "replication_factor": 1})
    url = broker.config.url
    async with Producer(url, linger_ms=0, batch_size_bytes=64) as producer:
        real = producer.t.request
        seen = []

        async def slow_first(method, u, **kw):
            if "/records" in u:
                seen.append(u)
                if len(seen) == 1:
                    await asyncio.sleep(0.5)   # the first request is slow on its way
            return await real(method, u, **kw)
        monkeypatch.setattr(producer.t, "request", slow_first)
        futs = [await producer.send("ovt", "v%d-" % i + "x" * 80, partition=0) for i in range(6)]
        await producer.flush()
        offsets = [f.result().offset for f in futs]
    assert len(seen) >= 2, seen      # several batches, so a later one could have overtaken
    assert offsets == list(range(6)), offsets
    async with Consumer(url, auto_offset_reset="earliest") as consumer:
        consumer.assign([("ovt", 0)])
        got = []
        for _ in range(10):
            got.extend(await consumer.poll(200))
            if len(got) >= 6:
                break
    assert [r.value for r in got] == [b"v%d-" % i + b"x" * 80 for i in range(6)]
