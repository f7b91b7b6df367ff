"""Broker-to-broker routes with a cluster secret: strangers get 401 SASL_AUTHENTICATION_FAILED,
brokers of the cluster replicate and list groups with the token."""
import pytest
from broker_harness import running_broker
from fake_controller import FakeControllerClient

from http_api.broker.internal_auth import INTERNAL_TOKEN_HEADER, internal_token

SECRET = "s3cret-of-the-cluster"


@pytest.fixture
async def secured(tmp_path):
    controller = FakeControllerClient()
    async with running_broker(tmp_path, controller, 1, cluster_secret=SECRET) as b1, \
            running_broker(tmp_path, controller, 2, cluster_secret=SECRET) as b2:
        yield b1, b2


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/internal/v1/replica-fetch", {"replica_id": 2, "partitions": []}),
    ("POST", "/internal/v1/epoch-end-offsets", {"replica_id": 2, "partitions": []}),
    ("GET", "/internal/v1/groups", None),
])
async def test_internal_routes_refuse_requests_without_the_cluster_token(secured, method, path, body):
    b1, _ = secured
    for headers in ({}, {INTERNAL_TOKEN_HEADER: "wrong"}, {INTERNAL_TOKEN_HEADER: internal_token("other-secret")}):
        r = await b1.client.request(method, path, json=body, headers=headers)
        doc = await r.json()
        assert r.status == 401 and doc["error_code"] == "SASL_AUTHENTICATION_FAILED", (headers, doc)
        assert "password" in doc["message"]
    r = await b1.client.request(method, path, json=body, headers={INTERNAL_TOKEN_HEADER: internal_token(SECRET)})
    assert r.status == 200, await r.text()


async def test_brokers_sharing_the_secret_replicate_and_list_groups(secured):
    b1, b2 = secured
    r = await b1.client.post("/v1/topics", json={"name": "sec", "partitions": 2, "replication_factor": 2})
    assert r.status == 201
    for p in range(2):
        r = await b1.client.post("/v1/topics/sec/records?acks=all",
                                 json={"records": [{"value": f"v{p}", "partition": p}]})
        assert r.status == 200, await r.text()     # acks=all: the follower fetched with the token
    r = await b2.client.post("/v1/groups/gsec/offsets", json={"offsets": [{"topic": "sec", "partition": 0, "offset": 1}]})
    assert r.status == 200, await r.text()
    for h in (b1, b2):   # the listing asks the other broker's /internal/v1/groups with the token
        listed = (await (await h.client.get("/v1/groups")).json())
        assert [g["group_id"] for g in listed["groups"]] == ["gsec"] and "errors" not in listed


async def test_public_routes_need_no_token(secured):
    b1, _ = secured
    assert (await b1.client.get("/v1/metadata")).status == 200
    assert (await b1.client.get("/healthz")).status == 200
