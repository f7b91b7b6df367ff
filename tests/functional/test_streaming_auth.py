"""With authentication and ACLs on: the consumers a broker runs for a client (group streams,
REST Proxy consumer instances) act as that client's principal, so its ACLs decide what they
read, as for a fetch (http_api/broker/streaming.py internal_session)."""
from __future__ import annotations

import json
import types

from broker_harness import running_broker
from fake_controller import FakeControllerClient

from http_api.broker.app import BROKER_KEY
from http_api.wire.auth import basic_header, write_broker_credentials
from metadata_quorum.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from metadata_quorum.security.scram import make_credential

PASSWORDS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw"}
ADMIN, ALICE, BOB = ({"Authorization": basic_header(u, PASSWORDS[u])} for u in ("admin", "alice", "bob"))
V2 = "application/vnd.kafka.v2+json"


def acl(principal, op, rtype, name):
    return AclBinding(principal, ResourceType[rtype], name, PatternType.LITERAL, Operation[op], Permission.ALLOW)


async def test_group_stream_and_consumer_instances_read_as_the_client(tmp_path):
    creds, pw = tmp_path / "broker-credentials.json", tmp_path / "broker.password"
    write_broker_credentials(str(creds), {1: "broker-1-pw"})
    pw.write_text("broker-1-pw\n")
    image = types.SimpleNamespace(scram_credentials={u: make_credential(p) for u, p in PASSWORDS.items()},
                                  tokens={}, acls=(), version=1)
    async with running_broker(tmp_path, FakeControllerClient(), 1, broker_credentials_file=str(creds),
                              broker_password_file=str(pw), authentication=["basic"], authorizer="acl",
                              super_users=["User:admin"]) as h:
        ctx = h.client.app[BROKER_KEY]
        ctx.authenticator.image = ctx.authorizer.security_image = lambda: image
        c = h.client
        for name in ("open", "secret"):
            r = await c.post("/v1/topics", json={"name": name, "partitions": 1, "replication_factor": 1},
                             headers=ADMIN)
            assert r.status == 201, await r.text()
            r = await c.post(f"/v1/topics/{name}/partitions/0/records", json={"records": [{"value": name}]},
                             headers=ADMIN)
            assert r.status == 200
        image.acls = tuple(acl(p, "READ", "GROUP", "g") for p in ("User:alice", "User:bob")) + (
            acl("User:alice", "READ", "TOPIC", "open"), acl("User:alice", "READ", "TOPIC", "secret"),
            acl("User:bob", "READ", "TOPIC", "open"), acl("User:bob", "DESCRIBE", "TOPIC", "secret"))
        image.version += 1
        # alice streams through the group (the broker's consumer joins, fetches and commits as alice)
        r = await c.get("/v1/groups/g/records/stream?topics=secret&auto_offset_reset=earliest&max_records=1",
                        headers=ALICE)
        assert r.status == 200, await r.text()
        body = (await r.read()).decode()
        assert '"value":"secret"' in body, body
        # bob may not read "secret": refused before the stream
        r = await c.get("/v1/groups/g/records/stream?topics=secret&auto_offset_reset=earliest", headers=BOB)
        assert r.status == 403 and (await r.json())["error_code"] == "TOPIC_AUTHORIZATION_FAILED"
        # a REST Proxy consumer instance of bob's: its fetches of "secret" are bob's (DESCRIBE, no READ): refused
        hdr = {**BOB, "Content-Type": V2, "Accept": V2}
        r = await c.post("/consumers/g", data=json.dumps({"name": "b", "auto.offset.reset": "earliest"}), headers=hdr)
        assert r.status == 200, await r.text()
        r = await c.post("/consumers/g/instances/b/assignments",
                         data=json.dumps({"partitions": [{"topic": "secret", "partition": 0}]}), headers=hdr)
        assert r.status == 204, await r.text()
        for _ in range(50):            # (a first poll may end before its fetch is answered)
            r = await c.get("/consumers/g/instances/b/records?timeout=200",
                            headers={**BOB, "Accept": "application/vnd.kafka.binary.v2+json"})
            doc = await r.json()
            if doc:
                break
        assert r.status == 403 and doc["error_code"] == 40301, doc
        # ... and alice may not use bob's instance
        r = await c.get("/consumers/g/instances/b/assignments", headers={**ALICE, "Accept": V2})
        assert r.status == 403 and (await r.json())["error_code"] == 40301
        r = await c.delete("/consumers/g/instances/b", headers=BOB)
        assert r.status == 204
