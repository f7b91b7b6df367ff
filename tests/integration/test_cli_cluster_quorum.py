"""`kraftlog cluster add-controller` and `kraftlog quorum describe|remove-controller` on a local
2-node cluster: the added controller joins the quorum, `cluster status` lists it, a removed
controller stops by itself, metadata writes go on, `cluster down` stops the added one, and
`cluster up` restarts it but not the removed one (cluster.json)."""
import glob
import json
import os
import time

import pytest

from deploy.cluster import CONTROLLER_PORT_OFFSET, RAFT_PORT_OFFSET, alive, load_state
from tests.integration.test_cli_cluster import free_base_port, kraftlog  # the local-cluster tests' CLI runner and port picker

# ~15 CLI processes and two cluster starts: 581 s at load 32 on 2 shared cores (default: 300 s)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _wait_dead(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def _why(r, data: str) -> str:
    """A failed CLI call's stderr and the last lines of every node's logs (what exited, and why)."""
    out = [r.stderr]
    for path in sorted(glob.glob(os.path.join(data, "node-*", "*.log"))):
        with open(path, errors="replace") as f:
            out.append(f"--- {path}:\n" + "".join(f.readlines()[-15:]))
    return "\n".join(out)


def test_cluster_add_controller_then_remove_one(tmp_path):
    data = str(tmp_path / "c")
    base = free_base_port(3)   # nodes 1-2 and controller 3's ports
    kafka_base = free_base_port(2, offsets=(0,))
    while kafka_base in range(base - 2, base + RAFT_PORT_OFFSET + 3):
        kafka_base = free_base_port(2, offsets=(0,))
    r = kraftlog("cluster", "up", "--nodes", "2", "--data-dir", data, "--base-port", str(base),
                 "--kafka-base-port", str(kafka_base))
    try:
        assert r.returncode == 0, _why(r, data)
        boot = r.stdout.split()[0]
        r = kraftlog("cluster", "add-controller", "--data-dir", data)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [f"http://127.0.0.1:{base + CONTROLLER_PORT_OFFSET + 2}"]
        r = kraftlog("quorum", "describe", "--output", "json", "--bootstrap", boot)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert [v["id"] for v in doc["voters"]] == [1, 2, 3] and doc["leader_id"] in (1, 2, 3)
        assert doc["voters"][2]["address"] == f"127.0.0.1:{base + RAFT_PORT_OFFSET + 2}"
        r = kraftlog("cluster", "status", "--data-dir", data, "--output", "json")
        assert (3, "controller") in {(p["node_id"], p["role"]) for p in json.loads(r.stdout)}
        r = kraftlog("quorum", "describe", "--bootstrap", boot)   # the text form
        assert r.returncode == 0 and "leader:" in r.stdout and "127.0.0.1" in r.stdout, r.stdout

        pid1 = next(p["pid"] for p in load_state(data)["processes"] if p["node_id"] == 1 and p["role"] == "controller")
        r = kraftlog("quorum", "remove-controller", "1", "--bootstrap", boot)
        assert r.returncode == 0, r.stderr
        assert _wait_dead(pid1, 30), "the removed controller did not stop"
        r = kraftlog("topic", "create", "after", "--partitions", "1", "--bootstrap", boot)
        assert r.returncode == 0, r.stderr
        r = kraftlog("quorum", "describe", "--output", "json", "--bootstrap", boot)
        assert [v["id"] for v in json.loads(r.stdout)["voters"]] == [2, 3]
        pid3 = next(p["pid"] for p in load_state(data)["processes"] if p["node_id"] == 3)
    finally:
        down = kraftlog("cluster", "down", "--data-dir", data)
    assert down.returncode == 0, down.stderr
    assert not alive(pid3)
    assert os.path.exists(os.path.join(data, "node-3", "controller.log"))
    assert load_state(data)["removed_controllers"] == [1]

    r = kraftlog("cluster", "up", "--nodes", "2", "--data-dir", data, "--base-port", str(base))
    try:
        assert r.returncode == 0, _why(r, data)
        r = kraftlog("cluster", "status", "--data-dir", data, "--output", "json")
        assert {(p["node_id"], p["role"]) for p in json.loads(r.stdout)} == {
            (1, "broker"), (2, "broker"), (2, "controller"), (3, "controller")}
        r = kraftlog("topic", "create", "after-up", "--partitions", "1", "--bootstrap", boot)
        assert r.returncode == 0, r.stderr   # a metadata write needs the restarted controller 3
        r = kraftlog("quorum", "describe", "--output", "json", "--bootstrap", boot)
        assert r.returncode == 0, r.stderr
        assert [v["id"] for v in json.loads(r.stdout)["voters"]] == [2, 3]
    finally:
        down = kraftlog("cluster", "down", "--data-dir", data)
    assert down.returncode == 0, down.stderr
