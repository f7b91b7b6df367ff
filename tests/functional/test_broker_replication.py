"""Follower fetching between two in-process brokers: acks=all, HW, ISR shrink/expand
proposals, truncation to the leader's epoch end after a leader change."""
import asyncio

from http_api.wire import codecs
from partitions.log import record_batch as rb


async def rf2_topic(b1, name="r", partitions=1):
    r = await b1.client.post("/v1/topics", json={"name": name, "partitions": partitions, "replication_factor": 2})
    assert r.status == 201
    return (await r.json())["partitions"]


def by_id(b1, b2, broker_id):
    return b1 if broker_id == 1 else b2


async def wait_for(pred, timeout=5.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.01)


async def test_acks_all_commits_once_the_follower_has_it(two_brokers):
    b1, b2 = two_brokers
    parts = await rf2_topic(b1)
    leader = by_id(b1, b2, parts[0]["leader"])
    follower = by_id(b1, b2, 3 - parts[0]["leader"])
    r = await leader.client.post("/v1/topics/r/partitions/0/records?acks=all",
                                 json={"records": [{"value": f"v{i}"} for i in range(10)]})
    assert r.status == 200, await r.text()
    assert (await r.json())["offsets"][-1]["offset"] == 9
    flog = follower.rm.logs[("r", 0)]
    await wait_for(lambda: flog.log_end_offset == 10)
    assert [x.value for x in rb.decode_batches(flog.read(0, 1 << 20).records)] == [f"v{i}".encode() for i in range(10)]
    r = await leader.client.get("/v1/topics/r/partitions/0/offsets")
    assert (await r.json())["high_watermark"] == 10
    await wait_for(lambda: follower.rm.partitions[("r", 0)].high_watermark == 10)


async def test_new_leader_serves_everything_committed(two_brokers):
    b1, b2 = two_brokers
    parts = await rf2_topic(b1)
    old_id = parts[0]["leader"]
    old, new = by_id(b1, b2, old_id), by_id(b1, b2, 3 - old_id)
    r = await old.client.post("/v1/topics/r/records?acks=all", json={"records": [{"value": "a"}, {"value": "b"}]})
    assert r.status == 200
    await b1.controller.move_leader("r", 0, 3 - old_id)
    r = await new.client.post("/v1/topics/r/records?acks=all", json={"records": [{"value": "c"}]})
    assert r.status == 200 and (await r.json())["offsets"] == [{"partition": 0, "offset": 2}]
    r = await new.client.get("/v1/topics/r/partitions/0/records", params={"offset": "0"})
    assert [x["value"] for x in (await r.json())["records"]] == ["a", "b", "c"]
    # the old leader now follows and catches up
    await wait_for(lambda: old.rm.logs[("r", 0)].log_end_offset == 3)


async def test_divergent_uncommitted_tail_is_truncated(two_brokers):
    b1, b2 = two_brokers
    parts = await rf2_topic(b1)
    old_id = parts[0]["leader"]
    old, new = by_id(b1, b2, old_id), by_id(b1, b2, 3 - old_id)
    r = await old.client.post("/v1/topics/r/records?acks=all", json={"records": [{"value": "committed"}]})
    assert r.status == 200
    await new.fetcher.close()  # the follower stops fetching: the next write stays on the old leader only
    batch = rb.build_batch([rb.Record(None, b"lost")])
    r = await old.client.post("/v1/topics/r/partitions/0/records?acks=1", data=batch,
                              headers={"Content-Type": codecs.RAW_BATCH})
    assert r.status == 200
    assert old.rm.logs[("r", 0)].log_end_offset == 2
    new.fetcher.closed = False  # fetching again from the next metadata change
    await b1.controller.move_leader("r", 0, 3 - old_id)  # unclean for "lost" (acks=1), as in Kafka
    r = await new.client.post("/v1/topics/r/records?acks=1", json={"records": [{"value": "new"}]})
    assert r.status == 200
    old_log = old.rm.logs[("r", 0)]

    def values():
        return [x.value for x in rb.decode_batches(old_log.read(0, 1 << 20).records)]
    await wait_for(lambda: b"new" in values())
    assert values() == [b"committed", b"new"]


async def test_lagging_follower_is_proposed_for_isr_removal(two_brokers):
    b1, b2 = two_brokers
    parts = await rf2_topic(b1)
    leader = by_id(b1, b2, parts[0]["leader"])
    follower_id = 3 - parts[0]["leader"]
    await by_id(b1, b2, follower_id).fetcher.close()
    await leader.client.post("/v1/topics/r/records?acks=1", json={"records": [{"value": "x"}]})
    changes = leader.rm.isr_changes(replica_lag_time_max_ms=0)
    assert [(p.topic, p.partition, isr) for p, isr in changes] == [("r", 0, [parts[0]["leader"]])]


async def test_topic_route_forwarding_retries_once_newer_metadata_names_the_leader(two_brokers):
    """The forwarding broker's metadata is stale: the broker it forwards to answers 421
    (before appending anything); the route waits for newer metadata and retries."""
    import copy
    b1, b2 = two_brokers
    parts = await rf2_topic(b1)
    leader_id = parts[0]["leader"]
    fwd, leader = by_id(b1, b2, 3 - leader_id), by_id(b1, b2, leader_id)
    ctl = b1.controller
    ctl.views.remove(fwd.view)          # the forwarding broker misses the next change for now
    try:
        await ctl.move_leader("r", 0, 3 - leader_id)   # the forwarding broker itself now leads
    finally:
        ctl.views.append(fwd.view)

    async def late_metadata():
        await asyncio.sleep(0.2)
        await fwd.view.update(copy.deepcopy(ctl.image))
    late = asyncio.create_task(late_metadata())
    r = await fwd.client.post("/v1/topics/r/records?acks=1", json={"records": [{"value": "x", "partition": 0}]})
    await late
    assert r.status == 200, await r.text()
    assert (await r.json())["offsets"] == [{"partition": 0, "offset": 0}]
    assert leader.rm.partitions[("r", 0)].is_leader is False
