"""The pure security core: Kafka's ACL decision rules, SCRAM-SHA-256 credentials, [security] settings."""
from __future__ import annotations

import pytest

from metadata_quorum.security.acl import (AclBinding, Authorizer, Operation, PatternType, Permission,
                                          ResourceType)
from metadata_quorum.security.config import SecurityConfig
from metadata_quorum.security.scram import ScramCredential, hash_token, make_credential, verify_password

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER


def acl(principal, rtype, name, op, *, prefixed=False, deny=False):
    return AclBinding(principal, rtype, name, PatternType.PREFIXED if prefixed else PatternType.LITERAL,
                      op, Permission.DENY if deny else Permission.ALLOW)


def test_default_deny_and_literal_allow():
    a = Authorizer([acl("User:alice", T, "orders", Operation.READ)])
    assert a.authorize("User:alice", Operation.READ, T, "orders")
    assert not a.authorize("User:alice", Operation.WRITE, T, "orders")
    assert not a.authorize("User:alice", Operation.READ, T, "orders2")
    assert not a.authorize("User:bob", Operation.READ, T, "orders")
    assert not a.authorize("User:alice", Operation.READ, G, "orders")
    assert not Authorizer().authorize("User:alice", Operation.DESCRIBE, C)


def test_prefixed_wildcard_and_any_principal():
    a = Authorizer([acl("User:alice", T, "pay.", Operation.WRITE, prefixed=True),
                    acl("User:*", G, "*", Operation.READ)])
    assert a.authorize("User:alice", Operation.WRITE, T, "pay.eu")
    assert not a.authorize("User:alice", Operation.WRITE, T, "payroll")
    assert a.authorize("User:bob", Operation.READ, G, "any-group")


def test_deny_wins_and_implications():
    a = Authorizer([acl("User:alice", T, "*", Operation.ALL),
                    acl("User:alice", T, "secret", Operation.READ, deny=True),
                    acl("User:bob", T, "t", Operation.WRITE),
                    acl("User:bob", T, "t", Operation.ALTER_CONFIGS)])
    assert a.authorize("User:alice", Operation.DELETE, T, "x")
    assert not a.authorize("User:alice", Operation.READ, T, "secret")
    assert a.authorize("User:alice", Operation.WRITE, T, "secret")
    assert a.authorize("User:bob", Operation.DESCRIBE, T, "t")            # implied by WRITE
    assert a.authorize("User:bob", Operation.DESCRIBE_CONFIGS, T, "t")    # implied by ALTER_CONFIGS
    assert not a.authorize("User:bob", Operation.READ, T, "t")
    assert a.describable("User:bob", T, ["t", "u"]) == ["t"]


def test_super_users_may_do_everything():
    a = Authorizer([acl("User:admin", T, "*", Operation.ALL, deny=True)], super_users=["User:admin"])
    assert a.authorize("User:admin", Operation.ALTER, C)


def test_binding_round_trip_and_errors():
    b = acl("User:alice", T, "pay.", Operation.WRITE, prefixed=True, deny=True)
    assert AclBinding.from_dict(b.to_dict()) == b
    with pytest.raises(ValueError, match="operation"):
        AclBinding.from_dict({**b.to_dict(), "operation": "FLY"})
    with pytest.raises(ValueError, match="User:NAME"):
        acl("alice", T, "t", Operation.READ)


def test_scram_credentials():
    c = make_credential("s3cret")
    assert verify_password(c, "s3cret")
    assert not verify_password(c, "s3cret ")
    assert ScramCredential.from_dict(c.to_dict()) == c
    assert make_credential("s3cret").salt != c.salt          # salted
    with pytest.raises(ValueError):
        make_credential("")
    with pytest.raises(ValueError):
        make_credential("x", iterations=10)
    assert hash_token("abc") != "abc" and len(hash_token("abc")) == 64


def test_security_config_validation():
    assert not SecurityConfig().secured and SecurityConfig().scheme == "http"
    s = SecurityConfig(tls_cert_file="c", tls_key_file="k", tls_ca_file="ca", tls_client_auth="required",
                       authentication=("basic", "mtls"), authorizer="acl", super_users=("User:admin",))
    assert s.secured and s.scheme == "https"
    for bad in (dict(tls_cert_file="c"), dict(tls_client_auth="always"), dict(tls_client_auth="required"),
                dict(authentication=("kerberos",)), dict(authorizer="acl"), dict(authentication=("mtls",)),
                dict(authentication=("basic",), super_users=("admin",))):
        with pytest.raises(ValueError):
            SecurityConfig(**bad)
