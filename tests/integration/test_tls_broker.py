"""One `kraftlog serve` node with TLS on (the `[security]` section of its config file): the
broker and the controller listeners refuse plain HTTP, clients with the CA work (Python
client, CLI with --ca-file and $KRAFTLOG_CA_FILE), the certificate expiry is on /metrics,
certificates rotate under load (SIGHUP and file change) with no failed request, a bad pair
keeps the served one, and `tls_client_auth = "required"` refuses clients without one."""
from __future__ import annotations

import asyncio
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import aiohttp
import pytest
from cryptography import x509

from deploy.certs import CertificateAuthority
from deploy.local_node import ROOT, LocalNode
from http_api.client import AdminClient, Producer
from http_api.wire import tls
from partitions.errors import ErrorCode, KraftlogError

pytestmark = pytest.mark.integration

HOSTS = ["127.0.0.1", "localhost"]


def write_config(tmp_path, ca: CertificateAuthority, client_auth: str = "none", reload_ms: int = 5000) -> str:
    ca.issue("broker-1", HOSTS, str(tmp_path / "node.pem"), str(tmp_path / "node-key.pem"))
    path = tmp_path / "node.toml"
    path.write_text(f"""
[security]
tls_cert_file = "{tmp_path / 'node.pem'}"
tls_key_file = "{tmp_path / 'node-key.pem'}"
tls_ca_file = "{ca.cert_path}"
tls_client_auth = "{client_auth}"
tls_reload_check_interval_ms = {reload_ms}
""")
    return str(path)


def start_node(tmp_path, config: str) -> LocalNode:
    return LocalNode(str(tmp_path / "data"), extra_args=["--config", config], scheme="https").start(90)


def kraftlog(*args, env=None, input=None):
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], capture_output=True, text=True, input=input,
                          env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})), timeout=120, cwd=ROOT)


def plain_http_refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=10)
    except urllib.error.HTTPError:
        return False
    except (urllib.error.URLError, ConnectionError, OSError):
        return True
    return False


def served_serial(port: int, ca_file: str) -> int:
    """Serial of the certificate a new handshake sees."""
    import socket
    ctx = tls.client_context(ca_file=ca_file)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            return x509.load_der_x509_certificate(s.getpeercert(binary_form=True)).serial_number


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def metric(url: str, ca_file: str, name: str) -> list[str]:
    with urllib.request.urlopen(url + "/metrics", timeout=10, context=ssl.create_default_context(cafile=ca_file)) as r:
        return [line for line in r.read().decode().splitlines() if line.startswith(name)]


def test_tls_node_serves_clients_with_the_ca_and_refuses_plain_http(tmp_path):
    ca = CertificateAuthority.create(str(tmp_path / "ca"))
    node = start_node(tmp_path, write_config(tmp_path, ca))
    try:
        assert node.url.startswith("https://")
        assert plain_http_refused(f"http://127.0.0.1:{node.http_port}/healthz")
        assert plain_http_refused(f"http://127.0.0.1:{node.controller_port}/controller/v1/status")
        assert f"controller https://127.0.0.1:{node.controller_port}" in node.output   # the ready line

        r = kraftlog("topic", "create", "tls-t", "--partitions", "2", "--bootstrap", node.url,
                     "--ca-file", ca.cert_path, env={"KRAFTLOG_CA_FILE": ""})
        assert r.returncode == 0, r.stderr
        r = kraftlog("produce", "tls-t", "--bootstrap", node.url, "--ca-file", ca.cert_path,
                     input="".join(f"r{i}\n" for i in range(20)), env={"KRAFTLOG_CA_FILE": ""})
        assert r.returncode == 0, r.stderr
        r = kraftlog("consume", "tls-t", "--from-beginning", "--max-records", "20", "--bootstrap", node.url,
                     env={"KRAFTLOG_CA_FILE": ca.cert_path})
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.split()) == sorted(f"r{i}" for i in range(20))
        r = kraftlog("topic", "list", "--bootstrap", node.url, env={"KRAFTLOG_CA_FILE": ""})
        assert r.returncode != 0 and "--ca-file" in r.stderr, r.stderr

        # expiry of the served certificate, for alerts
        leaf = x509.load_pem_x509_certificate((tmp_path / "node.pem").read_bytes())
        [line] = metric(node.url, ca.cert_path, "kraftlog_tls_certificate_expiry_timestamp_seconds{")
        assert f'serial="{leaf.serial_number:x}"' in line and 'listener="broker"' in line
        assert float(line.rsplit(" ", 1)[1]) == leaf.not_valid_after_utc.timestamp()
    finally:
        node.stop()


def test_certificate_rotation_under_load_with_no_failed_request(tmp_path):
    ca = CertificateAuthority.create(str(tmp_path / "ca"))
    node = start_node(tmp_path, write_config(tmp_path, ca, client_auth="requested", reload_ms=300))
    cert, key = tmp_path / "node.pem", tmp_path / "node-key.pem"

    def rotate(cn: str = "broker-1", foreign_key: bool = False) -> int:
        new = ca.issue(cn, HOSTS, str(tmp_path / "new.pem"), str(tmp_path / "new-key.pem"))
        if foreign_key:   # the key of another certificate: a bad pair
            ca.issue(cn, HOSTS, str(tmp_path / "other.pem"), str(tmp_path / "new-key.pem"))
        os.replace(tmp_path / "new.pem", cert)
        os.replace(tmp_path / "new-key.pem", key)
        return new.serial_number

    async def scenario():
        ctx = tls.client_context(ca_file=ca.cert_path)
        errors: list = []
        acked = 0
        handshakes = 0
        stop = asyncio.Event()

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
            async with AdminClient(node.url, session=session) as admin:
                await admin.create_topic("rot", 1, 1)

            async def produce():   # keep-alive connections, acks=all
                nonlocal acked
                async with Producer(node.url, acks="all", linger_ms=2, session=session) as p:
                    while not stop.is_set():
                        futures = [await p.send("rot", f"v{acked + i}".encode()) for i in range(20)]
                        for f in futures:
                            try:
                                await f
                                acked += 1
                            except Exception as e:   # noqa: BLE001 - counted, the test fails on it
                                errors.append(e)

            async def new_connections():   # a fresh TLS handshake per request
                nonlocal handshakes
                while not stop.is_set():
                    try:
                        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
                            async with s.get(node.url + "/v1/metadata") as r:
                                assert r.status == 200, r.status
                                handshakes += 1
                    except Exception as e:   # noqa: BLE001
                        errors.append(e)
                    await asyncio.sleep(0.02)

            loop = asyncio.get_running_loop()

            async def until(pred, timeout, what):
                deadline = loop.time() + timeout
                while not await asyncio.to_thread(pred):
                    assert loop.time() < deadline, f"timed out waiting for {what}"
                    await asyncio.sleep(0.1)

            async def rotations():
                port, ca_file = node.http_port, ca.cert_path
                await until(lambda: acked > 50, 30, "the producer to get going")
                # 1. SIGHUP (to the supervisor, which forwards it to the broker and the controller)
                with_sighup = rotate()
                node.proc.send_signal(signal.SIGHUP)
                await until(lambda: served_serial(port, ca_file) == with_sighup, 20, "the SIGHUP reload")
                # 2. the file check alone (no signal)
                by_mtime = rotate()
                await until(lambda: served_serial(port, ca_file) == by_mtime, 20, "the mtime reload")
                # 3. a bad pair: the served certificate stays, the failure is logged
                failed_before = node.output.count("keeping the current certificate")
                rotate(foreign_key=True)
                await until(lambda: node.output.count("keeping the current certificate") > failed_before, 20,
                            "the bad pair to be refused")
                for _ in range(3):
                    assert await asyncio.to_thread(served_serial, port, ca_file) == by_mtime
                # 4. a good pair again
                fixed = rotate()
                await until(lambda: served_serial(port, ca_file) == fixed, 20, "the reload after the bad pair")
                count_at_fix = acked
                await until(lambda: acked > count_at_fix + 50 and handshakes > 20, 30, "more load after rotations")

            tasks = [asyncio.create_task(produce()), asyncio.create_task(new_connections())]
            try:
                await rotations()
            finally:
                stop.set()
                await asyncio.wait(tasks, timeout=30)
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            return errors, acked, handshakes

    try:
        errors, acked, handshakes = asyncio.run(scenario())
        assert errors == [], errors[:5]
        assert acked > 100 and handshakes > 20
        assert node.proc.poll() is None
        failed = [line for line in node.output.splitlines() if "keeping the current certificate" in line]
        assert failed and str(tmp_path / "node-key.pem") in failed[-1]   # says which files to fix
        for listener in ("broker", "controller"):   # the supervisor forwarded SIGHUP to both
            assert any(f"TLS {listener}: certificate reloaded (SIGHUP)" in line for line in node.output.splitlines())
        [ok] = metric(node.url, ca.cert_path, 'kraftlog_tls_certificate_reloads_total{listener="broker",result="ok"}')
        assert float(ok.rsplit(" ", 1)[1]) >= 3
    finally:
        node.stop()


def test_client_certificate_required_refuses_a_client_without_one(tmp_path):
    ca = CertificateAuthority.create(str(tmp_path / "ca"))
    node = start_node(tmp_path, write_config(tmp_path, ca, client_auth="required"))
    ca.issue("alice", None, str(tmp_path / "alice.pem"), str(tmp_path / "alice-key.pem"))

    async def list_topics(ctx):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            async with AdminClient(node.url, session=s) as admin:
                return await admin.list_topics()

    try:
        # the node itself is up: its broker reached the controller with its own certificate
        with pytest.raises(KraftlogError) as e:     # the handshake is refused: no HTTP answer at all
            asyncio.run(list_topics(tls.client_context(ca_file=ca.cert_path)))
        assert e.value.code is ErrorCode.BROKER_NOT_AVAILABLE
        ctx = tls.client_context(ca_file=ca.cert_path, cert_file=str(tmp_path / "alice.pem"),
                                 key_file=str(tmp_path / "alice-key.pem"))
        assert asyncio.run(list_topics(ctx)) == []
    finally:
        node.stop()
