"""Replicated clusters the way operators start them: `kraftlog cluster up --nodes 3` gives
replicated topics by default and survives kill -9 of a broker; the multi-machine example
configs (deploy/examples/3-node) start a working 3-node cluster (here on loopback)."""
import json
import os
import signal
import subprocess
import sys
import time
import tomllib

import pytest

from deploy.local_node import ROOT, free_port
from tests.rigs.cluster import http

pytestmark = pytest.mark.integration

EXAMPLES = os.path.join(ROOT, "deploy", "examples", "3-node")


def kraftlog(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=timeout, cwd=ROOT)


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = pred()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {last!r}")


def write_until_ok(url, topic, value, timeout=20):
    return wait_for(lambda: http("POST", f"{url}/v1/topics/{topic}/records?acks=all",
                                 {"records": [{"value": value}]}, timeout=5)[0] == 200, timeout, "a write")


def test_cluster_up_is_replicated_and_survives_a_broker_kill(tmp_path):
    for attempt in range(5):   # base+i, base+1000+i, base+2000+i must all be free
        data = str(tmp_path / f"c{attempt}")
        base = free_port()
        while base + 2003 > 65535:
            base = free_port()
        r = kraftlog("cluster", "up", "--nodes", "3", "--data-dir", data, "--base-port", str(base))
        if "is in use" not in r.stderr:
            break
    assert r.returncode == 0, r.stderr
    urls = r.stdout.split()
    try:
        status, topic = http("POST", urls[0] + "/v1/topics", {"name": "dflt", "partitions": 1})
        assert status == 201, topic
        p = topic["partitions"][0]
        assert len(p["replicas"]) == 3          # replicated without asking
        wait_for(lambda: len(http("GET", urls[0] + "/v1/topics/dflt")[1]["partitions"][0]["isr"]) == 3, 20,
                 "full ISR")
        status, doc = http("POST", urls[0] + "/v1/topics/dflt/records?acks=all",
                           {"records": [{"value": f"v{i}"} for i in range(10)]})
        assert status == 200, doc
        procs = json.loads(kraftlog("cluster", "status", "--data-dir", data, "--output", "json").stdout)
        victim = next(x for x in procs if x["role"] == "broker" and x["node_id"] == p["leader"])
        os.kill(victim["pid"], signal.SIGKILL)
        other = next(u for i, u in enumerate(urls, 1) if i != p["leader"])
        write_until_ok(other, "dflt", "after")
        desc = http("GET", other + "/v1/topics/dflt")[1]["partitions"][0]
        assert desc["leader"] != p["leader"] and p["leader"] not in desc["isr"]
        status, got = http("GET", f"{urls[desc['leader'] - 1]}/v1/topics/dflt/partitions/0/records?offset=0")
        assert [x["value"] for x in got["records"]] == [f"v{i}" for i in range(10)] + ["after"]
    finally:
        kraftlog("cluster", "down", "--data-dir", data)


def test_example_configs_start_a_replicated_cluster(tmp_path):
    """deploy/examples/3-node/node*.toml, with loopback addresses, free ports and tmp dirs
    substituted for the machine-specific values."""
    ports = {i: (free_port(), free_port(), free_port()) for i in (1, 2, 3)}   # http, controller, raft
    voters = ",".join(f"{i}@127.0.0.1:{ports[i][2]}:{ports[i][1]}" for i in (1, 2, 3))
    procs, urls = [], []
    try:
        for i in (1, 2, 3):
            with open(os.path.join(EXAMPLES, f"node{i}.toml"), "rb") as f:
                cfg = tomllib.load(f)
            assert cfg["node_id"] == i and cfg["default_replication_factor"] == 3
            cfg.update(http_host="127.0.0.1", advertised_host="127.0.0.1", http_port=ports[i][0],
                       controller_port=ports[i][1], raft_port=ports[i][2], controller_quorum_voters=voters,
                       data_dir=str(tmp_path / f"n{i}"), log_dirs=[str(tmp_path / f"n{i}" / "logs")])
            path = tmp_path / f"node{i}.toml"
            path.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in cfg.items()) + "\n")
            log = open(tmp_path / f"node{i}.log", "wb")
            procs.append(subprocess.Popen([sys.executable, "-m", "deploy.cli", "serve", "--config", str(path)],
                                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=log,
                                          stderr=subprocess.STDOUT))
            urls.append(f"http://127.0.0.1:{ports[i][0]}")
        def ready():
            for i, p in enumerate(procs, 1):
                if p.poll() is not None:
                    raise AssertionError(f"node {i} exited with {p.returncode}:\n"
                                         + (tmp_path / f"node{i}.log").read_text()[-3000:])
            return all(http("GET", u + "/healthz", timeout=2)[0] == 200 for u in urls)
        try:
            wait_for(ready, 60, "3 ready brokers")
        except AssertionError as e:
            logs = "\n".join(f"--- node{i}.log\n" + (tmp_path / f"node{i}.log").read_text()[-2000:] for i in (1, 2, 3))
            raise AssertionError(f"{e}\n{logs}") from None
        status, topic = http("POST", urls[0] + "/v1/topics", {"name": "ex", "partitions": 3})
        assert status == 201 and all(len(q["replicas"]) == 3 for q in topic["partitions"]), topic
        write_until_ok(urls[1], "ex", "hello")
        meta = http("GET", urls[2] + "/v1/metadata")[1]
        assert sorted(b["id"] for b in meta["brokers"] if not b["fenced"]) == [1, 2, 3]
        assert {b["rack"] for b in meta["brokers"]} == {"rack-1", "rack-2", "rack-3"}
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                p.kill()
