"""The Python client's transactions: Producer(transactional_id=...), Consumer(isolation_level=...)
and `kraftlog consume --isolation-level`."""
from __future__ import annotations

import pytest

from http_api.client import AdminClient, Consumer, Producer
from partitions.errors import ErrorCode, KraftlogError

TPS = [("ca", 0), ("ca", 1), ("cb", 0)]


async def _read_all(url, isolation, expect_at_least=0):
    out = []
    async with Consumer(url, isolation_level=isolation, max_wait_ms=50) as c:
        c.assign(TPS)
        for tp in TPS:
            await c.seek_to_beginning(tp)
        for _ in range(20):
            recs = await c.poll(50)
            out += [(r.topic, r.partition, r.value) for r in recs]
            if not recs and len(out) >= expect_at_least:
                break
    return sorted(out)


async def _topics(url):
    async with AdminClient(url) as admin:
        await admin.create_topic("ca", 2)
        await admin.create_topic("cb", 1)


async def test_producer_commit_and_abort_and_read_committed_consumer(broker):
    url = broker.config.url
    await _topics(url)
    async with Producer(url, transactional_id="cli-tx") as p:
        await p.init_transactions()
        p.begin_transaction()
        futs = [await p.send(t, f"c{t}{q}", partition=q) for t, q in TPS]
        await p.commit_transaction()
        assert sorted((m.topic, m.partition) for m in [f.result() for f in futs]) == sorted(TPS)
        p.begin_transaction()
        for t, q in TPS:
            await p.send(t, b"\xffaborted", key=b"k", partition=q)
        await p.flush()                          # written, then aborted
        await p.abort_transaction()
    committed = sorted((t, q, f"c{t}{q}".encode()) for t, q in TPS)
    assert await _read_all(url, "read_committed", 3) == committed
    everything = await _read_all(url, "read_uncommitted", 6)
    assert len(everything) == 6 and set(committed) <= set(everything)   # markers never show
    # the read_committed consumer's position moved past the aborted records and markers
    async with Consumer(url, isolation_level="read_committed", max_wait_ms=50) as c:
        c.assign([("cb", 0)])
        await c.seek_to_beginning(("cb", 0))
        for _ in range(5):
            await c.poll(50)
        assert await c.position(("cb", 0)) == 4   # record, COMMIT, aborted record, ABORT


async def test_a_second_producer_fences_the_first(broker):
    url = broker.config.url
    await _topics(url)
    async with Producer(url, transactional_id="fenced") as old, Producer(url, transactional_id="fenced") as new:
        await old.init_transactions()
        old.begin_transaction()
        await old.send("ca", "zombie", partition=0)
        await old.flush()
        await new.init_transactions()
        with pytest.raises(KraftlogError) as e:
            await old.commit_transaction()
        assert e.value.code is ErrorCode.PRODUCER_FENCED
        new.begin_transaction()
        await new.send("ca", "fresh", partition=0)
        await new.commit_transaction()
    assert await _read_all(url, "read_committed", 1) == [("ca", 0, b"fresh")]


async def test_send_offsets_to_transaction(broker):
    url = broker.config.url
    await _topics(url)
    async with Producer(url, transactional_id="eos") as p:
        await p.init_transactions()
        p.begin_transaction()
        await p.send("cb", "out", partition=0)
        await p.send_offsets_to_transaction({("ca", 1): 5}, "eos-group")
        async with Consumer(url, group_id="eos-group") as c:
            assert await c.committed(("ca", 1)) is None      # not before the commit
        await p.commit_transaction()
    async with Consumer(url, group_id="eos-group") as c:
        assert await c.committed(("ca", 1)) == 5


async def test_cli_consume_isolation_level(broker, capsysbinary):
    from deploy.cli import _consume, build_parser

    url = broker.config.url
    await _topics(url)
    async with Producer(url, transactional_id="cli") as p:
        await p.init_transactions()
        p.begin_transaction()
        await p.send("cb", "committed", partition=0)
        await p.commit_transaction()
        p.begin_transaction()
        await p.send("cb", "aborted", partition=0)
        await p.flush()
        await p.abort_transaction()
        p.begin_transaction()
        await p.send("cb", "last", partition=0)
        await p.commit_transaction()
    args = build_parser().parse_args(["consume", "cb", "--from-beginning", "--max-records", "2",
                                      "--max-wait-ms", "100", "--isolation-level", "read_committed",
                                      "--bootstrap", url])
    assert await _consume(args) == 0
    assert capsysbinary.readouterr().out.splitlines() == [b"committed", b"last"]


async def test_read_committed_latest_starts_at_the_last_stable_offset(broker):
    url = broker.config.url
    await _topics(url)
    async with Producer(url, transactional_id="latest") as p:
        await p.init_transactions()
        p.begin_transaction()
        await p.send("cb", "open-then-committed", partition=0)
        await p.flush()
        r = await broker.client.get("/v1/topics/cb/partitions/0/offsets")
        doc = await r.json()
        assert doc["last_stable_offset"] == 0 and doc["high_watermark"] == 1, doc
        async with Consumer(url, isolation_level="read_committed", max_wait_ms=50) as c:
            c.assign([("cb", 0)])
            assert await c.position(("cb", 0)) == 0          # latest = the LSO, not the HW
            await c.seek_to_end(("cb", 0))
            assert await c.position(("cb", 0)) == 0
            await p.commit_transaction()
            got = []
            for _ in range(20):
                got += [r.value for r in await c.poll(50)]
                if got:
                    break
            assert got == [b"open-then-committed"]
