"""Transactions on two brokers: markers through remote partition leaders, followers rebuilding
their transaction state from replicated markers, and a new coordinator resuming a
PrepareCommit the old one never finished."""
from __future__ import annotations

import asyncio
import contextlib
import time

from broker_harness import running_broker
from fake_controller import FakeControllerClient
from http_api.broker.transactions import SERVICE_KEY
from http_api.client import Producer
from partitions.errors import ErrorCode, KraftlogError
from partitions.transactions.coordinator import TxnState

TPS = [("xa", 0), ("xa", 1), ("xb", 0)]
SETTINGS = dict(transaction_state_num_partitions=1, request_timeout_ms=3_000)


@contextlib.asynccontextmanager
async def _cluster(tmp_path):
    ctl = FakeControllerClient()
    async with running_broker(tmp_path, ctl, 1, **SETTINGS) as b1, running_broker(tmp_path, ctl, 2, **SETTINGS) as b2:
        brokers = {1: b1, 2: b2}
        for name, n in (("xa", 2), ("xb", 1)):
            r = await b1.client.post("/v1/topics", json={"name": name, "partitions": n, "replication_factor": 2})
            assert r.status == 201, await r.text()
        # leaders on both brokers: xa-0 and xb-0 on 1, xa-1 on 2
        for (t, p), leader in zip(TPS, (1, 2, 1)):
            if ctl.image.topics[t].partitions[p].leader != leader:
                await ctl.move_leader(t, p, leader)
        yield ctl, brokers


async def _until(pred, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        got = await pred()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _committed_values(ctl, brokers):
    out = []
    for t, p in TPS:
        leader = brokers[ctl.image.topics[t].partitions[p].leader]
        r = await leader.client.get(f"/v1/topics/{t}/partitions/{p}/records?offset=0&isolation_level=read_committed")
        assert r.status == 200, await r.text()
        out += [r_["value"] for r_ in (await r.json())["records"]]
    return sorted(out)


async def _begin(c, txid, tag):
    r = await c.post(f"/v1/transactions/{txid}/init", json={})
    assert r.status == 200, await r.text()
    prod = await r.json()
    r = await c.post(f"/v1/transactions/{txid}/records",
                     json={**prod, "records": [{"topic": t, "partition": p, "value": f"{tag}{t}{p}"} for t, p in TPS]})
    assert r.status == 200, await r.text()
    return prod


async def test_markers_reach_remote_leaders_and_followers_rebuild_transaction_state(tmp_path):
    async with _cluster(tmp_path) as (ctl, brokers):
        c = brokers[2].client          # any broker: forwarded to the coordinator
        prod = await _begin(c, "two-a", "x")
        r = await c.post("/v1/transactions/two-a/abort", json=prod)
        assert r.status == 200 and (await r.json())["state"] == "CompleteAbort", await r.text()
        prod = await _begin(c, "two-c", "c")
        r = await c.post("/v1/transactions/two-c/commit", json=prod)
        assert r.status == 200 and (await r.json())["state"] == "CompleteCommit", await r.text()
        assert await _committed_values(ctl, brokers) == sorted(f"c{t}{p}" for t, p in TPS)
        # every follower copied the markers and rebuilt the same transaction state from them
        for t, p in TPS:
            leader_id = ctl.image.topics[t].partitions[p].leader
            leader_log = brokers[leader_id].rm.logs[(t, p)]
            follower_log = brokers[3 - leader_id].rm.logs[(t, p)]

            async def caught_up(fl=follower_log, ll=leader_log):
                return fl.log_end_offset == ll.log_end_offset
            await _until(caught_up, f"follower of {t}-{p}")
            assert follower_log.transactions.ongoing == {}
            assert follower_log.aborted_transactions(0, 10) == leader_log.aborted_transactions(0, 10) != []


async def test_a_new_coordinator_finishes_a_prepare_commit_the_old_one_left(tmp_path):
    async with _cluster(tmp_path) as (ctl, brokers):
        c = brokers[1].client
        r = await c.post("/v1/transactions/failover/init", json={})
        assert r.status == 200, await r.text()
        if ctl.image.topics["__transaction_state"].partitions[0].leader != 1:
            await ctl.move_leader("__transaction_state", 0, 1)
        old = brokers[1].client.app[SERVICE_KEY]
        await _until(lambda: _loaded(old), "broker 1 coordinating")
        prod = await _begin(c, "failover", "f")
        stuck = asyncio.Event()

        async def never(*a, **kw):     # the old coordinator dies before writing any marker
            stuck.set()
            await asyncio.Event().wait()
        old._write_markers = never
        r = await c.post("/v1/transactions/failover/commit", json=prod)
        assert r.status == 200 and (await r.json())["state"] == "PrepareCommit", await r.text()
        assert stuck.is_set()
        assert await _committed_values(ctl, brokers) == []            # nothing half visible
        await ctl.move_leader("__transaction_state", 0, 2)             # failover
        new = brokers[2].client.app[SERVICE_KEY]

        async def done():
            return await _committed_values(ctl, brokers) == sorted(f"f{t}{p}" for t, p in TPS)
        await _until(done, "the new coordinator to finish the commit")

        async def complete():
            ld = new.loaded.get(0)
            md = ld.state.txns.get("failover") if ld is not None else None
            return md is not None and md.state is TxnState.COMPLETE_COMMIT
        await _until(complete, "CompleteCommit on the new coordinator")


async def _loaded(coordinator):
    ld = coordinator.loaded.get(0)
    return ld is not None and ld.ready.done()


async def _uncommitted_values(ctl, brokers):
    out = []
    for t, p in TPS:
        leader = brokers[ctl.image.topics[t].partitions[p].leader]
        r = await leader.client.get(f"/v1/topics/{t}/partitions/{p}/records?offset=0")
        assert r.status == 200, await r.text()
        out += [r_["value"] for r_ in (await r.json())["records"]]
    return sorted(out)


async def test_a_lost_records_answer_is_resent_by_the_client_and_stored_once(tmp_path):
    """The Python transactional producer resends a records request whose answer was lost
    (the request reached the coordinator, the connection dropped): its per-partition
    sequences make the leaders, local and remote, answer the resend with the original
    offsets. Each record is in the log once and read_committed shows it once."""
    async with _cluster(tmp_path) as (ctl, brokers):
        urls = [brokers[1].config.url, brokers[2].config.url]
        async with Producer(urls, transactional_id="lost-answer", retry_backoff_ms=20) as prod:
            real = prod.t.request
            lost = []

            async def drop_first_records_answer(method, url, **kw):
                got = await real(method, url, **kw)   # written on the brokers
                if url.endswith("/records") and "/transactions/" in url and len(lost) < 2:
                    lost.append(url)
                    raise KraftlogError(ErrorCode.BROKER_NOT_AVAILABLE, f"cannot reach broker at {url}: dropped")
                return got
            prod.t.request = drop_first_records_answer
            await prod.init_transactions()
            prod.begin_transaction()
            futs = [await prod.send(t, f"a{t}{p}", partition=p) for t, p in TPS]
            await prod.flush()                              # answer lost, resent
            futs += [await prod.send(t, f"b{t}{p}", partition=p) for t, p in TPS]
            await prod.commit_transaction()                 # answer lost again, resent
            assert len(lost) == 2
            offsets = sorted((m.topic, m.partition, m.offset) for m in (f.result() for f in futs))
            assert offsets == sorted((t, p, o) for t, p in TPS for o in (0, 1))   # the original offsets
            prod.begin_transaction()                        # sequences continue after the commit
            for t, p in TPS:
                await prod.send(t, f"c{t}{p}", partition=p)
            await prod.commit_transaction()
        want = sorted(f"{tag}{t}{p}" for tag in "abc" for t, p in TPS)
        assert await _committed_values(ctl, brokers) == want
        assert await _uncommitted_values(ctl, brokers) == want   # never appended twice
