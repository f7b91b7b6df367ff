"""Internal topics over the broker HTTP API (issue 16): growing `__consumer_offsets` used to
move groups onto partitions without their offsets (2 of 4 groups lost theirs in the issue's
try). Partition changes, data-losing config changes, client produce (topic- and
partition-level, JSON, CBOR, raw batches), delete-records, client creation and deletion are
refused with Kafka's error names; the group coordinator's own writes keep working."""
import cbor2

from http_api.wire import codecs
from partitions.errors import ErrorCode, KraftlogError
from partitions.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC
from partitions.log import record_batch as rb

GROUPS = ("g1", "g2", "g3", "g4")


async def create(c, name, partitions=1):
    r = await c.post("/v1/topics", json={"name": name, "partitions": partitions, "replication_factor": 1})
    assert r.status == 201, await r.text()


async def commit_all(c, offset):
    for i, g in enumerate(GROUPS):
        r = await c.post(f"/v1/groups/{g}/offsets", json={"offsets": [{"topic": "t", "partition": i % 4,
                                                                          "offset": offset + i}]})
        assert r.status == 200, await r.text()


async def offsets_of(c):
    out = {}
    for g in GROUPS:
        r = await c.get(f"/v1/groups/{g}/offsets")
        assert r.status == 200, await r.text()
        out[g] = [(o["partition"], o["offset"]) for o in (await r.json())["offsets"]]
    return out


async def refused(resp, code: str):
    doc = await resp.json()
    assert resp.status == 400 and doc["error_code"] == code, (resp.status, doc)
    return doc["message"]


async def test_growing_consumer_offsets_is_refused_and_every_group_keeps_its_offsets(broker):
    c = broker.client
    await create(c, "t", 4)
    await commit_all(c, 10)
    before = await offsets_of(c)
    assert before == {g: [(i % 4, 10 + i)] for i, g in enumerate(GROUPS)}
    n = len(broker.controller.image.topics[OFFSETS_TOPIC].partitions)
    msg = await refused(await c.post(f"/v1/topics/{OFFSETS_TOPIC}/partitions", json={"partitions": 50}),
                        "POLICY_VIOLATION")
    assert "internal topic" in msg and "DELETE /v1/groups" in msg
    assert len(broker.controller.image.topics[OFFSETS_TOPIC].partitions) == n
    assert await offsets_of(c) == before
    # the coordinator's own writes to __consumer_offsets still work
    await commit_all(c, 20)
    assert await offsets_of(c) == {g: [(i % 4, 20 + i)] for i, g in enumerate(GROUPS)}


async def test_the_controller_refuses_growing_consumer_offsets_whoever_asks(broker):
    c = broker.client
    await create(c, "t", 4)
    await commit_all(c, 1)
    try:
        await broker.controller.create_partitions(OFFSETS_TOPIC, 50)   # past the broker's check
        raise AssertionError("the controller grew __consumer_offsets")
    except KraftlogError as e:
        assert e.code is ErrorCode.POLICY_VIOLATION
    try:
        await broker.controller.alter_configs(OFFSETS_TOPIC, {"cleanup.policy": "delete"})
        raise AssertionError("the controller changed __consumer_offsets' cleanup.policy")
    except KraftlogError as e:
        assert e.code is ErrorCode.POLICY_VIOLATION
    assert broker.controller.image.topics[OFFSETS_TOPIC].configs["cleanup.policy"] == "compact"


async def test_data_losing_config_changes_of_consumer_offsets_are_refused(broker):
    c = broker.client
    await create(c, "t", 4)
    await commit_all(c, 5)
    before = await offsets_of(c)
    msg = await refused(await c.post(f"/v1/topics/{OFFSETS_TOPIC}/configs",
                                     json={"configs": {"cleanup.policy": "delete", "retention.ms": "1"}}),
                        "POLICY_VIOLATION")
    assert "cleanup.policy" in msg and "segment.bytes" in msg
    await refused(await c.post(f"/v1/topics/{OFFSETS_TOPIC}/configs", json={"configs": {"cleanup.policy": None}}),
                  "POLICY_VIOLATION")
    assert broker.controller.image.topics[OFFSETS_TOPIC].configs == {"cleanup.policy": "compact"}
    # storage tuning is allowed (the chaos harness uses small segments)
    r = await c.post(f"/v1/topics/{OFFSETS_TOPIC}/configs", json={"configs": {"segment.bytes": "4096"}})
    assert r.status == 200, await r.text()
    assert await offsets_of(c) == before


async def test_client_produce_and_delete_records_into_consumer_offsets_are_refused(broker):
    c = broker.client
    await create(c, "t", 4)
    await commit_all(c, 7)
    before = await offsets_of(c)
    hw = {p: broker.rm.offsets(OFFSETS_TOPIC, p)["high_watermark"]
          for p in broker.controller.image.topics[OFFSETS_TOPIC].partitions}
    json_body = {"records": [{"key": "x", "value": "y"}]}
    cbor_body = cbor2.dumps({"records": [{"key": b"x", "value": b"y"}]})
    raw = rb.build_batch([rb.Record(b"x", b"y")])
    for path in (f"/v1/topics/{OFFSETS_TOPIC}/records", f"/v1/topics/{OFFSETS_TOPIC}/partitions/0/records"):
        msg = await refused(await c.post(path, json=json_body), "INVALID_TOPIC_EXCEPTION")
        assert "produce" in msg and "POST /v1/groups/{group}/offsets" in msg
        await refused(await c.post(path, data=cbor_body, headers={"Content-Type": codecs.CBOR}),
                      "INVALID_TOPIC_EXCEPTION")
        await refused(await c.post(path + "?acks=0", json=json_body), "INVALID_TOPIC_EXCEPTION")
    await refused(await c.post(f"/v1/topics/{OFFSETS_TOPIC}/partitions/0/records", data=raw,
                               headers={"Content-Type": codecs.RAW_BATCH}), "INVALID_TOPIC_EXCEPTION")
    for p in hw:
        msg = await refused(await c.post(f"/v1/topics/{OFFSETS_TOPIC}/partitions/{p}/delete-records",
                                         json={"before_offset": -1}), "INVALID_TOPIC_EXCEPTION")
        assert "delete-records" in msg
    assert {p: broker.rm.offsets(OFFSETS_TOPIC, p) for p in hw} == {
        p: {"log_start_offset": 0, "high_watermark": h} for p, h in hw.items()}
    assert await offsets_of(c) == before


async def test_clients_cannot_create_or_delete_internal_topics(broker):
    c = broker.client
    for name in (OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC):
        r = await c.post("/v1/topics", json={"name": name, "partitions": 50, "replication_factor": 1,
                                             "configs": {"cleanup.policy": "delete"}})
        await refused(r, "INVALID_TOPIC_EXCEPTION")
        r = await c.get(f"/v1/topics/{name}?allow_auto_create=true")
        assert r.status == 404, await r.text()
        await refused(await c.post(f"/v1/topics/{name}/records", json={"records": [{"value": "v"}]}),
                      "INVALID_TOPIC_EXCEPTION")
        assert name not in broker.controller.image.topics
    # the coordinator still creates __consumer_offsets itself, compacted, on first use
    await create(c, "t", 4)
    await commit_all(c, 3)
    assert broker.controller.image.topics[OFFSETS_TOPIC].configs == {"cleanup.policy": "compact"}
    await refused(await c.delete(f"/v1/topics/{OFFSETS_TOPIC}"), "INVALID_TOPIC_EXCEPTION")
