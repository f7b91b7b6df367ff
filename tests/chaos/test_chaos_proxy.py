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


# ---- a dead target is mirrored: refused, as a dead process's port (issue 24) ---------------

class _ReusableEcho(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def _serve_echo(port: int = 0):
    srv = _ReusableEcho(("127.0.0.1", port), _Echo)
    srv.received = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _stop_echo(srv) -> None:
    srv.shutdown()
    srv.server_close()


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2.0).close()
    except ConnectionRefusedError:
        return True
    return False


def _poll(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _echoes(port: int) -> bool:
    try:
        return _talk(port, timeout=2.0) == b"ping"
    except OSError:
        return False


def test_a_killed_target_is_refused_until_it_listens_again():
    # a controller probing a killed broker through its proxy must see "connection refused"
    # (immediate fencing as unreachable), not "connected, then closed" (the silence path)
    srv = _serve_echo()
    port = srv.server_address[1]
    p = Proxy(port)
    try:
        assert _talk(p.port) == b"ping"
        _stop_echo(srv)
        p.target_down()
        assert not p.listening
        assert _refused(p.port), "a dead target's proxy accepted a connection"
        assert _refused(p.port)
        with socket.socket() as other, pytest.raises(OSError):   # the port stays ours meanwhile
            other.bind(("127.0.0.1", p.port))
        srv = _serve_echo(port)                      # the restarted process listens again
        assert _poll(lambda: _echoes(p.port)), "the proxy did not listen again after the restart"
        assert p.listening
    finally:
        p.close()
        _stop_echo(srv)


def test_a_target_that_died_by_itself_is_refused_after_the_first_failed_connect():
    srv = _serve_echo()
    p = Proxy(srv.server_address[1])
    try:
        assert _talk(p.port) == b"ping"
        _stop_echo(srv)                              # no target_down(): the proxy finds out
        assert _poll(lambda: _refused(p.port)), "the proxy kept accepting for a dead target"
    finally:
        p.close()


def test_a_paused_target_keeps_the_proxy_accepting():
    # SIGSTOP: the kernel still completes handshakes on the paused process's listening socket
    paused = socket.socket()
    paused.bind(("127.0.0.1", 0))
    paused.listen(16)                                 # never accepts, like a stopped process
    p = Proxy(paused.getsockname()[1])
    try:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", p.port), timeout=2.0) as s:
                s.sendall(b"x")
                s.settimeout(0.3)
                with pytest.raises(socket.timeout):
                    s.recv(10)
        assert p.listening
    finally:
        p.close()
        paused.close()


def test_the_chaos_cluster_kill_closes_that_process_proxies_only(tmp_path):
    from tests.chaos.harness.cluster import ChaosCluster
    c = ChaosCluster(str(tmp_path / "cluster"))     # processes not started: nothing to kill
    try:
        c.kill("broker", 1)
        c.kill("controller", 2)
        down = [c.broker_proxy[1], c.ctl_proxy[2], c.raft_proxy[2]]
        assert [p.listening for p in down] == [False, False, False]
        assert _refused(c.broker_proxy[1].port)
        assert all(p.listening for p in c.all_proxies() if p not in down)
    finally:
        c.stop()
