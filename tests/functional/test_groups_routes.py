"""Consumer group routes on in-process brokers: membership and assignment over HTTP,
session expiry, fencing of stale commits, describe with lag, forwarding from any broker,
and the coordinator moving to another broker with the group's state intact."""
import asyncio
import time

from broker_harness import start_broker, stop_broker
from fake_controller import FakeControllerClient

from partitions.groups.records import OFFSETS_TOPIC, partition_for_group


async def create(c, name, partitions=1, rf=1):
    r = await c.post("/v1/topics", json={"name": name, "partitions": partitions, "replication_factor": rf})
    assert r.status == 201, await r.text()


async def post(c, path, body, status=200):
    r = await c.post(path, json=body)
    doc = await r.json()
    assert r.status == status, doc
    return doc


async def settle(c, group, members, rounds=4):
    """Heartbeat every member with what it owns until assignments stop changing."""
    for _ in range(rounds):
        for m in members.values():
            doc = await post(c, f"/v1/groups/{group}/heartbeat", {
                "member_id": m["member_id"], "member_epoch": m["member_epoch"],
                "owned": m["assignment"]})
            m.update(doc)


def owned_sets(members):
    return {k: {(a["topic"], a["partition"]) for a in m["assignment"]} for k, m in members.items()}


async def wait_for(pred, timeout=5.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await pred():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.05)


async def test_three_members_share_six_partitions_and_describe_shows_lag(broker):
    c = broker.client
    await create(c, "t6", 6)
    r = await c.post("/v1/topics/t6/records", json={"records": [{"value": str(i), "partition": i % 6}
                                                                for i in range(60)]})
    assert r.status == 200
    members = {}
    for name in ("a", "b", "c"):
        members[name] = await post(c, "/v1/groups/g3/join", {"subscribed_topics": ["t6"], "client_id": name,
                                                               "session_timeout_ms": 30000})
        assert members[name]["member_epoch"] >= 0
    await settle(c, "g3", members)
    sets = owned_sets(members)
    assert sorted(len(s) for s in sets.values()) == [2, 2, 2]
    assert set().union(*sets.values()) == {("t6", p) for p in range(6)}
    a = members["a"]
    await post(c, "/v1/groups/g3/offsets", {"member_id": a["member_id"], "member_epoch": a["member_epoch"],
                                            "offsets": [{"topic": t, "partition": p, "offset": 4}
                                                        for t, p in sorted(sets["a"])]})
    d = await (await c.get("/v1/groups/g3")).json()
    assert d["state"] == "stable" and len(d["members"]) == 3 and d["assignor"] == "sticky"
    by_tp = {(x["topic"], x["partition"]): x for x in d["partitions"]}
    for tp in sets["a"]:
        assert by_tp[tp]["committed_offset"] == 4 and by_tp[tp]["high_watermark"] == 10
        assert by_tp[tp]["lag"] == 6 and by_tp[tp]["member_id"] == a["member_id"]
    assert d["total_lag"] == 12
    listed = (await (await c.get("/v1/groups")).json())["groups"]
    assert [(g["group_id"], g["state"], g["members"]) for g in listed] == [("g3", "stable", 3)]
    # a commit without member id while the group has members is refused (cannot move offsets behind it)
    r = await c.post("/v1/groups/g3/offsets", json={"offsets": [{"topic": "t6", "partition": 0, "offset": 0}]})
    assert r.status == 409 and (await r.json())["error_code"] == "UNKNOWN_MEMBER_ID"
    await post(c, "/v1/groups/g3/leave", {"member_id": a["member_id"]})
    r = await c.post("/v1/groups/g3/heartbeat", json={"member_id": a["member_id"], "member_epoch": a["member_epoch"]})
    assert r.status == 409 and (await r.json())["error_code"] == "UNKNOWN_MEMBER_ID"
    r = await c.get("/v1/groups/nope")
    assert r.status == 404 and (await r.json())["error_code"] == "GROUP_ID_NOT_FOUND"


async def test_silent_member_expires_and_its_partitions_move(broker):
    c = broker.client
    await create(c, "te", 4)
    m1 = await post(c, "/v1/groups/ge/join", {"subscribed_topics": ["te"], "session_timeout_ms": 1000})
    m2 = await post(c, "/v1/groups/ge/join", {"subscribed_topics": ["te"], "session_timeout_ms": 5000})
    members = {"m1": m1, "m2": m2}
    await settle(c, "ge", members)
    assert [len(s) for s in owned_sets(members).values()] == [2, 2]
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def m2_has_all():
        await settle(c, "ge", {"m2": m2}, rounds=1)
        return len(m2["assignment"]) == 4
    await wait_for(m2_has_all, timeout=4.5)   # m1's 1 s session expired, well before m2's 5 s
    print(f"\nm1's partitions moved after {loop.time() - start:.2f} s (session 1 s)")
    r = await c.post("/v1/groups/ge/offsets", json={"member_id": m1["member_id"], "member_epoch": m1["member_epoch"],
                                                    "offsets": [{"topic": "te", "partition": 0, "offset": 1}]})
    assert r.status == 409 and (await r.json())["error_code"] == "UNKNOWN_MEMBER_ID"


async def test_zombie_commit_after_revocation_is_refused(broker):
    c = broker.client
    await create(c, "tz", 2)
    a = await post(c, "/v1/groups/gz/join", {"subscribed_topics": ["tz"], "assignor": "range"})
    assert len(a["assignment"]) == 2
    b = await post(c, "/v1/groups/gz/join", {"subscribed_topics": ["tz"], "assignor": "range"})
    old = dict(a)
    await settle(c, "gz", {"a": a, "b": b})
    revoked = [x for x in old["assignment"] if x not in a["assignment"]]
    assert len(revoked) == 1
    r = await c.post("/v1/groups/gz/offsets", json={"member_id": a["member_id"], "member_epoch": old["member_epoch"],
                                                    "offsets": [dict(revoked[0], offset=0)]})
    assert r.status == 409 and (await r.json())["error_code"] == "ILLEGAL_GENERATION"
    r = await c.post("/v1/groups/gz/join", json={"subscribed_topics": ["tz"], "session_timeout_ms": 10})
    assert r.status == 400 and (await r.json())["error_code"] == "INVALID_SESSION_TIMEOUT"
    r = await c.post("/v1/groups/gz/join", json={"subscribed_topics": ["tz"], "assignor": "magic"})
    assert r.status == 400 and (await r.json())["error_code"] == "UNSUPPORTED_ASSIGNOR"


async def test_any_broker_serves_groups_and_the_coordinator_can_move(two_brokers):
    b1, b2 = two_brokers
    await create(b1.client, "tf", 2, rf=2)
    # offsets topic with RF 2 (both brokers live when it is auto-created)
    r = await b2.client.post("/v1/groups/gf/offsets", json={"offsets": [{"topic": "tf", "partition": 0, "offset": 3}]})
    assert r.status == 200, await r.text()
    t = b1.controller.image.topics[OFFSETS_TOPIC]
    assert t.configs.get("cleanup.policy") == "compact"
    p = partition_for_group("gf", len(t.partitions))
    reg = t.partitions[p]
    assert len(reg.replicas) == 2
    coord = {1: b1, 2: b2}[reg.leader]
    other = {1: b2, 2: b1}[reg.leader]
    doc = await (await other.client.get("/v1/groups/gf/coordinator")).json()
    assert doc["coordinator_id"] == reg.leader and doc["partition"] == p
    # a forwarded request that lands on a non-coordinator is told where to go
    r = await other.client.post("/v1/groups/gf/offsets", json={"offsets": []},
                                headers={"X-Kraftlog-Forwarded": "9"})
    assert r.status == 421 and (await r.json())["coordinator_id"] == reg.leader
    m = await post(other.client, "/v1/groups/gm/join", {"subscribed_topics": ["tf"]})  # forwarded
    pm = partition_for_group("gm", len(t.partitions))
    await post(b1.client, "/v1/groups/gf/offsets", {"offsets": [{"topic": "tf", "partition": 1, "offset": 7}]})
    # the follower has every commit (acks=all) -> the new leader rebuilds the same state
    await b1.controller.move_leader(OFFSETS_TOPIC, p, other.config.broker_id)
    new_leader_gm = b1.controller.image.topics[OFFSETS_TOPIC].partitions[pm].leader
    await b1.controller.move_leader(OFFSETS_TOPIC, pm, 3 - new_leader_gm)
    for h in (b1, b2):
        doc = await (await h.client.get("/v1/groups/gf/offsets")).json()
        assert doc == {"offsets": [{"topic": "tf", "partition": 0, "offset": 3},
                                   {"topic": "tf", "partition": 1, "offset": 7}]}
    doc = await post(coord.client, "/v1/groups/gf/offsets", {"offsets": [{"topic": "tf", "partition": 0, "offset": 9}]})
    assert (await (await other.client.get("/v1/groups/gf/offsets")).json())["offsets"][0]["offset"] == 9
    # the member survived the move: same id and epoch, still owns its partitions
    hb = await post(b1.client, "/v1/groups/gm/heartbeat", {"member_id": m["member_id"],
                                                           "member_epoch": m["member_epoch"],
                                                           "owned": m["assignment"]})
    assert hb["member_epoch"] == m["member_epoch"] and hb["assignment"] == m["assignment"]
    for h in (b1, b2):   # every broker lists every coordinator's groups
        listed = (await (await h.client.get("/v1/groups")).json())["groups"]
        assert [(g["group_id"], g["members"]) for g in listed] == [("gf", 0), ("gm", 1)]


async def test_group_metrics(broker):
    c = broker.client
    await create(c, "tmx", 1)
    await post(c, "/v1/groups/gmx/join", {"subscribed_topics": ["tmx"]})
    text = await (await c.get("/metrics")).text()
    assert "kraftlog_groups 1.0" in text and "kraftlog_group_members 1.0" in text
    assert "kraftlog_group_coordinator_partitions 10.0" in text


async def test_under_replicated_offsets_partition_is_coordinator_not_available(two_brokers):
    b1, b2 = two_brokers
    await create(b1.client, "tu", 1)
    await post(b1.client, "/v1/groups/gu/offsets", {"offsets": [{"topic": "tu", "partition": 0, "offset": 1}]})
    r = await b1.client.post(f"/v1/topics/{OFFSETS_TOPIC}/configs", json={"configs": {"min.insync.replicas": "3"}})
    assert r.status == 200, await r.text()
    r = await b2.client.post("/v1/groups/gu/offsets", json={"offsets": [{"topic": "tu", "partition": 0, "offset": 2}]})
    doc = await r.json()
    assert r.status == 503 and doc["error_code"] == "COORDINATOR_NOT_AVAILABLE", doc
    assert "NOT_ENOUGH_REPLICAS" in doc["message"]
    doc = await (await b1.client.get("/v1/groups/gu/offsets")).json()
    assert doc["offsets"][0]["offset"] == 1   # the refused commit is not visible


async def test_offsets_are_not_read_from_the_cache_without_the_followers_confirming_the_leader(tmp_path):
    """Read barrier: a coordinator cut off from its ISR followers (it may have been deposed
    without knowing) answers a retriable error, not its possibly stale cache."""
    controller = FakeControllerClient()
    brokers = [await start_broker(tmp_path, controller, i, offsets_commit_timeout_ms=300) for i in (1, 2)]
    try:
        b1 = brokers[0]
        await create(b1.client, "tb", 1)
        await post(b1.client, "/v1/groups/gb/offsets", {"offsets": [{"topic": "tb", "partition": 0, "offset": 4}]})
        reg = controller.image.topics[OFFSETS_TOPIC].partitions[partition_for_group("gb", 10)]
        assert len(reg.isr) == 2
        coord, follower = sorted(brokers, key=lambda h: h.config.broker_id != reg.leader)
        doc = await (await coord.client.get("/v1/groups/gb/offsets")).json()
        assert doc["offsets"][0]["offset"] == 4                 # followers confirm: served
        await follower.fetcher.close()                           # the follower stops fetching from it
        r = await coord.client.get("/v1/groups/gb/offsets")
        doc = await r.json()
        assert r.status == 503 and doc["error_code"] == "COORDINATOR_NOT_AVAILABLE", doc
        assert "retry" in doc["message"]
        r = await coord.client.get("/v1/groups/gb")
        assert r.status == 503, await r.text()                  # describe reads group state too
    finally:
        for h in brokers:
            await stop_broker(h)


async def test_new_partitions_are_assigned_and_deleted_topics_lose_their_offsets(broker):
    c = broker.client
    await create(c, "tg", 2)
    await create(c, "tk", 1)
    m = await post(c, "/v1/groups/gp/join", {"subscribed_topics": ["tg"]})
    assert len(m["assignment"]) == 2
    r = await c.post("/v1/topics/tg/partitions", json={"partitions": 4})
    assert r.status == 200

    async def has_four():
        await settle(c, "gp", {"m": m}, rounds=1)
        return len(m["assignment"]) == 4
    await wait_for(has_four)
    await post(c, "/v1/groups/gp/offsets", {"member_id": m["member_id"], "member_epoch": m["member_epoch"],
                                            "offsets": [{"topic": "tg", "partition": 3, "offset": 1}]})
    await post(c, "/v1/groups/gk/offsets", {"offsets": [{"topic": "tk", "partition": 0, "offset": 5}]})
    r = await c.delete("/v1/topics/tk")
    assert r.status in (202, 204)

    async def gone():
        return (await (await c.get("/v1/groups/gk/offsets")).json()) == {"offsets": []}
    await wait_for(gone)
    doc = await (await c.get("/v1/groups/gp/offsets")).json()
    assert doc == {"offsets": [{"topic": "tg", "partition": 3, "offset": 1}]}


async def test_offsets_of_the_legacy_per_broker_store_are_imported(broker):
    from http_api.broker.app import BROKER_KEY
    c = broker.client
    await create(c, "tl", 2)
    legacy = c.server.app[BROKER_KEY].deps.groups
    await legacy.commit("old", [("tl", 0, 4), ("tl", 1, 6), ("gone", 0, 1)])
    doc = await (await c.get("/v1/groups/old/offsets")).json()
    assert doc == {"offsets": [{"topic": "tl", "partition": 0, "offset": 4},
                               {"topic": "tl", "partition": 1, "offset": 6}]}
    await post(c, "/v1/groups/old/offsets", {"offsets": [{"topic": "tl", "partition": 0, "offset": 5}]})
    doc = await (await c.get("/v1/groups/old/offsets")).json()
    assert doc["offsets"][0]["offset"] == 5   # imported once; the group's own commits win


async def test_delete_group(broker):
    c = broker.client
    await create(c, "td", 1)
    m = await post(c, "/v1/groups/gd/join", {"subscribed_topics": ["td"]})
    await post(c, "/v1/groups/gd/offsets", {"member_id": m["member_id"], "member_epoch": m["member_epoch"],
                                            "offsets": [{"topic": "td", "partition": 0, "offset": 2}]})
    r = await c.delete("/v1/groups/gd")
    assert r.status == 409 and (await r.json())["error_code"] == "NON_EMPTY_GROUP"
    await post(c, "/v1/groups/gd/leave", {"member_id": m["member_id"]})
    r = await c.delete("/v1/groups/gd")
    assert r.status == 204
    assert (await (await c.get("/v1/groups/gd/offsets")).json()) == {"offsets": []}
    assert (await c.get("/v1/groups/gd")).status == 404
    assert (await c.delete("/v1/groups/gd")).status == 404
    # imported legacy offsets are not revived after the group is deleted
    from http_api.broker.app import BROKER_KEY
    await c.server.app[BROKER_KEY].deps.groups.commit("gl2", [("td", 0, 7)])
    assert (await (await c.get("/v1/groups/gl2/offsets")).json())["offsets"][0]["offset"] == 7
    assert (await c.delete("/v1/groups/gl2")).status == 204
    assert (await (await c.get("/v1/groups/gl2/offsets")).json()) == {"offsets": []}


async def test_offsets_topic_waits_for_enough_live_brokers(broker):
    from metadata_quorum.records import RegisterBrokerRecord, UnfenceBrokerRecord
    ctl = broker.controller
    ctl._apply([RegisterBrokerRecord(7, "inc-7", -1, "http://127.0.0.1:9", None, True, 0)])  # registered, fenced
    await ctl.publish()
    await create(broker.client, "tw", 1)
    r = await broker.client.get("/v1/groups/gw/offsets")
    doc = await r.json()
    assert r.status == 503 and doc["error_code"] == "COORDINATOR_NOT_AVAILABLE", doc
    assert OFFSETS_TOPIC not in ctl.image.topics
    ctl._apply([UnfenceBrokerRecord(7, ctl.image.brokers[7].epoch)])
    await ctl.publish()
    await broker.client.get("/v1/groups/gw/offsets")   # answered by broker 1 or forwarded to 7 (not running)
    assert all(len(p.replicas) == 2 for p in ctl.image.topics[OFFSETS_TOPIC].partitions.values())


async def test_offsets_topic_cannot_be_deleted(broker):
    c = broker.client
    await create(c, "tk", 1)
    m = await post(c, "/v1/groups/gk/join", {"subscribed_topics": ["tk"]})
    await post(c, "/v1/groups/gk/offsets", {"member_id": m["member_id"], "member_epoch": m["member_epoch"],
                                            "offsets": [{"topic": "tk", "partition": 0, "offset": 3}]})
    assert "__consumer_offsets" in (await (await c.get("/v1/topics")).json())["topics"]
    r = await c.delete("/v1/topics/__consumer_offsets")
    assert r.status == 400
    doc = await r.json()
    assert doc["error_code"] == "INVALID_TOPIC_EXCEPTION" and "DELETE /v1/groups" in doc["message"]
    offsets = (await (await c.get("/v1/groups/gk/offsets")).json())["offsets"]
    assert [(o["topic"], o["offset"]) for o in offsets] == [("tk", 3)]


async def test_offsets_of_groups_without_members_expire_after_offsets_retention_minutes(broker):
    from http_api.broker.groups import SERVICE_KEY
    c = broker.client
    gc = c.server.app[SERVICE_KEY]
    await create(c, "tr", 1)
    m = await post(c, "/v1/groups/gr/join", {"subscribed_topics": ["tr"]})
    await post(c, "/v1/groups/gr/offsets", {"member_id": m["member_id"], "member_epoch": m["member_epoch"],
                                            "offsets": [{"topic": "tr", "partition": 0, "offset": 3}]})
    await post(c, "/v1/groups/gs/offsets", {"offsets": [{"topic": "tr", "partition": 0, "offset": 8}]})
    week = broker.config.offsets_retention_minutes * 60_000
    now = int(time.time() * 1000)
    assert await gc.expire_offsets_once(now + week + 60_000) == 1            # gs only: gr has a member
    assert (await (await c.get("/v1/groups/gs/offsets")).json()) == {"offsets": []}
    assert (await (await c.get("/v1/groups/gr/offsets")).json())["offsets"][0]["offset"] == 3
    await post(c, "/v1/groups/gr/leave", {"member_id": m["member_id"]})
    assert await gc.expire_offsets_once(now + week // 2) == 0                 # empty, but not for long
    assert await gc.expire_offsets_once(now + 2 * week) == 2                  # its offset + the group
    assert (await (await c.get("/v1/groups/gr/offsets")).json()) == {"offsets": []}
    assert (await c.get("/v1/groups/gr")).status == 404
    assert (await (await c.get("/v1/groups")).json())["groups"] == []
