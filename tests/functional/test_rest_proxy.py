"""Confluent REST Proxy API v2 on an in-process broker (http_api/rest_proxy/).

The produce / consume-in-a-group / commit / resume cycle is driven by a third-party client
from PyPI, `nlp-kafka-rest-api` (module `kafka_rest`, written against Confluent's v2 API, not
here; it uses `requests`, so it runs in a thread). Its commit is the one Confluent's proxy
makes for it: auto commit, and the commit when the instance is deleted. The rest of the API
(explicit commits, seeks, assignments, media types and Confluent's error codes) is checked
with raw HTTP as in Confluent's documented curl examples."""
from __future__ import annotations

import asyncio
import base64
import json

import pytest
from kafka_rest import kafka_rest as krp     # nlp-kafka-rest-api (third party)

from http_api.rest_proxy import REST_PROXY_KEY

V2 = "application/vnd.kafka.v2+json"
V2_JSON = "application/vnd.kafka.json.v2+json"
V2_BINARY = "application/vnd.kafka.binary.v2+json"


async def create(c, name, partitions=1):
    r = await c.post("/v1/topics", json={"name": name, "partitions": partitions, "replication_factor": 1})
    assert r.status == 201, await r.text()


async def call(c, method, path, body=None, *, ctype=V2, accept=V2, status=200):
    headers = {"Accept": accept}
    data = None
    if body is not None:
        headers["Content-Type"] = ctype
        data = json.dumps(body)
    r = await c.request(method, path, data=data, headers=headers)
    text = await r.text()
    assert r.status == status, (method, path, r.status, text)
    return json.loads(text) if text else None


async def committed(c, group) -> dict:
    doc = await (await c.get(f"/v1/groups/{group}/offsets")).json()
    return {(e["topic"], e["partition"]): e["offset"] for e in doc["offsets"]}


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for k in ("KAFKA_REST_API_URL", "TOPIC_ID", "X_API_KEY"):    # the library reads these first
        monkeypatch.delenv(k, raising=False)


async def test_third_party_client_produces_consumes_in_a_group_commits_and_resumes(broker):
    c = broker.client
    url = broker.config.url
    await create(c, "orders-response", partitions=2)     # the library's consumer reads "<topic_id>-response"
    producer = krp.Producer(kafka_rest_api_url=url, topic_id="orders-response")
    first = await asyncio.to_thread(producer.produce, [f"m{i}" for i in range(20)], "ep")
    assert len(first) == 20
    hw = {}
    for p in (0, 1):
        hw[p] = (await (await c.get(f"/v1/topics/orders-response/partitions/{p}/offsets")).json())["high_watermark"]
    assert hw[0] + hw[1] == 20 and hw[0] > 0 and hw[1] > 0        # keyed json records spread over both

    def consume_until(instance: str, keys: list) -> list:
        got = []
        with krp.Consumer(kafka_rest_api_url=url, topic_id="orders", consumer_group="billing",
                          instance=instance) as consumer:
            wanted = set(keys)
            for _ in range(200):
                batch = consumer.consume_earliest()
                got += batch
                if wanted <= {r["key"] for r in got}:
                    break
        return got           # leaving the `with` deletes the instance: its positions are committed

    got = await asyncio.to_thread(consume_until, "reader-1", first)
    assert sorted(r["key"] for r in got) == sorted(first)
    assert {r["value"]["payload"] for r in got} == {f"m{i}" for i in range(20)}
    assert all(r["value"]["endpoint"] == "ep" for r in got)
    assert await committed(c, "billing") == {("orders-response", 0): hw[0], ("orders-response", 1): hw[1]}
    # more records; a new instance of the group resumes at the committed offsets: only the new ones
    second = await asyncio.to_thread(producer.produce, [f"n{i}" for i in range(7)], "ep")
    got = await asyncio.to_thread(consume_until, "reader-2", second)
    assert sorted(r["key"] for r in got) == sorted(second)
    assert sum((await committed(c, "billing")).values()) == 27


async def test_topics_and_produce_answers_in_confluents_shapes(broker):
    c = broker.client
    await create(c, "t2", partitions=2)
    assert "t2" in await call(c, "GET", "/topics") and "__consumer_offsets" not in await call(c, "GET", "/topics")
    doc = await call(c, "GET", "/topics/t2")
    assert doc["name"] == "t2" and [p["partition"] for p in doc["partitions"]] == [0, 1]
    assert doc["partitions"][0]["replicas"] == [{"broker": 1, "leader": True, "in_sync": True}]
    assert len(await call(c, "GET", "/topics/t2/partitions")) == 2
    assert (await call(c, "GET", "/topics/t2/partitions/1"))["leader"] == 1
    # binary to a partition, json to the topic
    ans = await call(c, "POST", "/topics/t2/partitions/1", {"records": [
        {"key": base64.b64encode(b"k").decode(), "value": base64.b64encode(b"\x00\xff").decode()},
        {"value": base64.b64encode(b"v2").decode()}]}, ctype=V2_BINARY)
    assert ans == {"offsets": [{"partition": 1, "offset": 0, "error_code": None, "error": None},
                               {"partition": 1, "offset": 1, "error_code": None, "error": None}],
                   "key_schema_id": None, "value_schema_id": None}
    ans = await call(c, "POST", "/topics/t2", {"records": [{"value": {"a": [1, 2]}, "partition": 0}]}, ctype=V2_JSON)
    assert ans["offsets"] == [{"partition": 0, "offset": 0, "error_code": None, "error": None}]
    fetched = await (await c.get("/v1/topics/t2/partitions/0/records?offset=0")).json()
    assert json.loads(fetched["records"][0]["value"]) == {"a": [1, 2]}
    fetched = await (await c.get("/v1/topics/t2/partitions/1/records?offset=0")).json()
    assert base64.b64decode(fetched["records"][0]["value_b64"]) == b"\x00\xff" and fetched["records"][0]["key"] == "k"
    # Confluent's error codes
    for method, path, body, ctype, accept, status, code in [
        ("GET", "/topics/nope", None, V2, V2, 404, 40401),
        ("GET", "/topics/t2/partitions/9", None, V2, V2, 404, 40402),
        ("POST", "/topics/t2/partitions/9", {"records": [{"value": "eA=="}]}, V2_BINARY, V2, 404, 40402),
        ("POST", "/topics/t2", {"records": [{"value": "not base64!"}]}, V2_BINARY, V2, 422, 42203),
        ("POST", "/topics/t2", {"records": [{"value": 1}]}, "text/plain", V2, 415, 415),
        ("POST", "/topics/t2", {"records": [{"value": 1}]}, "application/vnd.kafka.avro.v2+json", V2, 415, 415),
        ("POST", "/topics/t2", {"records": []}, V2_JSON, V2, 422, 422),
        ("GET", "/topics", None, V2, "text/html", 406, 406),
    ]:
        doc = await call(c, method, path, body, ctype=ctype, accept=accept, status=status)
        assert doc["error_code"] == code and doc["message"], (path, doc)


async def test_consumer_instance_lifecycle_commits_seeks_and_confluents_error_codes(broker):
    c = broker.client
    await create(c, "ev")
    await call(c, "POST", "/topics/ev/partitions/0", {"records": [{"value": {"n": i}} for i in range(10)]},
               ctype=V2_JSON)
    base = "/consumers/g1/instances/c1"
    doc = await call(c, "POST", "/consumers/g1", {"name": "c1", "format": "json", "auto.offset.reset": "earliest",
                                                  "auto.commit.enable": "false"})
    assert doc == {"instance_id": "c1", "base_uri": f"{broker.config.url}{base}"}
    dup = await call(c, "POST", "/consumers/g1", {"name": "c1", "format": "json"}, status=409)
    assert dup["error_code"] == 40902
    await call(c, "POST", base + "/assignments", {"partitions": [{"topic": "ev", "partition": 0}]}, status=204)
    assert await call(c, "GET", base + "/assignments") == {"partitions": [{"topic": "ev", "partition": 0}]}
    clash = await call(c, "POST", base + "/subscription", {"topics": ["ev"]}, status=409)
    assert clash["error_code"] == 40903
    # records: the instance's embedded format only
    wrong = await call(c, "GET", base + "/records", accept=V2_BINARY, status=406)
    assert wrong["error_code"] == 40601
    got = []
    for _ in range(50):
        got += await call(c, "GET", base + "/records?timeout=500", accept=V2_JSON)
        if len(got) >= 10:
            break
    assert [r["value"] for r in got] == [{"n": i} for i in range(10)] and got[0]["topic"] == "ev"
    # explicit commit: the last consumed offset (Confluent commits it + 1)
    assert await call(c, "POST", base + "/offsets", {"offsets": [{"topic": "ev", "partition": 0, "offset": 3}]}) \
        == {"offsets": []}
    assert await committed(c, "g1") == {("ev", 0): 4}
    doc = await call(c, "GET", base + "/offsets", {"partitions": [{"topic": "ev", "partition": 0}]})
    assert doc == {"offsets": [{"topic": "ev", "partition": 0, "offset": 4, "metadata": ""}]}
    # seeks
    await call(c, "POST", base + "/positions", {"offsets": [{"topic": "ev", "partition": 0, "offset": 7}]}, status=204)
    assert [r["offset"] for r in await call(c, "GET", base + "/records?timeout=2000", accept=V2_JSON)][:1] == [7]
    await call(c, "POST", base + "/positions/beginning", {"partitions": [{"topic": "ev", "partition": 0}]},
               status=204)
    assert (await call(c, "GET", base + "/records?timeout=2000", accept=V2_JSON))[0]["offset"] == 0
    await call(c, "POST", base + "/positions/end", {"partitions": [{"topic": "ev", "partition": 0}]}, status=204)
    assert await call(c, "GET", base + "/records?timeout=100", accept=V2_JSON) == []
    not_mine = await call(c, "POST", base + "/positions", {"offsets": [{"topic": "other", "partition": 0,
                                                                         "offset": 0}]}, status=409)
    assert not_mine["error_code"] == 40903
    # no body commit: the position of what was read
    await call(c, "POST", base + "/offsets")
    assert await committed(c, "g1") == {("ev", 0): 10}
    # a subscribing instance in the same group
    await call(c, "POST", "/consumers/g1", {"name": "c2", "format": "binary"})
    await call(c, "POST", "/consumers/g1/instances/c2/subscription", {"topics": ["ev"]}, status=204)
    assert await call(c, "GET", "/consumers/g1/instances/c2/subscription") == {"topics": ["ev"]}
    await call(c, "DELETE", "/consumers/g1/instances/c2/subscription", status=204)
    assert await call(c, "GET", "/consumers/g1/instances/c2/subscription") == {"topics": []}
    # media types and unknown instances
    bad_ct = await call(c, "POST", base + "/positions", {"offsets": []}, ctype="text/plain", status=415)
    assert bad_ct["error_code"] == 415
    for method, path in (("GET", "/consumers/g1/instances/nope/records"), ("DELETE", "/consumers/g1/instances/nope"),
                         ("POST", "/consumers/g1/instances/nope/subscription"),
                         ("GET", "/consumers/zz/instances/c1/assignments")):
        doc = await call(c, method, path, {"topics": ["ev"]} if method == "POST" else None,
                         accept=V2_BINARY if path.endswith("records") else V2, status=404)
        assert doc["error_code"] == 40403, (path, doc)
    await call(c, "DELETE", base, status=204)
    assert (await call(c, "GET", base + "/assignments", status=404))["error_code"] == 40403


async def test_idle_consumer_instances_expire(broker):
    c = broker.client
    instances = c.app[REST_PROXY_KEY].instances
    instances.instance_timeout_ms = 200          # Confluent's consumer.instance.timeout.ms, shortened
    await call(c, "POST", "/consumers/gx", {"name": "idle"})
    await call(c, "POST", "/consumers/gx", {"name": "busy"})
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while ("gx", "idle") in instances.instances:
        assert loop.time() < deadline, "the idle instance did not expire"
        await call(c, "GET", "/consumers/gx/instances/busy/subscription")   # used: kept
        await asyncio.sleep(0.05)
    assert ("gx", "busy") in instances.instances
    doc = await call(c, "GET", "/consumers/gx/instances/idle/subscription", status=404)
    assert doc["error_code"] == 40403


async def test_a_json_instance_polling_a_record_that_is_not_json_skips_nothing(broker):
    """A json consumer instance cannot render a non-JSON record (50002): the poll answers the
    error and the position stays at that record, so a seek past it (or a binary instance)
    still gets every later record; before, the records polled with it were skipped."""
    c = broker.client
    await create(c, "mixed")
    r = await c.post("/v1/topics/mixed/records", json={"records": [{"value": "plain text"}]})
    assert r.status == 200
    await call(c, "POST", "/topics/mixed", {"records": [{"value": {"a": 1}}, {"value": {"b": 2}}]}, ctype=V2_JSON)
    await call(c, "POST", "/consumers/gm", {"name": "m1", "format": "json", "auto.offset.reset": "earliest"})
    await call(c, "POST", "/consumers/gm/instances/m1/subscription", {"topics": ["mixed"]}, status=204)
    errors = 0
    for _ in range(20):
        headers = {"Accept": V2_JSON}
        r = await c.get("/consumers/gm/instances/m1/records?timeout=200", headers=headers)
        body = await r.json()
        if r.status == 500:
            assert body["error_code"] == 50002
            errors += 1
            if errors >= 2:
                break
        else:
            assert body == [], body   # nothing was fetched yet (the group is still joining)
    assert errors >= 2          # the error repeats: the record was not skipped silently
    await call(c, "POST", "/consumers/gm/instances/m1/positions",
               {"offsets": [{"topic": "mixed", "partition": 0, "offset": 1}]}, status=204)
    got = []
    for _ in range(20):
        got += await call(c, "GET", "/consumers/gm/instances/m1/records?timeout=200", accept=V2_JSON)
        if len(got) >= 2:
            break
    assert [(g["offset"], g["value"]) for g in got] == [(1, {"a": 1}), (2, {"b": 2})]
    await call(c, "DELETE", "/consumers/gm/instances/m1", status=204)
