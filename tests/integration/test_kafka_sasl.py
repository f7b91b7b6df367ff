"""SASL_SSL on the Kafka listener of a secured node (`kraftlog serve` with [security] TLS,
HTTP Basic authentication and the ACL authorizer): confluent-kafka authenticates with
SCRAM-SHA-256 and PLAIN as the cluster's users (the same passwords as HTTP Basic, created
by the controller from the bootstrap users file), produces, consumes and runs transactions
as far as the user's ACLs (granted over HTTPS) allow; a wrong password, a client without
SASL and a client without TLS get nothing."""
from __future__ import annotations

import json
import ssl
import time
import urllib.request
import uuid

import pytest

from deploy.certs import CertificateAuthority
from deploy.local_node import LocalNode

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POLL_S = 60.0


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = tmp_path_factory.mktemp("kafka-sasl")
    ca = CertificateAuthority.create(str(d / "ca"))
    ca.issue("broker-1", ["127.0.0.1", "localhost"], str(d / "node.pem"), str(d / "node-key.pem"))
    (d / "users.json").write_text(json.dumps({"admin": "admin-pw", "alice": "alice-pw"}))
    (d / "node.toml").write_text(f"""
[security]
tls_cert_file = "{d / 'node.pem'}"
tls_key_file = "{d / 'node-key.pem'}"
tls_ca_file = "{ca.cert_path}"
authentication = ["basic"]
authorizer = "acl"
super_users = ["User:admin"]
bootstrap_users_file = "{d / 'users.json'}"
""")
    n = LocalNode(str(d / "data"), extra_args=["--config", str(d / "node.toml")], scheme="https")
    try:
        n.start(90)
        n.ca_file = ca.cert_path
        yield n
    finally:
        n.stop()


def _admin(node, path: str, body: dict) -> int:
    """POST `body` to the node's HTTPS API as the super user admin; the status."""
    req = urllib.request.Request(node.url + path, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json",
        "Authorization": "Basic " + __import__("base64").b64encode(b"admin:admin-pw").decode()})
    try:
        with urllib.request.urlopen(req, timeout=30, context=ssl.create_default_context(cafile=node.ca_file)) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _grant(node, operation: str, resource_type: str, name: str, pattern: str = "LITERAL") -> None:
    deadline = time.monotonic() + POLL_S   # admin exists once the controller created the bootstrap users
    while (status := _admin(node, "/v1/admin/acls", {
            "principal": "User:alice", "resource_type": resource_type, "resource_name": name,
            "pattern_type": pattern, "operation": operation})) not in (201, 409):   # 409: granted before
        assert status == 401 and time.monotonic() < deadline, status
        time.sleep(0.2)


def _conf(node, **extra) -> dict:
    return {"bootstrap.servers": f"127.0.0.1:{node.kafka_port}", "security.protocol": "SASL_SSL",
            "ssl.ca.location": node.ca_file, "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
            "sasl.password": "alice-pw", **extra}


def _metadata_error(conf: dict, timeout: float = 8.0):
    """The KafkaException a metadata request gets under `conf` (None when it succeeds)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    errors = []
    admin = AdminClient({"reconnect.backoff.ms": 500, **conf, "error_cb": errors.append})
    try:
        admin.list_topics(timeout=timeout)
        return None
    except KafkaException as e:
        admin.poll(0.5)   # serves error_cb
        return e.args[0], errors


def test_scram_and_plain_clients_produce_and_consume_over_sasl_ssl(node):
    from confluent_kafka import Consumer, Producer, TopicPartition
    for op in ("WRITE", "READ", "CREATE"):
        _grant(node, op, "TOPIC", "s-", pattern="PREFIXED")
    _grant(node, "READ", "GROUP", "g-sasl")
    # the controller creates the bootstrap users once active; the broker learns them from the metadata
    deadline = time.monotonic() + POLL_S
    while _metadata_error(_conf(node)) is not None:
        assert time.monotonic() < deadline, "alice never authenticated over SCRAM-SHA-256"
    topic = f"s-{uuid.uuid4().hex[:6]}"
    p = Producer(_conf(node, acks="all"))
    for i in range(10):
        p.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
    assert p.flush(POLL_S) == 0
    c = Consumer(_conf(node, **{"sasl.mechanism": "PLAIN", "group.id": "g-sasl", "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + POLL_S
        while len(got) < 10 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append((m.key(), m.value()))
    finally:
        c.close()
    assert got == [(f"k{i}".encode(), f"v{i}".encode()) for i in range(10)]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_a_wrong_password_is_refused(node, mechanism):
    from confluent_kafka import KafkaError
    deadline = time.monotonic() + POLL_S
    while _metadata_error(_conf(node)) is not None:   # alice exists (so only the password is wrong)
        assert time.monotonic() < deadline
    err, seen = _metadata_error(_conf(node, **{"sasl.mechanism": mechanism, "sasl.password": "wrong"}), timeout=3)
    # refused by the broker (its SaslAuthenticate error), not only by the client's own check
    # of the server signature
    assert any(e.code() == KafkaError._AUTHENTICATION and "wrong user name or password" in e.str()
               for e in seen), (err, seen)


def test_clients_without_sasl_or_without_tls_get_nothing(node):
    # TLS without SASL: the listener closes the connection at the first request that is not
    # ApiVersions/SASL, so no metadata ever arrives
    assert _metadata_error({"bootstrap.servers": f"127.0.0.1:{node.kafka_port}", "security.protocol": "SSL",
                            "ssl.ca.location": node.ca_file}, timeout=3) is not None
    assert _metadata_error({"bootstrap.servers": f"127.0.0.1:{node.kafka_port}", "security.protocol": "SASL_PLAINTEXT",
                            "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "alice-pw"},
                           timeout=3) is not None


def test_acls_gate_topics_and_transactional_ids(node):
    from confluent_kafka import KafkaError, KafkaException, Producer
    _grant(node, "WRITE", "TOPIC", "s-", pattern="PREFIXED")
    deadline = time.monotonic() + POLL_S
    while _metadata_error(_conf(node)) is not None:
        assert time.monotonic() < deadline
    # no ACL on the topic: refused with TOPIC_AUTHORIZATION_FAILED
    errors = []
    p = Producer(_conf(node, **{"message.timeout.ms": 15_000}))
    p.produce(f"denied-{uuid.uuid4().hex[:6]}", value=b"v", on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED], errors
    # no ACL on the transactional id: TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    txid = f"tx-{uuid.uuid4().hex[:6]}"
    p = Producer(_conf(node, **{"transactional.id": txid}))
    with pytest.raises(KafkaException) as e:
        p.init_transactions(30)
    assert e.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, e.value
    # granted: the same client commits a transaction over SASL_SSL
    _grant(node, "WRITE", "TRANSACTIONAL_ID", txid)
    p = Producer(_conf(node, **{"transactional.id": txid}))
    p.init_transactions(POLL_S)
    p.begin_transaction()
    p.produce(f"s-{uuid.uuid4().hex[:6]}", value=b"in-a-transaction")
    p.commit_transaction(POLL_S)
