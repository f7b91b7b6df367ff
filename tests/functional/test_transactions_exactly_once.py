"""Consume-transform-produce with the input offsets in the transaction (KIP-98's exactly-once):
processors crash mid-transaction (after writing some output, before committing); the next
instance with the same transactional id fences the crashed one, its open transaction is
aborted, and it resumes from the group's committed offsets. read_committed output holds each
input record's result exactly once."""
from __future__ import annotations

from http_api.client import AdminClient, Consumer, Producer

IN, OUT, GROUP, N = "eos-in", "eos-out", "eos-g", 60
TPS = [(IN, 0), (IN, 1)]


class Crash(Exception):
    pass


async def run(url: str, crash_after: int | None) -> int:
    """One processor instance: doubles input values into OUT, 7 records per transaction."""
    done = 0
    async with Consumer(url, group_id=GROUP, isolation_level="read_committed", enable_auto_commit=False,
                        max_wait_ms=50) as c, Producer(url, transactional_id="eos-proc") as p:
        await p.init_transactions()          # fences a crashed predecessor, aborts its transaction
        c.assign(TPS)
        for tp in TPS:
            c.seek(tp, await c.committed(tp) or 0)
        idle = 0
        while idle < 5:
            records = await c.poll(50)
            for r in reversed(records[7:]):   # left for the next transaction: read them again
                c.seek((r.topic, r.partition), r.offset)
            records = records[:7]
            if not records:
                idle += 1
                continue
            idle = 0
            p.begin_transaction()
            for r in records:
                c.seek((r.topic, r.partition), r.offset + 1)
                await p.send(OUT, str(2 * int(r.value)), partition=r.partition)
                done += 1
                if crash_after is not None and done >= crash_after:
                    await p.flush()          # output written, transaction left open: a crash
                    raise Crash()
            await p.send_offsets_to_transaction({tp: await c.position(tp) for tp in TPS}, GROUP)
            await p.commit_transaction()
    return done


async def test_consume_transform_produce_exactly_once_across_crashes(broker):
    url = broker.config.url
    async with AdminClient(url) as admin:
        await admin.create_topic(IN, 2)
        await admin.create_topic(OUT, 2)
    async with Producer(url, linger_ms=0) as p:
        for i in range(N):
            await p.send(IN, str(i), partition=i % 2)
    for crash_after in (11, 4, 17):
        try:
            await run(url, crash_after)
            raise AssertionError("the processor should have crashed")
        except Crash:
            pass
    await run(url, None)
    out = []
    async with Consumer(url, isolation_level="read_committed", max_wait_ms=50) as c:
        c.assign([(OUT, 0), (OUT, 1)])
        for tp in c.assignment():
            await c.seek_to_beginning(tp)
        for _ in range(30):
            recs = await c.poll(50)
            out += [int(r.value) for r in recs]
            if not recs and len(out) >= N:
                break
    assert sorted(out) == [2 * i for i in range(N)]          # each result once, none of the aborted ones
    async with Consumer(url, isolation_level="read_uncommitted", max_wait_ms=50) as c:
        c.assign([(OUT, 0), (OUT, 1)])
        for tp in c.assignment():
            await c.seek_to_beginning(tp)
        raw = []
        for _ in range(30):
            recs = await c.poll(50)
            raw += recs
            if not recs and len(raw) > N:
                break
    assert len(raw) > N     # the crashed transactions did write output: it was aborted, not avoided
