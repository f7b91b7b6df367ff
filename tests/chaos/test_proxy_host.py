"""Chaos proxies in a process of their own (harness/proxy_host.py): the same rules as the
in-process proxy, connections named from the labels the harness pushes, and forwarding that
does not wait for the harness process's own work."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tests.chaos.harness.proxy import Proxy
from tests.chaos.harness.proxy_host import ProxyHost

# an echo server and a pinging client as processes of their own: nothing of the path from
# the client to the echo but the proxy may live in this (the harness's) process
_ECHO = textwrap.dedent("""
    import socket, sys, threading
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(64)
    print(srv.getsockname()[1], flush=True)
    def serve(c):
        while True:
            d = c.recv(65536)
            if not d:
                return
            c.sendall(d)
    while True:
        c, _ = srv.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
""")
_PINGER = textwrap.dedent("""
    import socket, sys, time
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    print("connected", flush=True)
    worst, end = 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.monotonic(); s.sendall(b"p"); s.recv(10)
        worst = max(worst, time.monotonic() - t)
        time.sleep(0.01)
    print(worst, flush=True)
""")


@pytest.fixture
def echo_port():
    p = subprocess.Popen([sys.executable, "-c", _ECHO], stdout=subprocess.PIPE, text=True)
    try:
        yield int(p.stdout.readline())
    finally:
        p.kill()
        p.wait(10)


@pytest.fixture
def host():
    h = ProxyHost("test-proxy-host", "test-proxy-host-loop")
    try:
        yield h
    finally:
        h.close()
        assert not h._proc.is_alive()


def _talk(port: int, payload: bytes = b"ping", timeout: float = 2.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        return s.recv(100)


def test_rules_and_labels_in_the_proxy_process(host, echo_port):
    p = host.open(echo_port, "echo", resolve=True)
    assert _talk(p.port) == b"ping"                       # forwards; unknown pid: "client"
    host.set_labels({os.getpid(): "harness"})            # now this process is "harness"
    p.cut("harness")
    with pytest.raises(OSError):
        if not _talk(p.port):
            raise ConnectionResetError
    assert p.faults[("refused", "harness")] == 1
    assert p.rules == {"harness": ("cut", True, True, 0)} and p.state() == "harness: cut"
    p.heal()
    assert _talk(p.port) == b"ping"
    p.one_way("harness", answers=False)                  # the request arrives, the answer is lost
    with pytest.raises(socket.timeout):
        _talk(p.port, timeout=0.3)
    p.heal()
    p.target_down()              # reached the proxy (the target still runs: it listens again)
    assert p.faults[("target-down", "*")] == 1
    deadline = time.monotonic() + 10
    while not p.listening and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.listening and _talk(p.port) == b"ping"
    faults = dict(p.faults)
    p.close()
    assert dict(p.faults) == faults                      # kept for the report after close
    with pytest.raises(RuntimeError, match="failed"):    # errors come back as errors
        host.call("heal", 12345, ((), {}))


def _worst_round_trip_while_busy(port: int, busy_s: float) -> tuple[float, float]:
    """(worst round trip of a pinging client process through `port`, how long this process
    held its GIL) while this process holds its GIL about `busy_s`."""
    pinger = subprocess.Popen([sys.executable, "-c", _PINGER, str(port), str(busy_s + 1.0)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert pinger.stdout.readline().strip() == "connected"
        time.sleep(0.3)
        t = time.perf_counter()
        sum(range(2_000_000))
        per_item_s = (time.perf_counter() - t) / 2_000_000
        t = time.monotonic()
        sum(range(int(busy_s / per_item_s)))           # one C call: the GIL is not given up
        held_s = time.monotonic() - t
        return float(pinger.stdout.readline()), held_s
    finally:
        pinger.kill()
        pinger.wait(10)


def test_a_proxy_process_forwards_while_the_harness_is_busy(host, echo_port):
    busy_s = 2.0
    in_process = Proxy(echo_port, "in-process")
    try:   # the control: a proxy sharing the busy interpreter waits for it
        worst, held = _worst_round_trip_while_busy(in_process.port, busy_s)
        assert worst > 0.6 * held, (worst, held)
    finally:
        in_process.close()
    remote = host.open(echo_port, "remote")
    worst, held = _worst_round_trip_while_busy(remote.port, busy_s)
    assert worst < 0.4 * held, (worst, held)
