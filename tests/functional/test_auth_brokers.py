"""Two brokers with [security] Basic + ACLs and per-broker passwords (issue 16): followers
replicate as `User:broker-<id>`, a broker forwards a client's produce and group commit to the
leader / coordinator on the client's behalf (the leader authorizes the client, not the
broker), and the group listing asks the other broker's /internal/ route as a broker."""
from __future__ import annotations

import pytest
from broker_harness import running_broker
from fake_controller import FakeControllerClient
from test_auth_routes import ADMIN, ALICE, SECURE, SecurityHolder, acl

from http_api.broker.app import BROKER_KEY
from http_api.wire.auth import broker_auth_headers, write_broker_credentials

PASSWORDS = {1: "broker-one-pw", 2: "broker-two-pw"}


@pytest.fixture
async def brokers(tmp_path):
    creds = tmp_path / "broker-credentials.json"
    write_broker_credentials(str(creds), PASSWORDS)
    holder = SecurityHolder()
    controller = FakeControllerClient()
    settings = {}
    for bid, pw in PASSWORDS.items():
        f = tmp_path / f"broker-{bid}.password"
        f.write_text(pw + "\n")
        settings[bid] = dict(SECURE, broker_credentials_file=str(creds), broker_password_file=str(f))
    async with running_broker(tmp_path, controller, 1, **settings[1]) as b1, \
            running_broker(tmp_path, controller, 2, **settings[2]) as b2:
        for h in (b1, b2):
            ctx = h.client.app[BROKER_KEY]
            ctx.authenticator.image = ctx.authorizer.security_image = holder.get
            # as server.py does: the follower fetches as this broker
            h.fetcher.transport.headers.update(broker_auth_headers(h.config.security, h.config.broker_id))
        yield b1, b2, holder


async def test_replication_forwarding_and_listings_as_cluster_principals(brokers):
    b1, b2, holder = brokers
    r = await b1.client.post("/v1/topics", json={"name": "orders", "partitions": 2, "replication_factor": 2},
                             headers=ADMIN)
    assert r.status == 201, await r.text()
    holder.grant(acl("User:alice", "WRITE", "TOPIC", "orders"), acl("User:alice", "READ", "GROUP", "g"),
                 acl("User:alice", "READ", "TOPIC", "orders"))
    # each partition through b1: one is led by b2 (forwarded as alice), acks=all needs the
    # follower's authenticated fetches
    for p in range(2):
        r = await b1.client.post("/v1/topics/orders/records?acks=all",
                                 json={"records": [{"value": f"v{p}", "partition": p}]}, headers=ALICE)
        assert r.status == 200, await r.text()
    for h in (b1, b2):
        r = await h.client.post("/v1/groups/g/offsets", headers=ALICE,
                                json={"offsets": [{"topic": "orders", "partition": 0, "offset": 1}]})
        assert r.status == 200, await r.text()   # one of them forwards to the coordinator
        listed = await (await h.client.get("/v1/groups", headers=ADMIN)).json()
        assert [g["group_id"] for g in listed["groups"]] == ["g"] and "errors" not in listed
    # the leader authorizes the forwarded client, not the forwarding broker: b2 (not yet
    # seeing alice's WRITE, say) refuses the half that b1 forwards to it as alice's
    meta = await (await b1.client.get("/v1/metadata", headers=ADMIN)).json()
    orders = next(t for t in meta["topics"] if t["name"] == "orders")
    on_b2 = [p["partition"] for p in orders["partitions"] if p["leader"] == 2]
    assert on_b2, meta
    other = SecurityHolder()
    b2.client.app[BROKER_KEY].authorizer.security_image = other.get
    r = await b1.client.post("/v1/topics/orders/records",
                             json={"records": [{"value": "x", "partition": on_b2[0]}]}, headers=ALICE)
    doc = await r.json()
    assert r.status == 403 and doc["offsets"][0]["error_code"] == "TOPIC_AUTHORIZATION_FAILED", doc
    assert "User:alice lacks WRITE" in doc["offsets"][0]["message"], doc
