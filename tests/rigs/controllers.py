"""Helpers to run real controller processes (integration tests, benchmarks).

`ControllerCluster(n, base_dir)` picks free ports, starts `n` controller processes with
`python -m metadata_quorum.controller_server`, and can kill -9 / restart them.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import json
from typing import Optional

from metadata_quorum.controller_server import Voter, format_voters
from deploy.ports import free_port  # noqa: F401 - re-exported for the rigs and tests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root


def http_json(url: str, timeout: float = 2.0) -> Optional[dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read())
    except Exception:
        return None


class ControllerCluster:
    def __init__(self, n: int, base_dir: str, password: str = "test-secret", cluster_id: str = "test-cluster",
                 extra_args: Optional[list] = None):
        self.base_dir = base_dir
        self.password = password
        self.cluster_id = cluster_id
        self.extra_args = list(extra_args or [])
        self.voters = {i: Voter(i, "127.0.0.1", free_port(), free_port()) for i in range(1, n + 1)}
        self.procs: dict[int, subprocess.Popen] = {}

    @property
    def urls(self) -> list[str]:
        return [v.url for v in self.voters.values()]

    def start(self, node_id: int) -> None:
        v = self.voters[node_id]
        data_dir = os.path.join(self.base_dir, f"controller-{node_id}")
        os.makedirs(data_dir, exist_ok=True)
        cmd = [sys.executable, "-m", "metadata_quorum.controller_server", "--node-id", str(node_id),
               "--data-dir", data_dir, "--voters", format_voters(self.voters), "--password", self.password,
               "--cluster-id", self.cluster_id, "--log-level", "WARNING"] + self.extra_args
        log = open(os.path.join(data_dir, "controller.log"), "ab")
        self.procs[node_id] = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                               env={**os.environ, "PYTHONPATH": ROOT})
        log.close()

    def start_all(self) -> None:
        for nid in self.voters:
            self.start(nid)

    def kill(self, node_id: int, sig: int = signal.SIGKILL, timeout: float = 30.0) -> None:
        """Send `sig` and wait for the exit; a process that outlives `timeout` is killed -9
        (and the timeout raised), so a forgotten controller never outlives its test."""
        p = self.procs.pop(node_id, None)
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(sig)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
            raise

    def stop_all(self, sig: int = signal.SIGTERM) -> None:
        """Stops every controller, even when stopping one of them fails (the first error is raised)."""
        error: BaseException | None = None
        for nid in list(self.procs):
            try:
                self.kill(nid, sig)
            except BaseException as e:  # noqa: BLE001 - stop the others first
                error = error or e
        if error is not None:
            raise error

    def status(self, node_id: int) -> Optional[dict]:
        return http_json(self.voters[node_id].url + "/controller/v1/status", timeout=5.0)   # a loaded 2-core machine answers slowly

    def active(self) -> Optional[int]:
        for nid in self.procs:
            st = self.status(nid)
            if st and st.get("is_active"):
                return nid
        return None

    def wait_active(self, timeout: float = 15.0, exclude: tuple = ()) -> int:
        """Wait until exactly one running controller (not in `exclude`) is active and every
        other reachable one names it as leader; returns its node id."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.raise_if_crashed(exclude)
            statuses = {nid: self.status(nid) for nid in self.procs if nid not in exclude}
            active = [nid for nid, st in statuses.items() if st and st.get("is_active")]
            if len(active) == 1 and all(st is None or st.get("leader_id") == active[0]
                                        for st in statuses.values()):
                return active[0]
            time.sleep(0.02)
        raise TimeoutError(f"no single active controller within {timeout} s")

    def log_tail(self, node_id: int, lines: int = 30) -> str:
        try:
            with open(os.path.join(self.base_dir, f"controller-{node_id}", "controller.log"), "rb") as f:
                return b"".join(f.readlines()[-lines:]).decode(errors="replace")
        except OSError as e:
            return f"(no log: {e})"

    def raise_if_crashed(self, exclude: tuple = ()) -> None:
        """A controller this rig started that exited with an error (not one it killed: those
        leave `procs`) fails the wait at once, with the end of its log, instead of at the
        wait's timeout."""
        for nid, p in self.procs.items():
            rc = p.poll()
            if nid not in exclude and rc not in (None, 0):
                raise RuntimeError(f"controller {nid} exited with code {rc}; its log ends:\n{self.log_tail(nid)}")

    def __enter__(self) -> "ControllerCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all(signal.SIGKILL)
