"""deploy/ports.py: ports for child processes come from outside the kernel's ephemeral range.

A port chosen by binding port 0 lies in the range outgoing connections draw from; a CI run
lost a controller when SeaweedFS's own connections took its port before it bound it."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from deploy import ports
from tests.rigs.controllers import ControllerCluster


def test_free_ports_are_outside_the_ephemeral_range_distinct_and_bindable():
    low, high = ports.ephemeral_range()
    got = ports.free_ports(200)
    assert len(set(got)) == len(got)
    for p in got:
        assert not low <= p <= high, (p, low, high)
        assert ports.LOWEST_PORT <= p <= 65535
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_in_use_is_never_handed_out(monkeypatch):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    busy = listener.getsockname()[1]
    listener.listen()
    try:
        monkeypatch.setattr(ports, "candidate_ranges", lambda: [range(busy, busy + 1)])
        port = ports.free_port()      # the only candidate is busy: the kernel chooses
        assert port != busy
    finally:
        listener.close()


def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path, monkeypatch):
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", str(f))
    assert ports.ephemeral_range() == (40000, 50000)
    assert ports.candidate_ranges() == [range(ports.LOWEST_PORT, 40000), range(50001, 65536)]
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", str(tmp_path / "missing"))
    assert ports.ephemeral_range() == (32768, 60999)


def test_a_crashed_controller_fails_the_wait_at_once_with_its_log(tmp_path):
    rig = ControllerCluster(1, str(tmp_path))
    log_dir = tmp_path / "controller-1"
    log_dir.mkdir()
    (log_dir / "controller.log").write_text("OSError: [Errno 98] address already in use\n")
    rig.procs[1] = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    rig.procs[1].wait(10)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="address already in use"):
        rig.wait_active(timeout=30)
    assert time.monotonic() - t0 < 5
    rig.stop_all(signal.SIGKILL)
