"""A real broker process compacts a topic through its LogScheduler (the pass runs in the
broker's cleaner child process), exposes the cleaner metrics, and still shuts down cleanly."""
import json
import signal
import urllib.request

import pytest

from deploy.local_node import LocalNode

pytestmark = pytest.mark.integration


def call(method, url, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            ctype = r.headers.get("Content-Type", "")
            return r.status, (json.loads(raw) if raw and "json" in ctype else raw.decode())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_broker_process_compacts_in_its_cleaner_process(tmp_path):
    node = LocalNode(str(tmp_path / "data")).start()
    try:
        u = node.url
        configs = {"cleanup.policy": "compact", "segment.bytes": "1000", "min.cleanable.dirty.ratio": "0.1"}
        status, _ = call("POST", u + "/v1/topics", {"name": "state", "partitions": 1, "replication_factor": 1,
                                                    "configs": configs})
        assert status == 201
        for i in range(20):
            status, _ = call("POST", u + "/v1/topics/state/records?acks=all",
                             {"records": [{"key": f"k{j}", "value": f"v{i}.{j}"} for j in range(5)]})
            assert status == 200
        status, d = call("POST", u + "/admin/v1/log-cleaner/run", {})
        assert status == 200, d
        [c] = d["cleaned"]
        assert c["segments_cleaned"] > 0 and not c["aborted"]
        status, body = call("GET", u + "/v1/topics/state/partitions/0/records?offset=0")
        values = {r["key"]: r["value"] for r in body["records"]}
        assert values == {f"k{j}": f"v19.{j}" for j in range(5)}
        assert len(body["records"]) < 50  # of 100 (the active segment is never cleaned)
        status, text = call("GET", u + "/metrics")
        assert "kraftlog_log_cleaner_passes_total 1.0" in text
        assert 'kraftlog_log_dirty_ratio{partition="0",topic="state"}' in text
    finally:
        code = node.stop(signal.SIGTERM)
    assert code == 0, node.output
    assert "kraftlog stopped cleanly" in node.output
