"""Authentication at the HTTP edge, shared by the broker and the controller servers.

Job: turn a request into a principal (`User:NAME`) or refuse it, before any handler runs.
- `Authorization: Basic base64(user:password)` ("basic"): checked against the user's salted
  SCRAM-SHA-256 credential (the metadata quorum's `SecurityImage.scram_credentials`, or the
  broker verifiers of `broker_credentials_file`). A check costs a PBKDF2 (~0.9 ms), so a
  successful one is cached, keyed by (user, sha256(password), the credential): a changed or
  deleted credential no longer matches its entries and drops them.
- `Authorization: Bearer TOKEN` ("bearer"): the principal of the unexpired delegation token
  whose sha256 is sha256(TOKEN) in `SecurityImage.tokens` (indexed by hash once per image;
  tokens are long and random: no cache of checks needed).
- a TLS client certificate ("mtls"): `User:<CN>`.
- No authentication configured: every request is `User:ANONYMOUS` (the node says so on start).

No or bad credentials: 401 SASL_AUTHENTICATION_FAILED with `WWW-Authenticate` naming the
enabled schemes. Failed attempts are rate limited per client address
(`authentication_failures_max_per_second`, a token bucket one second deep): beyond it a
request from that address that would need a password or token check gets 429
THROTTLING_QUOTA_EXCEEDED without the check (cached Basic and certificates still pass), so
guessing costs the node little CPU. `/healthz` stays open.

Cluster principals: `User:broker-<id>` is reserved for broker `id` (its password verifier
ships in `broker_credentials_file`, or its certificate has CN broker-<id>); a broker may
forward a client's request on the client's behalf (`X-Kraftlog-Principal`), which is
honoured only when the sender authenticated as a broker. `forwarding_headers()` gives the
header for the request being served (a context variable set here).
"""
from __future__ import annotations

import base64
import binascii
import contextvars
import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Mapping, Optional, Protocol

from aiohttp import web

from http_api.wire.codecs import JSON, error_body
from http_api.wire.errors import http_status
from metadata_quorum.security.config import SecurityConfig
from metadata_quorum.security.scram import ScramCredential, hash_token, verify_password
from partitions.errors import ErrorCode, KraftlogError

log = logging.getLogger("kraftlog.auth")

ANONYMOUS = "User:ANONYMOUS"
REALM = "kraftlog"
PRINCIPAL_HEADER = "X-Kraftlog-Principal"       # a broker forwarding a client's request names the client
OPEN_PATHS = frozenset({"/healthz", "/controller/v1/healthz"})
BROKER_PRINCIPAL_RE = re.compile(r"^User:broker-(\d+)$")
CACHE_USERS_MAX = 10_000          # users with cached successful checks
CACHE_PASSWORDS_PER_USER_MAX = 4  # distinct passwords remembered per user and credential
FAILURE_ADDRESSES_MAX = 10_000    # client addresses tracked by the failure limiter

PRINCIPAL_KEY: web.RequestKey = web.RequestKey("principal", str)
_current_principal: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("kraftlog_principal", default=None)


class SecurityImageLike(Protocol):
    """What authentication and authorization read from the metadata quorum's SecurityImage."""

    scram_credentials: Mapping[str, ScramCredential]   # user name (no `User:`) -> credential
    tokens: Mapping[str, Any]                          # token id -> DelegationToken (token_hash, principal, expired())
    acls: tuple                                        # AclBinding, ...
    version: int


def broker_id_of(principal: Optional[str]) -> Optional[int]:
    """The broker id of a broker principal (`User:broker-3` -> 3), else None."""
    m = BROKER_PRINCIPAL_RE.match(principal or "")
    return int(m.group(1)) if m else None


def broker_principal(broker_id: int) -> str:
    return f"User:broker-{broker_id}"


def basic_header(user: str, password: str) -> str:
    """The `Authorization` value of HTTP Basic for (user, password)."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def client_headers(user: Optional[str] = None, password: Optional[str] = None,
                   token: Optional[str] = None) -> dict[str, str]:
    """Request headers carrying a client's credentials (a token wins over a password)."""
    if token:
        return {"Authorization": f"Bearer {token}"}
    if user and password is not None:
        return {"Authorization": basic_header(user, password)}
    return {}


USER_ENV, PASSWORD_ENV, TOKEN_ENV = "KRAFTLOG_USER", "KRAFTLOG_PASSWORD", "KRAFTLOG_TOKEN"


def client_headers_from_env(user: Optional[str] = None, password: Optional[str] = None,
                            token: Optional[str] = None) -> dict[str, str]:
    """A client's credential headers: the arguments, else $KRAFTLOG_TOKEN or $KRAFTLOG_USER
    with $KRAFTLOG_PASSWORD (API.md, Security). ValueError for a user without a password."""
    import os
    if token is None and user is None and password is None:
        token, user, password = (os.environ.get(TOKEN_ENV) or None, os.environ.get(USER_ENV) or None,
                                 os.environ.get(PASSWORD_ENV))
    if user and password is None and not token:
        raise ValueError(f"a user ({user}) needs a password: give --password-file F or ${PASSWORD_ENV}")
    if password is not None and not user and not token:
        raise ValueError(f"a password needs a user name: give --user NAME or ${USER_ENV}")
    return client_headers(user, password, token)


def read_secret_file(path: str, what: str) -> str:
    """The first line of a secret file (a password or token), stripped; ValueError says what to fix."""
    try:
        with open(path, encoding="utf-8") as f:
            value = f.readline().strip()
    except OSError as e:
        raise ValueError(f"cannot read the {what} file {path}: {e.strerror}; check the path") from None
    if not value:
        raise ValueError(f"the {what} file {path} is empty; put the {what} on its first line")
    return value


def load_broker_credentials(path: Optional[str]) -> dict[str, ScramCredential]:
    """`broker_credentials_file`: JSON {"broker-<id>": SCRAM credential dict} (verifiers only)."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        out = {str(user): ScramCredential.from_dict(cred) for user, cred in doc.items()}
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"broker_credentials_file {path} is unreadable or malformed ({e}); expected "
                         'JSON {"broker-<id>": {"salt", "iterations", "stored_key", "server_key"}}') from None
    for user in out:
        if broker_id_of("User:" + user) is None:
            raise ValueError(f"broker_credentials_file {path} names {user!r}; only broker-<id> users belong there")
    return out


def write_broker_credentials(path: str, passwords: Mapping[int, str]) -> None:
    """Write the verifiers of broker passwords {broker id: password} as `broker_credentials_file`."""
    from metadata_quorum.security.scram import make_credential
    doc = {f"broker-{bid}": make_credential(pw).to_dict() for bid, pw in sorted(passwords.items())}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)


def broker_auth_headers(security: SecurityConfig, broker_id: int) -> dict[str, str]:
    """The headers a broker sends to controllers and other brokers: Basic as
    `broker-<id>` with `broker_password_file` when set (with TLS client certificates the
    certificate names the broker and no header is needed)."""
    if not (security.secured and security.broker_password_file):
        return {}
    return {"Authorization": basic_header(f"broker-{broker_id}",
                                          read_secret_file(security.broker_password_file, "broker password"))}


def forwarding_headers() -> dict[str, str]:
    """For a broker forwarding the request it is serving: the client's principal (empty when
    nothing was authenticated, e.g. no authentication configured)."""
    p = _current_principal.get()
    return {PRINCIPAL_HEADER: p} if p is not None and p != ANONYMOUS else {}


def principal_of(request: web.Request) -> str:
    """The authenticated principal of a request (ANONYMOUS when authentication is off)."""
    return request.get(PRINCIPAL_KEY, ANONYMOUS)


def peer_certificate_principal(request: web.Request) -> Optional[str]:
    """`User:<CN>` of the verified TLS client certificate, or None."""
    try:
        from http_api.wire.tls import peer_principal  # the TLS listener's rule when present
    except ImportError:
        peer_principal = None
    transport = request.transport
    if transport is None:
        return None
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    if peer_principal is not None:
        try:
            return peer_principal(ssl_object)
        except TypeError:
            pass
    cert = ssl_object.getpeercert()
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return f"User:{value}"
    return None


@dataclass
class _Bucket:
    tokens: float
    at: float


class FailureLimiter:
    """Failed authentications per client address: a token bucket of `rate_per_s` tokens
    refilled per second, at most `rate_per_s` deep. `allowed(addr)` is False while the
    address has no token left (its requests are refused without a check)."""

    def __init__(self, rate_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = float(rate_per_s)
        self.clock = clock
        self.buckets: dict[str, _Bucket] = {}
        self.refused = 0

    def _bucket(self, addr: str) -> _Bucket:
        now = self.clock()
        b = self.buckets.get(addr)
        if b is None:
            if len(self.buckets) >= FAILURE_ADDRESSES_MAX:
                full = [a for a, x in self.buckets.items() if x.tokens + (now - x.at) * self.rate >= self.rate]
                for a in full or list(self.buckets)[: FAILURE_ADDRESSES_MAX // 2]:
                    del self.buckets[a]
            b = self.buckets[addr] = _Bucket(self.rate, now)
        else:
            b.tokens = min(self.rate, b.tokens + (now - b.at) * self.rate)
            b.at = now
        return b

    def allowed(self, addr: str) -> bool:
        if addr not in self.buckets:
            return True
        ok = self._bucket(addr).tokens >= 1
        if not ok:
            self.refused += 1
        return ok

    def failed(self, addr: str) -> None:
        b = self._bucket(addr)
        b.tokens = max(0.0, b.tokens - 1)


class AuthenticationFailed(Exception):
    """Credentials missing or wrong: a 401 naming what to send."""


class Throttled(Exception):
    """Too many failed authentications from the client's address: a 429."""


class Authenticator:
    """Request -> principal under one node's `SecurityConfig` (see the module docstring).

    `image()` gives the current SecurityImage (or None before the first metadata); the
    cache of successful Basic checks (`cache_hits`, `cache_misses`) is only ever consulted
    with the credential the image holds now.
    """

    def __init__(self, security: SecurityConfig, image: Callable[[], Optional[SecurityImageLike]] = lambda: None,
                 *, broker_credentials: Optional[Mapping[str, ScramCredential]] = None,
                 clock: Callable[[], float] = time.monotonic,
                 peer_principal: Callable[[web.Request], Optional[str]] = peer_certificate_principal) -> None:
        self.security = security
        self.methods = frozenset(security.authentication)
        self.image = image
        self.broker_credentials = dict(broker_credentials if broker_credentials is not None
                                       else load_broker_credentials(security.broker_credentials_file))
        self.peer_principal = peer_principal
        self.limiter = FailureLimiter(security.authentication_failures_max_per_second, clock)
        self._cache: dict[str, tuple[ScramCredential, list[bytes]]] = {}   # user -> (credential, sha256s)
        self._token_index: tuple[Any, dict] = (None, {})   # (image, token hash -> token)
        self.cache_hits = 0
        self.cache_misses = 0
        self.failures = 0
        schemes = [f'Basic realm="{REALM}"'] if "basic" in self.methods else []
        if "bearer" in self.methods:
            schemes.append(f'Bearer realm="{REALM}"')
        self.challenge = ", ".join(schemes) or f'Basic realm="{REALM}"'

    @property
    def enabled(self) -> bool:
        return bool(self.methods)

    def credential(self, user: str) -> Optional[ScramCredential]:
        cred = self.broker_credentials.get(user)
        if cred is not None:
            return cred
        img = self.image()
        return None if img is None else img.scram_credentials.get(user)

    def check_password(self, user: str, password: str, addr: Optional[str] = None) -> bool:
        """True when `password` is `user`'s (cached after the first success). A check the
        cache cannot answer is refused (Throttled) while `addr` is over its failure limit."""
        cred = self.credential(user)
        if cred is None:
            self._cache.pop(user, None)
            self._throttle(addr)
            return False
        digest = hashlib.sha256(password.encode()).digest()
        entry = self._cache.get(user)
        if entry is not None and entry[0] is cred and digest in entry[1]:   # same credential object
            self.cache_hits += 1
            return True
        self._throttle(addr)
        self.cache_misses += 1
        if not verify_password(cred, password):
            return False
        if entry is None or entry[0] is not cred:   # new or changed credential: forget the old passwords
            if len(self._cache) >= CACHE_USERS_MAX:
                self._cache.clear()
            entry = self._cache[user] = (cred, [])
        if len(entry[1]) >= CACHE_PASSWORDS_PER_USER_MAX:
            del entry[1][0]
        entry[1].append(digest)
        return True

    def _tokens_by_hash(self) -> Mapping[str, Any]:
        img = self.image()
        if img is None:
            return {}
        if self._token_index[0] is not img:   # a new image: index its tokens by hash once
            self._token_index = (img, {t.token_hash: t for t in img.tokens.values()})
        return self._token_index[1]

    def _throttle(self, addr: Optional[str]) -> None:
        if addr is not None and not self.limiter.allowed(addr):
            raise Throttled(f"too many failed authentications from {addr} (authentication_failures_max_per_second="
                            f"{self.limiter.rate:g}); wait a second, then send valid credentials")

    def _from_header(self, value: str, addr: Optional[str]) -> str:
        scheme, _, rest = value.strip().partition(" ")
        scheme = scheme.lower()
        rest = rest.strip()
        if scheme == "basic" and "basic" in self.methods:
            try:
                user, sep, password = base64.b64decode(rest, validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError, ValueError):
                raise AuthenticationFailed("the Basic credentials are not base64 of user:password") from None
            if not sep or not user:
                raise AuthenticationFailed("the Basic credentials are not base64 of user:password")
            if not self.check_password(user, password, addr):
                raise AuthenticationFailed(f"wrong user name or password for {user!r}")
            return f"User:{user}"
        self._throttle(addr)
        if scheme == "bearer" and "bearer" in self.methods:
            token = self._tokens_by_hash().get(hash_token(rest)) if rest else None
            if token is None:
                raise AuthenticationFailed("unknown or revoked bearer token")
            if token.expired(int(time.time() * 1000)):
                raise AuthenticationFailed(f"the bearer token {token.token_id} has expired; ask an admin for a new "
                                           "one (kraftlog token create)")
            return token.principal
        raise AuthenticationFailed(f"the {scheme or 'empty'} Authorization scheme is not accepted here; use "
                                   f"{' or '.join(sorted(m for m in self.methods if m != 'mtls')) or 'a client certificate'}")

    def authenticate(self, request: web.Request) -> str:
        """The principal of `request`; AuthenticationFailed (the caller counts it against the
        client address) or Throttled otherwise. A cached Basic check or a client certificate
        passes even while the address is throttled (neither costs a password check)."""
        if not self.methods:
            return ANONYMOUS
        addr = client_address(request)
        header = request.headers.get("Authorization")
        if header:
            principal = self._from_header(header, addr)
        else:
            principal = self.peer_principal(request) if "mtls" in self.methods else None
            if principal is None:
                self._throttle(addr)
                raise AuthenticationFailed("this node requires authentication")
        forwarded = request.headers.get(PRINCIPAL_HEADER)
        if forwarded is not None:
            if broker_id_of(principal) is None:
                raise AuthenticationFailed(f"{PRINCIPAL_HEADER} is only accepted from brokers, not {principal}")
            return forwarded
        return principal

    def refusal(self, message: str) -> web.Response:
        how = []
        if "basic" in self.methods:
            how.append("HTTP Basic (kraftlog --user NAME --password-file F)")
        if "bearer" in self.methods:
            how.append("a bearer token (--token-file F)")
        if "mtls" in self.methods:
            how.append("a client certificate signed by the cluster CA")
        err = KraftlogError(ErrorCode.SASL_AUTHENTICATION_FAILED, f"{message}; authenticate with {' or '.join(how)}")
        return web.Response(body=error_body(err), status=http_status(err), content_type=JSON,
                            headers={"WWW-Authenticate": self.challenge})


# async (request, principal) -> None, or a function rewriting the answer (listings); raises
# KraftlogError (403) to refuse
Authorize = Callable[[web.Request, str], Awaitable[Optional[Callable[[web.StreamResponse], web.StreamResponse]]]]


def client_address(request: web.Request) -> str:
    return request.remote or "unknown"


class AuthMiddleware:
    """aiohttp middleware: authenticate (401/429), remember the principal on the request and
    for forwarding, then `await authorize(request, principal)` (raises KraftlogError 403, or
    returns a rewrite of the answer), then the handler. Placed before the error middleware, it answers
    its own refusals (with `WWW-Authenticate`)."""

    __middleware_version__ = 1

    def __init__(self, authenticator: Authenticator, authorize: Optional[Authorize] = None,
                 open_paths: Iterable[str] = OPEN_PATHS, echo_headers: tuple[str, ...] = ()) -> None:
        self.authenticator = authenticator
        self.authorize = authorize
        self.open_paths = frozenset(open_paths)
        self.echo_headers = echo_headers

    def _echo(self, request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
        for name in self.echo_headers:
            value = request.headers.get(name)
            if value is not None:
                resp.headers[name] = value
        return resp

    async def __call__(self, request: web.Request, handler) -> web.StreamResponse:
        if request.path in self.open_paths:
            return await handler(request)
        a = self.authenticator
        if a.methods:
            try:
                principal = a.authenticate(request)
            except AuthenticationFailed as e:
                a.failures += 1
                a.limiter.failed(client_address(request))
                return self._echo(request, a.refusal(str(e)))
            except Throttled as e:
                err = KraftlogError(ErrorCode.THROTTLING_QUOTA_EXCEEDED, str(e))
                return self._echo(request, web.Response(body=error_body(err), status=http_status(err),
                                                        content_type=JSON))
        else:
            principal = ANONYMOUS
        request[PRINCIPAL_KEY] = principal
        _current_principal.set(principal)
        post = None
        if self.authorize is not None:
            try:
                post = await self.authorize(request, principal)
            except KraftlogError as e:
                return self._echo(request, web.Response(body=error_body(e), status=http_status(e), content_type=JSON))
        resp = await handler(request)
        return post(resp) if post is not None else resp


def say_unauthenticated(security: SecurityConfig, node: str, logger: logging.Logger = log) -> None:
    """The one start-up line of a node that authenticates nobody."""
    if not security.secured:
        logger.warning("%s is UNAUTHENTICATED: anyone who reaches its port may do anything (no [security] "
                       "authentication configured; see API.md, Security)", node)


def register_auth_metrics(registry, a: Authenticator) -> None:
    """The authenticator's counters on /metrics (Prometheus gauges read at scrape time)."""
    import prometheus_client as prom
    for name, doc, fn in (
            ("kraftlog_authentication_failures", "Requests refused for missing or wrong credentials (401)",
             lambda: a.failures),
            ("kraftlog_authentication_throttled", "Requests refused by authentication_failures_max_per_second (429)",
             lambda: a.limiter.refused),
            ("kraftlog_authentication_cache_hits", "Basic checks answered by the cache", lambda: a.cache_hits),
            ("kraftlog_authentication_cache_misses", "Basic checks that ran PBKDF2", lambda: a.cache_misses)):
        prom.Gauge(name, doc, registry=registry).set_function(fn)
