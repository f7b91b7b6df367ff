"""The process rigs clean up after themselves: a cluster that fails to start kills every
process it had started before the error reaches the test."""
import subprocess

import pytest

from tests.rigs.cluster import ReplicatedCluster

pytestmark = pytest.mark.integration


def test_a_cluster_that_fails_to_start_kills_what_it_started(tmp_path, monkeypatch):
    started: list[subprocess.Popen] = []

    class RecordingPopen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(subprocess, "Popen", RecordingPopen)
    # the controller comes up; every broker refuses its configuration and exits
    c = ReplicatedCluster(str(tmp_path), brokers=2, broker_config={"no_such_setting": 1})
    try:
        with pytest.raises(RuntimeError, match="broker 1 exited"):
            c.start()
        assert len(started) == 3   # 1 controller + 2 brokers were started
        assert [p.args[2] for p in started] == ["metadata_quorum.controller_server", "http_api.broker.server",
                                                "http_api.broker.server"]
        assert all(p.poll() is not None for p in started), [p.args[:3] for p in started if p.poll() is None]
        assert c.procs == {} and c.controllers.procs == {}
    finally:
        for p in started:   # without the rig's cleanup, the controller would still be running here
            if p.poll() is None:
                p.kill()
                p.wait(10)


def test_a_background_producer_left_running_is_stopped_even_mid_request():
    """What the autouse fixture of tests/integration/conftest.py does after a failed test: a
    producer stuck in a request to a broker that never answers is cancelled after the grace."""
    import socket

    import replication_helpers

    with socket.socket() as black_hole:   # accepts connections (backlog), never answers
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(16)
        url = f"http://127.0.0.1:{black_hole.getsockname()[1]}"
        prod = replication_helpers.BackgroundProducer([url], "t", [0], request_timeout_ms=600_000,
                                                      delivery_timeout_ms=600_000).start()
        assert prod in replication_helpers._running
        black_hole.settimeout(30)
        conn, _ = black_hole.accept()   # the producer's first request is on its way: it waits
        with conn:
            replication_helpers.stop_all(grace_s=0.5)
            assert not prod._thread.is_alive() and not replication_helpers._running
