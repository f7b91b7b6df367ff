"""TLS cost benchmark: produce throughput at RF=3 acks=all, TLS on every listener vs
plaintext, two 3-node clusters (combined nodes: controller + broker processes) up in the
same run, rounds alternated A/B so load from elsewhere hits both alike. Besides records/s,
the CPU time the cluster's processes and the client spent per record: on a machine shared
with other work, throughput moves with their load; the CPU cost per record much less.

The TLS cluster has TLS only (no authentication: that cost is measured apart): broker and
controller listeners, replica fetches and broker -> controller calls over TLS with client
certificates requested (brokers present theirs). The client keeps its connections alive,
as producers do. Goal (issue 16): TLS >= 70% of plaintext.

    python -m bench.tls_bench [--seconds S] [--rounds R] [--concurrency C]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

import aiohttp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from deploy.certs import CertificateAuthority, ensure_node_certificate  # noqa: E402
from deploy.config import NodeConfig  # noqa: E402
from deploy.local_node import free_port  # noqa: E402
from deploy.supervisor import broker_command, client_ssl_context, controller_command, http_ok, spawn  # noqa: E402
from http_api.wire import codecs, tls  # noqa: E402
from partitions.log import record_batch as rb  # noqa: E402

RECORD_BYTES = 100
RECORDS_PER_BATCH = 1000
PARTITIONS = 3
NODES = 3


class BenchCluster:
    """NODES combined nodes (controller + broker processes) on free ports, TLS or not."""

    def __init__(self, base_dir: str, use_tls: bool) -> None:
        self.base_dir, self.use_tls = base_dir, use_tls
        ports = {i: (free_port(), free_port(), free_port()) for i in range(1, NODES + 1)}
        voters = ",".join(f"{i}@127.0.0.1:{r}:{c}" for i, (_, c, r) in ports.items())
        ca = CertificateAuthority.create(base_dir) if use_tls else None
        self.ca_file = ca.cert_path if ca is not None else None
        self.cfgs = []
        for i, (http_port, controller_port, raft_port) in ports.items():
            node_dir = os.path.join(base_dir, f"node-{i}")
            sec = {}
            if ca is not None:
                cert, key = ensure_node_certificate(ca, node_dir, f"broker-{i}", ["127.0.0.1", "localhost"])
                sec = dict(tls_cert_file=cert, tls_key_file=key, tls_ca_file=ca.cert_path,
                           tls_client_auth="requested")
            self.cfgs.append(NodeConfig.from_dict(dict(
                node_id=i, data_dir=node_dir, http_port=http_port, controller_port=controller_port,
                raft_port=raft_port, cluster_id="tls-bench", controller_quorum_voters=voters,
                password="tls-bench-secret", default_replication_factor=3, min_insync_replicas=2,
                log_level="WARNING", **sec), source="tls bench"))
        self.procs = []

    @property
    def urls(self) -> list[str]:
        return [c.broker_url for c in self.cfgs]

    def start(self, timeout: float = 90.0) -> "BenchCluster":
        env = {"KRAFTLOG_RAFT_PASSWORD": "tls-bench-secret"}
        for cfg in self.cfgs:
            os.makedirs(cfg.data_dir, exist_ok=True)
            self.procs.append(spawn(controller_command(cfg), env, os.path.join(cfg.data_dir, "controller.log")))
        for cfg in self.cfgs:
            self.procs.append(spawn(broker_command(cfg), env, os.path.join(cfg.data_dir, "broker.log")))
        ctx = client_ssl_context(self.cfgs[0])
        deadline = time.monotonic() + timeout
        while not all(http_ok(c.broker_url + "/healthz", ssl_context=ctx) for c in self.cfgs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.stop()
                raise RuntimeError(f"cluster under {self.base_dir} did not start; see node-*/*.log there")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait(10)
        self.procs = []

    def cpu_seconds(self) -> float:
        """user + system CPU time of the cluster's processes so far."""
        total = 0
        for p in self.procs:
            try:
                with open(f"/proc/{p.pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])   # utime, stime (clock ticks)
            except OSError:
                pass
        return total / os.sysconf("SC_CLK_TCK")

    def client_ssl(self):
        return tls.client_context(ca_file=self.ca_file) if self.use_tls else None

    async def create_topic(self, session: aiohttp.ClientSession, name: str) -> dict[int, str]:
        """-> partition -> leader URL, once every partition has its 3 replicas in sync."""
        async with session.post(self.urls[0] + "/v1/topics", json={
                "name": name, "partitions": PARTITIONS, "replication_factor": 3, "configs": {}}) as r:
            assert r.status == 201, await r.text()
        deadline = time.monotonic() + 60
        while True:
            async with session.get(self.urls[0] + f"/v1/topics/{name}") as r:
                doc = await r.json()
            parts = doc.get("partitions", [])
            if len(parts) == PARTITIONS and all(len(p["isr"]) == 3 for p in parts):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not in sync within 60 s: {doc}")
            await asyncio.sleep(0.2)
        async with session.get(self.urls[0] + "/v1/metadata") as r:
            md = await r.json()
        urls = {b["id"]: b["url"] for b in md["brokers"]}
        return {p["partition"]: urls[p["leader"]] for p in parts}


async def produce_round(session: aiohttp.ClientSession, leaders: dict[int, str], topic: str, seconds: float,
                        concurrency: int) -> tuple[float, int]:
    """(records/s, records) of raw-batch acks=all produce to the leaders, `concurrency` requests in flight."""
    batch = rb.build_batch([rb.Record(None, b"x" * RECORD_BYTES) for _ in range(RECORDS_PER_BATCH)])
    done = 0
    stop_at = time.monotonic() + seconds

    async def worker(i: int) -> None:
        nonlocal done
        p = i % PARTITIONS
        while time.monotonic() < stop_at:
            async with session.post(f"{leaders[p]}/v1/topics/{topic}/partitions/{p}/records?acks=all", data=batch,
                                    headers={"Content-Type": codecs.RAW_BATCH}) as r:
                body = await r.read()
            if r.status != 200:
                raise RuntimeError(f"produce answered {r.status}: {body[:200]!r}")
            done += RECORDS_PER_BATCH

    t0 = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return done / (time.monotonic() - t0), done


async def run(seconds: float, rounds: int, concurrency: int, base: str) -> tuple[dict, dict]:
    plain = BenchCluster(os.path.join(base, "plain"), use_tls=False)
    secure = BenchCluster(os.path.join(base, "tls"), use_tls=True)
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpu_us: dict[bool, list[float]] = {False: [], True: []}   # cluster + client CPU microseconds per record
    client_us: dict[bool, list[float]] = {False: [], True: []}   # the client's part
    try:
        plain.start()
        secure.start()
        sessions, leaders = {}, {}
        for c in (plain, secure):
            ctx = c.client_ssl()
            sessions[c.use_tls] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=ctx if ctx is not None else True))
            leaders[c.use_tls] = await c.create_topic(sessions[c.use_tls], "bench")
        for c in (plain, secure):   # warm-up: connections, segments, fetch sessions
            await produce_round(sessions[c.use_tls], leaders[c.use_tls], "bench", 1.0, concurrency)
        for r in range(rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for use_tls in order:
                c = secure if use_tls else plain
                cluster0, client0 = c.cpu_seconds(), time.process_time()
                rate, n = await produce_round(sessions[use_tls], leaders[use_tls], "bench", seconds, concurrency)
                client = (time.process_time() - client0) / max(n, 1) * 1e6
                us = (c.cpu_seconds() - cluster0) / max(n, 1) * 1e6 + client
                rates[use_tls].append(rate)
                cpu_us[use_tls].append(us)
                client_us[use_tls].append(client)
                print(f"  round {r + 1} {'TLS      ' if use_tls else 'plaintext'}: {rate:>10,.0f} records/s, "
                      f"{us:.2f} us CPU per record ({client:.2f} of them in the client)", flush=True)
        for s in sessions.values():
            await s.close()
    finally:
        plain.stop()
        secure.stop()
    return rates, cpu_us


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tls_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="length of one measured round")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per mode, alternated")
    ap.add_argument("--concurrency", type=int, default=6, help="produce requests in flight")
    args = ap.parse_args(argv)
    base = tempfile.mkdtemp(prefix="kraftlog-tls-bench-")
    try:
        print(f"RF=3 acks=all produce, {RECORDS_PER_BATCH} x {RECORD_BYTES} B records per request, "
              f"{PARTITIONS} partitions, {args.concurrency} requests in flight, {args.rounds} x {args.seconds:g} s "
              "per mode", flush=True)
        rates, cpu_us = asyncio.run(run(args.seconds, args.rounds, args.concurrency, base))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    plain, secure = rates[False], rates[True]
    p, t = statistics.median(plain), statistics.median(secure)
    print(f"plaintext median {p:,.0f} records/s ({p * RECORD_BYTES / 1e6:.1f} MB/s of values)")
    print(f"TLS       median {t:,.0f} records/s ({t * RECORD_BYTES / 1e6:.1f} MB/s of values)")
    pairs = [b / a for a, b in zip(plain, secure)]   # each round's two modes ran back to back
    print(f"TLS / plaintext = {t / p:.0%} (medians); per round {', '.join(f'{r:.0%}' for r in pairs)}, "
          f"median {statistics.median(pairs):.0%} (goal >= 70%; the machine's load moves single rounds)")
    cp, ct = statistics.median(cpu_us[False]), statistics.median(cpu_us[True])
    print(f"CPU per record (cluster + client, medians): plaintext {cp:.2f} us, TLS {ct:.2f} us: "
          f"on CPU-bound hardware TLS would reach {cp / ct:.0%} of plaintext's throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
