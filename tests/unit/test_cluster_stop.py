"""`kraftlog cluster down` returns only once its processes are gone, also those it had to
SIGKILL: an `up` right after must not meet a dying broker still holding its port and its
data dir's lock (seen as "broker 1 exited" on a loaded machine)."""
from __future__ import annotations

import signal

from deploy import cluster


class _FakeProcesses:
    """Processes that ignore SIGTERM and, once SIGKILLed, stay alive for a few more checks
    (as one in uninterruptible disk I/O does)."""

    def __init__(self, pids, checks_after_kill: int = 5) -> None:
        self.left = {pid: None for pid in pids}   # pid -> checks left once killed (None: running)
        self.checks_after_kill = checks_after_kill

    def kill(self, pid: int, sig: int) -> None:
        if sig == signal.SIGKILL and self.left.get(pid) is None:
            self.left[pid] = self.checks_after_kill

    def alive(self, pid: int) -> bool:
        left = self.left.get(pid)
        if left is None:
            return True
        if left > 0:
            self.left[pid] = left - 1
            return True
        return False

    def gone(self, pid: int) -> bool:
        return self.left.get(pid) == 0


def test_stop_waits_until_sigkilled_processes_are_gone(monkeypatch):
    procs = _FakeProcesses([101, 102])
    monkeypatch.setattr(cluster.os, "kill", procs.kill)
    monkeypatch.setattr(cluster, "alive", procs.alive)
    cluster._stop([101, 102], timeout=0.05)
    assert procs.gone(101) and procs.gone(102), procs.left
