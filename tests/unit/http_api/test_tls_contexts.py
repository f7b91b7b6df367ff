"""TLS contexts, mTLS principals, hot reload and the expiry metric (http_api/wire/tls.py),
against real aiohttp listeners on loopback (each test on asyncio's loop and on uvloop),
with certificates from deploy/certs.py and, for a foreign CA, trustme."""
from __future__ import annotations

import asyncio
import logging
import os
import ssl

import aiohttp
import prometheus_client as prom
import pytest
import trustme
from aiohttp import web
from cryptography import x509

from deploy.certs import CertificateAuthority
from http_api.wire import tls
from metadata_quorum.security.config import SecurityConfig
from partitions.errors import ErrorCode, KraftlogError


@pytest.fixture
def pki(tmp_path):
    """A CA, a server certificate (localhost / 127.0.0.1) and a client certificate."""
    ca = CertificateAuthority.create(str(tmp_path / "ca"))
    server = ca.issue("broker-1", ["127.0.0.1", "localhost"], str(tmp_path / "server.pem"),
                      str(tmp_path / "server-key.pem"))
    ca.issue("alice", None, str(tmp_path / "client.pem"), str(tmp_path / "client-key.pem"))
    return {"ca": ca, "dir": tmp_path, "server_serial": server.serial_number,
            "cert": str(tmp_path / "server.pem"), "key": str(tmp_path / "server-key.pem"),
            "client_cert": str(tmp_path / "client.pem"), "client_key": str(tmp_path / "client-key.pem")}


def _security(pki, client_auth="none") -> SecurityConfig:
    return SecurityConfig(tls_cert_file=pki["cert"], tls_key_file=pki["key"], tls_ca_file=pki["ca"].cert_path,
                          tls_client_auth=client_auth)


async def _serve(ctx: ssl.SSLContext, handshake_timeout_ms: int = tls.DEFAULT_HANDSHAKE_TIMEOUT_MS):
    """An aiohttp listener on a free port answering GET /whoami with the peer principal."""
    async def whoami(request):
        return web.json_response({"principal": tls.peer_principal(request)})

    app = web.Application()
    app.router.add_get("/whoami", whoami)
    runner = web.AppRunner(app)
    await runner.setup()
    site = tls.TcpSite(runner, "127.0.0.1", 0, ssl_context=ctx, handshake_timeout_ms=handshake_timeout_ms)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port


async def _get(url: str, ctx=None):
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx if ctx is not None else True)) as s:
        async with s.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
            return r.status, await r.json()


async def _served_serial(port: int, ca_file: str) -> int:
    """Serial number of the certificate a new handshake with the listener sees."""
    ctx = tls.client_context(ca_file=ca_file)
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1")
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    return x509.load_der_x509_certificate(der).serial_number


async def test_https_with_the_ca_works_and_plain_http_is_refused(pki):
    runner, port = await _serve(tls.server_context(_security(pki)))
    try:
        status, doc = await _get(f"https://127.0.0.1:{port}/whoami", tls.client_context(ca_file=pki["ca"].cert_path))
        assert (status, doc) == (200, {"principal": None})    # no client certificate asked for
        with pytest.raises(aiohttp.ClientError):               # plain HTTP to the TLS port: no answer
            await _get(f"http://127.0.0.1:{port}/whoami")
        with pytest.raises(aiohttp.ClientConnectorCertificateError):   # a client that does not trust the CA
            await _get(f"https://127.0.0.1:{port}/whoami")
    finally:
        await runner.cleanup()


async def test_contexts_refuse_tls_below_1_2(pki):
    assert tls.server_context(_security(pki)).minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.client_context(ca_file=pki["ca"].cert_path).minimum_version == ssl.TLSVersion.TLSv1_2


async def test_client_auth_required_refuses_a_client_without_certificate(pki):
    runner, port = await _serve(tls.server_context(_security(pki, "required")))
    url = f"https://127.0.0.1:{port}/whoami"
    foreign = trustme.CA().issue_cert("mallory")   # a client certificate from a CA the listener does not trust
    try:
        with pytest.raises(aiohttp.ClientError):
            await _get(url, tls.client_context(ca_file=pki["ca"].cert_path))
        bad = tls.client_context(ca_file=pki["ca"].cert_path)
        foreign.configure_cert(bad)
        with pytest.raises(aiohttp.ClientError):
            await _get(url, bad)
        ok = tls.client_context(ca_file=pki["ca"].cert_path, cert_file=pki["client_cert"], key_file=pki["client_key"])
        assert await _get(url, ok) == (200, {"principal": "User:alice"})
    finally:
        await runner.cleanup()


async def test_client_auth_requested_accepts_both_and_names_the_certificate_holder(pki):
    runner, port = await _serve(tls.server_context(_security(pki, "requested")))
    url = f"https://127.0.0.1:{port}/whoami"
    try:
        assert await _get(url, tls.client_context(ca_file=pki["ca"].cert_path)) == (200, {"principal": None})
        # a node's client context presents its own certificate (brokers: User:broker-<id>)
        node = tls.client_context(_security(pki, "requested"))
        assert await _get(url, node) == (200, {"principal": "User:broker-1"})
    finally:
        await runner.cleanup()


def _replace_pair(pki, cn: str) -> int:
    """New certificate files for the listener (written aside, then renamed into place)."""
    d = pki["dir"]
    cert = pki["ca"].issue(cn, ["127.0.0.1", "localhost"], str(d / "new.pem"), str(d / "new-key.pem"))
    os.replace(d / "new.pem", pki["cert"])
    os.replace(d / "new-key.pem", pki["key"])
    return cert.serial_number


async def test_reload_serves_the_new_certificate_on_new_handshakes_and_keeps_connections(pki):
    r = tls.ReloadingServerContext(pki["cert"], pki["key"], pki["ca"].cert_path, name="broker")
    runner, port = await _serve(r.context)
    ca = pki["ca"].cert_path
    try:
        assert await _served_serial(port, ca) == pki["server_serial"]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls.client_context(ca_file=ca))) as s:
            async with s.get(f"https://127.0.0.1:{port}/whoami") as resp:
                assert resp.status == 200
            new = _replace_pair(pki, "broker-1")
            assert r.reload("test")
            assert await _served_serial(port, ca) == new == r.serial
            async with s.get(f"https://127.0.0.1:{port}/whoami") as resp:   # the open keep-alive connection
                assert resp.status == 200
            assert s.connector._conns, "the first connection was kept alive across the reload"
    finally:
        await runner.cleanup()


async def test_a_bad_pair_keeps_the_current_certificate_and_says_why(pki, caplog):
    r = tls.ReloadingServerContext(pki["cert"], pki["key"], pki["ca"].cert_path, name="broker")
    runner, port = await _serve(r.context)
    ca = pki["ca"].cert_path
    try:
        d = pki["dir"]   # a new certificate with the key of another one (trustme's)
        pki["ca"].issue("broker-1", ["127.0.0.1"], str(d / "new.pem"), str(d / "unused-key.pem"))
        os.replace(d / "new.pem", pki["cert"])
        trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(pki["key"])
        with caplog.at_level(logging.WARNING, logger="kraftlog.tls"):
            assert not r.reload("test")
        lines = [rec.getMessage() for rec in caplog.records if rec.name == "kraftlog.tls"]
        assert len(lines) == 1 and "keeping the current certificate" in lines[0] and pki["key"] in lines[0], lines
        assert r.reloads_failed == 1
        assert await _served_serial(port, ca) == pki["server_serial"]   # still served, handshakes work
        status, _ = await _get(f"https://127.0.0.1:{port}/whoami", tls.client_context(ca_file=ca))
        assert status == 200
        with open(pki["key"], "w") as f:
            f.write("not a key")                                       # garbage: same outcome
        assert not r.reload("test")
        assert await _served_serial(port, ca) == pki["server_serial"]
    finally:
        await runner.cleanup()


async def test_changed_files_are_picked_up_by_the_mtime_check(pki):
    r = tls.ReloadingServerContext(pki["cert"], pki["key"], pki["ca"].cert_path, check_interval_ms=50,
                                   name="broker")
    runner, port = await _serve(r.context)
    r.start(sighup=False)
    try:
        new = _replace_pair(pki, "broker-1")
        deadline = asyncio.get_running_loop().time() + 10
        while await _served_serial(port, pki["ca"].cert_path) != new:
            assert asyncio.get_running_loop().time() < deadline, "the new certificate was never served"
            await asyncio.sleep(0.05)
        assert r.reloads_ok == 1
    finally:
        r.stop()
        await runner.cleanup()


async def test_attached_client_context_presents_the_rotated_certificate(pki):
    sec = _security(pki, "required")
    listener = tls.ReloadingServerContext(pki["cert"], pki["key"], pki["ca"].cert_path, "required", name="a")
    runner, port = await _serve(listener.context)
    node = tls.ReloadingServerContext.from_security(sec, name="b")   # another node sharing the files
    client = node.attach(tls.client_context(sec))
    try:
        url = f"https://127.0.0.1:{port}/whoami"
        assert await _get(url, client) == (200, {"principal": "User:broker-1"})
        _replace_pair(pki, "broker-7")
        assert node.reload("test")
        assert await _get(url, client) == (200, {"principal": "User:broker-7"})
    finally:
        await runner.cleanup()


def test_expiry_metric(pki):
    r = tls.ReloadingServerContext(pki["cert"], pki["key"], name="broker")
    registry = prom.CollectorRegistry()
    registry.register(tls.TlsMetricsCollector([r]))
    with open(pki["cert"], "rb") as f:
        leaf = x509.load_pem_x509_certificate(f.read())
    value = registry.get_sample_value("kraftlog_tls_certificate_expiry_timestamp_seconds",
                                      {"listener": "broker", "serial": format(leaf.serial_number, "x")})
    assert value == leaf.not_valid_after_utc.timestamp()
    assert registry.get_sample_value("kraftlog_tls_certificate_reloads_total",
                                     {"listener": "broker", "result": "ok"}) == 0


def test_node_certificates_name_the_broker_and_cover_loopback(tmp_path):
    ca = CertificateAuthority.create(str(tmp_path))
    cert = ca.issue("broker-3", ["127.0.0.1", "localhost", "node3.example"], str(tmp_path / "n.pem"),
                    str(tmp_path / "n-key.pem"))
    assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "broker-3"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert oct(os.stat(tmp_path / "n-key.pem").st_mode & 0o777) == "0o600"
    assert oct(os.stat(tmp_path / "ca-key.pem").st_mode & 0o777) == "0o600"
    again = CertificateAuthority.load_or_create(str(tmp_path))     # kept, not replaced
    assert again.cert.serial_number == ca.cert.serial_number


async def test_a_silent_tls_handshake_is_closed_at_its_deadline(pki):
    """A connection that never sends its ClientHello (slowloris before any HTTP) is closed
    after `handshake_timeout_ms`, not after asyncio's 60 s; TLS clients are served as before."""
    runner, port = await _serve(tls.server_context(_security(pki)), handshake_timeout_ms=300)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await asyncio.wait_for(reader.read(), 10) == b""     # closed by the listener
        assert loop.time() - t0 < 5
        writer.close()
        ok = await _get(f"https://127.0.0.1:{port}/whoami", tls.client_context(ca_file=pki["ca"].cert_path))
        assert ok == (200, {"principal": None})
    finally:
        await runner.cleanup()


def test_unusable_files_are_refused_at_start_naming_them(pki):
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(open(pki["key"], "rb").read(), None)
    encrypted = pki["dir"] / "encrypted-key.pem"
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"secret")))
    sec = SecurityConfig(tls_cert_file=pki["cert"], tls_key_file=str(encrypted))
    with pytest.raises(ValueError, match="encrypted.*unencrypted PEM key"):   # never a terminal prompt
        tls.ReloadingServerContext.from_security(sec)
    missing = SecurityConfig(tls_cert_file=str(pki["dir"] / "nope.pem"), tls_key_file=pki["key"])
    with pytest.raises(ValueError, match=r"TLS broker: cannot load tls_cert_file .*nope\.pem"):
        tls.ReloadingServerContext.from_security(missing, name="broker")


async def test_replica_fetches_run_over_tls_with_the_node_certificate(pki):
    """The follower's lean client (ReplicaConnectionPool, a BufferedProtocol) over TLS: the
    answer body lands intact, the leader sees the follower's certificate (User:broker-1),
    and an https leader is refused by a follower without TLS (told what to set)."""
    from http_api.broker.replica_client import (INTERNAL_PREFIX, REPLICA_FETCH_MEDIA, ReplicaTransport,
                                                encode_fetch_header)

    chunk = os.urandom(300_000)
    entries = [{"topic": "t", "partition": 0, "size": len(chunk), "high_watermark": 7, "log_start_offset": 0,
                "log_end_offset": 7}]
    seen = []

    async def fetch(request):
        seen.append(tls.peer_principal(request))
        await request.read()
        return web.Response(body=encode_fetch_header(entries) + chunk, content_type=REPLICA_FETCH_MEDIA)

    app = web.Application()
    app.router.add_post(INTERNAL_PREFIX + "/replica-fetch", fetch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = tls.TcpSite(runner, "127.0.0.1", 0, ssl_context=tls.server_context(_security(pki, "requested")))
    await site.start()
    url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    follower = ReplicaTransport(ssl_context=tls.client_context(_security(pki, "requested")))
    plain = ReplicaTransport()
    try:
        for _ in range(3):   # a kept-alive connection is reused
            [data] = await follower.fetch(url, 1, 1, [{"topic": "t", "partition": 0, "offset": 0, "leader_epoch": 1}],
                                          max_bytes=1 << 20, partition_max_bytes=1 << 20, max_wait_ms=10)
            assert bytes(data.records) == chunk and data.high_watermark == 7
        assert seen == ["User:broker-1"] * 3
        assert sum(len(idle) for idle in follower.pool._idle.values()) == 1   # one connection, kept alive
        with pytest.raises(KraftlogError) as e:
            await plain.fetch(url, 1, 1, [], max_bytes=1, partition_max_bytes=1, max_wait_ms=10)
        assert e.value.code is ErrorCode.BROKER_NOT_AVAILABLE and "tls_cert_file" in e.value.message
    finally:
        await follower.close()
        await plain.close()
        await runner.cleanup()
