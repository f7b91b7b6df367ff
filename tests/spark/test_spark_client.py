"""The executor HTTP client's routing: leader redirects (421) and retriable errors.

Two tiny stub "brokers" on free ports stand in for a multi-node cluster: a follower that
answers 421 NOT_LEADER_OR_FOLLOWER naming the leader, and the leader.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipelines.client import BrokerError, Cluster


class _Stub:
    def __init__(self, handler):
        outer = self
        self.calls = []

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                outer.calls.append(self.path)
                status, body = handler(self.path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")   # no keep-alive handler thread outlives the test
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stubs():
    made = []

    def make(handler):
        stub = _Stub(handler)
        made.append(stub)
        return stub

    yield make
    for stub in made:
        stub.close()


def test_follows_not_leader_redirect_and_remembers_the_leader(stubs):
    leader = stubs(lambda path: (200, {"log_start_offset": 3, "high_watermark": 9}))
    follower = stubs(lambda path: (
        (200, {"brokers": [{"id": 1, "url": "http://127.0.0.1:9"}], "topics": []}) if path == "/v1/metadata"
        else (421, {"error_code": "NOT_LEADER_OR_FOLLOWER", "message": "not here",
                    "leader_id": 2, "leader_url": leader.url})))
    cluster = Cluster([follower.url])
    assert cluster.offsets("t", 0) == (3, 9)
    assert cluster.offsets("t", 0) == (3, 9)
    assert len(leader.calls) == 2
    assert [c for c in follower.calls if "/partitions/" in c] == ["/v1/topics/t/partitions/0/offsets"]


def test_non_retriable_errors_surface_with_their_code(stubs):
    broker = stubs(lambda path: (
        (200, {"brokers": [], "topics": []}) if path == "/v1/metadata"
        else (416, {"error_code": "OFFSET_OUT_OF_RANGE", "message": "offset 5 < log start 9"})))
    with pytest.raises(BrokerError) as info:
        Cluster([broker.url]).fetch("t", 0, 5, 1024)
    assert info.value.error_code == "OFFSET_OUT_OF_RANGE" and info.value.status == 416
