"""Start and stop a local single-node kraftlog (`kraftlog serve`) for examples, tests, benches.

`LocalNode(data_dir).start()` picks free ports (bind to port 0), runs
`kraftlog serve --data-dir ... --http-port ... --controller-port ... --raft-port ...` as a
subprocess, and returns once `/healthz` answers and metadata lists an unfenced broker.
`stop()` sends SIGTERM, waits, and kills only that process group if it does not exit.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

start_timeout_s_default = 60.0
stop_timeout_s_default = 15.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kraftlog_command() -> list:
    exe = os.path.join(os.path.dirname(sys.executable), "kraftlog")
    if os.path.exists(exe):
        return [exe]
    found = shutil.which("kraftlog")
    if found:
        return [found]
    return [sys.executable, "-m", "deploy.cli"]


class LocalNode:
    """One combined-mode node (controller + broker) as a child process."""

    def __init__(self, data_dir: str, log_path: str | None = None):
        self.data_dir = data_dir
        self.http_port = free_port()
        self.controller_port = free_port()
        self.raft_port = free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.log_path = log_path or os.path.join(data_dir, "kraftlog-serve.log")
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self, timeout_s: float = start_timeout_s_default) -> "LocalNode":
        os.makedirs(self.data_dir, exist_ok=True)
        cmd = kraftlog_command() + ["serve", "--data-dir", self.data_dir,
                                    "--http-port", str(self.http_port),
                                    "--controller-port", str(self.controller_port),
                                    "--raft-port", str(self.raft_port)]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"`{' '.join(cmd)}` exited with {self.proc.returncode}; "
                                   f"see {self.log_path}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as resp:
                    if resp.status == 200 and self._broker_ready():
                        return self
            except Exception as exc:  # not listening yet
                last = repr(exc)
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"kraftlog serve not ready at {self.url} after {timeout_s}s ({last}); "
                           f"see {self.log_path}:\n{self.log_tail()}")

    def _broker_ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/v1/metadata", timeout=2) as resp:
                md = json.loads(resp.read())
        except Exception:
            return False
        return any(not b.get("fenced", False) for b in md.get("brokers", []))

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = stop_timeout_s_default) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
