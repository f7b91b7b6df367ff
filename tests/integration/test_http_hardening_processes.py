"""The hardened HTTP edge on real processes (a controller and a broker, as deployed): the
limits reach both servers from their configuration, a slowloris head is closed at the
configured deadline on each, and malformed requests log one line each, no traceback."""
from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from tests.rigs.cluster import ReplicatedCluster, http

pytestmark = pytest.mark.integration

HEADER_TIMEOUT_MS = 600


def slowloris_closed_after(port: int, limit_s: float = 10.0) -> float:
    """Dribble a request head one byte every 100 ms; seconds until the server closes."""
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 500 + b"\r\n\r\n"
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=limit_s) as s:
        s.settimeout(0.1)
        for b in head:
            try:
                s.sendall(bytes([b]))
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - t0
            try:
                if s.recv(1) == b"":
                    return time.monotonic() - t0
            except socket.timeout:
                pass
            except ConnectionResetError:
                return time.monotonic() - t0
            assert time.monotonic() - t0 < limit_s, "the server kept the slowloris connection open"
    raise AssertionError("the whole head was sent: the server never closed the connection")


def malformed(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data


def log_lines(path: str, needle: str) -> list[str]:
    with open(path, errors="replace") as f:
        return [line for line in f if needle in line]


def test_slowloris_and_malformed_requests_on_a_broker_and_a_controller_process(tmp_path):
    limits = {"request_header_timeout_ms": HEADER_TIMEOUT_MS, "request_body_timeout_ms": 1000}
    with ReplicatedCluster(str(tmp_path), brokers=1, broker_config=limits,
                           controller_args=["--http-limits-json", json.dumps(limits),
                                            "--log-level", "INFO"]) as c:
        broker_port = c.ports[1]
        controller = c.controllers.voters[1]
        for port in (broker_port, controller.http_port):
            elapsed = slowloris_closed_after(port)
            assert HEADER_TIMEOUT_MS / 1000 - 0.1 <= elapsed < HEADER_TIMEOUT_MS / 1000 + 3, (port, elapsed)
        # served as before
        assert http("GET", c.url(1) + "/healthz")[0] == 200
        assert http("GET", controller.url + "/controller/v1/status")[0] == 200

        for port in (broker_port, controller.http_port):
            for _ in range(3):
                got = malformed(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
                assert got.startswith((b"HTTP/1.1 400", b"HTTP/1.0 400")), got[:200]
                assert b"INVALID_REQUEST" in got
        for _ in range(2):
            status, body = http("POST", c.url(1) + "/v1/topics", raw=b"{not json")
            assert status == 400, body
        broker_log = c.log_path(1)
        controller_log = str(tmp_path / "controller-1" / "controller.log")

        def settled():
            return (len(log_lines(broker_log, "rejected")) >= 5 and len(log_lines(controller_log, "rejected")) >= 3)

        deadline = time.monotonic() + 10
        while not settled():
            assert time.monotonic() < deadline, "rejection lines not logged"
            time.sleep(0.05)
        assert len(log_lines(broker_log, "rejected UNKNOWN")) + len(log_lines(broker_log, "rejected GET")) == 3
        assert len(log_lines(broker_log, "rejected POST /v1/topics")) == 2
        assert len(log_lines(controller_log, "rejected")) == 3
        with urllib.request.urlopen(c.url(1) + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert 'kraftlog_http_edge_refused_total{reason="header_timeout"} 1.0' in metrics
        assert 'kraftlog_http_edge_refused_total{reason="rejected"} 5.0' in metrics
        for path in (broker_log, controller_log):
            assert not log_lines(path, "Traceback"), path
            assert len(log_lines(path, "request head not complete within request_header_timeout_ms=600")) == 1
