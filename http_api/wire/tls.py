"""TLS for every kraftlog listener and internal client, built from the `[security]` settings.

- `server_context(security)`: the listener's `ssl.SSLContext` (TLS >= 1.2; client
  certificates per `tls_client_auth`: none -> CERT_NONE, requested -> CERT_OPTIONAL,
  required -> CERT_REQUIRED, checked against `tls_ca_file`).
- `client_context(...)`: what internal clients (replica fetchers, the controller client,
  forwarding) and the CLI use: verifies the peer against the CA (host name checked) and,
  when the node has a certificate, presents it (mTLS: brokers are `User:broker-<id>`).
- `peer_principal(request_or_transport)`: `User:<CN>` of a verified client certificate.
- `ReloadingServerContext`: a new certificate pair is picked up on SIGHUP or when the files
  change (mtime checked every `tls_reload_check_interval_ms`), by `load_cert_chain()` on the
  same contexts, so the next handshake serves it and open connections are untouched. The
  pair is first loaded into a scratch context: a bad pair keeps the current one (one log
  line saying why and what to do).
- `TlsMetricsCollector`: `kraftlog_tls_certificate_expiry_timestamp_seconds` and reload
  counters for /metrics.
- `TcpSite`: aiohttp's TCPSite with a TLS handshake deadline (asyncio's default is 60 s, and
  the HTTP head deadline only starts once the handshake is done: a slowloris handshake).
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import ssl
import tempfile
import time
from typing import Any, Callable, Iterable, Optional

from aiohttp import web

log = logging.getLogger("kraftlog.tls")
# add/remove_signal_handler outside the main thread (ValueError/RuntimeError) or on a platform
# without signals (NotImplementedError): the file check still sees certificate changes
SIGNAL_HANDLER_UNAVAILABLE = (NotImplementedError, RuntimeError, ValueError)

TLS_MIN_VERSION = ssl.TLSVersion.TLSv1_2
DEFAULT_RELOAD_CHECK_INTERVAL_MS = 5_000
DEFAULT_HANDSHAKE_TIMEOUT_MS = 10_000
CA_FILE_ENV = "KRAFTLOG_CA_FILE"
VERIFY_MODES = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def _no_passphrase() -> str:
    """OpenSSL would prompt on the terminal for an encrypted key; refuse instead."""
    raise ValueError("the TLS key file is encrypted (a passphrase is needed); give an unencrypted PEM key "
                     "readable only by kraftlog (chmod 600)")


def server_context(security: Any) -> Optional[ssl.SSLContext]:
    """The listener context of a `SecurityConfig` (None when TLS is off)."""
    if not security.tls_enabled:
        return None
    return _server_context(security.tls_cert_file, security.tls_key_file, security.tls_ca_file,
                           security.tls_client_auth)


def _server_context(cert_file: str, key_file: str, ca_file: Optional[str], client_auth: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_MIN_VERSION
    ctx.load_cert_chain(cert_file, key_file, password=_no_passphrase)
    if ca_file:
        ctx.load_verify_locations(cafile=ca_file)
    ctx.verify_mode = VERIFY_MODES[client_auth]
    return ctx


def client_context(security: Any = None, *, ca_file: Optional[str] = None, cert_file: Optional[str] = None,
                   key_file: Optional[str] = None) -> ssl.SSLContext:
    """A verifying client context: the CA of `security` (or `ca_file`; else the system's
    trust store), and the node's own certificate as client certificate when it has one."""
    if security is not None:
        ca_file = ca_file or security.tls_ca_file
        cert_file = cert_file or security.tls_cert_file
        key_file = key_file or security.tls_key_file
    ctx = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    ctx.minimum_version = TLS_MIN_VERSION
    if cert_file and key_file:
        ctx.load_cert_chain(cert_file, key_file, password=_no_passphrase)
    return ctx


def internal_client_context(security: Any) -> Optional[ssl.SSLContext]:
    """The client context a node's internal clients use (None when the node's TLS is off)."""
    return client_context(security) if security.tls_enabled else None


def ca_file_from_env() -> Optional[str]:
    return os.environ.get(CA_FILE_ENV) or None


def cli_client_context(ca_file: Optional[str] = None) -> Optional[ssl.SSLContext]:
    """The context of a client command: `ca_file` or `$KRAFTLOG_CA_FILE`; None (aiohttp's
    default: the system trust store for https URLs) when neither is given."""
    ca_file = ca_file or ca_file_from_env()
    if not ca_file:
        return None
    if not os.path.exists(ca_file):
        raise ValueError(f"CA file {ca_file!r} does not exist; give the cluster's ca.pem with --ca-file "
                         f"or ${CA_FILE_ENV}")
    return client_context(ca_file=ca_file)


# ---- principals -------------------------------------------------------------------------

def _ssl_object(obj: Any):
    if isinstance(obj, (ssl.SSLObject, ssl.SSLSocket)):
        return obj
    transport = getattr(obj, "transport", obj)   # an aiohttp web.Request has .transport
    if transport is None or not hasattr(transport, "get_extra_info"):
        return None
    return transport.get_extra_info("ssl_object")


def peer_certificate(obj: Any) -> Optional[dict]:
    """The verified peer certificate (ssl.getpeercert() form) of a request, transport or SSL
    object; None when the connection is plain or the peer sent no (verified) certificate."""
    so = _ssl_object(obj)
    if so is None:
        return None
    try:
        cert = so.getpeercert()
    except (ValueError, ssl.SSLError):   # handshake not done
        return None
    return cert or None


def common_name(cert: dict) -> Optional[str]:
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None


def peer_principal(request_or_transport: Any) -> Optional[str]:
    """`User:<CN>` of the verified client certificate (mTLS), else None."""
    cert = peer_certificate(request_or_transport)
    cn = common_name(cert) if cert else None
    return f"User:{cn}" if cn else None


# ---- certificate facts ------------------------------------------------------------------

def certificate_info(cert_file: str) -> tuple[float, int]:
    """(not-after as epoch seconds, serial number) of the first certificate in `cert_file`."""
    from cryptography import x509

    with open(cert_file, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    not_after = getattr(cert, "not_valid_after_utc", None) or cert.not_valid_after
    if not_after.tzinfo is None:
        import datetime
        not_after = not_after.replace(tzinfo=datetime.timezone.utc)
    return not_after.timestamp(), cert.serial_number


# ---- hot reload ---------------------------------------------------------------------------

class ReloadingServerContext:
    """A listener context whose certificate pair is reloaded in place.

    `reload()` (SIGHUP, or a change of either file seen by the mtime check every
    `check_interval_ms`) copies both files, loads the copy into a scratch context (a
    mismatched, unreadable or half-written pair fails there: the current pair stays, one
    warning says why), then into the live server context and every `attach`ed client
    context (the node's client certificate rotates with it). Invariant: the live contexts
    always hold a matching pair. Runs on the event loop thread, as do the handshakes."""

    def __init__(self, cert_file: str, key_file: str, ca_file: Optional[str] = None, client_auth: str = "none",
                 check_interval_ms: int = DEFAULT_RELOAD_CHECK_INTERVAL_MS, name: str = "listener") -> None:
        self.cert_file, self.key_file, self.ca_file = cert_file, key_file, ca_file
        self.client_auth = client_auth
        self.check_interval_ms = check_interval_ms
        self.name = name
        self.context = _server_context(cert_file, key_file, ca_file, client_auth)
        self._clients: list[ssl.SSLContext] = []
        self.expiry_timestamp_s, self.serial = certificate_info(cert_file)
        self.reloads_ok = 0
        self.reloads_failed = 0
        self.last_error: Optional[str] = None
        self._stamp = self._file_stamp()
        self._task: Optional[asyncio.Task] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._sighup_installed = False
        self._listeners: list[Callable[[], None]] = []

    @classmethod
    def from_security(cls, security: Any, name: str = "listener") -> Optional["ReloadingServerContext"]:
        """The listener's context (None when TLS is off); ValueError saying which file is wrong."""
        if not security.tls_enabled:
            return None
        try:
            return cls(security.tls_cert_file, security.tls_key_file, security.tls_ca_file,
                       security.tls_client_auth, check_interval_ms=security.tls_reload_check_interval_ms, name=name)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise ValueError(f"TLS {name}: cannot load tls_cert_file {security.tls_cert_file!r}, tls_key_file "
                             f"{security.tls_key_file!r}, tls_ca_file {security.tls_ca_file!r}: {e}; fix the "
                             "files or the [security] settings") from None

    def attach(self, client: ssl.SSLContext) -> ssl.SSLContext:
        """Reload `client`'s certificate (the node's client certificate) with the listener's."""
        self._clients.append(client)
        return client

    def _file_stamp(self) -> tuple:
        out = []
        for path in (self.cert_file, self.key_file):
            try:
                st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append(None)
        return tuple(out)

    def reload(self, reason: str = "requested") -> bool:
        """Load the pair again; True when the live contexts now serve it."""
        self._stamp = self._file_stamp()
        tmp = tempfile.mkdtemp(prefix="kraftlog-tls-")
        try:
            cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
            shutil.copyfile(self.cert_file, cert)    # one snapshot for the check and the live load
            shutil.copyfile(self.key_file, key)
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=_no_passphrase)  # the check
            expiry, serial = certificate_info(cert)
            for ctx in [self.context, *self._clients]:
                ctx.load_cert_chain(cert, key, password=_no_passphrase)
        except (OSError, ssl.SSLError, ValueError) as e:
            self.reloads_failed += 1
            self.last_error = f"{type(e).__name__}: {e}"
            log.warning("TLS %s: certificate reload (%s) failed, keeping the current certificate (serial %x, "
                        "expires %s): %s; put a matching PEM certificate/key pair at %s and %s, then send "
                        "SIGHUP or wait %d ms", self.name, reason, self.serial,
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.expiry_timestamp_s)),
                        self.last_error, self.cert_file, self.key_file, self.check_interval_ms)
            return False
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        changed = serial != self.serial
        self.expiry_timestamp_s, self.serial = expiry, serial
        self.reloads_ok += 1
        self.last_error = None
        log.info("TLS %s: certificate reloaded (%s): serial %x, expires %s%s", self.name, reason, serial,
                 time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expiry)), "" if changed else " (same certificate)")
        for fn in self._listeners:
            fn()
        return True

    def check_files(self) -> bool:
        """Reload when either file changed since the last attempt; True when reloaded."""
        if self._file_stamp() == self._stamp:
            return False
        return self.reload("files changed")

    def start(self, loop: Optional[asyncio.AbstractEventLoop] = None, sighup: bool = True) -> None:
        """SIGHUP handler (main thread only) and the file check task, on the running loop."""
        self._loop = loop or asyncio.get_running_loop()
        if sighup:
            try:
                self._loop.add_signal_handler(signal.SIGHUP, self.reload, "SIGHUP")
                self._sighup_installed = True
            except SIGNAL_HANDLER_UNAVAILABLE:
                log.info("TLS %s: no SIGHUP handler here; certificate changes are seen by the file check only",
                         self.name)
        if self.check_interval_ms > 0:
            self._task = self._loop.create_task(self._watch(), name=f"tls-reload-{self.name}")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval_ms / 1000)
            try:
                self.check_files()
            except Exception:   # noqa: BLE001 - never let the watcher die
                log.exception("TLS %s: certificate file check failed", self.name)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._loop is not None and self._sighup_installed:
            try:
                self._loop.remove_signal_handler(signal.SIGHUP)
            except SIGNAL_HANDLER_UNAVAILABLE:   # the loop closed meanwhile
                pass
            self._sighup_installed = False
        self._loop = None


class TlsMetricsCollector:
    """Prometheus collector of the certificates of `ReloadingServerContext`s: expiry (epoch
    seconds; alert on `... - time() < 14 * 86400`) and reload outcomes, labelled by listener."""

    def __init__(self, contexts: Iterable[ReloadingServerContext]) -> None:
        self.contexts = list(contexts)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        expiry = GaugeMetricFamily("kraftlog_tls_certificate_expiry_timestamp_seconds",
                                   "Not-after time of the certificate a TLS listener serves (epoch seconds)",
                                   labels=["listener", "serial"])
        reloads = CounterMetricFamily("kraftlog_tls_certificate_reloads",
                                      "Certificate reloads of a TLS listener (SIGHUP or file change) by result",
                                      labels=["listener", "result"])
        for c in self.contexts:
            expiry.add_metric([c.name, format(c.serial, "x")], c.expiry_timestamp_s)
            reloads.add_metric([c.name, "ok"], c.reloads_ok)
            reloads.add_metric([c.name, "failed"], c.reloads_failed)
        yield expiry
        yield reloads


class TcpSite(web.TCPSite):
    """`web.TCPSite` whose TLS handshakes must finish within `handshake_timeout_ms` (a
    connection still handshaking then is closed); the same as TCPSite without TLS."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 handshake_timeout_ms: int = DEFAULT_HANDSHAKE_TIMEOUT_MS, **kw: Any) -> None:
        super().__init__(runner, host, port, **kw)
        self.handshake_timeout_ms = handshake_timeout_ms

    async def start(self) -> None:
        if self._ssl_context is None or self.handshake_timeout_ms <= 0:
            await super().start()
            return
        await web.BaseSite.start(self)   # registers the site with its runner
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            server, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port,
            ssl_handshake_timeout=self.handshake_timeout_ms / 1000)
        if self._server.sockets:
            self._bound_port = self._server.sockets[0].getsockname()[1]
        else:
            self._bound_port = self._port
