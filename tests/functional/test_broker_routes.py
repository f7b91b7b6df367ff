"""Every route of API.md against the in-process broker app."""
import asyncio
import base64
import json

import cbor2

from http_api.wire import codecs
from partitions.log import record_batch as rb


async def until(pred, what: str, timeout: float = 20.0) -> None:
    """Poll `pred` until true; fail after `timeout` seconds naming `what`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        await asyncio.sleep(0.005)


async def create(client, name="t", partitions=1, rf=1, configs=None):
    r = await client.post("/v1/topics", json={"name": name, "partitions": partitions,
                                              "replication_factor": rf, "configs": configs or {}})
    return r.status, await r.json()


async def test_topic_admin_lifecycle(broker):
    c = broker.client
    status, body = await create(c, "orders", 3)
    assert status == 201
    assert body["name"] == "orders" and [p["partition"] for p in body["partitions"]] == [0, 1, 2]
    assert set(body["partitions"][0]) >= {"partition", "leader", "leader_epoch", "replicas", "isr"}
    status, body = await create(c, "orders", 3)
    assert status == 409 and body["error_code"] == "TOPIC_ALREADY_EXISTS"
    r = await c.get("/v1/topics")
    assert (await r.json()) == {"topics": ["orders"]}
    r = await c.get("/v1/topics/orders")
    d = await r.json()
    assert r.status == 200 and d["configs"] == {} and len(d["partitions"]) == 3
    r = await c.get("/v1/metadata")
    md = await r.json()
    assert set(md) == {"cluster_id", "controller_id", "brokers", "topics"}
    assert md["brokers"][0]["id"] == 1 and md["brokers"][0]["fenced"] is False
    assert md["topics"][0]["name"] == "orders"
    r = await c.delete("/v1/topics/orders")
    assert r.status == 204
    r = await c.get("/v1/topics/orders")
    assert r.status == 404 and (await r.json())["error_code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    r = await c.delete("/v1/topics/orders")
    assert r.status == 404


async def test_create_topic_validation(broker):
    c = broker.client
    for body, code in [
        ({"name": "bad name!", "partitions": 1, "replication_factor": 1}, "INVALID_TOPIC_EXCEPTION"),
        ({"name": "x" * 250, "partitions": 1, "replication_factor": 1}, "INVALID_TOPIC_EXCEPTION"),
        ({"name": "ok", "partitions": 0, "replication_factor": 1}, "INVALID_PARTITIONS"),
        ({"name": "ok", "partitions": "2", "replication_factor": 1}, "INVALID_PARTITIONS"),
        ({"name": "ok", "partitions": 1, "replication_factor": 0}, "INVALID_REPLICATION_FACTOR"),
        ({"name": "ok", "partitions": 1, "replication_factor": 3}, "INVALID_REPLICATION_FACTOR"),
        ({"name": "ok", "partitions": 1, "replication_factor": 1, "configs": {"retention.ms": "x"}},
         "INVALID_CONFIG"),
    ]:
        r = await c.post("/v1/topics", json=body)
        d = await r.json()
        assert r.status == 400, (body, d)
        assert d["error_code"] == code and d["message"]
    r = await c.post("/v1/topics", data=b"{nope", headers={"Content-Type": "application/json"})
    assert r.status == 400 and (await r.json())["error_code"] == "INVALID_REQUEST"
    assert (await (await c.get("/v1/topics")).json()) == {"topics": []}


async def test_produce_fetch_json_roundtrip_with_bytes_and_headers(broker):
    c = broker.client
    await create(c, "t", 1)
    recs = [{"key": "k1", "value": "hello", "headers": {"h": "v"}},
            {"key_b64": base64.b64encode(b"\xff\x00").decode(), "value_b64": base64.b64encode(b"\x80").decode()},
            {"value": None}]
    r = await c.post("/v1/topics/t/records", json={"records": recs})
    assert r.status == 200
    assert (await r.json()) == {"offsets": [{"partition": 0, "offset": 0}, {"partition": 0, "offset": 1},
                                            {"partition": 0, "offset": 2}]}
    r = await c.get("/v1/topics/t/partitions/0/records", params={"offset": "0"})
    d = await r.json()
    assert r.status == 200
    assert d["next_offset"] == 3 and d["high_watermark"] == 3 and d["log_start_offset"] == 0
    got = d["records"]
    assert [g["offset"] for g in got] == [0, 1, 2]
    assert got[0]["key"] == "k1" and got[0]["value"] == "hello" and got[0]["headers"] == {"h": "v"}
    assert isinstance(got[0]["timestamp"], int)
    assert base64.b64decode(got[1]["key_b64"]) == b"\xff\x00" and base64.b64decode(got[1]["value_b64"]) == b"\x80"
    assert got[2]["value"] is None
    r = await c.get("/v1/topics/t/partitions/0/records", params={"offset": "2"})
    d = await r.json()
    assert [g["offset"] for g in d["records"]] == [2]
    r = await c.get("/v1/topics/t/partitions/0/records", params={"offset": "3"})
    d = await r.json()
    assert d["records"] == [] and d["next_offset"] == 3


async def test_keyed_records_land_on_one_partition_keyless_spread(broker):
    c = broker.client
    await create(c, "k", 4)
    r = await c.post("/v1/topics/k/records", json={"records": [{"key": "same", "value": str(i)} for i in range(20)]})
    parts = {o["partition"] for o in (await r.json())["offsets"]}
    assert len(parts) == 1
    r = await c.post("/v1/topics/k/records", json={"records": [{"value": str(i)} for i in range(8)]})
    offsets = (await r.json())["offsets"]
    assert {o["partition"] for o in offsets} == {0, 1, 2, 3}
    r = await c.post("/v1/topics/k/records", json={"records": [{"value": "x", "partition": 2}]})
    assert (await r.json())["offsets"][0]["partition"] == 2


async def test_cbor_produce_and_fetch(broker):
    c = broker.client
    await create(c, "cb", 1)
    body = cbor2.dumps({"records": [{"key": b"\x01\x02", "value": b"\xff" * 3, "headers": {"a": "b"}}]})
    r = await c.post("/v1/topics/cb/partitions/0/records", data=body, headers={"Content-Type": codecs.CBOR})
    assert r.status == 200 and r.content_type == codecs.CBOR
    assert cbor2.loads(await r.read()) == {"offsets": [{"partition": 0, "offset": 0}]}
    r = await c.get("/v1/topics/cb/partitions/0/records", params={"offset": "0"},
                    headers={"Accept": codecs.CBOR})
    d = cbor2.loads(await r.read())
    assert d["records"][0]["key"] == b"\x01\x02" and d["records"][0]["value"] == b"\xff" * 3
    assert d["high_watermark"] == 1


async def test_raw_batch_produce_and_fetch_passthrough(broker):
    c = broker.client
    await create(c, "raw", 1)
    b1 = rb.build_batch([rb.Record(b"a", b"1"), rb.Record(b"b", b"2")])
    b2 = rb.build_batch([rb.Record(None, b"3")], compression=rb.Compression.ZSTD)
    r = await c.post("/v1/topics/raw/partitions/0/records?acks=1", data=b1 + b2,
                     headers={"Content-Type": codecs.RAW_BATCH})
    assert r.status == 200
    assert (await r.json())["offsets"] == [{"partition": 0, "offset": 0, "last_offset": 1},
                                           {"partition": 0, "offset": 2, "last_offset": 2}]
    r = await c.get("/v1/topics/raw/partitions/0/records", params={"offset": "1"},
                    headers={"Accept": codecs.RAW_BATCH})
    assert r.status == 200 and r.content_type == codecs.RAW_BATCH
    assert r.headers[codecs.HEADER_HIGH_WATERMARK] == "3"
    assert r.headers[codecs.HEADER_NEXT_OFFSET] == "3"
    assert r.headers[codecs.HEADER_LOG_START_OFFSET] == "0"
    data = await r.read()
    recs = rb.decode_batches(data)
    assert [(x.offset, x.value) for x in recs] == [(0, b"1"), (1, b"2"), (2, b"3")]
    # stored batch is the producer's batch with offsets stamped: compression kept
    headers = [h for h, _ in rb.iter_batches(data)]
    assert headers[1].compression is rb.Compression.ZSTD
    # raw batches on the topic-level route carry no partition
    r = await c.post("/v1/topics/raw/records", data=b1, headers={"Content-Type": codecs.RAW_BATCH})
    assert r.status == 415


async def test_corrupt_raw_batch_is_rejected_and_log_unchanged(broker):
    c = broker.client
    await create(c, "raw", 1)
    good = rb.build_batch([rb.Record(None, b"ok")])
    await c.post("/v1/topics/raw/partitions/0/records", data=good, headers={"Content-Type": codecs.RAW_BATCH})
    bad = bytearray(rb.build_batch([rb.Record(None, b"x")]))
    bad[-1] ^= 1
    for body in (bytes(bad), good + bytes(bad), good[:-2], b"\x00" * 10, b""):
        r = await c.post("/v1/topics/raw/partitions/0/records", data=body,
                         headers={"Content-Type": codecs.RAW_BATCH})
        d = await r.json()
        assert r.status == 400 and d["error_code"] in ("CORRUPT_MESSAGE", "INVALID_REQUEST"), d
    r = await c.get("/v1/topics/raw/partitions/0/offsets")
    assert (await r.json()) == {"log_start_offset": 0, "high_watermark": 1, "local_log_start_offset": 0}


async def test_malformed_produce_leaves_log_unchanged(broker):
    c = broker.client
    await create(c, "m", 2)
    await c.post("/v1/topics/m/records", json={"records": [{"value": "first", "partition": 0}]})
    bad_bodies = [
        (b"not json", "application/json"), (b"[]", "application/json"),
        (json.dumps({"records": [{"value": "ok"}, {"value": 7}]}).encode(), "application/json"),
        (json.dumps({"records": [{"value": "ok"}, {"value": "x", "partition": 9}]}).encode(), "application/json"),
        (json.dumps({"records": [{"value": "a", "headers": {"x": 1}}]}).encode(), "application/json"),
        (b"\xff\xfe", "application/cbor"), (b"hello", "text/plain"),
    ]
    for body, ct in bad_bodies:
        r = await c.post("/v1/topics/m/records", data=body, headers={"Content-Type": ct})
        d = await r.json()
        assert 400 <= r.status < 500 and d["error_code"] and d["message"], (body, d)
    for p in (0, 1):
        r = await c.get(f"/v1/topics/m/partitions/{p}/offsets")
        assert (await r.json())["high_watermark"] == (1 if p == 0 else 0)


async def test_fetch_parameter_errors_and_out_of_range(broker):
    c = broker.client
    await create(c, "f", 1)
    base = "/v1/topics/f/partitions/0/records"
    for params in ({}, {"offset": "-1"}, {"offset": "abc"}, {"offset": "0", "max_bytes": "0"},
                   {"offset": "0", "max_wait_ms": "-5"}):
        r = await c.get(base, params=params)
        assert r.status == 400 and (await r.json())["error_code"] == "INVALID_REQUEST"
    r = await c.get(base, params={"offset": "5"})
    d = await r.json()
    assert r.status == 416 and d["error_code"] == "OFFSET_OUT_OF_RANGE"
    r = await c.get("/v1/topics/f/partitions/7/records", params={"offset": "0"})
    assert r.status == 404
    r = await c.get("/v1/topics/nope/partitions/0/records", params={"offset": "0"})
    assert r.status == 404 and (await r.json())["error_code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    r = await c.get("/v1/topics/f/partitions/x/records", params={"offset": "0"})
    assert r.status == 400


async def test_long_poll_wakes_on_produce(broker):
    c = broker.client
    await create(c, "lp", 1)
    fetch = asyncio.create_task(c.get("/v1/topics/lp/partitions/0/records",
                                      params={"offset": "0", "max_wait_ms": "5000"}))
    await until(lambda: broker.rm.long_polls_waiting > 0, "the fetch waiting")
    assert not fetch.done()
    await c.post("/v1/topics/lp/records", json={"records": [{"value": "wake"}]})
    r = await asyncio.wait_for(fetch, 4)   # woken: a fetch left waiting would take its 5 s
    d = await r.json()
    assert [x["value"] for x in d["records"]] == ["wake"]


async def test_long_poll_times_out_empty(broker):
    c = broker.client
    await create(c, "lp", 1)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    r = await c.get("/v1/topics/lp/partitions/0/records", params={"offset": "0", "max_wait_ms": "150"})
    d = await r.json()
    assert r.status == 200 and d["records"] == [] and d["next_offset"] == 0
    assert 0.14 <= loop.time() - t0 < 5.0   # waited its 150 ms, not the 30 s cap


async def test_offsets_timestamp_and_delete_records(broker):
    c = broker.client
    await create(c, "o", 1)
    await c.post("/v1/topics/o/records", json={"records": [{"value": str(i), "timestamp": 1000 + i * 10}
                                                           for i in range(5)]})
    r = await c.get("/v1/topics/o/partitions/0/offsets", params={"timestamp": "1015"})
    assert (await r.json()) == {"offset": 2}
    r = await c.post("/v1/topics/o/partitions/0/delete-records", json={"before_offset": 3})
    assert r.status == 200 and (await r.json()) == {"log_start_offset": 3}
    r = await c.get("/v1/topics/o/partitions/0/records", params={"offset": "1"})
    assert r.status == 416
    r = await c.get("/v1/topics/o/partitions/0/records", params={"offset": "3"})
    assert [x["value"] for x in (await r.json())["records"]] == ["3", "4"]
    r = await c.post("/v1/topics/o/partitions/0/delete-records", json={"before_offset": 99})
    assert r.status == 416
    r = await c.post("/v1/topics/o/partitions/0/delete-records", json={"before_offset": "3"})
    assert r.status == 400


async def test_group_offsets_commit_and_fetch(broker):
    c = broker.client
    await create(c, "g", 2)
    r = await c.post("/v1/groups/grp/offsets", json={"offsets": [{"topic": "g", "partition": 1, "offset": 5},
                                                                  {"topic": "g", "partition": 0, "offset": 2}]})
    assert r.status == 200
    r = await c.get("/v1/groups/grp/offsets")
    assert (await r.json()) == {"offsets": [{"topic": "g", "partition": 0, "offset": 2},
                                            {"topic": "g", "partition": 1, "offset": 5}]}
    r = await c.get("/v1/groups/other/offsets")
    assert (await r.json()) == {"offsets": []}
    for bad in ({"offsets": [{"topic": "g", "partition": 0, "offset": -1}]},
                {"offsets": [{"topic": "g", "partition": "0", "offset": 1}]}, {"offsets": "x"}):
        r = await c.post("/v1/groups/grp/offsets", json=bad)
        assert r.status == 400
    r = await c.post("/v1/groups/grp/offsets", json={"offsets": [{"topic": "zz", "partition": 0, "offset": 1}]})
    assert r.status == 404


async def test_auto_create_on_first_produce(broker):
    c = broker.client
    r = await c.post("/v1/topics/fresh/records", json={"records": [{"value": "x"}]})
    assert r.status == 200
    assert (await (await c.get("/v1/topics")).json()) == {"topics": ["fresh"]}
    r = await c.post("/v1/topics/bad%20name/records", json={"records": [{"value": "x"}]})
    assert r.status == 400 and (await r.json())["error_code"] == "INVALID_TOPIC_EXCEPTION"


async def test_auto_create_disabled(tmp_path):
    from broker_harness import start_broker, stop_broker
    from fake_controller import FakeControllerClient
    h = await start_broker(tmp_path, FakeControllerClient(), auto_create_topics_enable=False)
    try:
        r = await h.client.post("/v1/topics/fresh/records", json={"records": [{"value": "x"}]})
        assert r.status == 404 and (await r.json())["error_code"] == "UNKNOWN_TOPIC_OR_PARTITION"
    finally:
        await stop_broker(h)


async def test_limits(tmp_path):
    from broker_harness import start_broker, stop_broker
    from fake_controller import FakeControllerClient
    h = await start_broker(tmp_path, FakeControllerClient(), socket_request_max_bytes=2000,
                           request_max_records=5, message_max_bytes=600)
    c = h.client
    try:
        await create(c, "l", 1)
        r = await c.post("/v1/topics/l/records", json={"records": [{"value": "x" * 3000}]})
        assert r.status == 413 and (await r.json())["error_code"] == "RECORD_LIST_TOO_LARGE"
        r = await c.post("/v1/topics/l/records", json={"records": [{"value": "x"}] * 6})
        assert r.status == 413 and (await r.json())["error_code"] == "RECORD_LIST_TOO_LARGE"
        r = await c.post("/v1/topics/l/records", json={"records": [{"value": "x" * 900}]})
        assert r.status == 413 and (await r.json())["error_code"] == "MESSAGE_TOO_LARGE"
        big = rb.build_batch([rb.Record(None, b"y" * 800)])
        r = await c.post("/v1/topics/l/partitions/0/records", data=big, headers={"Content-Type": codecs.RAW_BATCH})
        assert r.status == 413 and (await r.json())["error_code"] == "MESSAGE_TOO_LARGE"
        # several small records over max_message_bytes in total are split into batches
        r = await c.post("/v1/topics/l/records", json={"records": [{"value": "z" * 200}] * 4})
        assert r.status == 200
        r = await c.get("/v1/topics/l/partitions/0/offsets")
        assert (await r.json())["high_watermark"] == 4
    finally:
        await stop_broker(h)


async def test_acks_param_and_acks_zero(broker):
    c = broker.client
    await create(c, "a", 1)
    r = await c.post("/v1/topics/a/records?acks=2", json={"records": [{"value": "x"}]})
    assert r.status == 400 and (await r.json())["error_code"] == "INVALID_REQUIRED_ACKS"
    r = await c.post("/v1/topics/a/records?acks=0", json={"records": [{"value": "x"}]})
    assert r.status == 202
    r = await c.post("/v1/topics/a/records?acks=1", json={"records": [{"value": "y"}]})
    assert (await r.json())["offsets"] == [{"partition": 0, "offset": 1}]


async def test_ops_routes_and_correlation_id(broker):
    c = broker.client
    r = await c.get("/healthz", headers={"X-Correlation-Id": "abc-1", "X-Client-Id": "tester"})
    assert r.status == 200 and r.headers["X-Correlation-Id"] == "abc-1"
    r = await c.get("/v1/topics/none/partitions/0/offsets", headers={"X-Correlation-Id": "e-2"})
    assert r.status == 404 and r.headers["X-Correlation-Id"] == "e-2"
    await create(c, "mx", 1)
    await c.post("/v1/topics/mx/records", json={"records": [{"value": "x"}]})
    await c.get("/v1/topics/mx/partitions/0/records", params={"offset": "0"})
    text = await (await c.get("/metrics")).text()
    assert 'kraftlog_produce_requests_total{status="200"} 1.0' in text
    assert "kraftlog_fetch_latency_seconds_bucket" in text and "kraftlog_partitions 1.0" in text
    doc = await (await c.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    routes = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops if m != "parameters"}
    app_routes = set()
    for res in c.server.app.router.resources():
        info = res.get_info()
        path = info.get("path") or info.get("formatter")
        for route in res:
            if route.method != "HEAD":
                app_routes.add((route.method, path))
    assert app_routes <= routes, app_routes - routes
    r = await c.get("/v1/nothing-here")
    assert r.status == 404 and (await r.json())["error_code"] == "INVALID_REQUEST"


async def test_create_partitions_and_alter_configs(broker):
    c = broker.client
    await create(c, "cp", 1)
    r = await c.post("/v1/topics/cp/partitions", json={"partitions": 3})
    assert r.status == 200 and len((await r.json())["partitions"]) == 3
    r = await c.post("/v1/topics/cp/configs", json={"configs": {"retention.ms": "1000"}})
    assert r.status == 200 and (await r.json())["configs"] == {"retention.ms": "1000"}
    r = await c.post("/v1/topics/cp/configs", json={"configs": {"retention.ms": "abc"}})
    assert r.status == 400


async def test_too_many_long_polls_is_429(tmp_path):
    from broker_harness import start_broker, stop_broker
    from fake_controller import FakeControllerClient
    h = await start_broker(tmp_path, FakeControllerClient(), long_poll_max_requests=1)
    c = h.client
    try:
        await create(c, "lp", 1)
        first = asyncio.create_task(c.get("/v1/topics/lp/partitions/0/records",
                                          params={"offset": "0", "max_wait_ms": "2000"}))
        await until(lambda: h.rm.long_polls_waiting > 0, "the first fetch waiting")
        r = await c.get("/v1/topics/lp/partitions/0/records", params={"offset": "0", "max_wait_ms": "2000"})
        d = await r.json()
        assert r.status == 429 and d["error_code"] == "THROTTLING_QUOTA_EXCEEDED"
        r = await c.get("/v1/topics/lp/partitions/0/records", params={"offset": "0"})  # no wait: served
        assert r.status == 200
        await c.post("/v1/topics/lp/records", json={"records": [{"value": "x"}]})
        assert (await first).status == 200
    finally:
        await stop_broker(h)


async def test_group_offsets_survive_a_broker_restart(tmp_path):
    """Committed offsets live in `__consumer_offsets`: a broker stopped and started again on
    the same log dir rebuilds its groups from that log and answers the latest commits."""
    from broker_harness import running_broker
    from fake_controller import FakeControllerClient
    controller = FakeControllerClient()
    commits = [[("t", 0, 7), ("t", 1, 3)], [("t", 0, 9)]]
    expected = {"offsets": [{"topic": "t", "partition": 0, "offset": 9}, {"topic": "t", "partition": 1, "offset": 3}]}
    async with running_broker(tmp_path, controller) as h:
        assert (await create(h.client, "t", 2))[0] == 201
        for offsets in commits:
            r = await h.client.post("/v1/groups/g/offsets", json={"offsets": [
                {"topic": t, "partition": p, "offset": o} for t, p, o in offsets]})
            assert r.status == 200, await r.text()
        assert (await (await h.client.get("/v1/groups/g/offsets")).json()) == expected
        first_url = h.config.url
    # a new broker process on the same data: nothing of the first one's memory survives
    async with running_broker(tmp_path, controller) as h:
        assert h.config.url != first_url
        r = await h.client.get("/v1/groups/g/offsets")
        assert r.status == 200 and (await r.json()) == expected, await r.text()
        r = await h.client.post("/v1/groups/g/offsets", json={"offsets": [{"topic": "t", "partition": 1, "offset": 5}]})
        assert r.status == 200, await r.text()   # and the group goes on committing
        doc = await (await h.client.get("/v1/groups/g/offsets")).json()
        assert doc["offsets"][1] == {"topic": "t", "partition": 1, "offset": 5}


async def test_legacy_group_offset_store_reopens_with_the_latest_commits(tmp_path):
    """The per-broker file store (offsets committed before `__consumer_offsets` existed) read
    back by a second instance on the same file."""
    from http_api.broker.group_offsets import GroupOffsetStore
    path = str(tmp_path / "g.json")
    s1 = GroupOffsetStore(path)
    await s1.commit("g", [("t", 0, 7), ("t", 1, 3)])
    await s1.commit("g", [("t", 0, 9)])
    s2 = GroupOffsetStore(path)
    assert s2.fetch("g") == [{"topic": "t", "partition": 0, "offset": 9}, {"topic": "t", "partition": 1, "offset": 3}]
