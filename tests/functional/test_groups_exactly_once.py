"""Exactly-once consume-transform-produce (http_api/client/exactly_once.py): the input position
travels in the output records' headers; a processor that crashes after writing output but
before committing to the group resumes from the output and writes every result once."""
from http_api.client import AdminClient, Consumer, Producer
from http_api.client.exactly_once import output_partition_for, parse_source, recover_position, source_header

IN, OUT, N = "eo-in", "eo-out", 40


class Crash(Exception):
    pass


async def run_processor(url, crash_after=None):
    """Group member: doubles each input value into OUT; commits to the group only every 7
    records (lag display), so the group's committed offset lags what is in OUT."""
    done = 0
    async with Consumer(url, group_id="eo", auto_offset_reset="earliest", enable_auto_commit=False,
                        max_wait_ms=100) as c, Producer(url, linger_ms=0) as p, Consumer(url) as reader:
        await c.subscribe([IN])
        positioned = set()
        while True:
            records = await c.poll(200)
            for tp in c.assignment():
                if tp not in positioned:   # gained it: the output says where we are
                    out_p = output_partition_for(tp[1], 2)
                    pos = await recover_position(reader, OUT, out_p, tp[0], tp[1])
                    if pos is None:
                        pos = await c.committed(tp) or 0
                    c.seek(tp, pos)
                    positioned.add(tp)
                    records = []  # re-poll from the recovered positions
            if not records and len(positioned) == 2:
                if min([await c.position(tp) for tp in c.assignment()]) >= N // 2:
                    return done
            for r in records:
                fut = await p.send(OUT, str(2 * int(r.value)), partition=output_partition_for(r.partition, 2),
                                   headers=source_header(r.topic, r.partition, r.offset + 1))
                await fut  # output and position are now stored together
                done += 1
                if crash_after is not None and done == crash_after:
                    raise Crash()   # before any group commit of this record
                if done % 7 == 0:
                    await c.commit({(r.topic, r.partition): r.offset + 1})


async def test_consume_transform_produce_writes_every_result_once_across_a_crash(broker):
    url = broker.config.url
    async with AdminClient(url) as admin:
        await admin.create_topic(IN, 2)
        await admin.create_topic(OUT, 2)
    async with Producer(url, linger_ms=0) as p:
        for i in range(N):
            await p.send(IN, str(i), partition=i % 2)
    try:
        await run_processor(url, crash_after=13)
    except Crash:
        pass
    # the group's committed offsets are behind the output: resuming from them would duplicate
    async with Consumer(url, group_id="eo") as probe:
        _, doc = await probe.t.bootstrap_json("GET", "/v1/groups/eo/offsets")
    assert sum(e["offset"] for e in doc["offsets"]) < 13
    await run_processor(url)
    got = []
    async with Consumer(url, auto_offset_reset="earliest") as c:
        c.assign([(OUT, 0), (OUT, 1)])
        while len(got) < N:
            recs = await c.poll(500)
            assert recs or len(got) == N, f"only {len(got)} outputs"
            got.extend(recs)
        assert await c.poll(200) == []
    values = sorted(int(r.value) for r in got)
    assert values == [2 * i for i in range(N)]          # every input once: no loss, no duplicate
    for part in (0, 1):
        srcs = [parse_source(r.headers) for r in got if r.partition == part]
        assert [s[2] for s in srcs] == list(range(1, N // 2 + 1))   # in input order
