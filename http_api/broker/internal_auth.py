"""Authentication of the broker-to-broker routes (`/internal/...`).

The nodes of a cluster share one secret (the node config's `password`, which also guards
the controllers' raft port; processes get it as $KRAFTLOG_RAFT_PASSWORD). A broker that
has it refuses `/internal/` requests without the token derived from it, with 401
SASL_AUTHENTICATION_FAILED, and sends the token on its own internal requests (replica
fetches, epoch end offsets, group listings). The token is a SHA-256 of the secret, so the
secret itself (the raft key) never crosses the wire. Plain HTTP: the token keeps out
strangers and misconfigured nodes, not an eavesdropper on the network; keep broker ports on
a private network. No secret configured (tests, a bare `python -m http_api.broker.server`):
no check.

With `[security]` authentication on, brokers are cluster principals instead (`User:broker-<id>`
by certificate or `broker_password_file`, http_api/wire/auth.py) and /internal/ needs
CLUSTER_ACTION (http_api/broker/authorization.py); deploy/ then gives brokers no secret
(the raft password stays with the controllers).
"""
from __future__ import annotations

import hashlib
import hmac

CLUSTER_SECRET_ENV = "KRAFTLOG_RAFT_PASSWORD"
INTERNAL_TOKEN_HEADER = "X-Kraftlog-Internal-Token"
INTERNAL_PATH_PREFIX = "/internal/"


def broker_cluster_secret(security, configured: str | None, environ=None) -> str | None:
    """The cluster secret a broker keeps: `configured`, else $KRAFTLOG_RAFT_PASSWORD; none at
    all once `[security]` authentication is on (brokers are cluster principals then, and the
    raft secret stays with the controllers)."""
    import os
    if security.secured:
        return None
    return configured or (environ if environ is not None else os.environ).get(CLUSTER_SECRET_ENV) or None


def internal_token(secret: str | None) -> str | None:
    if not secret:
        return None
    return hashlib.sha256(b"kraftlog-internal-routes:" + secret.encode()).hexdigest()


def token_ok(expected: str | None, given: str | None) -> bool:
    """True when no token is expected, or `given` is it (constant-time compare)."""
    if expected is None:
        return True
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())
