"""`kraftlog serve` as a real process: HTTP round trip, SIGTERM -> clean shutdown marker
-> restart without recovery, data still there."""
import json
import os
import signal
import urllib.request

import pytest

from deploy.local_node import LocalNode

pytestmark = pytest.mark.integration


def call(method, url, body=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_serve_roundtrip_sigterm_clean_restart(tmp_path):
    node = LocalNode(str(tmp_path / "data")).start()
    try:
        u = node.url
        status, topic = call("POST", u + "/v1/topics", {"name": "events", "partitions": 2,
                                                        "replication_factor": 1, "configs": {}})
        assert status == 201 and len(topic["partitions"]) == 2
        status, body = call("POST", u + "/v1/topics/events/records?acks=all",
                            {"records": [{"key": f"k{i}", "value": f"v{i}"} for i in range(50)]})
        assert status == 200 and len(body["offsets"]) == 50
        counts = {}
        for o in body["offsets"]:
            counts[o["partition"]] = counts.get(o["partition"], 0) + 1
        status, md = call("GET", u + "/v1/metadata")
        assert md["brokers"][0]["url"] == u and md["brokers"][0]["fenced"] is False
        assert call("GET", u + "/healthz")[0] == 200
    finally:
        code = node.stop(signal.SIGTERM)
    assert code == 0, node.output
    assert "kraftlog stopped cleanly" in node.output
    assert "controlled shutdown completed" in node.output
    logs = tmp_path / "data" / "broker-1" / "logs"
    assert (logs / ".kraftlog_cleanshutdown").exists()

    node.start()
    try:
        assert "after a clean shutdown (recovery skipped)" in node.output, node.output
        assert not (logs / ".kraftlog_cleanshutdown").exists()
        total = 0
        for p, n in counts.items():
            status, body = call("GET", f"{node.url}/v1/topics/events/partitions/{p}/records?offset=0")
            assert status == 200 and len(body["records"]) == n and body["high_watermark"] == n
            total += n
        assert total == 50
        status, body = call("POST", node.url + "/v1/topics/events/records",
                            {"records": [{"key": "k1", "value": "after-restart"}]})
        assert status == 200
    finally:
        assert node.stop() == 0


def test_serve_refuses_busy_port_with_advice(tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        node = LocalNode(str(tmp_path / "d"))
        node.http_port = s.getsockname()[1]
        with pytest.raises(RuntimeError) as e:
            node.start(timeout=20)
        assert "already in use" in str(e.value) and "--http-port" in str(e.value)
    finally:
        s.close()


def test_second_serve_on_the_same_data_dir_is_refused(tmp_path):
    with LocalNode(str(tmp_path / "data")):
        other = LocalNode(str(tmp_path / "data"))
        with pytest.raises(RuntimeError) as e:
            other.start(timeout=20)
        assert "in use by another kraftlog" in str(e.value)
