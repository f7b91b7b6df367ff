"""The fault-injecting TCP proxy: forwarding, per-source rules, cut / blackhole / one-way /
slow, and naming the connecting process from /proc."""
from __future__ import annotations

import os
import socket
import socketserver
import threading
import time

import pytest

from tests.chaos.harness.proxy import Proxy, pid_of_peer


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            data = self.request.recv(65536)
            if not data:
                return
            self.server.received.append(data)
            self.request.sendall(data)


@pytest.fixture
def echo():
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    srv.daemon_threads = True
    srv.received = []
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _talk(port: int, payload: bytes = b"ping", timeout: float = 1.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        return s.recv(100)


def test_forwards_and_names_the_connecting_process(echo):
    seen = []

    def resolver(peer_port, local_port):
        pid = pid_of_peer(peer_port, local_port, [os.getpid()])
        seen.append(pid)
        return "me" if pid == os.getpid() else "client"

    p = Proxy(echo.server_address[1], resolver=resolver)
    try:
        assert _talk(p.port) == b"ping"
        assert seen == [os.getpid()]
    finally:
        p.close()


def test_cut_blackhole_one_way_slow_and_heal(echo):
    p = Proxy(echo.server_address[1], resolver=lambda peer, local: "me")
    try:
        p.cut("me")
        with pytest.raises(OSError):
            if not _talk(p.port):          # closed at once: empty read or reset
                raise ConnectionResetError
        p.heal()
        assert _talk(p.port) == b"ping"

        p.cut("someone-else")               # rules are per source
        assert _talk(p.port) == b"ping"
        p.heal()

        p.blackhole()
        with pytest.raises(socket.timeout):
            _talk(p.port, timeout=0.3)
        p.heal()

        n = len(echo.received)
        p.one_way("me", answers=False)      # the request arrives, the answer is lost
        with pytest.raises(socket.timeout):
            _talk(p.port, b"lost-answer", timeout=0.3)
        assert b"lost-answer" in echo.received[n:]
        p.heal()

        p.one_way("me", requests=False)     # the request never arrives
        with pytest.raises(socket.timeout):
            _talk(p.port, b"lost-request", timeout=0.3)
        assert b"lost-request" not in echo.received
        p.heal()

        p.slow(200)
        t0 = time.monotonic()
        assert _talk(p.port) == b"ping"
        assert time.monotonic() - t0 >= 0.35  # both directions delayed
        assert "slow 200ms" in p.state()
    finally:
        p.close()


def test_cut_severs_established_connections(echo):
    p = Proxy(echo.server_address[1])
    try:
        with socket.create_connection(("127.0.0.1", p.port), timeout=1.0) as s:
            s.sendall(b"a")
            assert s.recv(10) == b"a"
            p.cut()
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                try:
                    s.sendall(b"b")
                    if s.recv(10) == b"":
                        break
                except OSError:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the established connection survived the cut")
    finally:
        p.close()


def test_naming_a_new_connection_does_not_hold_up_the_others(echo):
    # every proxied link (raft between controllers included) shares one loop: naming a new
    # connection (a /proc lookup, 100-200 ms on a busy machine) must not stall established
    # ones, or raft votes arrive late and elections never complete (issue 24)
    release, entered = threading.Event(), threading.Event()

    def resolver(peer_port, local_port):
        if pid_of_peer(peer_port, local_port, [os.getpid()]) != os.getpid():
            return "client"
        if seen:
            entered.set()
            release.wait(10)    # the second connection's lookup hangs
        seen.append(peer_port)
        return "me"

    seen: list = []
    p = Proxy(echo.server_address[1], resolver=resolver)
    try:
        with socket.create_connection(("127.0.0.1", p.port), timeout=5) as first:
            first.sendall(b"a")
            assert first.recv(10) == b"a"
            second = socket.create_connection(("127.0.0.1", p.port), timeout=5)
            try:
                assert entered.wait(10), "the proxy never named the second connection"
                first.settimeout(2.0)
                first.sendall(b"b")
                assert first.recv(10) == b"b", "an established link waited for a new one's lookup"
            finally:
                release.set()
                second.close()
    finally:
        release.set()
        p.close()
