"""Security metadata records (Kafka's names): SCRAM users, delegation (bearer) tokens, ACLs.

Plain frozen dataclasses with a stable `TYPE`, registered in `metadata_quorum.records.RECORD_TYPES`
so they travel like every other record (raft entries, the brokers' metadata feed, JSON).
They hold no secret that can be replayed: a user's SCRAM credential (salt, iterations,
stored key, server key; never the password) and a token's SHA-256 (never the token).
The active controller stamps ids and timestamps in before proposing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from metadata_quorum.security.scram import MECHANISM


@dataclass(frozen=True)
class UserScramCredentialRecord:
    """User `name` authenticates with this SCRAM credential (`ScramCredential.to_dict()`);
    creates the user or replaces its credential."""

    TYPE: ClassVar[str] = "UserScramCredential"
    name: str
    credential: dict
    mechanism: str = MECHANISM


@dataclass(frozen=True)
class RemoveUserScramCredentialRecord:
    TYPE: ClassVar[str] = "RemoveUserScramCredential"
    name: str
    mechanism: str = MECHANISM


@dataclass(frozen=True)
class DelegationTokenRecord:
    """A bearer token for `principal`: stored as `token_hash` (sha256 hex of the token),
    listed and deleted by `token_id`; `expiry_timestamp_ms` None = never expires."""

    TYPE: ClassVar[str] = "DelegationToken"
    token_id: str
    token_hash: str
    principal: str
    issue_timestamp_ms: int = 0
    expiry_timestamp_ms: Optional[int] = None


@dataclass(frozen=True)
class RemoveDelegationTokenRecord:
    TYPE: ClassVar[str] = "RemoveDelegationToken"
    token_id: str


@dataclass(frozen=True)
class AccessControlEntryRecord:
    """One ACL binding (`AclBinding.to_dict()` fields, enums by name)."""

    TYPE: ClassVar[str] = "AccessControlEntry"
    principal: str
    resource_type: str
    resource_name: str
    pattern_type: str
    operation: str
    permission: str = "ALLOW"
    host: str = "*"


@dataclass(frozen=True)
class RemoveAccessControlEntryRecord:
    """Removes the binding with exactly these fields."""

    TYPE: ClassVar[str] = "RemoveAccessControlEntry"
    principal: str
    resource_type: str
    resource_name: str
    pattern_type: str
    operation: str
    permission: str = "ALLOW"
    host: str = "*"


SECURITY_RECORDS: tuple = (
    UserScramCredentialRecord,
    RemoveUserScramCredentialRecord,
    DelegationTokenRecord,
    RemoveDelegationTokenRecord,
    AccessControlEntryRecord,
    RemoveAccessControlEntryRecord,
)
