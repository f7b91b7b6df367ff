"""Users, bearer tokens and ACLs in the metadata quorum, without sockets: the security
records, SecurityImage replay and batch checks, the controller's decisions, snapshots and
the raft state machine."""
from __future__ import annotations

import copy
import json

import pytest

from metadata_quorum.image import MetadataImage
from metadata_quorum.records import LeaderChangeRecord, record_from_dict, record_to_dict
from metadata_quorum.security import controller as sc
from metadata_quorum.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from metadata_quorum.security.image import SecurityImage
from metadata_quorum.security.records import (
    AccessControlEntryRecord, DelegationTokenRecord, RemoveAccessControlEntryRecord, RemoveDelegationTokenRecord,
    RemoveUserScramCredentialRecord, UserScramCredentialRecord,
)
from metadata_quorum.security.scram import hash_token, make_credential, verify_password
from metadata_quorum.state_machine import MetadataStateMachine
from partitions.errors import ErrorCode, KraftlogError

SALT = b"0123456789abcdef"
READ_ORDERS = AclBinding("User:alice", ResourceType.TOPIC, "orders", PatternType.LITERAL, Operation.READ)
DENY_PAY = AclBinding("User:bob", ResourceType.TOPIC, "pay-", PatternType.PREFIXED, Operation.ALL, Permission.DENY)


def _apply(image: MetadataImage, records: list) -> None:
    assert image.check_batch(records) is None
    for r in records:
        image.replay(r)


def _image_with_alice() -> MetadataImage:
    img = MetadataImage("c1")
    img.replay(LeaderChangeRecord(1, 1))
    _apply(img, sc.create_user(img.security, "alice", make_credential("s3cret", salt=SALT)))
    return img


def test_security_records_round_trip_through_plain_json():
    cred = make_credential("pw", salt=SALT).to_dict()
    samples = [UserScramCredentialRecord("alice", cred), RemoveUserScramCredentialRecord("alice"),
               DelegationTokenRecord("t1", hash_token("tok"), "User:svc", 5, 10), RemoveDelegationTokenRecord("t1"),
               AccessControlEntryRecord(**{k: v for k, v in READ_ORDERS.to_dict().items()}),
               RemoveAccessControlEntryRecord(**{k: v for k, v in DENY_PAY.to_dict().items()})]
    for r in samples:
        assert record_from_dict(json.loads(json.dumps(record_to_dict(r)))) == r


def test_users_replay_into_scram_credentials_and_every_change_moves_the_version():
    img = _image_with_alice()
    sec = img.security
    assert set(sec.scram_credentials) == {"alice"}
    assert verify_password(sec.scram_credentials["alice"], "s3cret")
    assert sec.users_json() == [{"name": "alice", "mechanism": "SCRAM-SHA-256", "iterations": 4096}]
    assert "s3cret" not in json.dumps(img.to_snapshot())
    v1 = sec.version
    _apply(img, sc.alter_user(img.security, "alice", make_credential("new", salt=SALT)))
    assert img.security.version > v1 and verify_password(img.security.scram_credentials["alice"], "new")
    assert sec is not img.security and verify_password(sec.scram_credentials["alice"], "s3cret")  # immutable
    v2 = img.security.version
    _apply(img, sc.delete_user(img.security, "alice"))
    assert img.security.scram_credentials == {} and img.security.version > v2


def test_controller_validates_users():
    img = _image_with_alice()
    cred = make_credential("pw", salt=SALT)
    with pytest.raises(KraftlogError) as e:
        sc.create_user(img.security, "alice", cred)
    assert e.value.code is ErrorCode.DUPLICATE_RESOURCE
    for bad in ("", "a:b", "x" * 250, "sp ace", None, "User*"):
        with pytest.raises(KraftlogError) as e:
            sc.create_user(img.security, bad, cred)
        assert e.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(KraftlogError) as e:
        sc.delete_user(img.security, "nobody")
    assert e.value.code is ErrorCode.RESOURCE_NOT_FOUND and "GET /v1/admin/users" in e.value.message


def test_credentials_from_requests_need_4096_iterations_and_never_echo_the_password():
    c = sc.credential_from_request(password="hunter2", salt=SALT)
    assert c.iterations == 4096 and verify_password(c, "hunter2")
    assert sc.credential_from_request(credential=c.to_dict()) == c
    weak = make_credential("pw", salt=SALT)
    weak_doc = dict(weak.to_dict(), iterations=1000)
    for kwargs in ({"password": "hunter2", "iterations": 4095}, {"credential": weak_doc},
                   {"password": "hunter2", "credential": c.to_dict()}, {}, {"password": ""},
                   {"credential": dict(c.to_dict(), mechanism="SCRAM-SHA-512")},
                   {"credential": {"salt": "!!"}}):
        with pytest.raises(KraftlogError) as e:
            sc.credential_from_request(salt=SALT, **kwargs)
        assert e.value.code is ErrorCode.INVALID_REQUEST
        assert "hunter2" not in e.value.message


def test_batch_check_refuses_weak_credentials_and_missing_removals():
    img = _image_with_alice()
    weak = dict(make_credential("pw", salt=SALT).to_dict(), iterations=1000)
    assert "iterations" in img.check_batch([UserScramCredentialRecord("eve", weak)])
    assert "does not exist" in img.check_batch([RemoveUserScramCredentialRecord("nobody")])
    assert img.check_batch([RemoveUserScramCredentialRecord("alice"), RemoveUserScramCredentialRecord("alice")])
    assert "malformed" in img.check_batch([UserScramCredentialRecord("eve", {"salt": 1})])


def test_tokens_are_stored_by_hash_with_expiry():
    img = _image_with_alice()
    token = "the-token"
    _apply(img, sc.create_token(img.security, "User:svc", "t1", hash_token(token), now_ms=1000, lifetime_ms=500))
    _apply(img, sc.create_token(img.security, "User:ops", "t2", hash_token("other"), now_ms=1000))
    sec = img.security
    assert sec.token_principals == {hash_token(token): "User:svc", hash_token("other"): "User:ops"}
    assert sec.principal_for_token(hash_token(token), now_ms=1499) == "User:svc"
    assert sec.principal_for_token(hash_token(token), now_ms=1500) is None      # expired
    assert sec.principal_for_token(hash_token("other"), now_ms=10**15) == "User:ops"
    assert sec.principal_for_token(hash_token("guess"), now_ms=0) is None
    assert token not in json.dumps(img.to_snapshot())
    with pytest.raises(KraftlogError) as e:
        sc.create_token(sec, "svc", "t3", hash_token("x"), now_ms=0)
    assert e.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(KraftlogError) as e:
        sc.create_token(sec, "User:svc", "t1", hash_token("x"), now_ms=0)
    assert e.value.code is ErrorCode.DUPLICATE_RESOURCE
    assert [r.token_id for r in sc.remove_expired_tokens(img.security, now_ms=1499)] == []
    assert [r.token_id for r in sc.remove_expired_tokens(img.security, now_ms=1500)] == ["t1"]
    _apply(img, sc.delete_token(img.security, "t1"))
    assert img.security.principal_for_token(hash_token(token), now_ms=0) is None
    with pytest.raises(KraftlogError) as e:
        sc.delete_token(img.security, "t1")
    assert e.value.code is ErrorCode.RESOURCE_NOT_FOUND


def test_acls_add_list_remove_and_authorize():
    img = _image_with_alice()
    _apply(img, sc.create_acls(img.security, [READ_ORDERS, DENY_PAY]))
    sec = img.security
    assert sec.acls == (READ_ORDERS, DENY_PAY)
    assert sec.acls_matching(principal="User:alice") == [READ_ORDERS]
    assert sec.acls_matching(resource_type="topic", pattern_type="prefixed") == [DENY_PAY]
    assert sec.acls_matching(resource_name="nope") == []
    auth = sec.authorizer(super_users=["User:admin"])
    assert auth.authorize("User:alice", Operation.READ, ResourceType.TOPIC, "orders")
    assert not auth.authorize("User:alice", Operation.WRITE, ResourceType.TOPIC, "orders")
    assert auth.authorize("User:admin", Operation.WRITE, ResourceType.TOPIC, "pay-x")
    with pytest.raises(KraftlogError) as e:
        sc.create_acls(sec, [READ_ORDERS])
    assert e.value.code is ErrorCode.DUPLICATE_RESOURCE
    with pytest.raises(KraftlogError) as e:
        sc.create_acls(SecurityImage(), [READ_ORDERS, READ_ORDERS])
    assert e.value.code is ErrorCode.DUPLICATE_RESOURCE
    assert "already exists" in img.check_batch(sc.create_acls(SecurityImage(), [READ_ORDERS]))
    _apply(img, sc.delete_acls(img.security, [READ_ORDERS]))
    assert img.security.acls == (DENY_PAY,)
    with pytest.raises(KraftlogError) as e:
        sc.delete_acls(img.security, [READ_ORDERS])
    assert e.value.code is ErrorCode.RESOURCE_NOT_FOUND and "does not exist" in e.value.message


def test_parse_bindings_validates_and_accepts_one_or_many():
    one = READ_ORDERS.to_dict()
    assert sc.parse_bindings(one) == [READ_ORDERS]
    assert sc.parse_bindings({"acls": [one, DENY_PAY.to_dict()]}) == [READ_ORDERS, DENY_PAY]
    cluster = sc.parse_bindings({"principal": "User:ops", "resource_type": "CLUSTER", "operation": "describe"})
    assert cluster[0].resource_name == "kafka-cluster" and cluster[0].operation is Operation.DESCRIBE
    for bad in ({"acls": []}, dict(one, operation="EAT"), dict(one, principal="alice"),
                dict(one, resource_type="TABLE"), dict(one, permission="MAYBE"), {"acls": [1]}):
        with pytest.raises(KraftlogError) as e:
            sc.parse_bindings(bad)
        assert e.value.code is ErrorCode.INVALID_REQUEST


def test_bootstrap_creates_only_missing_users():
    img = _image_with_alice()
    users = {"alice": make_credential("other", salt=SALT), "admin": make_credential("root", salt=SALT)}
    records = sc.bootstrap_users(img.security, users)
    assert [r.name for r in records] == ["admin"]
    _apply(img, records)
    assert verify_password(img.security.scram_credentials["alice"], "s3cret")   # left alone
    assert sc.bootstrap_users(img.security, users) == []


def test_snapshot_round_trip_keeps_users_tokens_acls_and_version():
    img = _image_with_alice()
    _apply(img, sc.create_token(img.security, "User:svc", "t1", hash_token("tok"), now_ms=7, lifetime_ms=3))
    _apply(img, sc.create_acls(img.security, [READ_ORDERS, DENY_PAY]))
    back = MetadataImage.from_snapshot(json.loads(json.dumps(img.to_snapshot())))
    assert back.security.scram_credentials == img.security.scram_credentials
    assert back.security.tokens == img.security.tokens
    assert back.security.token_principals == img.security.token_principals
    assert back.security.acls == img.security.acls
    assert back.security.version == img.security.version > 0
    # a snapshot from before security existed restores an empty SecurityImage
    old = img.to_snapshot()
    del old["security"]
    assert MetadataImage.from_snapshot(old).security == SecurityImage()


def test_metadata_image_copies_share_the_immutable_security_image():
    img = _image_with_alice()
    assert copy.deepcopy(img).security is img.security


def test_state_machine_applies_security_batches_and_rejects_conflicts_on_every_node():
    nodes = [MetadataStateMachine("c1"), MetadataStateMachine("c1")]
    cred = make_credential("pw", salt=SALT).to_dict()
    entries = [
        {"request_id": None, "controller_epoch": 1, "records": [record_to_dict(LeaderChangeRecord(1, 1))]},
        {"request_id": "r1", "controller_epoch": 1, "records": [record_to_dict(UserScramCredentialRecord("u", cred))]},
        {"request_id": "r2", "controller_epoch": 1,
         "records": [record_to_dict(RemoveUserScramCredentialRecord("ghost"))]},
    ]
    results = [sm.apply(entries) for sm in nodes]
    assert results[0] == results[1]
    assert results[0][1]["ok"] and not results[0][2]["ok"] and results[0][2]["conflict"]
    for sm in nodes:
        assert set(sm.image.security.scram_credentials) == {"u"}
    restored = MetadataStateMachine("c1")
    restored.restore(nodes[0].snapshot())
    assert restored.image.security.scram_credentials == nodes[0].image.security.scram_credentials
    # the brokers' feed carries the security records
    feed = nodes[0].records_since(1, 10)
    assert feed[0]["record"]["type"] == "UserScramCredential"
