"""Authentication cost benchmark (issue 16): single-record produce to a plaintext node vs a
node with HTTP Basic authentication and the ACL authorizer on, same run.

Two real `kraftlog serve` nodes on this machine: one without [security], one with
`authentication = ["basic"]`, `authorizer = "acl"` and a user `bench` allowed WRITE on the
topic (a plain user, so every request pays the Basic check from the cache and an ACL
decision, not the super-user shortcut). Runs alternate between the nodes so machine noise
hits both alike. Printed (not asserted): requests/s of each, the cost of authentication as
1 - secured/plaintext (goal <= 5%), and the in-process cost of one cached Basic check plus
the ACL decision in microseconds.

    python -m bench.auth_bench [--seconds S] [--concurrency C] [--rounds R]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import types

import aiohttp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from deploy.local_node import LocalNode  # noqa: E402
from http_api.wire.auth import basic_header  # noqa: E402

ADMIN_PASSWORD = "bench-admin-password"
USER, PASSWORD = "bench", "bench-user-password"
TOPIC = "bench"
RECORD = json.dumps({"records": [{"value": "x" * 100}]}).encode()


def secure_config(tmp: str) -> str:
    users = os.path.join(tmp, "bootstrap-users.json")
    with open(users, "w") as f:
        json.dump({"admin": ADMIN_PASSWORD}, f)
    path = os.path.join(tmp, "secure.toml")
    with open(path, "w") as f:
        f.write("[security]\nauthentication = [\"basic\"]\nauthorizer = \"acl\"\n"
                f"super_users = [\"User:admin\"]\nbootstrap_users_file = \"{users}\"\n")
    return path


async def produce_loop(session: aiohttp.ClientSession, url: str, headers: dict, seconds: float,
                       concurrency: int) -> float:
    """Single-record JSON produce (acks=1) from `concurrency` workers; -> requests/s."""
    stop_at = time.perf_counter() + seconds
    ok = errors = 0

    async def worker():
        nonlocal ok, errors
        while time.perf_counter() < stop_at:
            async with session.post(url, data=RECORD, headers=headers) as r:
                await r.read()
                if r.status == 200:
                    ok += 1
                else:
                    errors += 1
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    if errors:
        print(f"  ({errors} failed requests to {url})", file=sys.stderr)
    return ok / (time.perf_counter() - t0)


async def setup_secure(session: aiohttp.ClientSession, base: str) -> None:
    admin = {"Authorization": basic_header("admin", ADMIN_PASSWORD)}
    deadline = time.monotonic() + 30
    while True:   # the active controller writes the bootstrap user shortly after start
        async with session.post(base + "/v1/admin/users", json={"name": USER, "password": PASSWORD},
                                headers=admin) as r:
            if r.status in (201, 409):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"creating the bench user failed: {r.status} {await r.text()}")
        await asyncio.sleep(0.2)
    async with session.post(base + "/v1/admin/acls", headers=admin, json={
            "principal": f"User:{USER}", "resource_type": "TOPIC", "resource_name": TOPIC,
            "operation": "WRITE"}) as r:
        assert r.status == 201, await r.text()
    async with session.post(base + "/v1/topics", headers=admin,
                            json={"name": TOPIC, "partitions": 1, "replication_factor": 1}) as r:
        assert r.status == 201, await r.text()


def in_process_cost(iterations: int = 20_000) -> float:
    """Microseconds per request of a cached Basic check plus the ACL decision (no IO)."""
    from aiohttp.test_utils import make_mocked_request

    from http_api.broker.authorization import BrokerAuthorizer
    from http_api.wire.auth import Authenticator
    from metadata_quorum.security.acl import AclBinding, Operation, PatternType, ResourceType
    from metadata_quorum.security.config import SecurityConfig
    from metadata_quorum.security.scram import make_credential

    img = types.SimpleNamespace(scram_credentials={USER: make_credential(PASSWORD)}, tokens={},
                                acls=(AclBinding(f"User:{USER}", ResourceType.TOPIC, TOPIC, PatternType.LITERAL,
                                                 Operation.WRITE),), version=1)
    sec = SecurityConfig(authentication=("basic",), authorizer="acl", super_users=("User:admin",))
    a = Authenticator(sec, lambda: img)
    az = BrokerAuthorizer(sec, lambda: img)
    req = make_mocked_request("POST", f"/v1/topics/{TOPIC}/records",
                              headers={"Authorization": basic_header(USER, PASSWORD)})
    a.authenticate(req)   # the one PBKDF2; then the cache
    t0 = time.perf_counter()
    for _ in range(iterations):
        principal = a.authenticate(req)
        az.require(principal, Operation.WRITE, ResourceType.TOPIC, TOPIC)
    return (time.perf_counter() - t0) / iterations * 1e6


async def run(seconds: float, concurrency: int, rounds: int) -> list[tuple[str, str]]:
    tmp = tempfile.mkdtemp(prefix="kraftlog-auth-bench-")
    plain = secure = None
    try:
        plain = LocalNode(os.path.join(tmp, "plain"), extra_args=["--log-level", "WARNING"]).start()
        secure = LocalNode(os.path.join(tmp, "secure"),
                           extra_args=["--log-level", "WARNING", "--config", secure_config(tmp)]).start()
        conn = aiohttp.TCPConnector(limit=concurrency * 2)
        async with aiohttp.ClientSession(connector=conn) as s:
            async with s.post(plain.url + "/v1/topics",
                              json={"name": TOPIC, "partitions": 1, "replication_factor": 1}) as r:
                assert r.status == 201, await r.text()
            await setup_secure(s, secure.url)
            targets = ((f"{plain.url}/v1/topics/{TOPIC}/records?acks=1", {"Content-Type": "application/json"}),
                       (f"{secure.url}/v1/topics/{TOPIC}/records?acks=1",
                        {"Content-Type": "application/json", "Authorization": basic_header(USER, PASSWORD)}))
            for url, headers in targets:   # warm up both
                await produce_loop(s, url, headers, 0.5, concurrency)
            rates: tuple[list, list] = ([], [])
            for _ in range(rounds):
                for i, (url, headers) in enumerate(targets):
                    rates[i].append(await produce_loop(s, url, headers, seconds / rounds, concurrency))
        p, q = statistics.median(rates[0]), statistics.median(rates[1])
        paired = statistics.median(b / a for a, b in zip(*rates))   # each round's pair: same noise
        return [
            ("single-record produce, plaintext node (requests/s, median of rounds)", f"{p:,.0f}"),
            ("single-record produce, Basic auth + ACLs (requests/s)", f"{q:,.0f}"),
            ("  per round plaintext / secured", " | ".join(f"{a:,.0f}/{b:,.0f}" for a, b in zip(*rates))),
            ("secured / plaintext ratio (of medians; median of per-round ratios)", f"{q / p:.3f}; {paired:.3f}"),
            ("authentication cost 1 - ratio (goal <= 5%)", f"{100 * (1 - q / p):.1f}%; {100 * (1 - paired):.1f}%"),
            ("cached Basic check + ACL decision in process (us/request)", f"{in_process_cost():.1f}"),
        ]
    finally:
        for node in (secure, plain):
            if node is not None:
                node.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.auth_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=12.0, help="measured seconds per node (split in rounds)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args(argv)
    rows = asyncio.run(run(args.seconds, args.concurrency, args.rounds))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
