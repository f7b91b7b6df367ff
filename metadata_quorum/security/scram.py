"""Salted SCRAM-SHA-256 credentials (RFC 5802/7677, Kafka's `UserScramCredentialRecord`).

The metadata quorum stores only (salt, iterations, stored_key, server_key): never the
password. `verify_password` recomputes the client key from a password (HTTP Basic) and
checks H(ClientKey) == StoredKey. A check costs a PBKDF2 of `iterations` rounds (about
0.9 ms at 4096 here): the HTTP edge caches successful checks.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass

MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096
MIN_ITERATIONS = 4096      # Kafka's minimum for SCRAM-SHA-256
SALT_BYTES = 16


@dataclass(frozen=True)
class ScramCredential:
    """What the quorum keeps for a user: enough to verify, not to recover, the password."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def to_dict(self) -> dict:
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        return {"mechanism": MECHANISM, "salt": b64(self.salt), "iterations": self.iterations,
                "stored_key": b64(self.stored_key), "server_key": b64(self.server_key)}

    @classmethod
    def from_dict(cls, d: dict) -> "ScramCredential":
        try:
            return cls(salt=base64.b64decode(d["salt"]), iterations=int(d["iterations"]),
                       stored_key=base64.b64decode(d["stored_key"]), server_key=base64.b64decode(d["server_key"]))
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(f"malformed SCRAM credential ({e}); expected salt, iterations, stored_key, server_key") from None


def _keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    return hashlib.sha256(client_key).digest(), server_key


def make_credential(password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> ScramCredential:
    """A fresh salted credential for `password` (ValueError on an empty password or too few rounds)."""
    if not password:
        raise ValueError("a password must not be empty")
    if iterations < MIN_ITERATIONS:
        raise ValueError(f"iterations must be >= {MIN_ITERATIONS} for {MECHANISM}, got {iterations}")
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    stored_key, server_key = _keys(password, salt, iterations)
    return ScramCredential(salt, iterations, stored_key, server_key)


def verify_password(cred: ScramCredential, password: str) -> bool:
    """True when `password` is the one `cred` was made from (constant-time compare)."""
    stored_key, _ = _keys(password, cred.salt, cred.iterations)
    return hmac.compare_digest(stored_key, cred.stored_key)


def hash_token(token: str) -> str:
    """How a bearer token is stored: its SHA-256, hex (a token is long and random, no salt needed)."""
    return hashlib.sha256(token.encode()).hexdigest()
