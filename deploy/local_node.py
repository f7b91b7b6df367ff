"""Run `kraftlog serve` as a real child process on free ports (integration tests, benchmarks)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from deploy.ports import free_port  # tests and benches import it from here too

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LocalNode:
    """One combined-mode node (`kraftlog serve`) with its own ports and data dir.

    `start()` waits for the ready line; `stop()` sends SIGTERM and waits; `output` is
    everything the node printed (stdout + stderr of the supervisor and its children)."""

    def __init__(self, data_dir: str, node_id: int = 1, extra_args: list[str] | None = None,
                 scheme: str = "http") -> None:
        self.data_dir = data_dir
        self.scheme = scheme     # https when its --config turns TLS on ([security])
        self.node_id = node_id
        self.http_port = free_port()
        self.controller_port = free_port()
        self.raft_port = free_port()
        self.kafka_port = free_port()   # never Kafka's default 9092: tests run side by side
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.http_port}"

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "deploy.cli", "serve", "--node-id", str(self.node_id),
                "--data-dir", self.data_dir, "--http-port", str(self.http_port),
                "--controller-port", str(self.controller_port), "--raft-port", str(self.raft_port),
                "--kafka-port", str(self.kafka_port),
                *self.extra_args]

    def start(self, timeout: float = 60.0) -> "LocalNode":
        self.lines = []
        self._saw_url = False
        self._ready.clear()
        env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(self.command(), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout):
            self.kill()
            raise RuntimeError(f"kraftlog serve did not become ready in {timeout}s:\n{self.output}")
        if not self._saw_url:  # output ended before the ready line: the node exited
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
            if self._reader is not None:
                self._reader.join(5)
            raise RuntimeError(f"kraftlog serve exited with code {self.proc.returncode}:\n{self.output}")
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.strip() == self.url:
                self._saw_url = True
                self._ready.set()
        self._ready.set()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        if self._reader is not None:
            self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> "LocalNode":
        return self.start()

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        except Exception:
            self.kill()
