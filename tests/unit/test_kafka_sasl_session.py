"""SASL on the Kafka listener (http_api/kafka/sasl.py): SCRAM-SHA-256 checked against
kafka-python's own SCRAM client (an independent implementation of RFC 5802), PLAIN, wrong
passwords, unknown users (no user enumeration), the failure limiter shared with HTTP Basic,
and the listener refusing every API but ApiVersions/SASL before authentication."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from kafka.net.sasl.scram import ScramClient

from http_api.broker.config import BrokerConfig
from http_api.kafka.apis import KafkaApis
from http_api.kafka.protocol import FrameError
from http_api.kafka.sasl import PLAIN, SCRAM_SHA_256, SaslFailed, SaslSession
from http_api.wire.auth import Authenticator
from metadata_quorum.security.config import SecurityConfig
from metadata_quorum.security.scram import make_credential
from tests.unit.test_kafka_transactions_listener import _decode_answer, _request


def _authenticator(rate: float = 10.0) -> Authenticator:
    image = SimpleNamespace(scram_credentials={"alice": make_credential("alice-pw")}, tokens={}, acls=(), version=1)
    return Authenticator(SecurityConfig(authentication=("basic",), authentication_failures_max_per_second=rate),
                         lambda: image, broker_credentials={})


def _scram(session: SaslSession, user: str, password: str) -> ScramClient:
    client = ScramClient(user, password, SCRAM_SHA_256)
    assert session.handshake(SCRAM_SHA_256)
    server_first = session.step(client.first_message())
    client.process_server_first_message(server_first)
    server_final = session.step(client.final_message())
    client.process_server_final_message(server_final)   # raises unless the server proved it knows the key
    return client


def test_scram_sha_256_with_kafka_pythons_client():
    session = SaslSession(_authenticator(), "10.0.0.1")
    _scram(session, "alice", "alice-pw")
    assert session.authenticated and session.principal == "User:alice"


@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("mallory", "alice-pw")])
def test_scram_refuses_a_wrong_password_and_an_unknown_user_alike(user, password):
    a = _authenticator()
    session = SaslSession(a, "10.0.0.2")
    client = ScramClient(user, password, SCRAM_SHA_256)
    assert session.handshake(SCRAM_SHA_256)
    server_first = session.step(client.first_message())      # an unknown user gets a challenge too
    assert b",s=" in server_first and b",i=4096" in server_first
    client.process_server_first_message(server_first)
    with pytest.raises(SaslFailed, match="wrong user name or password"):
        session.step(client.final_message())
    assert not session.authenticated and a.failures == 1


def test_plain_and_its_failures():
    a = _authenticator()
    ok = SaslSession(a, "10.0.0.3")
    assert ok.handshake(PLAIN) and ok.step(b"\x00alice\x00alice-pw") == b""
    assert ok.principal == "User:alice"
    for token in (b"\x00alice\x00nope", b"bob\x00alice\x00alice-pw", b"garbage"):
        s = SaslSession(a, "10.0.0.3")
        assert s.handshake(PLAIN)
        with pytest.raises(SaslFailed):
            s.step(token)
        assert not s.authenticated
    assert not SaslSession(a, "x").handshake("GSSAPI")


def test_failed_exchanges_count_against_the_address_like_http_basic():
    a = _authenticator(rate=2)
    for _ in range(2):
        s = SaslSession(a, "10.0.0.4")
        s.handshake(PLAIN)
        with pytest.raises(SaslFailed):
            s.step(b"\x00alice\x00nope")
    s = SaslSession(a, "10.0.0.4")   # over the limit: even the right password is refused unchecked
    s.handshake(PLAIN)
    with pytest.raises(SaslFailed, match="too many failed authentications"):
        s.step(b"\x00alice\x00alice-pw")
    other = SaslSession(a, "10.0.0.5")
    other.handshake(PLAIN)
    other.step(b"\x00alice\x00alice-pw")
    assert other.authenticated


def test_the_listener_serves_only_api_versions_and_sasl_before_authentication():
    async def go():
        apis = KafkaApis(SimpleNamespace(config=BrokerConfig(), rm=None), None, broker_id=1,
                         kafka_address=lambda: "127.0.0.1:1", sasl_authenticator=_authenticator())
        session = SaslSession(apis.sasl, "10.0.0.6")
        versions = _request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        keys = {k.api_key for k in _decode_answer(18, 3, await apis.handle(versions, session)).api_keys}
        assert {17, 36} <= keys
        metadata = _request(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                     "include_topic_authorized_operations": False})
        with pytest.raises(FrameError, match="before SASL authentication"):
            await apis.handle(metadata, session)
        answer = _decode_answer(17, 1, await apis.handle(_request(17, 1, {"mechanism": "PLAIN"}), session))
        assert answer.error_code.name == "none" and set(answer.mechanisms) == {"PLAIN", "SCRAM-SHA-256"}
        answer = _decode_answer(36, 2, await apis.handle(_request(36, 2, {"auth_bytes": b"\x00alice\x00no"}),
                                                         session))
        assert answer.error_code.name == "sasl_authentication_failed" and session.close
        plain = KafkaApis(SimpleNamespace(config=BrokerConfig(), rm=None), None, broker_id=1,
                          kafka_address=lambda: "127.0.0.1:1")
        keys = {k.api_key for k in _decode_answer(18, 3, await plain.handle(versions)).api_keys}
        assert not {17, 36} & keys     # no SASL configured: not advertised
    asyncio.run(go())



# ---- ACLs on the Kafka listener ------------------------------------------------------------

def _acl_apis(acls) -> tuple[KafkaApis, SaslSession]:
    from http_api.broker.authorization import BrokerAuthorizer
    from metadata_quorum.security.acl import AclBinding, Operation, PatternType, ResourceType
    from tests.unit.test_kafka_transactions_listener import _FakeCoordinator
    security = SecurityConfig(authentication=("basic",), authorizer="acl", super_users=("User:admin",))
    image = SimpleNamespace(scram_credentials={"alice": make_credential("alice-pw")}, tokens={}, version=1,
                            acls=tuple(AclBinding("User:alice", ResourceType[rt], name, PatternType.LITERAL,
                                                  Operation[op]) for op, rt, name in acls))
    authn = Authenticator(security, lambda: image, broker_credentials={})
    apis = KafkaApis(SimpleNamespace(config=BrokerConfig(), rm=None), None, broker_id=1,
                     kafka_address=lambda: "127.0.0.1:1", transactions=_FakeCoordinator(), sasl_authenticator=authn,
                     authorizer=BrokerAuthorizer(security, lambda: image))
    session = SaslSession(authn, "10.0.0.7")
    session.handshake(PLAIN)
    session.step(b"\x00alice\x00alice-pw")
    return apis, session


def test_every_served_api_has_an_authorization_rule():
    from http_api.kafka.apis import AUTHORIZED_API_KEYS, SASL_API_KEYS
    from http_api.kafka.protocol import API_VERSIONS
    assert AUTHORIZED_API_KEYS | set(SASL_API_KEYS) == set(API_VERSIONS)


def test_transactional_id_acl_denials_are_transactional_id_authorization_failed():
    async def go():
        apis, session = _acl_apis([("DESCRIBE", "GROUP", "g-ok")])
        init = _request(22, 4, {"transactional_id": "tx-denied", "transaction_timeout": 60000, "producer_id": -1,
                                "producer_epoch": -1})
        assert _decode_answer(22, 4, await apis.handle(init, session)).error_code.name == \
            "transactional_id_authorization_failed"
        end = _request(26, 3, {"transactional_id": "tx-denied", "producer_id": 5, "producer_epoch": 0,
                               "committed": True})
        assert _decode_answer(26, 3, await apis.handle(end, session)).error_code.name == \
            "transactional_id_authorization_failed"
        find = _request(10, 3, {"key": "tx-denied", "key_type": 1})
        assert _decode_answer(10, 3, await apis.handle(find, session)).error_code.name == \
            "transactional_id_authorization_failed"
        find = _request(10, 3, {"key": "g-denied", "key_type": 0})
        assert _decode_answer(10, 3, await apis.handle(find, session)).error_code.name == "group_authorization_failed"
        offsets = _request(25, 3, {"transactional_id": "tx-denied", "producer_id": 5, "producer_epoch": 0,
                                   "group_id": "g-ok"})
        assert _decode_answer(25, 3, await apis.handle(offsets, session)).error_code.name == \
            "transactional_id_authorization_failed"
        # granted: the request reaches the coordinator (here: "not the coordinator")
        apis, session = _acl_apis([("WRITE", "TRANSACTIONAL_ID", "tx-ok")])
        end = _request(26, 3, {"transactional_id": "tx-ok", "producer_id": 5, "producer_epoch": 0, "committed": True})
        assert _decode_answer(26, 3, await apis.handle(end, session)).error_code.name == "not_coordinator"
    asyncio.run(go())


def test_scram_accepts_the_nonce_older_librdkafka_sends():
    """librdkafka 2.0 (Debian's kcat) puts its own nonce in front of the server-first nonce in
    its final message; Kafka's broker checks only that it ends with it, so does this one."""
    import base64
    import hashlib
    import hmac
    session = SaslSession(_authenticator(), "10.0.0.8")
    assert session.handshake(SCRAM_SHA_256)
    cnonce = "rI=?sV[Zx}|9A/rk"
    server_first = session.step(f"n,,n=alice,r={cnonce}".encode()).decode()
    attrs = dict(kv.split("=", 1) for kv in server_first.split(","))
    salted = hashlib.pbkdf2_hmac("sha256", b"alice-pw", base64.b64decode(attrs["s"]), int(attrs["i"]))
    without_proof = f"c=biws,r={cnonce}{attrs['r']}"
    auth_message = f"n=alice,r={cnonce},{server_first},{without_proof}".encode()
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth_message, hashlib.sha256).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    session.step(f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
    assert session.principal == "User:alice"
    other = SaslSession(_authenticator(), "10.0.0.8")   # a nonce that is not the server's is still refused
    other.handshake(SCRAM_SHA_256)
    server_first = other.step(b"n,,n=alice,r=abc").decode()
    with pytest.raises(SaslFailed, match="nonce"):
        other.step(f"c=biws,r=abcXYZ,p={base64.b64encode(proof).decode()}".encode())


def test_sasl_handshake_v0_then_bare_tokens_over_a_real_socket():
    """Clients without SaslAuthenticate send the token as a bare frame after SaslHandshake v0
    and get a bare answer; then requests are served. A wrong password closes the connection."""
    from http_api.kafka.server import KafkaListener

    async def exchange(password: bytes) -> tuple[bytes | None, bytes | None]:
        apis = KafkaApis(SimpleNamespace(config=BrokerConfig(), rm=None), None, broker_id=1,
                         kafka_address=lambda: "127.0.0.1:1", sasl_authenticator=_authenticator())
        listener = KafkaListener(apis, "127.0.0.1", 0, request_max_bytes=1 << 20)
        await listener.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.bound_port)

            async def answer() -> bytes | None:
                try:
                    size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 10), "big")
                    return await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return None
            frame = _request(17, 0, {"mechanism": "PLAIN"})
            writer.write(len(frame).to_bytes(4, "big") + frame)
            assert _decode_answer(17, 0, len(frame).to_bytes(4, "big") + await answer()).error_code.name == "none"
            token = b"\x00alice\x00" + password
            writer.write(len(token).to_bytes(4, "big") + token)
            bare = await answer()
            versions = _request(18, 0, {})
            writer.write(len(versions).to_bytes(4, "big") + versions)
            after = await answer()
            writer.close()
            return bare, after
        finally:
            await listener.stop()

    bare, after = asyncio.run(exchange(b"alice-pw"))
    assert bare == b"" and after is not None          # authenticated: ApiVersions answered
    bare, after = asyncio.run(exchange(b"wrong"))
    assert bare is None and after is None             # refused: closed without an answer
