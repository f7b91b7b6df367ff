"""SASL on the Kafka listener (KIP-43 SaslHandshake v1 + KIP-152 SaslAuthenticate): PLAIN and
SCRAM-SHA-256 (RFC 5802/7677) against the cluster's SCRAM credentials, the same users and
passwords as HTTP Basic (`http_api.wire.auth.Authenticator`: the metadata quorum's
`SecurityImage.scram_credentials` and the brokers' verifiers).

`SaslSession` is one connection's exchange; it does no IO. A connection must finish it
before any request other than ApiVersions, SaslHandshake and SaslAuthenticate. A failed
exchange counts against the client address exactly like a failed HTTP Basic check
(`authentication_failures_max_per_second`): beyond the limit the check is refused unmade.
An unknown user gets a SCRAM challenge made from a fake credential and fails at the proof,
so the exchange does not reveal which users exist.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os

from http_api.wire.auth import Authenticator, Throttled
from metadata_quorum.security.scram import DEFAULT_ITERATIONS, MECHANISM as SCRAM_SHA_256, ScramCredential

PLAIN = "PLAIN"
MECHANISMS = (SCRAM_SHA_256, PLAIN)
NONCE_BYTES = 24


class SaslFailed(Exception):
    """The exchange failed: answered with SASL_AUTHENTICATION_FAILED, then the connection closes."""


def _unescape_saslname(name: str) -> str:
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise SaslFailed("malformed SCRAM user name (a '=' must be escaped as =3D)")
    return name.replace("=2C", ",").replace("=3D", "=")


def _attrs(message: str) -> dict[str, str]:
    out = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise SaslFailed(f"malformed SCRAM message attribute {part!r}")
        out[key] = value
    return out


class SaslSession:
    """One Kafka connection's authentication state: `principal` once authenticated."""

    def __init__(self, authenticator: Authenticator, address: str) -> None:
        self.authenticator = authenticator
        self.address = address
        self.mechanism: str | None = None
        self.principal: str | None = None
        self.close = False                 # the exchange failed: close the connection after the answer
        self.unframed = False              # SaslHandshake v0: tokens come as bare size-prefixed frames
        # SCRAM between its two rounds: (user, credential or None, client-first-bare,
        # server-first, nonce, gs2 header)
        self._scram: tuple | None = None

    @property
    def authenticated(self) -> bool:
        return self.principal is not None

    def handshake(self, mechanism: str) -> bool:
        """SaslHandshake: True when `mechanism` is served (the exchange may start)."""
        if mechanism not in MECHANISMS or self.mechanism is not None:
            return False
        self.mechanism = mechanism
        return True

    def step(self, token: bytes) -> bytes:
        """One SaslAuthenticate round: the server's answer token; SaslFailed when refused."""
        if self.mechanism is None or self.authenticated:
            raise SaslFailed("SaslAuthenticate out of order: send SaslHandshake first, once per connection")
        try:
            if self.mechanism == PLAIN:
                return self._plain(token)
            return self._scram_step(token)
        except SaslFailed:
            self._failed()
            raise
        except Throttled as e:
            raise SaslFailed(str(e)) from None

    def _failed(self) -> None:
        a = self.authenticator
        a.failures += 1
        a.limiter.failed(self.address)

    def _plain(self, token: bytes) -> bytes:
        try:
            authzid, user, password = token.decode("utf-8").split("\x00")
        except ValueError:
            raise SaslFailed("malformed PLAIN token: expected authzid NUL user NUL password") from None
        if not user or (authzid and authzid != user):
            raise SaslFailed("PLAIN: a user name is required (an authorization id, if any, must equal it)")
        if not self.authenticator.check_password(user, password, self.address):
            raise SaslFailed(f"wrong user name or password for {user!r}")
        self.principal = f"User:{user}"
        return b""

    def _scram_step(self, token: bytes) -> bytes:
        try:
            message = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailed("SCRAM messages are UTF-8") from None
        if self._scram is None:
            return self._client_first(message)
        return self._client_final(message)

    def _client_first(self, message: str) -> bytes:
        gs2, sep, bare = message.partition(",")
        authz, sep2, bare = bare.partition(",")
        if not sep or not sep2 or gs2 not in ("n", "y") or (authz and not authz.startswith("a=")):
            raise SaslFailed("malformed SCRAM client-first message (channel binding is not supported)")
        attrs = _attrs(bare)
        user = _unescape_saslname(attrs.get("n", ""))
        client_nonce = attrs.get("r", "")
        if not user or not client_nonce:
            raise SaslFailed("SCRAM client-first message needs n=user and r=nonce")
        if authz and _unescape_saslname(authz[2:]) != user:
            raise SaslFailed("SCRAM: an authorization id must equal the user name")
        self.authenticator._throttle(self.address)   # refused unmade while this address is over its limit
        cred = self.authenticator.credential(user)
        salt, iterations = (cred.salt, cred.iterations) if cred is not None else (
            hashlib.sha256(b"kraftlog-unknown-user:" + user.encode()).digest()[:16], DEFAULT_ITERATIONS)
        nonce = client_nonce + base64.b64encode(os.urandom(NONCE_BYTES)).decode()
        server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        self._scram = (user, cred, bare, server_first, nonce, message[:len(message) - len(bare)])
        return server_first.encode()

    def _client_final(self, message: str) -> bytes:
        user, cred, client_first_bare, server_first, nonce, gs2_header = self._scram
        without_proof, sep, proof_b64 = message.rpartition(",p=")
        if not sep:
            raise SaslFailed("SCRAM client-final message has no proof")
        attrs = _attrs(without_proof)
        # ends with the server-first nonce, as Kafka's ScramSaslServer checks (librdkafka before
        # 2.x's fix sends its own nonce in front of it)
        if not attrs.get("r", "").endswith(nonce):
            raise SaslFailed("SCRAM nonce mismatch")
        try:
            if base64.b64decode(attrs.get("c", ""), validate=True).decode() != gs2_header:
                raise SaslFailed("SCRAM channel binding does not match the client-first message")
            proof = base64.b64decode(proof_b64, validate=True)
        except (ValueError, UnicodeDecodeError):
            raise SaslFailed("SCRAM client-final message is not base64 where it must be") from None
        auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
        if cred is None or not self._proof_ok(cred, proof, auth_message):
            raise SaslFailed(f"wrong user name or password for {user!r}")
        self.principal = f"User:{user}"
        signature = hmac.new(cred.server_key, auth_message, hashlib.sha256).digest()
        return f"v={base64.b64encode(signature).decode()}".encode()

    @staticmethod
    def _proof_ok(cred: ScramCredential, proof: bytes, auth_message: bytes) -> bool:
        client_signature = hmac.new(cred.stored_key, auth_message, hashlib.sha256).digest()
        if len(proof) != len(client_signature):
            return False
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature))
        return hmac.compare_digest(hashlib.sha256(client_key).digest(), cred.stored_key)


__all__ = ["SaslSession", "SaslFailed", "MECHANISMS", "PLAIN", "SCRAM_SHA_256"]
