"""ChaosCluster's proxies on CONTROLLER_HOST use the same port number as their target on
127.0.0.1 (the voters list names it), so that port is picked before anything binds it and
another process can take it in between (a CI run failed on "address already in use" for a
127.0.0.2 proxy). A lost race is retried on a new port; the voters list and the controller's
command line name the port the proxy really got."""
from __future__ import annotations

import socket

import pytest

from tests.chaos.harness import cluster as cluster_mod
from tests.chaos.harness.cluster import CONTROLLER_HOST, ChaosCluster, ClusterSettings


@pytest.mark.parametrize("proxy_processes", [False, True])
def test_controller_host_proxy_retries_a_port_taken_after_it_was_picked(tmp_path, monkeypatch, proxy_processes):
    taken = socket.socket()
    taken.bind((CONTROLLER_HOST, 0))   # another process holds this port on CONTROLLER_HOST ...
    taken.listen(1)
    busy = taken.getsockname()[1]
    real = cluster_mod._free_on_both
    picks = iter([busy, busy])          # ... after the harness picked it (for controller 1: ctl and raft)
    monkeypatch.setattr(cluster_mod, "_free_on_both", lambda: next(picks, None) or real())
    cluster = ChaosCluster(str(tmp_path / "cluster"), ClusterSettings(nodes=1, proxy_processes=proxy_processes))
    try:
        assert cluster.ctl_port[1] != busy and cluster.raft_port[1] != busy
        assert cluster.ctl_proxy[1].port == cluster.ctl_port[1]
        assert cluster.raft_proxy[1].port == cluster.raft_port[1]
        cmd = cluster.procs[("controller", 1)].cmd
        assert cmd[cmd.index("--http-port") + 1] == str(cluster.ctl_port[1])
        assert cmd[cmd.index("--voters") + 1] == f"1@{CONTROLLER_HOST}:{cluster.raft_port[1]}:{cluster.ctl_port[1]}"
    finally:
        cluster.stop()
        taken.close()
