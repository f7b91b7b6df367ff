"""Authentication and authorization of every broker route (issue 16): each route registered
in the app's router x {anonymous, wrong credential, principal with exactly the ACLs the route
needs, principal without them}. A route added to the app without a row in SAMPLES (and a rule
in http_api/broker/authorization.py) fails `test_every_route_has_a_sample`."""
from __future__ import annotations

import types

import pytest
from broker_harness import running_broker
from fake_controller import FakeControllerClient

from http_api.broker.app import BROKER_KEY, BrokerDeps, create_app
from http_api.broker.config import BrokerConfig
from http_api.broker.metadata_view import MetadataView
from http_api.wire.auth import basic_header, write_broker_credentials
from metadata_quorum.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from metadata_quorum.security.image import DelegationToken
from metadata_quorum.security.scram import hash_token, make_credential

PASSWORDS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw"}
BROKER_PASSWORDS = {7: "broker-7-pw", 8: "broker-8-pw"}
ALICE_TOKEN = "alice-token-0123456789abcdef"
EXPIRED_TOKEN = "alice-old-token-0123456789abcdef"
CREDENTIALS = {u: make_credential(p) for u, p in PASSWORDS.items()}


class SecurityHolder:
    """A hand-built SecurityImage-like object the broker reads (scram_credentials, tokens,
    acls, version); `grant()` swaps in new ACLs as a new version."""

    def __init__(self) -> None:
        self.image = types.SimpleNamespace(scram_credentials=dict(CREDENTIALS),
                                           tokens={"t1": DelegationToken("t1", hash_token(ALICE_TOKEN), "User:alice"),
                                                   "t2": DelegationToken("t2", hash_token(EXPIRED_TOKEN), "User:alice",
                                                                         expiry_timestamp_ms=1)},
                                           acls=(), version=1)

    def get(self):
        return self.image

    def grant(self, *acls: AclBinding) -> None:
        self.image = types.SimpleNamespace(scram_credentials=self.image.scram_credentials,
                                           tokens=self.image.tokens,
                                           acls=tuple(acls), version=self.image.version + 1)


def acl(principal, op, rtype, name="kafka-cluster", deny=False, prefixed=False):
    return AclBinding(principal, ResourceType[rtype], name, PatternType.PREFIXED if prefixed else PatternType.LITERAL,
                      Operation[op], Permission.DENY if deny else Permission.ALLOW)


def auth(user):
    return {"Authorization": basic_header(user, PASSWORDS[user])}


def broker_auth(bid):
    return {"Authorization": basic_header(f"broker-{bid}", BROKER_PASSWORDS[bid])}


ADMIN, ALICE, BOB = auth("admin"), auth("alice"), auth("bob")
WRONG = {"Authorization": basic_header("alice", "not-her-password")}

# (method, route pattern) -> (path, body, ACLs of User:alice that permit it, error code for bob;
# None: a listing, answered filtered; "open": no authentication)
SAMPLES = {
    ("GET", "/v1/metadata"): ("/v1/metadata", None, [], None),
    ("GET", "/v1/topics"): ("/v1/topics", None, [], None),
    ("POST", "/v1/topics"): ("/v1/topics", {"name": "fresh", "partitions": 1, "replication_factor": 1},
                             [("CREATE", "TOPIC", "fresh")], "TOPIC_AUTHORIZATION_FAILED"),
    ("GET", "/v1/topics/{topic}"): ("/v1/topics/orders", None, [("DESCRIBE", "TOPIC", "orders")],
                                    "TOPIC_AUTHORIZATION_FAILED"),
    ("DELETE", "/v1/topics/{topic}"): ("/v1/topics/doomed", None, [("DELETE", "TOPIC", "doomed")],
                                       "TOPIC_AUTHORIZATION_FAILED"),
    ("POST", "/v1/topics/{topic}/partitions"): ("/v1/topics/orders/partitions", {"partitions": 2},
                                                [("ALTER", "TOPIC", "orders")], "TOPIC_AUTHORIZATION_FAILED"),
    ("POST", "/v1/topics/{topic}/configs"): ("/v1/topics/orders/configs", {"configs": {"retention.ms": "86400000"}},
                                             [("ALTER_CONFIGS", "TOPIC", "orders")], "TOPIC_AUTHORIZATION_FAILED"),
    ("POST", "/v1/topics/{topic}/records"): ("/v1/topics/orders/records", {"records": [{"value": "v"}]},
                                             [("WRITE", "TOPIC", "orders")], "TOPIC_AUTHORIZATION_FAILED"),
    ("POST", "/v1/topics/{topic}/partitions/{partition}/records"): (
        "/v1/topics/orders/partitions/0/records", {"records": [{"value": "v"}]},
        [("WRITE", "TOPIC", "orders")], "TOPIC_AUTHORIZATION_FAILED"),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/records"): (
        "/v1/topics/orders/partitions/0/records?offset=0", None, [("READ", "TOPIC", "orders")],
        "TOPIC_AUTHORIZATION_FAILED"),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/offsets"): (
        "/v1/topics/orders/partitions/0/offsets", None, [("DESCRIBE", "TOPIC", "orders")],
        "TOPIC_AUTHORIZATION_FAILED"),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/records/stream"): (   # a bad offset: 400 before streaming
        "/v1/topics/orders/partitions/0/records/stream?offset=bad", None, [("READ", "TOPIC", "orders")],
        "TOPIC_AUTHORIZATION_FAILED"),
    ("GET", "/v1/groups/{group}/records/stream"): (
        "/v1/groups/g1/records/stream?topics=orders&auto_offset_reset=bad", None,
        [("READ", "GROUP", "g1"), ("READ", "TOPIC", "orders")], "GROUP_AUTHORIZATION_FAILED"),
    ("POST", "/v1/topics/{topic}/partitions/{partition}/delete-records"): (
        "/v1/topics/orders/partitions/0/delete-records", {"before_offset": 0}, [("DELETE", "TOPIC", "orders")],
        "TOPIC_AUTHORIZATION_FAILED"),
    ("GET", "/v1/groups"): ("/v1/groups", None, [], None),
    ("GET", "/v1/groups/{group}"): ("/v1/groups/g1", None, [("DESCRIBE", "GROUP", "g1")],
                                    "GROUP_AUTHORIZATION_FAILED"),
    ("DELETE", "/v1/groups/{group}"): ("/v1/groups/gdel", None, [("DELETE", "GROUP", "gdel")],
                                       "GROUP_AUTHORIZATION_FAILED"),
    ("GET", "/v1/groups/{group}/coordinator"): ("/v1/groups/g1/coordinator", None, [("DESCRIBE", "GROUP", "g1")],
                                                "GROUP_AUTHORIZATION_FAILED"),
    ("POST", "/v1/groups/{group}/join"): ("/v1/groups/g1/join", {"bad": 1}, [("READ", "GROUP", "g1")],
                                          "GROUP_AUTHORIZATION_FAILED"),
    ("POST", "/v1/groups/{group}/heartbeat"): ("/v1/groups/g1/heartbeat", {"bad": 1}, [("READ", "GROUP", "g1")],
                                               "GROUP_AUTHORIZATION_FAILED"),
    ("POST", "/v1/groups/{group}/leave"): ("/v1/groups/g1/leave", {"bad": 1}, [("READ", "GROUP", "g1")],
                                           "GROUP_AUTHORIZATION_FAILED"),
    ("POST", "/v1/groups/{group}/offsets"): (
        "/v1/groups/g1/offsets", {"offsets": [{"topic": "orders", "partition": 0, "offset": 0}]},
        [("READ", "GROUP", "g1"), ("READ", "TOPIC", "orders")], "GROUP_AUTHORIZATION_FAILED"),
    ("GET", "/v1/groups/{group}/offsets"): ("/v1/groups/g1/offsets", None, [("DESCRIBE", "GROUP", "g1")],
                                            "GROUP_AUTHORIZATION_FAILED"),
    ("POST", "/v1/producer-ids"): ("/v1/producer-ids", {}, [("IDEMPOTENT_WRITE", "CLUSTER", "kafka-cluster")],
                                   "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/v1/transactions/{txid}/init"): ("/v1/transactions/t1/init", {},
                                               [("WRITE", "TRANSACTIONAL_ID", "t1")], "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/v1/transactions/{txid}/records"): (
        "/v1/transactions/t1/records", {"producer_id": 0, "producer_epoch": 0,
                                        "records": [{"topic": "orders", "value": "v"}]},
        [("WRITE", "TRANSACTIONAL_ID", "t1"), ("WRITE", "TOPIC", "orders")], "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/v1/transactions/{txid}/offsets"): (
        "/v1/transactions/t1/offsets", {"producer_id": 0, "producer_epoch": 0, "group": "g1", "offsets": []},
        [("WRITE", "TRANSACTIONAL_ID", "t1"), ("READ", "GROUP", "g1")], "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/v1/transactions/{txid}/commit"): ("/v1/transactions/t1/commit", {"producer_id": 0, "producer_epoch": 0},
                                                 [("WRITE", "TRANSACTIONAL_ID", "t1")], "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/v1/transactions/{txid}/abort"): ("/v1/transactions/t1/abort", {"producer_id": 0, "producer_epoch": 0},
                                                [("WRITE", "TRANSACTIONAL_ID", "t1")], "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/internal/v1/txn-markers"): ("/internal/v1/txn-markers", {"bad": 1},
                                           [("CLUSTER_ACTION", "CLUSTER", "kafka-cluster")],
                                           "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/internal/v1/transactions/{txid}/verify"): ("/internal/v1/transactions/t1/verify", {"bad": 1},
                                                          [("CLUSTER_ACTION", "CLUSTER", "kafka-cluster")],
                                                          "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/admin/v1/log-cleaner/run"): ("/admin/v1/log-cleaner/run", {"topic": "orders"},
                                            [("ALTER", "CLUSTER", "kafka-cluster")], "CLUSTER_AUTHORIZATION_FAILED"),
    ("GET", "/admin/v1/log-cleaner"): ("/admin/v1/log-cleaner", None, [("DESCRIBE", "CLUSTER", "kafka-cluster")],
                                       "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/internal/v1/replica-fetch"): ("/internal/v1/replica-fetch", {"replica_id": 7, "partitions": []},
                                             "broker-7", "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/internal/v1/epoch-end-offsets"): ("/internal/v1/epoch-end-offsets", {"partitions": []},
                                                 [("CLUSTER_ACTION", "CLUSTER", "kafka-cluster")],
                                                 "CLUSTER_AUTHORIZATION_FAILED"),
    ("GET", "/internal/v1/groups"): ("/internal/v1/groups", None, [("CLUSTER_ACTION", "CLUSTER", "kafka-cluster")],
                                     "CLUSTER_AUTHORIZATION_FAILED"),
    ("GET", "/metrics"): ("/metrics", None, [("DESCRIBE", "CLUSTER", "kafka-cluster")], "CLUSTER_AUTHORIZATION_FAILED"),
    # the controller quorum (http_api/broker/quorum_admin.py)
    ("GET", "/v1/admin/quorum"): ("/v1/admin/quorum", None, [("DESCRIBE", "CLUSTER", "kafka-cluster")],
                                  "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/v1/admin/quorum/voters"): ("/v1/admin/quorum/voters", {"bad": 1}, [("ALTER", "CLUSTER", "kafka-cluster")],
                                          "CLUSTER_AUTHORIZATION_FAILED"),
    ("DELETE", "/v1/admin/quorum/voters/{id}"): ("/v1/admin/quorum/voters/x", None,
                                                 [("ALTER", "CLUSTER", "kafka-cluster")], "CLUSTER_AUTHORIZATION_FAILED"),
    # partition reassignment and decommission (http_api/broker/reassignments.py)
    ("POST", "/v1/reassignments"): ("/v1/reassignments", {"version": 1, "partitions": []},
                                    [("ALTER", "CLUSTER", "kafka-cluster")], "CLUSTER_AUTHORIZATION_FAILED"),
    ("GET", "/v1/reassignments"): ("/v1/reassignments", None, [("DESCRIBE", "CLUSTER", "kafka-cluster")],
                                   "CLUSTER_AUTHORIZATION_FAILED"),
    ("DELETE", "/v1/reassignments"): ("/v1/reassignments", None, [("ALTER", "CLUSTER", "kafka-cluster")],
                                      "CLUSTER_AUTHORIZATION_FAILED"),
    ("GET", "/v1/brokers"): ("/v1/brokers", None, [("DESCRIBE", "CLUSTER", "kafka-cluster")],
                             "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/v1/brokers/{broker_id}/decommission"): ("/v1/brokers/7/decommission", None,
                                                       [("ALTER", "CLUSTER", "kafka-cluster")],
                                                       "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/v1/brokers/{broker_id}/recommission"): ("/v1/brokers/7/recommission", None,
                                                       [("ALTER", "CLUSTER", "kafka-cluster")],
                                                       "CLUSTER_AUTHORIZATION_FAILED"),
    ("GET", "/internal/v1/reassignment-progress"): ("/internal/v1/reassignment-progress", None,
                                                    [("CLUSTER_ACTION", "CLUSTER", "kafka-cluster")],
                                                    "CLUSTER_AUTHORIZATION_FAILED"),
    ("GET", "/v1/admin/users"): ("/v1/admin/users", None, [("DESCRIBE", "CLUSTER", "kafka-cluster")],
                                 "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/v1/admin/users"): ("/v1/admin/users", {"bad": 1}, [("ALTER", "CLUSTER", "kafka-cluster")],
                                  "CLUSTER_AUTHORIZATION_FAILED"),
    ("PUT", "/v1/admin/users/{name}"): ("/v1/admin/users/carol", {"bad": 1}, [("ALTER", "CLUSTER", "kafka-cluster")],
                                        "CLUSTER_AUTHORIZATION_FAILED"),
    ("DELETE", "/v1/admin/users/{name}"): ("/v1/admin/users/nobody", None, [("ALTER", "CLUSTER", "kafka-cluster")],
                                           "CLUSTER_AUTHORIZATION_FAILED"),
    ("GET", "/v1/admin/tokens"): ("/v1/admin/tokens", None, [("DESCRIBE", "CLUSTER", "kafka-cluster")],
                                  "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/v1/admin/tokens"): ("/v1/admin/tokens", {"bad": 1}, [("ALTER", "CLUSTER", "kafka-cluster")],
                                   "CLUSTER_AUTHORIZATION_FAILED"),
    ("DELETE", "/v1/admin/tokens/{token_id}"): ("/v1/admin/tokens/nope", None,
                                                [("ALTER", "CLUSTER", "kafka-cluster")], "CLUSTER_AUTHORIZATION_FAILED"),
    ("GET", "/v1/admin/acls"): ("/v1/admin/acls", None, [("DESCRIBE", "CLUSTER", "kafka-cluster")],
                                "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/v1/admin/acls"): ("/v1/admin/acls", {"bad": 1}, [("ALTER", "CLUSTER", "kafka-cluster")],
                                 "CLUSTER_AUTHORIZATION_FAILED"),
    ("POST", "/v1/admin/acls/delete"): ("/v1/admin/acls/delete", {"bad": 1}, [("ALTER", "CLUSTER", "kafka-cluster")],
                                        "CLUSTER_AUTHORIZATION_FAILED"),
    # Confluent REST Proxy v2 (http_api/rest_proxy/): the samples stop at a 4xx after authorization
    ("GET", "/topics"): ("/topics", None, [], None),
    ("GET", "/topics/{topic}"): ("/topics/orders", None, [("DESCRIBE", "TOPIC", "orders")], "TOPIC_AUTHORIZATION_FAILED"),
    ("GET", "/topics/{topic}/partitions"): ("/topics/orders/partitions", None, [("DESCRIBE", "TOPIC", "orders")],
                                            "TOPIC_AUTHORIZATION_FAILED"),
    ("GET", "/topics/{topic}/partitions/{partition}"): ("/topics/orders/partitions/0", None,
                                                        [("DESCRIBE", "TOPIC", "orders")], "TOPIC_AUTHORIZATION_FAILED"),
    ("POST", "/topics/{topic}"): ("/topics/orders", {"records": [{"value": "v"}]}, [("WRITE", "TOPIC", "orders")],
                                  "TOPIC_AUTHORIZATION_FAILED"),
    ("POST", "/topics/{topic}/partitions/{partition}"): ("/topics/orders/partitions/0", {"records": [{"value": "v"}]},
                                                         [("WRITE", "TOPIC", "orders")], "TOPIC_AUTHORIZATION_FAILED"),
    ("POST", "/consumers/{group}"): ("/consumers/g1", {"format": "avro"}, [("READ", "GROUP", "g1")],
                                     "GROUP_AUTHORIZATION_FAILED"),
    ("DELETE", "/consumers/{group}/instances/{instance}"): (
        "/consumers/g1/instances/none", None, [("READ", "GROUP", "g1")], "GROUP_AUTHORIZATION_FAILED"),
    ("POST", "/consumers/{group}/instances/{instance}/subscription"): (
        "/consumers/g1/instances/none/subscription", {}, [("READ", "GROUP", "g1")], "GROUP_AUTHORIZATION_FAILED"),
    ("GET", "/consumers/{group}/instances/{instance}/subscription"): (
        "/consumers/g1/instances/none/subscription", None, [("READ", "GROUP", "g1")], "GROUP_AUTHORIZATION_FAILED"),
    ("DELETE", "/consumers/{group}/instances/{instance}/subscription"): (
        "/consumers/g1/instances/none/subscription", None, [("READ", "GROUP", "g1")], "GROUP_AUTHORIZATION_FAILED"),
    ("POST", "/consumers/{group}/instances/{instance}/assignments"): (
        "/consumers/g1/instances/none/assignments", {}, [("READ", "GROUP", "g1")], "GROUP_AUTHORIZATION_FAILED"),
    ("GET", "/consumers/{group}/instances/{instance}/assignments"): (
        "/consumers/g1/instances/none/assignments", None, [("READ", "GROUP", "g1")], "GROUP_AUTHORIZATION_FAILED"),
    ("POST", "/consumers/{group}/instances/{instance}/positions"): (
        "/consumers/g1/instances/none/positions", {}, [("READ", "GROUP", "g1")], "GROUP_AUTHORIZATION_FAILED"),
    ("POST", "/consumers/{group}/instances/{instance}/positions/beginning"): (
        "/consumers/g1/instances/none/positions/beginning", {}, [("READ", "GROUP", "g1")], "GROUP_AUTHORIZATION_FAILED"),
    ("POST", "/consumers/{group}/instances/{instance}/positions/end"): (
        "/consumers/g1/instances/none/positions/end", {}, [("READ", "GROUP", "g1")], "GROUP_AUTHORIZATION_FAILED"),
    ("GET", "/consumers/{group}/instances/{instance}/records"): (
        "/consumers/g1/instances/none/records", None, [("READ", "GROUP", "g1")], "GROUP_AUTHORIZATION_FAILED"),
    ("POST", "/consumers/{group}/instances/{instance}/offsets"): (
        "/consumers/g1/instances/none/offsets", {}, [("READ", "GROUP", "g1")], "GROUP_AUTHORIZATION_FAILED"),
    ("GET", "/consumers/{group}/instances/{instance}/offsets"): (
        "/consumers/g1/instances/none/offsets", None, [("DESCRIBE", "GROUP", "g1")], "GROUP_AUTHORIZATION_FAILED"),
    # web console (http_api/console/): static assets open, page shells authenticated
    ("GET", "/ui"): ("/ui", None, [], "authenticated"),
    ("GET", "/ui/"): ("/ui/", None, [], "authenticated"),
    ("GET", "/ui/groups"): ("/ui/groups", None, [], "authenticated"),
    ("GET", "/ui/topics/{topic}"): ("/ui/topics/orders", None, [("DESCRIBE", "TOPIC", "orders")],
                                    "TOPIC_AUTHORIZATION_FAILED"),
    ("GET", "/ui/groups/{group}"): ("/ui/groups/g1", None, [("DESCRIBE", "GROUP", "g1")],
                                    "GROUP_AUTHORIZATION_FAILED"),
    ("GET", "/ui/metrics"): ("/ui/metrics", None, [("DESCRIBE", "CLUSTER", "kafka-cluster")],
                             "CLUSTER_AUTHORIZATION_FAILED"),
    ("GET", "/ui/api/log-dirs"): ("/ui/api/log-dirs", None, [("DESCRIBE", "CLUSTER", "kafka-cluster")],
                                  "CLUSTER_AUTHORIZATION_FAILED"),
    ("GET", "/ui/static/console.js"): ("/ui/static/console.js", None, [], "open"),
    ("GET", "/ui/static/console.css"): ("/ui/static/console.css", None, [], "open"),
    ("GET", "/healthz"): ("/healthz", None, [], "open"),
    ("GET", "/openapi.json"): ("/openapi.json", None, [], "open"),
}


def _registered_routes(app) -> set[tuple[str, str]]:
    """(method, pattern) of every route of the app (HEAD is authorized as its GET)."""
    return {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}


def _app_routes() -> list[tuple[str, str]]:
    """Every route of a broker app as create_app builds it (the parameters of the table test)."""
    rm = types.SimpleNamespace()
    app = create_app(BrokerConfig(), BrokerDeps(replica_manager=rm, metadata=MetadataView(rm), controller=None,
                                                groups=None))
    return sorted(_registered_routes(app))


SECURE = dict(authentication=["basic", "bearer"], authorizer="acl", super_users=["User:admin"],
              authentication_failures_max_per_second=100_000)


@pytest.fixture
async def secure_broker(tmp_path):
    creds = tmp_path / "broker-credentials.json"
    write_broker_credentials(str(creds), BROKER_PASSWORDS)
    holder = SecurityHolder()
    async with running_broker(tmp_path, FakeControllerClient(), 1, broker_credentials_file=str(creds),
                              **SECURE) as h:
        ctx = h.client.app[BROKER_KEY]
        ctx.authenticator.image = ctx.authorizer.security_image = holder.get
        c = h.client
        for name in ("orders", "doomed", "secret"):
            r = await c.post("/v1/topics", json={"name": name, "partitions": 1, "replication_factor": 1}, headers=ADMIN)
            assert r.status == 201, await r.text()
        for g in ("g1", "gdel", "hidden"):
            r = await c.post(f"/v1/groups/{g}/offsets", json={"offsets": [{"topic": "orders", "partition": 0,
                                                                            "offset": 0}]}, headers=ADMIN)
            assert r.status == 200, await r.text()
        yield h, holder


def test_every_route_has_a_sample():
    missing = set(_app_routes()) - set(SAMPLES)
    assert not missing, f"routes without a row in SAMPLES (and maybe no authorization rule): {sorted(missing)}"


async def _call(c, method, path, body, headers):
    r = await c.request(method, path, json=body, headers=headers)
    text = await r.text()
    return r, text


@pytest.mark.parametrize("route", _app_routes(), ids=lambda r: f"{r[0]} {r[1]}")
async def test_route_authentication_and_authorization(secure_broker, route):
    h, holder = secure_broker
    c = h.client
    assert route in SAMPLES, f"{route} has no row in SAMPLES: add one (and its rule in authorization.py)"
    method, _ = route
    path, body, permits, bob_code = SAMPLES[route]
    if bob_code == "open":
        for headers in ({}, WRONG):
            r, text = await _call(c, method, path, body, headers)
            assert r.status == 200, text
        return
    # anonymous and wrong credential: 401 with a challenge
    for headers in ({}, WRONG, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Negotiate abc"}):
        r, text = await _call(c, method, path, body, headers)
        assert r.status == 401, (headers, text)
        assert (await r.json())["error_code"] == "SASL_AUTHENTICATION_FAILED"
        assert 'Basic realm="kraftlog"' in r.headers["WWW-Authenticate"]
        assert "Bearer" in r.headers["WWW-Authenticate"]
    if bob_code == "authenticated":     # any authenticated principal (console pages)
        r, text = await _call(c, method, path, body, BOB)
        assert r.status == 200, text
        return
    if isinstance(permits, list):
        holder.grant(*[acl("User:alice", op, rt, name) for op, rt, name in permits])
        permitted = ALICE
    else:       # a broker route: the broker principal itself
        permitted = broker_auth(int(permits.split("-")[1]))
    # a principal without the ACL
    r, text = await _call(c, method, path, body, BOB)
    if bob_code is None:        # listings: answered, but empty for bob
        assert r.status == 200, text
        doc = await r.json()
        key = "groups" if "groups" in path else "topics"
        assert (doc if isinstance(doc, list) else doc[key]) == [], doc     # a list: REST Proxy's GET /topics
    else:
        assert r.status == 403, text
        doc = await r.json()
        assert doc["error_code"] == bob_code, doc
        assert "User:bob lacks" in doc["message"] or "may not fetch as replica" in doc["message"], doc
        assert "kraftlog acl add --principal User:bob" in doc["message"] or "replica" in doc["message"]
    # the permitted principal passes authentication and authorization (the route may still
    # refuse the sample's body with a 4xx of its own)
    r, text = await _call(c, method, path, body, permitted)
    assert r.status not in (401, 403), text
    # missing one of several needed permissions is still a refusal
    if isinstance(permits, list) and len(permits) > 1:
        holder.grant(*[acl("User:alice", op, rt, name) for op, rt, name in permits[:1]])
        r, text = await _call(c, method, path, body, ALICE)
        assert r.status == 403, text


async def test_listings_show_only_what_the_principal_may_describe(secure_broker):
    h, holder = secure_broker
    c = h.client
    holder.grant(acl("User:alice", "READ", "TOPIC", "ord", prefixed=True), acl("User:alice", "DESCRIBE", "GROUP", "g1"),
                 acl("User:alice", "DESCRIBE", "TOPIC", "doomed"), acl("User:alice", "DESCRIBE", "TOPIC", "doomed",
                                                                      deny=True))
    assert (await (await c.get("/v1/topics", headers=ALICE)).json())["topics"] == ["orders"]
    meta = await (await c.get("/v1/metadata", headers=ALICE)).json()
    assert [t["name"] for t in meta["topics"]] == ["orders"] and meta["brokers"]
    groups = await (await c.get("/v1/groups", headers=ALICE)).json()
    assert [g["group_id"] for g in groups["groups"]] == ["g1"]
    # the super user sees everything
    assert sorted((await (await c.get("/v1/topics", headers=ADMIN)).json())["topics"]) == [
        "__consumer_offsets", "doomed", "orders", "secret"]
    assert len((await (await c.get("/v1/groups", headers=ADMIN)).json())["groups"]) == 3


async def test_bearer_token_authenticates_its_principal(secure_broker):
    h, holder = secure_broker
    holder.grant(acl("User:alice", "WRITE", "TOPIC", "orders"))
    r = await h.client.post("/v1/topics/orders/records", json={"records": [{"value": "t"}]},
                            headers={"Authorization": f"Bearer {ALICE_TOKEN}"})
    assert r.status == 200, await r.text()
    r = await h.client.post("/v1/topics/secret/records", json={"records": [{"value": "t"}]},
                            headers={"Authorization": f"Bearer {ALICE_TOKEN}"})
    assert r.status == 403 and "User:alice lacks WRITE on topic secret" in (await r.json())["message"]
    r = await h.client.post("/v1/topics/orders/records", json={"records": [{"value": "t"}]},
                            headers={"Authorization": f"Bearer {EXPIRED_TOKEN}"})
    assert r.status == 401 and "expired" in (await r.json())["message"]


async def test_authentication_counters_on_metrics(secure_broker):
    h, _ = secure_broker
    for _ in range(3):
        assert (await h.client.get("/v1/topics", headers=WRONG)).status == 401
    for _ in range(5):
        assert (await h.client.get("/v1/topics", headers=ALICE)).status == 200
    text = await (await h.client.get("/metrics", headers=ADMIN)).text()
    values = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("kraftlog_authentication")}
    assert values["kraftlog_authentication_failures"] >= 3
    assert values["kraftlog_authentication_cache_hits"] >= 4 and values["kraftlog_authentication_cache_misses"] >= 1


async def test_replica_fetch_as_another_broker_is_refused(secure_broker):
    h, _ = secure_broker
    body = {"replica_id": 7, "partitions": []}
    r = await h.client.post("/internal/v1/replica-fetch", json=body, headers=broker_auth(8))
    doc = await r.json()
    assert r.status == 403 and doc["error_code"] == "CLUSTER_AUTHORIZATION_FAILED", doc
    assert "broker 8 may not fetch as replica 7" in doc["message"]
    # a super user is no broker either: it may not pose as a replica
    r = await h.client.post("/internal/v1/replica-fetch", json=body, headers=ADMIN)
    assert r.status == 403
    r = await h.client.post("/internal/v1/replica-fetch", json=body, headers=broker_auth(7))
    assert r.status == 200, await r.text()


async def test_forwarded_principal_is_only_believed_from_brokers(secure_broker):
    h, holder = secure_broker
    holder.grant(acl("User:alice", "WRITE", "TOPIC", "orders"))
    body = {"records": [{"value": "f"}]}
    # bob cannot claim to forward alice's request
    r = await h.client.post("/v1/topics/orders/records", json=body, headers={**BOB, "X-Kraftlog-Principal": "User:alice"})
    assert r.status == 401, await r.text()
    # a broker forwarding alice's request acts with alice's rights, not its own
    r = await h.client.post("/v1/topics/orders/records", json=body,
                            headers={**broker_auth(7), "X-Kraftlog-Principal": "User:alice"})
    assert r.status == 200, await r.text()
    r = await h.client.post("/v1/topics/secret/records", json=body,
                            headers={**broker_auth(7), "X-Kraftlog-Principal": "User:alice"})
    assert r.status == 403, await r.text()


async def test_acl_changes_apply_to_the_next_request(secure_broker):
    h, holder = secure_broker
    r = await h.client.get("/v1/topics/orders", headers=ALICE)
    assert r.status == 403
    holder.grant(acl("User:alice", "DESCRIBE", "TOPIC", "orders"))
    assert (await h.client.get("/v1/topics/orders", headers=ALICE)).status == 200
    holder.grant(acl("User:alice", "ALL", "TOPIC", "*"), acl("User:alice", "DESCRIBE", "TOPIC", "orders", deny=True))
    assert (await h.client.get("/v1/topics/orders", headers=ALICE)).status == 403   # deny wins


async def test_produce_that_auto_creates_needs_create(secure_broker):
    h, holder = secure_broker
    holder.grant(acl("User:alice", "WRITE", "TOPIC", "auto-", prefixed=True))
    body = {"records": [{"value": "a"}]}
    r = await h.client.post("/v1/topics/auto-1/records", json=body, headers=ALICE)
    doc = await r.json()
    assert r.status == 403 and "lacks CREATE on topic auto-1" in doc["message"], doc
    holder.grant(acl("User:alice", "WRITE", "TOPIC", "auto-", prefixed=True),
                 acl("User:alice", "CREATE", "TOPIC", "auto-", prefixed=True))
    r = await h.client.post("/v1/topics/auto-1/records", json=body, headers=ALICE)
    assert r.status == 200, await r.text()
