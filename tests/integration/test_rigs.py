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
        assert [p.args[2] for p in started] == ["metadata_quorum.controller_server", "http_api.broker_server",
                                                "http_api.broker_server"]
        assert all(p.poll() is not None for p in started), [p.args[:3] for p in started if p.poll() is None]
        assert c.procs == {} and c.controllers.procs == {}
    finally:
        for p in started:   # without the rig's cleanup, the controller would still be running here
            if p.poll() is None:
                p.kill()
                p.wait(10)
