"""Transactions over HTTP (API.md "Transactions"): atomic writes across partitions and topics,
read_committed fetches, fencing, timeouts, offsets in a transaction."""
from __future__ import annotations

import asyncio
import time

import pytest

from broker_harness import running_broker
from fake_controller import FakeControllerClient

TP = [("txa", 0), ("txa", 1), ("txb", 0)]


async def _post(c, path, doc, status=200):
    r = await c.post(path, json=doc)
    body = await r.json()
    assert r.status == status, (r.status, body)
    return body


async def _fetch(c, topic, partition, offset=0, isolation=None, accept=None):
    q = f"/v1/topics/{topic}/partitions/{partition}/records?offset={offset}"
    if isolation:
        q += f"&isolation_level={isolation}"
    r = await c.get(q, headers={"Accept": accept} if accept else None)
    assert r.status == 200, await r.text()
    if accept == "application/cbor":
        import cbor2
        return cbor2.loads(await r.read())
    return await r.json()


async def _values(c, isolation, offset=0):
    out = []
    for t, p in TP:
        doc = await _fetch(c, t, p, offset, isolation)
        out += [(t, p, r["value"]) for r in doc["records"]]
    return sorted(out)


async def _setup(c):
    await _post(c, "/v1/topics", {"name": "txa", "partitions": 2}, status=201)
    await _post(c, "/v1/topics", {"name": "txb", "partitions": 1}, status=201)


async def _init(c, txid, **kw):
    doc = await _post(c, f"/v1/transactions/{txid}/init", kw)
    return {"producer_id": doc["producer_id"], "producer_epoch": doc["producer_epoch"]}


def _records(tag):
    return [{"topic": t, "partition": p, "value": f"{tag}-{t}-{p}"} for t, p in TP]


async def test_commit_across_three_partitions_of_two_topics(broker):
    c = broker.client
    await _setup(c)
    prod = await _init(c, "tx-commit")
    await _post(c, "/v1/transactions/tx-commit/records", {**prod, "records": _records("c")})
    # open: read_committed sees nothing (LSO at the first transactional record), uncommitted sees all
    assert await _values(c, "read_committed") == []
    assert len(await _values(c, "read_uncommitted")) == 3
    doc = await _fetch(c, "txa", 0, 0, "read_committed")
    assert doc["last_stable_offset"] == 0 and doc["high_watermark"] == 1 and doc["next_offset"] == 0
    assert (await _post(c, "/v1/transactions/tx-commit/commit", prod))["state"] == "CompleteCommit"
    want = sorted((t, p, f"c-{t}-{p}") for t, p in TP)
    assert await _values(c, "read_committed") == want
    doc = await _fetch(c, "txa", 0, 0, "read_committed", accept="application/cbor")
    assert [r["value"] for r in doc["records"]] == [b"c-txa-0"]       # CBOR: no marker either
    assert doc["last_stable_offset"] == doc["high_watermark"] == 2    # record + COMMIT marker
    assert doc["next_offset"] == 2


async def test_abort_hides_records_from_read_committed_only(broker):
    c = broker.client
    await _setup(c)
    prod = await _init(c, "tx-abort")
    await _post(c, "/v1/transactions/tx-abort/records", {**prod, "records": _records("a")})
    assert (await _post(c, "/v1/transactions/tx-abort/abort", prod))["state"] == "CompleteAbort"
    assert await _values(c, "read_committed") == []
    assert await _values(c, "read_uncommitted") == sorted((t, p, f"a-{t}-{p}") for t, p in TP)
    # the consumer moves past the aborted record and the marker
    assert (await _fetch(c, "txa", 0, 0, "read_committed"))["next_offset"] == 2
    # a second transaction of the same producer commits and is the only thing visible
    await _post(c, "/v1/transactions/tx-abort/records", {**prod, "records": _records("b")})
    await _post(c, "/v1/transactions/tx-abort/commit", prod)
    assert await _values(c, "read_committed") == sorted((t, p, f"b-{t}-{p}") for t, p in TP)
    r = await c.get("/v1/topics/txa/partitions/0/records?offset=0&isolation_level=serializable")
    assert r.status == 400 and "read_committed" in (await r.json())["message"]


async def test_a_second_producer_fences_the_first_and_aborts_its_transaction(broker):
    c = broker.client
    await _setup(c)
    first = await _init(c, "tx-fence")
    await _post(c, "/v1/transactions/tx-fence/records", {**first, "records": _records("zombie")})
    second = await _init(c, "tx-fence")
    assert second["producer_id"] == first["producer_id"]
    assert second["producer_epoch"] > first["producer_epoch"]   # abort under +1, then +1 again (Kafka)
    for path in ("records", "commit"):
        body = await _post(c, f"/v1/transactions/tx-fence/{path}", {**first, "records": _records("z2")}, status=400)
        assert body["error_code"] == "PRODUCER_FENCED"
    # the first producer's open transaction was aborted: never visible, the LSO moved on
    assert await _values(c, "read_committed") == []
    doc = await _fetch(c, "txa", 0, 0, "read_committed")
    assert doc["last_stable_offset"] == doc["high_watermark"]
    await _post(c, "/v1/transactions/tx-fence/records", {**second, "records": _records("ok")})
    await _post(c, "/v1/transactions/tx-fence/commit", second)
    assert await _values(c, "read_committed") == sorted((t, p, f"ok-{t}-{p}") for t, p in TP)


async def test_a_transaction_past_its_timeout_is_aborted_and_the_lso_moves_on(tmp_path):
    async with running_broker(tmp_path, FakeControllerClient(), transaction_abort_timed_out_check_interval_ms=100,
                              transaction_max_timeout_ms=5_000) as b:
        c = b.client
        await _setup(c)
        body = await _post(c, "/v1/transactions/tx-late/init", {"transaction_timeout_ms": 60_000}, status=400)
        assert body["error_code"] == "INVALID_TRANSACTION_TIMEOUT"
        prod = await _init(c, "tx-late", transaction_timeout_ms=500)
        await _post(c, "/v1/transactions/tx-late/records", {**prod, "records": _records("late")})
        await _post(c, "/v1/topics/txa/partitions/0/records", {"records": [{"value": "after"}]})
        started = time.monotonic()
        deadline = started + 60
        while True:
            doc = await _fetch(c, "txa", 0, 0, "read_committed")
            if doc["last_stable_offset"] == doc["high_watermark"]:
                break
            assert time.monotonic() < deadline, doc
            await asyncio.sleep(0.05)
        assert [r["value"] for r in doc["records"]] == ["after"]   # the late records were aborted
        body = await _post(c, "/v1/transactions/tx-late/commit", prod, status=400)
        assert body["error_code"] == "PRODUCER_FENCED"


async def test_offsets_sent_to_a_transaction_are_committed_with_it(broker):
    c = broker.client
    await _setup(c)
    prod = await _init(c, "tx-offs")
    await _post(c, "/v1/transactions/tx-offs/records", {**prod, "records": _records("o")})
    await _post(c, "/v1/transactions/tx-offs/offsets",
                {**prod, "group": "g-tx", "offsets": [{"topic": "txb", "partition": 0, "offset": 7}]})
    r = await c.get("/v1/groups/g-tx/offsets")
    before = (await r.json()).get("offsets", []) if r.status == 200 else []
    assert not [o for o in before if o["topic"] == "txb"]          # invisible until the commit
    await _post(c, "/v1/transactions/tx-offs/commit", prod)
    r = await c.get("/v1/groups/g-tx/offsets")
    assert r.status == 200
    assert {"topic": "txb", "partition": 0, "offset": 7} in [
        {k: o[k] for k in ("topic", "partition", "offset")} for o in (await r.json())["offsets"]]


async def test_transaction_state_is_an_internal_topic(broker):
    c = broker.client
    await _setup(c)
    await _init(c, "tx-internal")
    body = await _post(c, "/v1/topics/__transaction_state/records", {"records": [{"value": "x"}]}, status=400)
    assert body["error_code"] == "INVALID_TOPIC_EXCEPTION"
    r = await c.delete("/v1/topics/__transaction_state")
    assert r.status >= 400


async def test_read_committed_long_poll_waits_for_the_lso_instead_of_spinning(broker):
    c = broker.client
    await _setup(c)
    prod = await _init(c, "tx-poll")
    await _post(c, "/v1/transactions/tx-poll/records", {**prod, "records": _records("p")})
    url = "/v1/topics/txa/partitions/0/records?offset=0&isolation_level=read_committed&max_wait_ms=1500"
    t0 = time.monotonic()
    r = await c.get(url)
    doc = await r.json()
    assert doc["records"] == [] and time.monotonic() - t0 >= 1.2, doc   # held, not answered at once
    poll = asyncio.ensure_future(c.get(url.replace("1500", "20000")))
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    await _post(c, "/v1/transactions/tx-poll/commit", prod)
    doc = await (await poll).json()
    assert [x["value"] for x in doc["records"]] == ["p-txa-0"] and time.monotonic() - t0 < 15, doc


async def test_a_resent_records_request_with_sequences_is_stored_once(broker):
    """A records request carrying the client's per-partition sequences, sent again (its answer
    was lost), is answered with the original offsets and appends nothing; read_committed
    shows each record once. Sequences continue after a commit; a gap is refused."""
    c = broker.client
    await _setup(c)
    prod = await _init(c, "tx-seq")
    body = {**prod, "records": _records("s") + _records("t"),
            "sequences": [{"topic": t, "partition": p, "base_sequence": 0} for t, p in TP]}
    first = await _post(c, "/v1/transactions/tx-seq/records", body)
    again = await _post(c, "/v1/transactions/tx-seq/records", body)
    assert again == first
    assert [(o["topic"], o["partition"], o["offset"]) for o in first["offsets"]] == [
        (t, p, o) for o in (0, 1) for t, p in TP]
    assert len(await _values(c, "read_uncommitted")) == 6          # nothing appended twice
    await _post(c, "/v1/transactions/tx-seq/commit", prod)
    want = sorted((t, p, f"{tag}-{t}-{p}") for tag in "st" for t, p in TP)
    assert await _values(c, "read_committed") == want
    # the next transaction continues at sequence 2; a gap is OUT_OF_ORDER_SEQUENCE_NUMBER
    gap = {**prod, "records": _records("g"),
           "sequences": [{"topic": t, "partition": p, "base_sequence": 3} for t, p in TP]}
    assert (await _post(c, "/v1/transactions/tx-seq/records", gap, status=409))["error_code"] == \
        "OUT_OF_ORDER_SEQUENCE_NUMBER"
    nxt = {**prod, "records": _records("n"),
           "sequences": [{"topic": t, "partition": p, "base_sequence": 2} for t, p in TP]}
    await _post(c, "/v1/transactions/tx-seq/records", nxt)
    await _post(c, "/v1/transactions/tx-seq/records", nxt)
    await _post(c, "/v1/transactions/tx-seq/commit", prod)
    want += [(t, p, f"n-{t}-{p}") for t, p in TP]
    assert await _values(c, "read_committed") == sorted(want)
    # sequences need every record's partition and one entry per partition written
    for bad in ({**nxt, "records": [{"topic": "txa", "value": "v"}]},
                {**nxt, "sequences": nxt["sequences"][:1]},
                {**nxt, "sequences": [{"topic": "txa", "partition": 0, "base_sequence": -1}]}):
        assert (await _post(c, "/v1/transactions/tx-seq/records", bad, status=400))["error_code"] == "INVALID_REQUEST"
