"""Two in-process brokers: 421 with the leader's URL, topic-level produce forwarded to
the leader, leadership moves."""
from http_api.wire import codecs
from partitions.log import record_batch as rb

from broker_harness import running_broker
from fake_controller import FakeControllerClient


async def setup_topic(b1, partitions=2, rf=2):
    r = await b1.client.post("/v1/topics", json={"name": "t", "partitions": partitions, "replication_factor": rf})
    assert r.status == 201
    return await r.json()


async def test_partition_routes_answer_421_off_leader(two_brokers):
    b1, b2 = two_brokers
    topic = await setup_topic(b1)
    for p in topic["partitions"]:
        leader = p["leader"]
        other = b2 if leader == 1 else b1
        leader_h = b1 if leader == 1 else b2
        base = f"/v1/topics/t/partitions/{p['partition']}"
        for method, path, kw in [
            ("POST", base + "/records", {"json": {"records": [{"value": "x"}]}}),
            ("GET", base + "/records?offset=0", {}),
            ("GET", base + "/offsets", {}),
        ]:
            r = await other.client.request(method, path, **kw)
            d = await r.json()
            assert r.status == 421 and d["error_code"] == "NOT_LEADER_OR_FOLLOWER"
            assert d["leader_id"] == leader and d["leader_url"] == leader_h.config.url


async def test_topic_produce_on_any_broker_reaches_leaders(two_brokers):
    b1, b2 = two_brokers
    topic = await setup_topic(b1, partitions=4, rf=1)
    leaders = {p["partition"]: p["leader"] for p in topic["partitions"]}
    assert set(leaders.values()) == {1, 2}  # placement spreads leaders
    r = await b2.client.post("/v1/topics/t/records?acks=1",
                             json={"records": [{"value": f"v{i}", "partition": i % 4} for i in range(8)]})
    d = await r.json()
    assert r.status == 200, d
    assert [o["partition"] for o in d["offsets"]] == [i % 4 for i in range(8)]
    assert [o["offset"] for o in d["offsets"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    for p, leader in leaders.items():
        h = b1 if leader == 1 else b2
        r = await h.client.get(f"/v1/topics/t/partitions/{p}/records", params={"offset": "0"})
        assert [x["value"] for x in (await r.json())["records"]] == [f"v{p}", f"v{p + 4}"]


async def test_forward_failure_is_reported_per_record(tmp_path):
    # the forward to a gone leader is retried until request_timeout_ms (30 s by default):
    # a short one here, the retries are not what this test is about
    controller = FakeControllerClient()
    async with running_broker(tmp_path, controller, 1, request_timeout_ms=2000) as b1, \
            running_broker(tmp_path, controller, 2, request_timeout_ms=2000) as b2:
        await _forward_failure_is_reported_per_record(b1, b2)


async def _forward_failure_is_reported_per_record(b1, b2):
    topic = await setup_topic(b1, partitions=2, rf=1)
    remote = next(p["partition"] for p in topic["partitions"] if p["leader"] == 1)
    local = next(p["partition"] for p in topic["partitions"] if p["leader"] == 2)
    await b1.client.close()  # the leader of `remote` goes away
    r = await b2.client.post("/v1/topics/t/records?acks=1", json={"records": [
        {"value": "a", "partition": local}, {"value": "b", "partition": remote}]})
    d = await r.json()
    assert r.status == 503 and d["error_code"] == "BROKER_NOT_AVAILABLE"
    assert d["offsets"][0] == {"partition": local, "offset": 0}
    assert d["offsets"][1]["error_code"] == "BROKER_NOT_AVAILABLE" and "offset" not in d["offsets"][1]


async def test_leadership_move_switches_answering_broker(two_brokers):
    b1, b2 = two_brokers
    await setup_topic(b1, partitions=1, rf=2)
    md = await (await b1.client.get("/v1/metadata")).json()
    leader = md["topics"][0]["partitions"][0]["leader"]
    new_leader = 2 if leader == 1 else 1
    old_h, new_h = (b1, b2) if leader == 1 else (b2, b1)
    batch = rb.build_batch([rb.Record(None, b"x")])
    r = await old_h.client.post("/v1/topics/t/partitions/0/records?acks=1", data=batch,
                                headers={"Content-Type": codecs.RAW_BATCH})
    assert r.status == 200
    await b1.controller.move_leader("t", 0, new_leader)
    r = await old_h.client.post("/v1/topics/t/partitions/0/records?acks=1", data=batch,
                                headers={"Content-Type": codecs.RAW_BATCH})
    assert r.status == 421 and (await r.json())["leader_id"] == new_leader
    r = await new_h.client.post("/v1/topics/t/partitions/0/records?acks=1", data=batch,
                                headers={"Content-Type": codecs.RAW_BATCH})
    assert r.status == 200
