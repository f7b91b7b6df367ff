"""The Python Consumer fetches ahead: once a poll returns a partition's records, the fetch
from the next offset is already on its way while the application handles them; a seek
drops it; records before the position in the first batch are not returned."""
import asyncio

from http_api.client.consumer import Consumer
from http_api.wire import codecs
from partitions.log import record_batch as rb

DOC = {"cluster_id": "c", "controller_id": 1, "brokers": [{"id": 1, "url": "http://b1:1"}],
       "topics": [{"name": "t", "partitions": [{"partition": 0, "leader": 1, "leader_epoch": 0,
                                                "replicas": [1], "isr": [1]}]}]}


class FakeLeader:
    """A log of 100 records in batches of 10; every fetch request is recorded."""

    def __init__(self) -> None:
        self.fetched: list[int] = []

    async def one(self, url: str) -> dict:
        return DOC

    async def request(self, method, url, params=None, **kw):
        offset = int(params["offset"])
        self.fetched.append(offset)
        await asyncio.sleep(0)
        base = offset - offset % 10
        body = b""
        for b in range(base, min(base + 30, 100), 10):
            batch = bytearray(rb.build_batch([rb.Record(None, b"%d" % (b + i)) for i in range(10)]))
            rb.stamp_batch(batch, b, 0)
            body += bytes(batch)
        return 200, {codecs.HEADER_NEXT_OFFSET: str(min(base + 30, 100))}, body


def _consumer(leader: FakeLeader) -> Consumer:
    c = Consumer("http://b1:1", max_wait_ms=100)
    c.meta._one = leader.one
    c.t.request = leader.request
    c.assign([("t", 0)])
    return c


async def test_the_next_fetch_is_sent_before_the_next_poll():
    leader = FakeLeader()
    c = _consumer(leader)
    try:
        c.seek(("t", 0), 0)
        first = await c.poll(timeout_ms=1000)
        assert [r.offset for r in first] == list(range(30))
        await asyncio.sleep(0.01)               # the application handles the records
        assert leader.fetched == [0, 30]        # meanwhile the fetch from 30 was sent
        second = await c.poll(timeout_ms=1000)
        assert [r.offset for r in second] == list(range(30, 60))
        await asyncio.sleep(0.01)
        assert leader.fetched == [0, 30, 60]    # one request per offset: the prefetch was used
    finally:
        await c.close()


async def test_a_seek_drops_the_fetch_ahead_and_mid_batch_positions_skip_earlier_records():
    leader = FakeLeader()
    c = _consumer(leader)
    try:
        c.seek(("t", 0), 0)
        await c.poll(timeout_ms=1000)
        c.seek(("t", 0), 75)
        got = await c.poll(timeout_ms=1000)
        assert [r.offset for r in got] == list(range(75, 100))
        assert [r.value for r in got][:2] == [b"75", b"76"]
    finally:
        await c.close()
