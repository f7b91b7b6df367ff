"""SecurityImage: users (SCRAM credentials), bearer tokens and ACLs as a pure replay of the
security records (metadata_quorum/security/records.py).

Immutable: `replay` returns a new image, so a reader holding one (a broker's request
handler, an Authorizer built from it) never sees it change, and copying the metadata image
shares it (`__deepcopy__` returns self). Never mutate its dicts. `version` is 1 + the
metadata offset of the last security record applied (0: none yet): it changes on every
change and is the same on every node, snapshots included.

On a broker: `MetadataView.security` (http_api/broker/metadata_view.py) is the current one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterable, Optional

from metadata_quorum.security.acl import AclBinding, Authorizer
from metadata_quorum.security.records import (
    AccessControlEntryRecord,
    DelegationTokenRecord,
    RemoveAccessControlEntryRecord,
    RemoveDelegationTokenRecord,
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
)
from metadata_quorum.security.scram import MECHANISM, MIN_ITERATIONS, ScramCredential

ACL_RECORD_FIELDS = ("principal", "resource_type", "resource_name", "pattern_type", "operation", "permission", "host")


@dataclass(frozen=True)
class DelegationToken:
    """A bearer token as the quorum knows it (its hash, never the token)."""

    token_id: str
    token_hash: str
    principal: str
    issue_timestamp_ms: int = 0
    expiry_timestamp_ms: Optional[int] = None

    def expired(self, now_ms: int) -> bool:
        return self.expiry_timestamp_ms is not None and now_ms >= self.expiry_timestamp_ms

    def to_json(self) -> dict:
        """What listings show: no hash."""
        return {"token_id": self.token_id, "principal": self.principal,
                "issue_timestamp_ms": self.issue_timestamp_ms, "expiry_timestamp_ms": self.expiry_timestamp_ms}


def acl_from_record(r) -> AclBinding:
    """The AclBinding of an (Remove)AccessControlEntryRecord; ValueError when malformed."""
    return AclBinding.from_dict({f: getattr(r, f) for f in ACL_RECORD_FIELDS})


def acl_record(binding: AclBinding, remove: bool = False):
    d = binding.to_dict()
    cls = RemoveAccessControlEntryRecord if remove else AccessControlEntryRecord
    return cls(**{f: d[f] for f in ACL_RECORD_FIELDS})


@dataclass(frozen=True)
class SecurityImage:
    """Users, tokens and ACLs at one metadata offset. See the module docstring."""

    scram_credentials: dict = field(default_factory=dict)   # user name -> ScramCredential
    tokens: dict = field(default_factory=dict)              # token id -> DelegationToken
    token_principals: dict = field(default_factory=dict)    # token hash (sha256 hex) -> principal
    acls: tuple = ()                                         # AclBinding, in creation order
    version: int = 0

    def __deepcopy__(self, memo) -> "SecurityImage":
        return self   # immutable: shared by every copy of the metadata image

    # ------------------------------------------------------------------ queries
    def token_for_hash(self, token_hash: str) -> Optional[DelegationToken]:
        tid = self._token_ids_by_hash().get(token_hash)
        return None if tid is None else self.tokens.get(tid)

    def principal_for_token(self, token_hash: str, now_ms: int) -> Optional[str]:
        """The principal of a bearer token (by its sha256 hex), None if unknown or expired."""
        t = self.token_for_hash(token_hash)
        if t is None or t.expired(now_ms):
            return None
        return t.principal

    def authorizer(self, super_users: Iterable[str] = ()) -> Authorizer:
        """Kafka's decision over these ACLs (build once per `version`, it is immutable)."""
        return Authorizer(self.acls, super_users)

    def users_json(self) -> list:
        """[{name, mechanism, iterations}] sorted by name: never a key or salt."""
        return [{"name": n, "mechanism": MECHANISM, "iterations": c.iterations}
                for n, c in sorted(self.scram_credentials.items())]

    def acls_matching(self, principal: Optional[str] = None, resource_type: Optional[str] = None,
                      resource_name: Optional[str] = None, pattern_type: Optional[str] = None) -> list:
        """Bindings whose fields equal every given filter (None = any), in creation order."""
        out = []
        for b in self.acls:
            if principal is not None and b.principal != principal:
                continue
            if resource_type is not None and b.resource_type.name != resource_type.upper():
                continue
            if resource_name is not None and b.resource_name != resource_name:
                continue
            if pattern_type is not None and b.pattern_type.name != pattern_type.upper():
                continue
            out.append(b)
        return out

    def _token_ids_by_hash(self) -> dict:
        return {t.token_hash: t.token_id for t in self.tokens.values()}

    # ------------------------------------------------------------------ replay
    def replay(self, r, offset: int) -> "SecurityImage":
        """The image after record `r` at metadata offset `offset` (records passed `check_batch`)."""
        creds, tokens, acls = self.scram_credentials, self.tokens, self.acls
        if isinstance(r, UserScramCredentialRecord):
            creds = {**creds, r.name: ScramCredential.from_dict(r.credential)}
        elif isinstance(r, RemoveUserScramCredentialRecord):
            creds = {k: v for k, v in creds.items() if k != r.name}
        elif isinstance(r, DelegationTokenRecord):
            tokens = {**tokens, r.token_id: DelegationToken(r.token_id, r.token_hash, r.principal,
                                                            r.issue_timestamp_ms, r.expiry_timestamp_ms)}
        elif isinstance(r, RemoveDelegationTokenRecord):
            tokens = {k: v for k, v in tokens.items() if k != r.token_id}
        elif isinstance(r, AccessControlEntryRecord):
            b = acl_from_record(r)
            if b not in acls:
                acls = acls + (b,)
        elif isinstance(r, RemoveAccessControlEntryRecord):
            b = acl_from_record(r)
            acls = tuple(a for a in acls if a != b)
        else:
            return self
        return SecurityImage(creds, tokens, {t.token_hash: t.principal for t in tokens.values()}, acls, offset + 1)

    def check_batch(self, records: list) -> Optional[str]:
        """Preconditions of the security records of a batch, in order (None = applicable).
        Deterministic and never raises: it runs in the raft apply path on every node."""
        users = set(self.scram_credentials)
        token_ids = set(self.tokens)
        hashes = set(self.token_principals)
        acls = set(self.acls)
        try:
            for r in records:
                if isinstance(r, UserScramCredentialRecord):
                    cred = ScramCredential.from_dict(r.credential)
                    if cred.iterations < MIN_ITERATIONS:
                        return f"user {r.name}: iterations {cred.iterations} < {MIN_ITERATIONS}"
                    if not r.name or r.mechanism != MECHANISM:
                        return f"user {r.name!r}: bad name or mechanism {r.mechanism!r}"
                    users.add(r.name)
                elif isinstance(r, RemoveUserScramCredentialRecord):
                    if r.name not in users:
                        return f"user {r.name} does not exist"
                    users.discard(r.name)
                elif isinstance(r, DelegationTokenRecord):
                    if r.token_id in token_ids or r.token_hash in hashes:
                        return f"token {r.token_id} already exists"
                    token_ids.add(r.token_id)
                    hashes.add(r.token_hash)
                elif isinstance(r, RemoveDelegationTokenRecord):
                    t = self.tokens.get(r.token_id)
                    if r.token_id not in token_ids:
                        return f"token {r.token_id} does not exist"
                    token_ids.discard(r.token_id)
                    if t is not None:
                        hashes.discard(t.token_hash)
                elif isinstance(r, AccessControlEntryRecord):
                    b = acl_from_record(r)
                    if b in acls:
                        return f"ACL {b.to_dict()} already exists"
                    acls.add(b)
                elif isinstance(r, RemoveAccessControlEntryRecord):
                    b = acl_from_record(r)
                    if b not in acls:
                        return f"ACL {b.to_dict()} does not exist"
                    acls.discard(b)
        except Exception as exc:  # never raise into the raft apply path
            return f"malformed security record: {exc!r}"
        return None

    # ------------------------------------------------------------------ snapshots
    def to_snapshot(self) -> dict:
        return {
            "version": self.version,
            "users": {n: c.to_dict() for n, c in self.scram_credentials.items()},
            "tokens": [dataclasses.astuple(t) for t in self.tokens.values()],
            "acls": [b.to_dict() for b in self.acls],
        }

    @classmethod
    def from_snapshot(cls, data: Optional[dict]) -> "SecurityImage":
        if not data:
            return cls()
        tokens = {t[0]: DelegationToken(*t) for t in data.get("tokens", [])}
        return cls(scram_credentials={n: ScramCredential.from_dict(c) for n, c in data.get("users", {}).items()},
                   tokens=tokens, token_principals={t.token_hash: t.principal for t in tokens.values()},
                   acls=tuple(AclBinding.from_dict(b) for b in data.get("acls", [])),
                   version=data.get("version", 0))
