"""The raft port's frame guard (raft/frame_guard.py) on real controller processes: a peer
that announces a 2 GiB frame is dropped at once with the controller's memory bounded and
the drop counted; a frame failing the raft password is counted; the quorum keeps working."""
from __future__ import annotations

import os
import socket
import struct
import time
import uuid

import pytest

from tests.rigs.cluster import http
from tests.rigs.controllers import ControllerCluster

pytestmark = pytest.mark.integration

FLOOD_BYTES = 96 * 1024 * 1024     # what the attacker tries to push after its header


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def flood(port: int, header: bytes, limit_s: float = 15.0) -> tuple[int, float]:
    """Send `header`, then zeros until the peer closes (or FLOOD_BYTES / `limit_s`);
    return (bytes sent after the header, seconds until the connection was closed or the limit)."""
    sent = 0
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(header)
        chunk = b"\0" * 65536
        try:
            while sent < FLOOD_BYTES and time.monotonic() - t0 < limit_s:
                sent += s.send(chunk)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            return sent, time.monotonic() - t0
        # all sent (or time out): closed means recv sees EOF or a reset
        try:
            s.settimeout(max(0.1, limit_s - (time.monotonic() - t0)))
            s.recv(1)
        except (ConnectionResetError, socket.timeout):
            pass
        return sent, time.monotonic() - t0


def register(url: str, broker_id: int) -> int:
    status, body = http("POST", url + "/controller/v1/brokers/register",
                        {"broker_id": broker_id, "incarnation_id": uuid.uuid4().hex,
                         "url": f"http://127.0.0.1:{40000 + broker_id}", "rack": None})
    assert status == 200, body
    return status


def test_huge_frame_and_bad_password_are_dropped_counted_and_the_quorum_keeps_working(tmp_path):
    with ControllerCluster(3, str(tmp_path)) as cluster:
        cluster.start_all()
        leader = cluster.wait_active(30)
        victim = leader
        pid = cluster.procs[victim].pid
        url = cluster.voters[victim].url
        raft_port = cluster.voters[victim].raft_port
        register(cluster.voters[leader].url, 1)
        before = cluster.status(victim)
        assert before["raft_frames_too_large"] == 0 and before["raft_auth_failures"] == 0, before
        rss_before = rss_bytes(pid)

        # 1. a 2 GiB frame announced, then a flood: the connection is dropped at once
        sent, elapsed = flood(raft_port, struct.pack("i", 2**31 - 1))
        assert sent < FLOOD_BYTES and elapsed < 10, (sent, elapsed)
        st = wait_for(lambda: (s := cluster.status(victim)) and s["raft_frames_too_large"] >= 1 and s,
                      10, "the oversized frame counted")
        assert st["raft_frames_too_large"] == 1
        grown = rss_bytes(pid) - rss_before
        assert grown < 8 * 1024 * 1024, f"RSS grew by {grown / 2**20:.1f} MiB"

        # 2. a whole frame that fails the raft password's MAC check
        with socket.create_connection(("127.0.0.1", raft_port), timeout=5) as s:
            junk = os.urandom(200)
            s.sendall(struct.pack("i", len(junk)) + junk)
            s.settimeout(5)
            try:
                assert s.recv(1) == b""      # dropped
            except ConnectionResetError:
                pass
        st = wait_for(lambda: (s := cluster.status(victim)) and s["raft_auth_failures"] >= 1 and s,
                      10, "the failed authentication counted")
        assert st["raft_auth_failures"] == 1 and st["raft_frames_too_large"] == 1

        # 3. the quorum keeps working: a write commits and every controller applies it
        active = cluster.wait_active(30)
        register(cluster.voters[active].url, 2)
        offset = cluster.status(active)["metadata_offset"]
        wait_for(lambda: all((s := cluster.status(n)) and s["metadata_offset"] >= offset for n in cluster.procs),
                 20, "every controller applied the write")
        assert cluster.status(victim)["leader_id"] == active and url
