"""Seeded garbage against every write route: always a 4xx with an error body, never a 5xx,
and the stored data is unchanged."""
import json
import random

import cbor2

from http_api.wire import codecs
from partitions.log import record_batch as rb


def garbage_bodies(rng: random.Random):
    good = rb.build_batch([rb.Record(b"k", b"v")])
    yield codecs.RAW_BATCH, bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 200)))
    flipped = bytearray(good)
    flipped[rng.randrange(17, len(flipped))] ^= 1 << rng.randrange(8)  # CRC and what it covers
    yield codecs.RAW_BATCH, bytes(flipped)
    yield codecs.RAW_BATCH, good[: rng.randrange(len(good))]
    values = [None, True, -1, 2**70, 1.5, "s", b"b", [], {}, [1], {"a": 1}, {"value": 1}]
    doc = {"records": [{rng.choice(["key", "value", "headers", "partition", "timestamp", "x", "key_b64"]):
                        rng.choice(values) for _ in range(rng.randrange(0, 4))}
                       for _ in range(rng.randrange(0, 3))]}
    if rng.random() < 0.3:
        doc = rng.choice(values)
    yield codecs.CBOR, cbor2.dumps(doc)
    try:
        yield codecs.JSON, json.dumps(doc).encode()
    except TypeError:
        pass
    yield codecs.JSON, b'{"records": [{"value": "a"}'


async def test_garbage_never_5xx_and_never_stored(broker):
    c = broker.client
    await c.post("/v1/topics", json={"name": "fz", "partitions": 2, "replication_factor": 1})
    await c.post("/v1/topics/fz/records", json={"records": [{"value": "keep", "partition": 0}]})
    rng = random.Random(1234)
    routes = ["/v1/topics/fz/records", "/v1/topics/fz/partitions/0/records", "/v1/topics/fz/partitions/1/records",
              "/v1/topics/fz/partitions/0/delete-records", "/v1/groups/g/offsets", "/v1/topics",
              "/v1/topics/fz/configs", "/v1/topics/fz/partitions"]
    for _ in range(60):
        for ct, body in garbage_bodies(rng):
            route = rng.choice(routes)
            r = await c.post(route + rng.choice(["", "?acks=1", "?acks=x", "?acks=all"]), data=body,
                             headers={"Content-Type": ct})
            text = await r.text()
            assert r.status < 500, (route, ct, body, r.status, text)
            assert r.status >= 400, (route, ct, body)  # this seed generates no valid request
            d = json.loads(text)
            assert d["error_code"] and d["message"]
    for params in ({"offset": "-5"}, {"offset": "x"}, {"offset": "0", "max_bytes": "-1"},
                   {"offset": "0", "min_bytes": "abc"}, {"offset": str(2**70)}):
        r = await c.get("/v1/topics/fz/partitions/0/records", params=params)
        assert 400 <= r.status < 500
    r = await c.get("/v1/topics/fz/partitions/0/records", params={"offset": "0"})
    assert [x["value"] for x in (await r.json())["records"]] == ["keep"]
    r = await c.get("/v1/topics/fz/partitions/1/offsets")
    assert (await r.json())["high_watermark"] == 0
    assert (await (await c.get("/v1/topics")).json()) == {"topics": ["fz"]}
