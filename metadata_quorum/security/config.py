"""The `[security]` settings of a node (API.md, section Security), shared by broker and controller.

No `[security]` section: every field at its default, i.e. plain HTTP, no authentication,
no authorizer (the node says on start that it is unauthenticated).
"""
from __future__ import annotations

from dataclasses import dataclass

TLS_CLIENT_AUTH = ("none", "requested", "required")
AUTHENTICATION_METHODS = ("basic", "bearer", "mtls")
AUTHORIZERS = ("acl",)


@dataclass(frozen=True)
class SecurityConfig:
    """TLS files, authentication methods, the authorizer and its super users.

    Invariants (`validate`): a certificate comes with its key; client certificates can only
    be requested or required with a CA to check them and TLS on; `mtls` authentication needs
    `tls_client_auth` other than none; the authorizer needs some authentication.
    """

    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_ca_file: str | None = None
    tls_client_auth: str = "none"                  # none | requested | required
    tls_reload_check_interval_ms: int = 5_000      # certificate/key files checked for changes (0: SIGHUP only)
    authentication: tuple[str, ...] = ()           # any subset of basic, bearer, mtls
    authorizer: str | None = None                  # "acl": Kafka's ACL model, default deny
    super_users: tuple[str, ...] = ()              # principals allowed everything, e.g. User:admin
    # users the active controller creates when missing from the metadata (read by controllers
    # only): JSON {"NAME": "password" or a SCRAM credential {salt, iterations, stored_key,
    # server_key}}; `kraftlog cluster up --secure` writes the super user `admin` here
    bootstrap_users_file: str | None = None
    # failed authentications answered per client address per second; beyond: 429 before any
    # password check (http_api/wire/auth.py)
    authentication_failures_max_per_second: float = 10.0
    # brokers as cluster principals without TLS (User:broker-<id>, http_api/wire/auth.py):
    # this broker's own password (brokers only), and the SCRAM verifiers of every broker's
    # password, JSON {"broker-<id>": credential} (every node; holds no password)
    broker_password_file: str | None = None
    broker_credentials_file: str | None = None

    def __post_init__(self) -> None:
        for name in ("authentication", "super_users"):   # JSON/TOML give lists; a comma string from flags
            v = getattr(self, name)
            v = [p.strip() for p in v.split(",") if p.strip()] if isinstance(v, str) else v
            object.__setattr__(self, name, tuple(v))
        self.validate()

    def validate(self) -> None:
        def bad(setting: str, what: str, value) -> None:
            raise ValueError(f"{setting} must be {what}, got {value!r}; fix {setting} in the config ([security] section)")

        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            bad("tls_key_file" if self.tls_cert_file else "tls_cert_file",
                "set together with tls_cert_file/tls_key_file", self.tls_key_file or self.tls_cert_file)
        if self.tls_reload_check_interval_ms < 0:
            bad("tls_reload_check_interval_ms", ">= 0 (0: reload on SIGHUP only)", self.tls_reload_check_interval_ms)
        if self.tls_client_auth not in TLS_CLIENT_AUTH:
            bad("tls_client_auth", " | ".join(TLS_CLIENT_AUTH), self.tls_client_auth)
        if self.tls_client_auth != "none" and not (self.tls_enabled and self.tls_ca_file):
            bad("tls_client_auth", "none unless tls_cert_file, tls_key_file and tls_ca_file are set",
                self.tls_client_auth)
        for m in self.authentication:
            if m not in AUTHENTICATION_METHODS:
                bad("authentication", f"a subset of {', '.join(AUTHENTICATION_METHODS)}", list(self.authentication))
        if "mtls" in self.authentication and self.tls_client_auth == "none":
            bad("tls_client_auth", "requested or required when authentication includes mtls", self.tls_client_auth)
        if self.authorizer is not None and self.authorizer not in AUTHORIZERS:
            bad("authorizer", " | ".join(AUTHORIZERS), self.authorizer)
        if self.authorizer and not self.authentication:
            bad("authentication", "non-empty when an authorizer is on (everyone would be denied)",
                list(self.authentication))
        if not self.authentication_failures_max_per_second > 0:
            bad("authentication_failures_max_per_second", "> 0", self.authentication_failures_max_per_second)
        for p in self.super_users:
            if ":" not in p:
                bad("super_users", "principals like User:admin", list(self.super_users))

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_cert_file)

    @property
    def secured(self) -> bool:
        """True when the node authenticates its clients."""
        return bool(self.authentication)

    @property
    def scheme(self) -> str:
        return "https" if self.tls_enabled else "http"
