"""The active controller's security decisions, as pure functions SecurityImage -> records.

Each raises KraftlogError (Kafka's vocabulary, a message that says what to do) or returns
the records to propose as one atomic batch. No IO, no clock, no randomness: the shell
passes the salt, the token id and hash, and the time in.

Rules: user names are 1-249 characters of [A-Za-z0-9._@+-] (they become `User:NAME`);
a SCRAM credential has >= 4096 and <= 16384 iterations (Kafka's bounds for SCRAM-SHA-256);
creating an existing user, or an ACL that exists, is DUPLICATE_RESOURCE; deleting a missing
user, token or ACL is RESOURCE_NOT_FOUND; a token's principal looks like `User:NAME`.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Optional

from metadata_quorum.security.acl import AclBinding, parse_principal
from metadata_quorum.security.image import SecurityImage, acl_record
from metadata_quorum.security.records import (
    DelegationTokenRecord,
    RemoveDelegationTokenRecord,
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
)
from metadata_quorum.security.scram import MECHANISM, MIN_ITERATIONS, ScramCredential, make_credential
from partitions.errors import ErrorCode, KraftlogError

USER_NAME_RE = re.compile(r"^[A-Za-z0-9._@+-]+$")
USER_NAME_LENGTH_MAX = 249
MAX_ITERATIONS = 16384          # Kafka's upper bound for SCRAM-SHA-256
PASSWORD_LENGTH_MAX = 1024
ACLS_PER_REQUEST_MAX = 1000


def validate_user_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, "name: a user name must be a non-empty string")
    if len(name) > USER_NAME_LENGTH_MAX or not USER_NAME_RE.match(name):
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            f"user name {name!r} is invalid: use 1-{USER_NAME_LENGTH_MAX} characters from "
                            "[A-Za-z0-9._@+-]")
    return name


def validate_principal(principal: Any) -> str:
    try:
        kind, name = parse_principal(principal) if isinstance(principal, str) else parse_principal("")
    except ValueError:
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            f"principal {principal!r} must look like User:NAME") from None
    if kind != "User":
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"principal {principal!r}: only User:NAME principals exist")
    validate_user_name(name)
    return principal


def credential_from_request(password: Any = None, credential: Any = None, iterations: Any = None,
                            salt: bytes = b"") -> ScramCredential:
    """The SCRAM credential a request asks for: derived from `password` (with `salt` and
    `iterations`, default 4096) or given precomputed (`ScramCredential.to_dict()` form)."""
    if (password is None) == (credential is None):
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            'give exactly one of "password" and "credential" (a precomputed SCRAM-SHA-256 '
                            'credential {"salt", "iterations", "stored_key", "server_key"}, base64)')
    if password is not None:
        if not isinstance(password, str) or not password or len(password) > PASSWORD_LENGTH_MAX:
            raise KraftlogError(ErrorCode.INVALID_REQUEST,
                                f"password must be a non-empty string of at most {PASSWORD_LENGTH_MAX} characters")
        n = MIN_ITERATIONS if iterations is None else iterations
        _check_iterations(n)
        return make_credential(password, n, salt)
    if not isinstance(credential, dict):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, "credential must be an object {salt, iterations, stored_key, server_key}")
    mech = credential.get("mechanism", MECHANISM)
    if mech != MECHANISM:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"mechanism {mech!r} is not supported; use {MECHANISM}")
    try:
        cred = ScramCredential.from_dict(credential)
    except ValueError as e:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, str(e)) from None
    _check_iterations(cred.iterations)
    if not cred.salt or len(cred.stored_key) != 32 or len(cred.server_key) != 32:
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            "credential: salt must be non-empty, stored_key and server_key 32 bytes (SHA-256), base64")
    return cred


def _check_iterations(n: Any) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not MIN_ITERATIONS <= n <= MAX_ITERATIONS:
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            f"iterations must be an integer from {MIN_ITERATIONS} to {MAX_ITERATIONS} for "
                            f"{MECHANISM}, got {n!r}")


# ---------------------------------------------------------------------- users
def create_user(sec: SecurityImage, name: Any, credential: ScramCredential) -> list:
    validate_user_name(name)
    if name in sec.scram_credentials:
        raise KraftlogError(ErrorCode.DUPLICATE_RESOURCE,
                            f"user {name} already exists; change its password with PUT /v1/admin/users/{name} "
                            "(kraftlog user alter)")
    return [UserScramCredentialRecord(name, credential.to_dict())]


def alter_user(sec: SecurityImage, name: Any, credential: ScramCredential) -> list:
    """Replaces the credential of `name` (creates the user when missing, as Kafka's
    AlterUserScramCredentials upserts)."""
    validate_user_name(name)
    return [UserScramCredentialRecord(name, credential.to_dict())]


def delete_user(sec: SecurityImage, name: Any) -> list:
    validate_user_name(name)
    if name not in sec.scram_credentials:
        raise KraftlogError(ErrorCode.RESOURCE_NOT_FOUND,
                            f"user {name} does not exist; list users with GET /v1/admin/users")
    return [RemoveUserScramCredentialRecord(name)]


def bootstrap_users(sec: SecurityImage, users: dict) -> list:
    """A credential record for every user of `users` (name -> ScramCredential) not yet in
    the image; existing users are left alone (their password may have changed since)."""
    return [UserScramCredentialRecord(validate_user_name(n), c.to_dict())
            for n, c in sorted(users.items()) if n not in sec.scram_credentials]


# ---------------------------------------------------------------------- tokens
def create_token(sec: SecurityImage, principal: Any, token_id: str, token_hash: str, now_ms: int,
                 lifetime_ms: Any = None) -> list:
    """A bearer token for `principal`, valid for `lifetime_ms` (None: until deleted)."""
    validate_principal(principal)
    if lifetime_ms is not None and (isinstance(lifetime_ms, bool) or not isinstance(lifetime_ms, int)
                                    or lifetime_ms <= 0):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"lifetime_ms must be an integer > 0 or null, got {lifetime_ms!r}")
    if token_id in sec.tokens or token_hash in sec.token_principals:
        raise KraftlogError(ErrorCode.DUPLICATE_RESOURCE, "token id or token already exists; retry")
    expiry = None if lifetime_ms is None else now_ms + lifetime_ms
    return [DelegationTokenRecord(token_id, token_hash, principal, now_ms, expiry)]


def remove_expired_tokens(sec: SecurityImage, now_ms: int) -> list:
    """Removal records of the tokens expired at `now_ms` (Kafka's expired token remover);
    brokers already refuse them, this keeps the image from growing."""
    return [RemoveDelegationTokenRecord(t.token_id) for t in sorted(sec.tokens.values(), key=lambda t: t.token_id)
            if t.expired(now_ms)]


def delete_token(sec: SecurityImage, token_id: Any) -> list:
    if not isinstance(token_id, str) or token_id not in sec.tokens:
        raise KraftlogError(ErrorCode.RESOURCE_NOT_FOUND,
                            f"token {token_id!r} does not exist; list tokens with GET /v1/admin/tokens")
    return [RemoveDelegationTokenRecord(token_id)]


# ---------------------------------------------------------------------- ACLs
def parse_bindings(doc: Any) -> list:
    """A body's ACL bindings: one binding object, or {"acls": [binding, ...]}."""
    items = doc.get("acls") if isinstance(doc, dict) and "acls" in doc else [doc]
    if not isinstance(items, list) or not items:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, 'give one ACL binding or {"acls": [binding, ...]}')
    if len(items) > ACLS_PER_REQUEST_MAX:
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"at most {ACLS_PER_REQUEST_MAX} ACLs per request")
    out = []
    for item in items:
        if not isinstance(item, dict):
            raise KraftlogError(ErrorCode.INVALID_REQUEST, "an ACL binding is an object {principal, resource_type, "
                                "resource_name, pattern_type, operation, permission}")
        try:
            b = AclBinding.from_dict(item)
        except ValueError as e:
            raise KraftlogError(ErrorCode.INVALID_REQUEST, str(e)) from None
        if b.principal != "User:*":
            validate_principal(b.principal)
        out.append(b)
    return out


def create_acls(sec: SecurityImage, bindings: Iterable[AclBinding]) -> list:
    seen: set = set()
    out = []
    for b in bindings:
        if b in sec.acls or b in seen:
            raise KraftlogError(ErrorCode.DUPLICATE_RESOURCE,
                                f"ACL {_describe(b)} already exists; list ACLs with GET /v1/admin/acls")
        seen.add(b)
        out.append(acl_record(b))
    return out


def delete_acls(sec: SecurityImage, bindings: Iterable[AclBinding]) -> list:
    seen: set = set()
    out = []
    for b in bindings:
        if b not in sec.acls or b in seen:
            raise KraftlogError(ErrorCode.RESOURCE_NOT_FOUND,
                                f"ACL {_describe(b)} does not exist; list ACLs with GET /v1/admin/acls "
                                "and give the same principal, resource, pattern type, operation and permission")
        seen.add(b)
        out.append(acl_record(b, remove=True))
    return out


def _describe(b: AclBinding) -> str:
    return (f"({b.principal} {b.permission.name} {b.operation.name} on {b.resource_type.name} "
            f"{b.pattern_type.name} {b.resource_name!r})")


def acl_filter(query: dict) -> dict:
    """Validated filter arguments for SecurityImage.acls_matching from query parameters."""
    out: dict[str, Optional[str]] = {}
    for key in ("principal", "resource_type", "resource_name", "pattern_type"):
        v = query.get(key)
        out[key] = v if v else None
    if out["resource_type"] is not None and out["resource_type"].upper() not in ("TOPIC", "GROUP", "CLUSTER",
                                                                                  "TRANSACTIONAL_ID"):
        raise KraftlogError(ErrorCode.INVALID_REQUEST,
                            f"resource_type {out['resource_type']!r}: use TOPIC, GROUP, CLUSTER or TRANSACTIONAL_ID")
    if out["pattern_type"] is not None and out["pattern_type"].upper() not in ("LITERAL", "PREFIXED"):
        raise KraftlogError(ErrorCode.INVALID_REQUEST, f"pattern_type {out['pattern_type']!r}: use LITERAL or PREFIXED")
    return out
