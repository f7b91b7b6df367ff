"""Clients pass credentials (issue 16): the Python producer, consumer and admin client, the
`kraftlog` CLI (--user/--password-file/--token-file and $KRAFTLOG_*), and the Spark
source/sink's HTTP client (kraftlog.user/password/token), against a broker with
authentication and ACLs on."""
from __future__ import annotations

import asyncio
import os
import sys

import pytest
from broker_harness import running_broker
from fake_controller import FakeControllerClient
from test_auth_routes import ALICE_TOKEN, SECURE, SecurityHolder, acl

from http_api.broker.app import BROKER_KEY
from http_api.client import AdminClient, Consumer, Producer
from partitions.errors import ErrorCode, KraftlogError
from pipelines.client import BrokerError, Cluster
from pipelines.options import ClientSecurity, OptionError, parse_sink_options

PASSWORD = "alice-pw"


@pytest.fixture
async def secure(tmp_path, monkeypatch):
    for name in ("KRAFTLOG_USER", "KRAFTLOG_PASSWORD", "KRAFTLOG_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    holder = SecurityHolder()
    async with running_broker(tmp_path, FakeControllerClient(), 1, **SECURE) as h:
        ctx = h.client.app[BROKER_KEY]
        ctx.authenticator.image = ctx.authorizer.security_image = holder.get
        holder.grant(acl("User:alice", "ALL", "TOPIC", "orders"), acl("User:alice", "CREATE", "CLUSTER"),
                     acl("User:alice", "IDEMPOTENT_WRITE", "CLUSTER"))
        url = str(h.client.make_url("")).rstrip("/")
        async with AdminClient(url, user="admin", password="admin-pw") as admin:
            await admin.create_topic("orders", 1, 1)
            await admin.create_topic("secret", 1, 1)
        yield h, url


async def test_python_clients_authenticate_with_user_password_or_token(secure):
    _, url = secure
    async with Producer(url, user="alice", password=PASSWORD, linger_ms=0) as p:
        md = await (await p.send("orders", b"v1"))
        assert md.offset == 0
    async with Producer(url, token=ALICE_TOKEN, linger_ms=0, enable_idempotence=False) as p:
        assert (await (await p.send("orders", b"v2"))).offset == 1
    c = Consumer(url, user="alice", password=PASSWORD, auto_offset_reset="earliest")
    try:
        c.assign([("orders", 0)])
        got = []
        for _ in range(20):
            got += [r.value for r in await c.poll(200)]
            if len(got) >= 2:
                break
        assert got == [b"v1", b"v2"]
    finally:
        await c.close()
    async with AdminClient(url, user="alice", password=PASSWORD) as admin:
        assert await admin.list_topics() == ["orders"]       # secret is not hers to describe
    async with AdminClient(url, user="alice", password="wrong") as admin:
        with pytest.raises(KraftlogError) as e:
            await admin.list_topics()
        assert e.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
    async with AdminClient(url) as admin:                       # no credentials at all
        with pytest.raises(KraftlogError) as e:
            await admin.list_topics()
        assert e.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED


async def test_python_clients_read_credentials_from_the_environment(secure, monkeypatch):
    _, url = secure
    monkeypatch.setenv("KRAFTLOG_USER", "alice")
    monkeypatch.setenv("KRAFTLOG_PASSWORD", PASSWORD)
    async with AdminClient(url) as admin:
        assert await admin.list_topics() == ["orders"]
    monkeypatch.delenv("KRAFTLOG_PASSWORD")
    with pytest.raises(KraftlogError) as e:
        AdminClient(url)
    assert "--password-file" in e.value.message


async def _kraftlog(*args, env_extra=None, stdin=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KRAFTLOG_")}
    env.update(env_extra or {})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deploy.cli", *args, env=env, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_cli_takes_user_password_file_token_file_and_env(secure, tmp_path):
    _, url = secure
    pw = tmp_path / "alice.password"
    pw.write_text(PASSWORD + "\n")
    tok = tmp_path / "alice.token"
    tok.write_text(ALICE_TOKEN + "\n")
    rc, out, err = await _kraftlog("topic", "list", "--bootstrap", url, "--user", "alice", "--password-file", str(pw))
    assert rc == 0 and out.split() == ["orders"], (out, err)
    rc, out, err = await _kraftlog("produce", "orders", "--bootstrap", url, "--token-file", str(tok), stdin=b"a\nb\n")
    assert rc == 0, err
    rc, out, err = await _kraftlog("topic", "list", "--bootstrap", url,
                                   env_extra={"KRAFTLOG_USER": "alice", "KRAFTLOG_PASSWORD": PASSWORD})
    assert rc == 0 and out.split() == ["orders"], (out, err)
    rc, out, err = await _kraftlog("topic", "list", "--bootstrap", url)
    assert rc != 0 and "SASL_AUTHENTICATION_FAILED" in err, (out, err)
    rc, out, err = await _kraftlog("topic", "list", "--bootstrap", url, "--user", "alice")
    assert rc != 0 and "--password-file" in err, (out, err)


async def test_spark_client_passes_credentials(secure):
    _, url = secure
    loop = asyncio.get_running_loop()
    sink = parse_sink_options({"kraftlog.bootstrap.servers": url, "kraftlog.user": "alice",
                               "kraftlog.password": PASSWORD})
    assert "alice-pw" not in repr(sink)
    ok = Cluster([url], security=sink.security)
    res = await loop.run_in_executor(None, lambda: ok.produce_records("orders", 0, [{"value": b"s"}]))
    assert res["offsets"][0]["offset"] >= 0
    tok = Cluster([url], security=ClientSecurity(token=ALICE_TOKEN))
    assert (await loop.run_in_executor(None, lambda: tok.fetch("orders", 0, 0, 1 << 20)))["batches"]
    for cluster in (Cluster([url]), Cluster([url], security=ClientSecurity(user="alice", password="no"))):
        with pytest.raises(BrokerError) as e:
            await loop.run_in_executor(None, lambda c=cluster: c.produce_records("orders", 0, [{"value": b"s"}]))
        assert e.value.status == 401 and e.value.error_code == "SASL_AUTHENTICATION_FAILED"
    with pytest.raises(OptionError):
        parse_sink_options({"kraftlog.bootstrap.servers": url, "kraftlog.user": "alice"})
