"""--raft-bind-host: the raft port listens on one interface while the voters entry (the
address other controllers dial) names another, e.g. a proxy or NAT in front of it."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

from tests.rigs.controllers import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _start(tmp_path, name, extra):
    raft, http = free_port(), free_port()
    cmd = [sys.executable, "-m", "metadata_quorum.controller_server", "--node-id", "1",
           "--data-dir", str(tmp_path / name), "--http-host", "127.0.0.1", "--http-port", str(http),
           "--voters", f"1@127.0.0.2:{raft}:{http}", "--log-level", "WARNING"] + extra
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/controller/v1/status", timeout=0.5):
                    break
            except OSError:
                assert proc.poll() is None, f"controller exited with {proc.returncode}"
                assert time.monotonic() < deadline, "controller API not up within 30 s"
                time.sleep(0.1)
        deadline = time.monotonic() + 10
        while not (_accepts("127.0.0.1", raft) or _accepts("127.0.0.2", raft)) and time.monotonic() < deadline:
            time.sleep(0.1)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, raft


def test_raft_listens_only_on_the_bind_host(tmp_path):
    proc, raft = _start(tmp_path, "bound", ["--raft-bind-host", "127.0.0.1"])
    try:
        assert _accepts("127.0.0.1", raft)
        assert not _accepts("127.0.0.2", raft)   # free for a proxy at the advertised address
    finally:
        proc.kill()
        proc.wait()


def test_without_it_raft_listens_on_every_interface(tmp_path):
    proc, raft = _start(tmp_path, "all", [])
    try:
        assert _accepts("127.0.0.1", raft) and _accepts("127.0.0.2", raft)
    finally:
        proc.kill()
        proc.wait()
