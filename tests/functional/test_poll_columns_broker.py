"""Consumer.poll_columns against an in-process broker: what send() and send_batch() wrote
reads back, record for record, as poll() reads it."""
from http_api.client import AdminClient, Consumer, Producer


async def test_poll_columns_reads_what_poll_reads(broker):
    url = broker.config.url
    async with AdminClient(url) as admin:
        await admin.create_topic("cols", partitions=2)
    async with Producer(url, linger_ms=5, acks="all") as producer:
        await producer.send_batch("cols", [b"b%d" % i for i in range(500)], partition=0)
        await producer.send_batch("cols", [b"kv", None], keys=[b"k", b"t"], partition=1)
        for i in range(20):
            await producer.send("cols", b"s%d" % i, key=b"x", partition=i % 2, headers=[("h", b"%d" % i)])
        await producer.flush()

    async def read(columns: bool) -> list[tuple]:
        async with Consumer(url, auto_offset_reset="earliest", max_wait_ms=200) as c:
            await c.subscribe(["cols"])
            rows: list[tuple] = []
            while len(rows) < 522:
                if columns:
                    for b in await c.poll_columns(1000):
                        rows += zip([b.partition] * len(b), b.offsets, b.timestamps, b.keys, b.values,
                                    map(tuple, b.headers))
                else:
                    rows += [(r.partition, r.offset, r.timestamp, r.key, r.value, tuple(r.headers))
                             for r in await c.poll(1000)]
            assert await c.position(("cols", 0)) == 510 and await c.position(("cols", 1)) == 12
            return sorted(rows)

    rows = await read(columns=True)
    assert rows == await read(columns=False)
    assert [r[4] for r in rows if r[0] == 0][:3] == [b"b0", b"b1", b"b2"]
    assert rows[510][3:] == (b"k", b"kv", ()) and rows[511][3:] == (b"t", None, ())   # a tombstone, keyed
    assert (0, 500) == rows[500][:2] and rows[500][3:] == (b"x", b"s0", (("h", b"0"),))
