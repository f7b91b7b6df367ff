"""The log cleaner's child process dies with its broker.

The broker cleans in a spawned child (`ProcessCleanerRunner`). After a kill -9 of the broker
nothing stops that child (nor the multiprocessing resource tracker, which waits for every
holder of its pipe): it must notice on its own that its parent is gone.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BROKER_STAND_IN = r"""
import os, sys, time
from partitions.log.log_scheduler import ProcessCleanerRunner
runner = ProcessCleanerRunner()
child = runner._get_pool().submit(os.getpid).result(timeout=60)
print(child, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.integration
def test_cleaner_child_exits_after_its_broker_is_killed():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    parent = subprocess.Popen([sys.executable, "-c", BROKER_STAND_IN], stdout=subprocess.PIPE, text=True, env=env)
    child = None
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 15
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), f"cleaner child {child} outlived its killed broker"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)
