"""Produce and fetch requests of the Python client go over its own keep-alive HTTP/1.1
connections (http_api/client/http1.py) against a real broker: many requests, one connection
each way, the records read back as written; an error answer (a fetch past the log end) is
handled as through aiohttp."""
import pytest

from http_api.client import AdminClient, Consumer, Producer
from http_api.wire import codecs
from partitions.errors import ErrorCode, KraftlogError


async def test_produce_and_fetch_reuse_one_own_connection_each(broker):
    url = broker.config.url
    async with AdminClient(url) as admin:
        await admin.create_topic("own", partitions=1)
    async with Producer(url, linger_ms=0, acks="all", max_in_flight_requests_per_connection=1) as producer:
        for i in range(30):   # one request per record: 30 requests
            await (await producer.send("own", b"v%d" % i, partition=0))
        await producer.send_batch("own", [b"b%d" % i for i in range(1000)], partition=0)
        await producer.flush()
        assert producer.t._pool.connects == 1
    async with Consumer(url, auto_offset_reset="earliest", max_wait_ms=100, max_bytes=4096) as c:
        c.assign([("own", 0)])
        values: list[bytes] = []
        while len(values) < 1030:
            for b in await c.poll_columns(5000):
                values += b.values.tolist()
        assert values == [b"v%d" % i for i in range(30)] + [b"b%d" % i for i in range(1000)]
        assert c.t._pool.connects <= 2   # the fetch ahead may overlap a poll's own fetch
        c.seek(("own", 0), 0)
        records = []
        while len(records) < 1030:
            records += await c.poll(5000)
        assert [r.value for r in records] == values and {type(r.value) for r in records} == {bytes}
        with pytest.raises(KraftlogError) as e:   # a broker's error answer on the own connection
            await c.t.request("GET", f"{url}/v1/topics/own/partitions/0/records", params={"offset": "99999"},
                              accept=codecs.RAW_BATCH, hot=True)
        assert e.value.code is ErrorCode.OFFSET_OUT_OF_RANGE
