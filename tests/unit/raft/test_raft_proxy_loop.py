"""Raft links between chaos controllers cross proxies of their own (a process of their own,
or a loop of their own in the harness process), so a backlog of other proxied connections
cannot hold up their handshakes (raft/README.md, "A quorum that
stops campaigning"; tests/chaos/harness/proxy.py)."""
from __future__ import annotations

import socket
import socketserver
import threading
import time

from tests.chaos.harness.proxy import DEFAULT_LOOP, RAFT_LOOP, Proxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            data = self.request.recv(65536)
            if not data:
                return
            self.request.sendall(data)


def test_a_raft_link_is_forwarded_while_the_shared_proxy_loop_is_behind():
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    http = Proxy(srv.server_address[1], "controller-1", loop_name=DEFAULT_LOOP)
    raft = Proxy(srv.server_address[1], "raft-1", loop_name=RAFT_LOOP)
    release = threading.Event()
    try:
        # the shared loop 30 s behind (measured under load: 1,300+ connections queued on it,
        # accept queues full for minutes)
        http._lp.loop.call_soon_threadsafe(release.wait, 30)
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", raft.port), timeout=5) as s:
            s.settimeout(5)
            s.sendall(b"vote")
            assert s.recv(10) == b"vote"
        # (pysyncobj drops a connection whose handshake takes over connectionTimeout, 1.5 s;
        # 10 s leaves room for a loaded machine and is far below the 30 s stall)
        waited = time.monotonic() - t0
        assert waited < 10, f"the raft link waited {waited:.2f} s for the shared proxy loop"
    finally:
        release.set()
        raft.close()
        http.close()
        srv.shutdown()
        srv.server_close()


def test_the_chaos_cluster_puts_raft_proxies_apart_from_the_http_proxies(tmp_path):
    from tests.chaos.harness.cluster import ChaosCluster, ClusterSettings

    c = ChaosCluster(str(tmp_path / "cluster"))   # default: proxies in processes of their own
    try:
        raft_hosts = {p._host for p in c.raft_proxy.values()}
        http_hosts = {p._host for p in list(c.ctl_proxy.values()) + list(c.broker_proxy.values())}
        assert len(raft_hosts) == 1 and len(http_hosts) == 1 and raft_hosts != http_hosts
        assert all(h._proc.is_alive() for h in raft_hosts | http_hosts)
    finally:
        c.stop()
    assert not any(h._proc.is_alive() for h in c.proxy_hosts)

    c = ChaosCluster(str(tmp_path / "in-process"), ClusterSettings(proxy_processes=False))
    try:   # in the harness process: raft proxies on a loop of their own
        assert {p._lp.name for p in c.raft_proxy.values()} == {RAFT_LOOP}
        assert {p._lp.name for p in list(c.ctl_proxy.values()) + list(c.broker_proxy.values())} == {DEFAULT_LOOP}
    finally:
        c.stop()
